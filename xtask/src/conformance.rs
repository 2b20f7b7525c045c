//! `cargo xtask conformance`: every conformance suite of the workspace, one after another.
//!
//! A suite is a set of test binaries and the filter that selects their macro-generated
//! conformance tests. The binaries are built once for the whole workspace by
//! `cargo test --workspace --all-features --no-run` (a per-package `cargo test -p` would resolve
//! features per package and build the dependency tree again for each suite). In CI they are the
//! binaries the test steps ran: the unpublished crates' from the repository, the published
//! crates' from the packaged crates' workspace, so nothing new is built. Before a suite runs, its tests are listed: a suite whose filter matches
//! nothing fails instead of passing vacuously (a renamed module must not silently switch a suite
//! off).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::cmd::{cargo, display, read_stdout, with_exports};
use crate::packaged;
use crate::postgres::{self, Cluster};
use crate::tidy::{self, CONFORMANCE, Package};

/// The filter of every suite: the suites' macros generate their tests in `mod conformance`.
const FILTER: &str = "conformance";

/// The store suite on each backend: (backend, package, test target).
const STORES: [(&str, &str, &str); 2] = [
    ("sqlite", "clawgate-store-sqlite", "store"),
    ("postgres", postgres::PACKAGE, postgres::TEST_TARGET),
];

/// One conformance suite: which test binaries it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Suite {
    name: String,
    package: String,
    /// Only this test target of the package, or all of them.
    target: Option<&'static str>,
}

/// Every suite: the store suite on every backend (PostgreSQL's unless `with_postgres` is
/// false, i.e. `CLAWGATE_TEST_PG=0`), and the adapter contract suite in every package that
/// (dev-)depends on `clawgate-conformance` (channel crates running it against their platform,
/// the e2e package against the QA platform), so a new channel crate's suite runs without being
/// listed here.
fn suites(packages: &[Package], with_postgres: bool) -> Vec<Suite> {
    let mut suites: Vec<Suite> = STORES
        .iter()
        .filter(|(backend, _, _)| with_postgres || *backend != "postgres")
        .map(|(backend, package, target)| Suite {
            name: format!("store ({backend})"),
            package: (*package).to_owned(),
            target: Some(*target),
        })
        .collect();
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
        package: name.to_owned(),
        target: None,
    }));
    suites
}

/// A test binary cargo built.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TestBinary {
    package: String,
    target: String,
    executable: PathBuf,
    /// The package's directory: cargo runs its tests from there.
    dir: PathBuf,
}

/// The command that builds (or finds already built) every test binary of the workspace, less
/// the `excluded` packages.
fn build_args(excluded: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "test",
        "--workspace",
        "--all-features",
        "--no-run",
        "--message-format",
        "json-render-diagnostics",
    ]
    .map(str::to_owned)
    .to_vec();
    for package in excluded {
        args.extend(["--exclude".to_owned(), package.clone()]);
    }
    args
}

/// The package name in a cargo package id: `path+file:///…/name#1.0.0`, or
/// `path+file:///…/dir#name@1.0.0` when the directory is named otherwise.
fn package_name(id: &str) -> Option<&str> {
    let (path, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _)) => Some(name),
        None => path.rsplit('/').next(),
    }
}

/// The test binaries in cargo's JSON messages.
fn test_binaries(messages: &str) -> anyhow::Result<Vec<TestBinary>> {
    let mut binaries = Vec::new();
    for line in messages.lines().filter(|line| line.starts_with('{')) {
        let message: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("cargo printed a message that is not JSON: {line}"))?;
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else {
            continue;
        };
        let id = message["package_id"].as_str().unwrap_or_default();
        let package = package_name(id)
            .with_context(|| format!("cannot read the package of `{id}`"))?
            .to_owned();
        let manifest = message["manifest_path"].as_str().unwrap_or_default();
        binaries.push(TestBinary {
            package,
            target: message["target"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            executable: executable.into(),
            dir: Path::new(manifest)
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        });
    }
    Ok(binaries)
}

impl Suite {
    fn binaries<'a>(&self, all: &'a [TestBinary]) -> Vec<&'a TestBinary> {
        all.iter()
            .filter(|binary| binary.package == self.package)
            .filter(|binary| self.target.is_none_or(|target| binary.target == target))
            .collect()
    }
}

