//! `cargo xtask ci`: everything CI runs, in order, stopping at the first failure.
//!
//! The order puts cheap, common failures first (formatting, lints) and the slow publish check
//! last. First, the test tools a fresh machine lacks are installed (cargo-deny, Debian's
//! Chromium and chromedriver: see `setup`); without cargo-nextest the tests run under
//! `cargo test`.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::cmd::{
    cargo, display, project_root, read_stdout, run as run_command, succeeds, term_color,
};
use crate::{codegen, conformance, tidy};

/// What a step does.
enum Action {
    /// `cargo <args>` with inherited stdio.
    Cargo(Vec<String>),
    /// `cargo package` of every publishable crate; whether the tree is dirty (and so whether
    /// `--allow-dirty` is needed) is decided when the step starts, as earlier steps may have
    /// touched files such as Cargo.lock.
    Package { unpublishable: Vec<String> },
    /// One of our own commands, in this process.
    Xtask {
        line: &'static str,
        run: fn() -> anyhow::Result<()>,
    },
    /// Not run, for the reason printed.
    Skip(&'static str),
}

struct Step {
    name: &'static str,
    action: Action,
}

/// What the plan depends on, probed once at the start.
#[derive(Debug, Clone, Default)]
struct Environment {
    nextest: bool,
    deny: bool,
    /// Workspace members with `publish = false`: not packaged.
    unpublishable: Vec<String>,
}

impl Environment {
    fn probe() -> anyhow::Result<Self> {
        let mut unpublishable: Vec<String> = tidy::workspace()?
            .into_iter()
            .filter(|package| !package.manifest.publishable)
            .map(|package| package.name)
            .collect();
        unpublishable.sort();
        Ok(Environment {
            nextest: succeeds(&mut cargo(["nextest", "--version"])),
            deny: succeeds(&mut cargo(["deny", "--version"])),
            unpublishable,
        })
    }
}

/// Whether `git status` reports changes; outside a git checkout cargo checks nothing, so no.
fn git_tree_is_dirty() -> bool {
    let mut git = Command::new("git");
    git.args(["status", "--porcelain"])
        .current_dir(project_root());
    read_stdout(&mut git).is_ok_and(|status| !status.trim().is_empty())
}

fn cargo_step(name: &'static str, args: &[&str]) -> Step {
    Step {
        name,
        action: Action::Cargo(args.iter().map(|arg| (*arg).to_owned()).collect()),
    }
}

/// The steps, in order.
fn plan(env: &Environment) -> Vec<Step> {
    let mut steps = vec![
        cargo_step("fmt", &["fmt", "--all", "--", "--check"]),
        cargo_step(
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--",
                "-D",
                "warnings",
            ],
        ),
    ];
    if env.nextest {
        steps.push(cargo_step(
            "tests",
            &[
                "nextest",
                "run",
                "--workspace",
                "--all-features",
                "--no-fail-fast",
            ],
        ));
        // nextest does not run doctests.
        steps.push(cargo_step(
            "doctests",
            &["test", "--doc", "--workspace", "--all-features"],
        ));
    } else {
        steps.push(cargo_step(
            "tests",
            &["test", "--workspace", "--all-features"],
        ));
    }
    steps.push(Step {
        name: "codegen",
        action: Action::Xtask {
            line: "cargo xtask codegen --check",
            run: || codegen::run(codegen::Mode::Check),
        },
    });
    steps.push(Step {
        name: "tidy",
        action: Action::Xtask {
            line: "cargo xtask tidy",
            run: tidy::run,
        },
    });
    steps.push(if env.deny {
        // Advisories need the RustSec database from the network, which CI machines here do not
        // reach; bans, licenses and sources are checked offline against deny.toml.
        cargo_step("deny", &["deny", "check", "bans", "licenses", "sources"])
    } else {
        Step {
            name: "deny",
            action: Action::Skip("cargo-deny not installed: skipped"),
        }
    });
    steps.push(Step {
        name: "conformance",
        action: Action::Xtask {
            line: "cargo xtask conformance",
            run: conformance::run,
        },
    });
    steps.push(Step {
        name: "package",
        action: Action::Package {
            unpublishable: env.unpublishable.clone(),
        },
    });
    steps
}

/// `cargo package` arguments: the whole workspace but the `publish = false` members, in
/// dependency order (cargo verifies each against the ones packaged before it).
fn package_args(unpublishable: &[String], dirty: bool) -> Vec<String> {
    let mut args = vec!["package".to_owned(), "--workspace".to_owned()];
    for name in unpublishable {
        args.extend(["--exclude".to_owned(), name.clone()]);
    }
    if dirty {
        args.push("--allow-dirty".to_owned());
    }
    args
}

impl Step {
    fn line(&self) -> String {
        match &self.action {
            Action::Cargo(args) => display(&cargo(args)),
            Action::Package { unpublishable } => {
                display(&cargo(package_args(unpublishable, git_tree_is_dirty())))
            }
            Action::Xtask { line, .. } => (*line).to_owned(),
            Action::Skip(reason) => (*reason).to_owned(),
        }
    }

