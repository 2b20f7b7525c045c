//! `cargo xtask conformance`: every conformance suite of the workspace, one after another.
//!
//! A suite is a cargo test invocation whose filter selects the macro-generated conformance
//! tests. Before running one, its tests are listed: a suite whose filter matches nothing fails
//! instead of passing vacuously (a renamed module must not silently switch a suite off).

use anyhow::bail;

use crate::cmd::{cargo, display, read_stdout, run as run_command};

/// One conformance suite.
#[derive(Debug)]
struct Suite {
    name: &'static str,
    /// `cargo` arguments up to the test binary's own arguments (the `--`).
    cargo_args: &'static [&'static str],
    /// The libtest filter that selects the suite's tests.
    filter: &'static str,
}

/// Every suite: the store suite on every backend, and the adapter contract suite on every
/// adapter with its peer (the QA platform, in both adapter variants).
const SUITES: &[Suite] = &[
    Suite {
        name: "store",
        cargo_args: &[
            "test",
            "-p",
            "clawgate-store",
            "--features",
            "testing",
            "--test",
            "store",
        ],
        filter: "conformance",
    },
    Suite {
        name: "adapter (QA platform)",
        cargo_args: &["test", "-p", "clawgate-e2e", "--test", "e2e"],
        filter: "conformance_qa",
    },
];

impl Suite {
    fn command(&self, extra: &[&str]) -> std::process::Command {
        let mut command = cargo(self.cargo_args);
        command.arg("--").arg(self.filter).args(extra);
        command
    }
}

/// How many tests libtest's `--list` output names.
fn count_listed(list: &str) -> usize {
    list.lines().filter(|line| line.ends_with(": test")).count()
}

pub(crate) fn run() -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for suite in SUITES {
        let listed = count_listed(&read_stdout(&mut suite.command(&["--list"]))?);
        println!("conformance: suite `{}`: {listed} tests", suite.name);
        if listed == 0 {
            let line = display(&suite.command(&[]));
            failed.push(format!("{}: `{line}` selects no tests", suite.name));
            continue;
        }
        if let Err(error) = run_command(&mut suite.command(&[])) {
            failed.push(format!("{}: {error}", suite.name));
        }
    }
    let names: Vec<&str> = SUITES.iter().map(|suite| suite.name).collect();
    if failed.is_empty() {
        println!(
            "conformance: all {} suites passed ({})",
            SUITES.len(),
            names.join(", ")
        );
        return Ok(());
    }
    bail!(
        "{} of {} conformance suites failed (ran: {}):\n  {}",
        failed.len(),
        SUITES.len(),
        names.join(", "),
        failed.join("\n  ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_suite_runs_the_documented_command() {
        let store = SUITES
            .iter()
            .find(|suite| suite.name == "store")
            .expect("store suite");
        assert_eq!(
            display(&store.command(&[])),
            "cargo test -p clawgate-store --features testing --test store -- conformance"
        );
    }

    #[test]
    fn listed_tests_are_counted() {
        let list = "\
conformance::sqlite::claims_once: test
conformance::sqlite::orders_oldest_first: test

2 tests, 0 benchmarks
";
        assert_eq!(count_listed(list), 2);
        assert_eq!(count_listed("0 tests, 0 benchmarks\n"), 0);
    }
}