impl TestBinary {
    /// The binary run with the suite's filter, as `cargo test` would run it.
    fn command(&self, extra: &[&str]) -> Command {
        let mut command = Command::new(&self.executable);
        command
            .arg(FILTER)
            .args(extra)
            .current_dir(&self.dir)
            .env("CARGO_MANIFEST_DIR", &self.dir);
        if let Some(cargo) = std::env::var_os("CARGO") {
            command.env("CARGO", cargo);
        }
        // The PostgreSQL suite's server (`CLAWGATE_TEST_PG_URL`), as the test steps had it.
        with_exports(&mut command);
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

/// `cargo xtask conformance`: every suite, on test binaries built from the repository. The
/// PostgreSQL suite runs on `CLAWGATE_TEST_PG_URL` when it is set, else on a throwaway cluster
/// started for this run (none with `CLAWGATE_TEST_PG=0`).
pub(crate) fn run() -> anyhow::Result<()> {
    let _cluster = if postgres::left_out() || std::env::var_os(postgres::URL_VAR).is_some() {
        None
    } else {
        let cluster = Cluster::start().with_context(|| {
            format!(
                "cannot start a PostgreSQL cluster for the store suite (set {}=0 to leave it out)",
                postgres::SWITCH_VAR
            )
        })?;
        crate::cmd::export_to_children(cluster.exports());
        Some(cluster)
    };
    run_on(&tidy::workspace()?, vec![cargo(build_args(&[]))])
}

/// The CI step, after the test steps: the binaries they built (see the module comment).
pub(crate) fn run_after_ci_tests() -> anyhow::Result<()> {
    let packages = tidy::workspace()?;
    let published = tidy::published(&packages);
    run_on(
        &packages,
        vec![
            cargo(build_args(&published)),
            packaged::cargo_in_workspace(build_args(&[])),
        ],
    )
}

/// Every suite of `packages`, on the test binaries the `builds` make (or find already made).
fn run_on(packages: &[Package], builds: Vec<Command>) -> anyhow::Result<()> {
    let suites = suites(packages, !postgres::left_out());
    let mut binaries = Vec::new();
    for mut build in builds {
        println!("conformance: {}", display(&build));
        binaries.extend(test_binaries(&read_stdout(&mut build)?)?);
    }
    let mut failed = Vec::new();
    for suite in &suites {
        let mut listed = 0;
        let mut skips = Vec::new();
        let mut errors = Vec::new();
        let chosen = suite.binaries(&binaries);
        for binary in &chosen {
            let count = count_listed(&read_stdout(&mut binary.command(&["--list"]))?);
            listed += count;
            if count == 0 {
                continue;
            }
            match run_reporting_skips(&mut binary.command(&["--nocapture"])) {
                Ok(found) => skips.extend(found),
                Err(error) => errors.push(error.to_string()),
            }
        }
        println!("conformance: suite `{}`: {listed} tests", suite.name);
        if listed == 0 {
            failed.push(format!(
                "{}: {} test binaries of {} select no test with the filter `{FILTER}`",
                suite.name,
                chosen.len(),
                suite.package
            ));
            continue;
        }
        if !errors.is_empty() {
            failed.push(format!("{}: {}", suite.name, errors.join("; ")));
            continue;
        }
        skips.sort_unstable();
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
            .map(|suite| {
                format!(
                    "{}: {} {}",
                    suite.name,
                    suite.package,
                    suite.target.unwrap_or("(every test target)")
                )
            })
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
            lines(&suites(&packages, true)),
            [
                "store (sqlite): clawgate-store-sqlite store",
                "store (postgres): clawgate-store-postgres postgres",
                "adapter (clawgate-channel-matrix): clawgate-channel-matrix (every test target)",
                "adapter (clawgate-conformance): clawgate-conformance (every test target)",
                "adapter (clawgate-e2e): clawgate-e2e (every test target)",
            ]
        );
        let without_postgres = lines(&suites(&packages, false));
        assert!(
            !without_postgres
                .iter()
                .any(|line| line.contains("postgres")),
            "{without_postgres:?}"
        );
        assert_eq!(without_postgres.len(), 4, "{without_postgres:?}");
    }

    #[test]
    fn package_names_are_read_from_both_id_shapes() {
        assert_eq!(
            package_name("path+file:///work/crates/clawgate-store#0.1.0"),
            Some("clawgate-store")
        );
        assert_eq!(
            package_name("path+file:///work/testing/e2e#clawgate-e2e@0.1.0"),
            Some("clawgate-e2e")
        );
        assert_eq!(package_name("no fragment"), None);
    }

    #[test]
    fn test_binaries_are_found_in_cargo_messages_and_suites_pick_theirs() {
        let messages = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/clawgate-store-sqlite#0.1.0","manifest_path":"/w/crates/clawgate-store-sqlite/Cargo.toml","target":{"name":"store"},"profile":{"test":true},"executable":"/t/debug/deps/store-1"}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/clawgate-store-sqlite#0.1.0","manifest_path":"/w/crates/clawgate-store-sqlite/Cargo.toml","target":{"name":"clawgate_store_sqlite"},"profile":{"test":true},"executable":"/t/debug/deps/clawgate_store-2"}
{"reason":"compiler-artifact","package_id":"registry+https://github.com/rust-lang/crates.io-index#tokio@1.54.0","manifest_path":"/r/tokio/Cargo.toml","target":{"name":"tokio"},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","package_id":"path+file:///w/channels/x#clawgate-channel-x@0.1.0","manifest_path":"/w/channels/x/Cargo.toml","target":{"name":"x"},"profile":{"test":true},"executable":"/t/debug/deps/x-3"}
{"reason":"build-finished","success":true}
Compiling is not JSON and is skipped
"#;
        let binaries = test_binaries(messages).expect("parsed");
        assert_eq!(binaries.len(), 3, "{binaries:?}");
        assert_eq!(binaries[2].package, "clawgate-channel-x");
        assert_eq!(binaries[2].dir, Path::new("/w/channels/x"));
        let store = &suites(&[], false)[0];
        let picked: Vec<&str> = store
            .binaries(&binaries)
            .iter()
            .map(|binary| binary.target.as_str())
            .collect();
        assert_eq!(picked, ["store"]);
        let adapter = Suite {
            name: "adapter (clawgate-store-sqlite)".into(),
            package: "clawgate-store-sqlite".into(),
            target: None,
        };
        assert_eq!(adapter.binaries(&binaries).len(), 2);
    }

    #[test]
    fn the_real_workspace_runs_the_qa_and_memory_suites() {
        let packages = tidy::workspace().expect("cargo metadata runs");
        let suites = suites(&packages, true);
        // A renamed or moved backend crate must not leave its store suite pointing nowhere.
        for suite in suites
            .iter()
            .filter(|suite| suite.name.starts_with("store"))
        {
            assert!(
                packages.iter().any(|package| package.name == suite.package),
                "{}: no workspace package `{}`",
                suite.name,
                suite.package
            );
        }
        for name in [
            "store (sqlite)",
            "store (postgres)",
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
