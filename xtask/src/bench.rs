//! `cargo xtask bench <suite> [args]`: runs the suite of the `clawgate-benchmarks` package
//! (binary `clawgate-bench`) from a release build, so xtask does not depend on what only the
//! benches use. Figures from unoptimized code mean nothing, hence `--release`.

use crate::cmd::{cargo, run as run_command};

/// The suites `clawgate-bench` runs; checked here too so a typo fails before a release build.
pub(crate) const SUITES: [&str; 8] = [
    "store",
    "send",
    "receive",
    "awareness",
    "acpx",
    "gateway",
    "telegram",
    "matrix",
];

/// One benchmark run: the suite and the arguments handed to it unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bench {
    pub(crate) suite: String,
    pub(crate) args: Vec<String>,
}

pub(crate) fn run(bench: &Bench) -> anyhow::Result<()> {
    let mut command = cargo([
        "run",
        "--release",
        "--quiet",
        "--package",
        "clawgate-benchmarks",
        "--",
        &bench.suite,
    ]);
    command.args(&bench.args);
    run_command(&mut command)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The suite names `benchmarks/src/main.rs` parses (`"name" => Some(Suite::…)`).
    fn benchmark_suites() -> Vec<String> {
        let path = crate::cmd::project_root().join("benchmarks/src/main.rs");
        let source = std::fs::read_to_string(&path).expect("benchmarks/src/main.rs is readable");
        source
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.trim().strip_prefix('"')?.split_once('"')?;
                rest.trim_start()
                    .starts_with("=> Some(Suite::")
                    .then(|| name.to_owned())
            })
            .collect()
    }

    #[test]
    fn the_suites_are_those_clawgate_bench_runs() {
        assert_eq!(benchmark_suites(), SUITES);
    }
}