    fn run(&self) -> anyhow::Result<()> {
        match &self.action {
            Action::Cargo(args) => run_command(&mut cargo(args)),
            Action::Package { unpublishable } => {
                forget_packaged_sources()?;
                let mut package = cargo(package_args(unpublishable, git_tree_is_dirty()));
                // A target directory of its own, emptied first: cargo treats our packaged crates
                // as immutable registry crates and would reuse an earlier run's builds of them.
                package.env("CARGO_TARGET_DIR", package_target_dir());
                run_command(&mut package)
            }
            Action::Xtask { run, .. } => run(),
            Action::Skip(_) => Ok(()),
        }
    }
}

/// `cargo package` verifies each crate against the ones packaged before it through a local
/// registry, and cargo extracts registry crates into `$CARGO_HOME/registry/src` once per version:
/// an earlier run's copy of `clawgate-store 0.1.0` would be used instead of today's sources.
/// Our crates are not on crates.io, so every extracted `clawgate-*` copy is such a leftover.
fn package_target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate::cmd::project_root().join("target"))
        .join("package-verify")
}

fn forget_packaged_sources() -> anyhow::Result<()> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
    let verify = package_target_dir();
    if verify.is_dir() {
        std::fs::remove_dir_all(&verify)
            .map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", verify.display()))?;
    }
    let Some(home) = home else { return Ok(()) };
    for area in ["src", "cache"] {
        let Ok(registries) = std::fs::read_dir(home.join("registry").join(area)) else {
            continue;
        };
        for registry in registries.flatten() {
            let Ok(entries) = std::fs::read_dir(registry.path()) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with("clawgate-") {
                    let path = entry.path();
                    let removed = if path.is_dir() {
                        std::fs::remove_dir_all(&path)
                    } else {
                        std::fs::remove_file(&path)
                    };
                    removed.map_err(|e| {
                        anyhow::anyhow!(
                            "cannot remove the stale packaged copy {}: {e}",
                            path.display()
                        )
                    })?;
                }
            }
        }
    }
    Ok(())
}

fn seconds(duration: Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

pub(crate) fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let color = term_color();
    crate::setup::ensure_test_tools()?;
    let env = Environment::probe()?;
    let steps = plan(&env);
    println!(
        "ci: {} steps (nextest: {}, cargo-deny: {}, CARGO_TERM_COLOR={color})",
        steps.len(),
        yes_no(env.nextest),
        yes_no(env.deny),
    );
    let mut timings = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        let position = format!("[{}/{}]", index + 1, steps.len());
        if let Action::Skip(reason) = &step.action {
            println!("\n==> {position} {}: {reason}", step.name);
            timings.push((step.name, None));
            continue;
        }
        println!("\n==> {position} {}: {}", step.name, step.line());
        let step_started = Instant::now();
        let result = step.run();
        let elapsed = step_started.elapsed();
        if let Err(error) = result {
            bail!(
                "ci failed at step {position} `{}` after {}: {error:#}\n\
                 rerun it alone with: {}",
                step.name,
                seconds(elapsed),
                step.line()
            );
        }
        println!("<== {position} {}: ok in {}", step.name, seconds(elapsed));
        timings.push((step.name, Some(elapsed)));
    }
    println!("\nci: all steps passed in {}", seconds(started.elapsed()));
    for (name, elapsed) in timings {
        println!(
            "  {name:<12} {}",
            elapsed.map_or("skipped".to_owned(), seconds)
        );
    }
    Ok(())
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each step as `name: command line`, the package step as if the tree were clean.
    fn lines(env: &Environment) -> Vec<String> {
        plan(env)
            .iter()
            .map(|step| {
                let line = match &step.action {
                    Action::Package { unpublishable } => {
                        display(&cargo(package_args(unpublishable, false)))
                    }
                    _ => step.line(),
                };
                format!("{}: {line}", step.name)
            })
            .collect()
    }

    #[test]
    fn the_plan_with_every_tool() {
        let env = Environment {
            nextest: true,
            deny: true,
            unpublishable: vec!["clawgate-e2e".into(), "xtask".into()],
        };
        assert_eq!(
            lines(&env),
            [
                "fmt: cargo fmt --all -- --check",
                "clippy: cargo clippy --workspace --all-targets --all-features -- -D warnings",
                "tests: cargo nextest run --workspace --all-features --no-fail-fast",
                "doctests: cargo test --doc --workspace --all-features",
                "codegen: cargo xtask codegen --check",
                "tidy: cargo xtask tidy",
                "deny: cargo deny check bans licenses sources",
                "conformance: cargo xtask conformance",
                "package: cargo package --workspace --exclude clawgate-e2e --exclude xtask",
            ]
        );
    }

    #[test]
    fn the_plan_without_optional_tools() {
        let lines = lines(&Environment::default());
        assert!(lines.contains(&"tests: cargo test --workspace --all-features".to_owned()));
        assert!(
            !lines.iter().any(|line| line.starts_with("doctests")),
            "{lines:?}"
        );
        assert!(lines.contains(&"deny: cargo-deny not installed: skipped".to_owned()));
        assert_eq!(
            lines.last().map(String::as_str),
            Some("package: cargo package --workspace")
        );
    }

    #[test]
    fn a_dirty_tree_allows_dirty_packaging() {
        let unpublishable = ["xtask".to_owned()];
        assert_eq!(
            package_args(&unpublishable, true),
            [
                "package",
                "--workspace",
                "--exclude",
                "xtask",
                "--allow-dirty"
            ]
        );
        assert_eq!(
            package_args(&unpublishable, false),
            ["package", "--workspace", "--exclude", "xtask"]
        );
    }
}
