//! `cargo xtask bench <suite> [args]`: runs the suite of the `clawgate-benchmarks` package
//! (binary `clawgate-bench`) from a release build, so xtask does not depend on what only the
//! benches use. Figures from unoptimized code mean nothing, hence `--release`.

use crate::cmd::{cargo, run as run_command};
use crate::postgres;

/// The suites `clawgate-bench` runs; checked here too so a typo fails before a release build.
pub(crate) const SUITES: [&str; 9] = [
    "store",
    "send",
    "receive",
    "awareness",
    "acpx",
    "gateway",
    "scale",
    "telegram",
    "matrix",
];

/// One benchmark run: the suite and the arguments handed to it unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bench {
    pub(crate) suite: String,
    pub(crate) args: Vec<String>,
}

/// The suites that also measure PostgreSQL (`--backend sqlite|postgres|both`).
const WITH_BACKEND: [&str; 2] = ["store", "send"];
/// The server the benchmarks measure; set, it is used as it is.
const URL_VAR: &str = "CLAWGATE_BENCH_PG_URL";

impl Bench {
    /// Whether this run measures PostgreSQL on a cluster xtask starts: a suite that takes a
    /// backend, not `--backend sqlite`, no server given — and, without `--backend`, a local
    /// PostgreSQL to start (asked for explicitly, it is installed when missing).
    fn wants_cluster(&self, url_given: bool, installed: bool) -> bool {
        if !WITH_BACKEND.contains(&self.suite.as_str()) || url_given {
            return false;
        }
        let backend = self
            .args
            .iter()
            .position(|arg| arg == "--backend")
            .and_then(|at| self.args.get(at + 1).map(String::as_str))
            .or_else(|| {
                self.args
                    .iter()
                    .find_map(|arg| arg.strip_prefix("--backend="))
            });
        match backend {
            Some("sqlite") => false,
            Some(_) => true,
            None => installed && !self.args.iter().any(|arg| arg == "--help" || arg == "help"),
        }
    }
}

pub(crate) fn run(bench: &Bench) -> anyhow::Result<()> {
    let url_given = std::env::var(URL_VAR).is_ok_and(|url| !url.trim().is_empty());
    let cluster = if bench.wants_cluster(url_given, postgres::installed()) {
        let cluster = postgres::Cluster::start_durable()?;
        println!(
            "bench: a throwaway PostgreSQL cluster (fsync on) at {}, given to the suite as {URL_VAR}",
            cluster.url()
        );
        Some(cluster)
    } else {
        None
    };
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
    if let Some(cluster) = &cluster {
        command.env(URL_VAR, cluster.url());
    }
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

    fn bench(suite: &str, args: &[&str]) -> Bench {
        Bench {
            suite: suite.to_owned(),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
        }
    }

    #[test]
    fn a_cluster_is_started_only_for_a_postgres_figure_without_a_server() {
        // (suite, args, URL given, PostgreSQL installed) → start one?
        let cases: [(&str, &[&str], bool, bool, bool); 10] = [
            ("send", &[], false, true, true),
            ("send", &[], false, false, false),
            ("store", &["--backend", "postgres"], false, false, true),
            ("store", &["--backend=both"], false, true, true),
            ("send", &["--backend", "sqlite"], false, true, false),
            ("send", &["--backend=sqlite"], false, true, false),
            ("send", &["--backend", "both"], true, true, false),
            ("send", &["--help"], false, true, false),
            ("receive", &["--backend", "postgres"], false, true, false),
            ("gateway", &[], false, true, false),
        ];
        for (suite, args, url, installed, expected) in cases {
            assert_eq!(
                bench(suite, args).wants_cluster(url, installed),
                expected,
                "{suite} {args:?} url={url} installed={installed}"
            );
        }
    }

    #[test]
    fn the_suites_are_those_clawgate_bench_runs() {
        assert_eq!(benchmark_suites(), SUITES);
    }
}
