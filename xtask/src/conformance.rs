//! `cargo xtask conformance`: every conformance suite of the workspace, one after another.
//!
//! A suite is a cargo test invocation whose filter selects the macro-generated conformance
//! tests. Before running one, its tests are listed: a suite whose filter matches nothing fails
//! instead of passing vacuously (a renamed module must not silently switch a suite off).

use anyhow::bail;

use crate::cmd::{cargo, display, read_stdout};
use crate::tidy::{self, CONFORMANCE, Package};

/// One conformance suite.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Suite {
    name: String,
    /// `cargo` arguments up to the test binary's own arguments (the `--`).
    cargo_args: Vec<String>,
    /// The libtest filter that selects the suite's tests.
    filter: &'static str,
}

/// The filter of every suite: the suites' macros generate their tests in `mod conformance`.
const FILTER: &str = "conformance";

/// Every suite: the store suite on every backend, and the adapter contract suite in every
/// package that (dev-)depends on `clawgate-conformance` (channel crates running it against their
/// platform, the e2e package against the QA platform), so a new channel crate's suite runs
/// without being listed here.
fn suites(packages: &[Package]) -> Vec<Suite> {
    let args = |args: &[&str]| args.iter().map(|arg| (*arg).to_owned()).collect();
    let mut suites = vec![Suite {
        name: "store".into(),
        cargo_args: args(&[
            "test",
            "-p",
            "clawgate-store",
            "--features",
            "testing",
            "--test",
            "store",
        ]),
        filter: FILTER,
    }];
    // The suite's own tests run it against the SDK's in-memory channel.
    let mut adapters: Vec<&str> = packages
        .iter()
        .filter(|package| {
            package.name == CONFORMANCE || package.deps.iter().any(|(dep, _)| dep == CONFORMANCE)
        })
        .map(|package| package.name.as_str())
        .collect();
    adapters.sort_unstable();
    adapters.dedup();
    suites.extend(adapters.into_iter().map(|name| Suite {
        name: format!("adapter ({name})"),
        cargo_args: args(&["test", "-p", name, "--all-features"]),
        filter: FILTER,
    }));
    suites
}

impl Suite {
    fn command(&self, extra: &[&str]) -> std::process::Command {
        let mut command = cargo(&self.cargo_args);
        command.arg("--").arg(self.filter).args(extra);
        command
    }
}

/// Runs a suite, its output passed through, and returns the skips its cases reported
/// (`conformance: <case> skipped: <reason>` lines, see `clawgate_conformance::Outcome`).
fn run_reporting_skips(command: &mut std::process::Command) -> anyhow::Result<Vec<String>> {
    use std::io::{BufRead as _, BufReader};
    let line = display(command);
    let mut child = command
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("could not start `{line}`: {e}"))?;
    let mut skips = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        for text in BufReader::new(stderr).lines() {
            let text = text?;
            eprintln!("{text}");
            if let Some(skip) = skip_of(&text) {
                skips.push(skip.to_owned());
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    skips.sort_unstable();
    Ok(skips)
}

/// `<case>: <reason>` of a skip line.
fn skip_of(line: &str) -> Option<&str> {
    line.trim()
        .strip_prefix("conformance: ")
        .filter(|rest| rest.contains(" skipped: "))
}

/// How many tests libtest's `--list` output names.
fn count_listed(list: &str) -> usize {
    list.lines().filter(|line| line.ends_with(": test")).count()
}

pub(crate) fn run() -> anyhow::Result<()> {
    let suites = suites(&tidy::workspace()?);
    let mut failed = Vec::new();
    for suite in &suites {
        let listed = count_listed(&read_stdout(&mut suite.command(&["--list"]))?);
        println!("conformance: suite `{}`: {listed} tests", suite.name);
        if listed == 0 {
            let line = display(&suite.command(&[]));
            failed.push(format!("{}: `{line}` selects no tests", suite.name));
            continue;
        }
        match run_reporting_skips(&mut suite.command(&["--nocapture"])) {
            Ok(skips) => {
                println!(
                    "conformance: suite `{}`: {listed} tests, {} passed, {} skipped{}",
                    suite.name,
                    listed - skips.len(),
                    skips.len(),
                    if skips.is_empty() { "" } else { ":" }
                );
                for skip in &skips {
                    println!("    {skip}");
                }
            }
            Err(error) => failed.push(format!("{}: {error}", suite.name)),
        }
    }
    let names: Vec<&str> = suites.iter().map(|suite| suite.name.as_str()).collect();
    if failed.is_empty() {
        println!(
            "conformance: all {} suites passed ({})",
            suites.len(),
            names.join(", ")
        );
        return Ok(());
    }
    bail!(
        "{} of {} conformance suites failed (ran: {}):\n  {}",
        failed.len(),
        suites.len(),
        names.join(", "),
        failed.join("\n  ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tidy::{DepKind, LICENSE_FILES, Manifest};

    fn package(name: &str, deps: &[(&str, DepKind)]) -> Package {
        Package {
            name: name.to_owned(),
            deps: deps
                .iter()
                .map(|(dep, kind)| ((*dep).to_owned(), *kind))
                .collect(),
            manifest: Manifest {
                publishable: true,
                is_lib: true,
                description: true,
                license: true,
                repository: true,
                readme: true,
                keywords: true,
                documentation: true,
                workspace_lints: true,
                license_files: LICENSE_FILES.to_vec(),
            },
        }
    }

    fn lines(suites: &[Suite]) -> Vec<String> {
        suites
            .iter()
            .map(|suite| format!("{}: {}", suite.name, display(&suite.command(&[]))))
            .collect()
    }

    #[test]
    fn every_package_using_the_conformance_suite_is_a_suite() {
        use DepKind::*;
        let packages = [
            package("clawgate-types", &[]),
            package("clawgate-channel-sdk", &[("clawgate-types", Normal)]),
            package(CONFORMANCE, &[("clawgate-channel-sdk", Normal)]),
            package(
                "clawgate-channel-matrix",
                &[("clawgate-channel-sdk", Normal), (CONFORMANCE, Dev)],
            ),
            package("clawgate-e2e", &[(CONFORMANCE, Normal), (CONFORMANCE, Dev)]),
            package("clawgate-channel-qa", &[("clawgate-channel-sdk", Normal)]),
        ];
        assert_eq!(
            lines(&suites(&packages)),
            [
                "store: cargo test -p clawgate-store --features testing --test store -- conformance",
                "adapter (clawgate-channel-matrix): cargo test -p clawgate-channel-matrix \
                 --all-features -- conformance",
                "adapter (clawgate-conformance): cargo test -p clawgate-conformance \
                 --all-features -- conformance",
                "adapter (clawgate-e2e): cargo test -p clawgate-e2e --all-features -- conformance",
            ]
        );
    }

    #[test]
    fn the_real_workspace_runs_the_qa_and_memory_suites() {
        let suites = suites(&tidy::workspace().expect("cargo metadata runs"));
        for name in [
            "adapter (clawgate-channel-qa)",
            "adapter (clawgate-conformance)",
        ] {
            assert!(
                suites.iter().any(|suite| suite.name == name),
                "{name}: {:?}",
                lines(&suites)
            );
        }
    }

    #[test]
    fn skip_lines_are_recognised() {
        assert_eq!(
            skip_of("conformance: edit_round_trip skipped: the adapter does not declare live.edit"),
            Some("edit_round_trip skipped: the adapter does not declare live.edit")
        );
        assert_eq!(skip_of("conformance: suite `store`: 3 tests"), None);
        assert_eq!(skip_of("test conformance::a ... ok"), None);
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
