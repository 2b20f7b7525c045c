//! `cargo xtask ci`: everything CI runs, in order, stopping at the first failure.
//!
//! The order puts cheap, common failures first (formatting, lints, docs), then the unpublished
//! crates' tests, and the slow publish check last: every publishable crate's own tests, built
//! from its packaged `.crate` ([`packaged`]) — the only place they run, so no test is built and
//! run twice — followed by the conformance report on the binaries both test runs built.
//!
//! The test tools a fresh machine lacks (cargo-deny, Debian packages, Python venvs, npm
//! packages: see `setup`) are installed by `cargo xtask setup` in a child process that runs
//! beside the first steps, which need none of them (formatting, lints, docs); its output goes to
//! `<target>/ci-setup.log`, shown if it fails, and the first step that needs the tools waits for
//! it. Without cargo-nextest the tests run under `cargo test`.

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::cmd::{
    cargo, display, project_root, read_stdout, run as run_command, succeeds, term_color,
};
use crate::postgres::{self, Cluster};
use crate::{codegen, conformance, packaged, tidy};

/// What a step does.
enum Action {
    /// `cargo <args>` with inherited stdio and these environment variables set.
    Cargo {
        args: Vec<String>,
        env: Vec<(&'static str, &'static str)>,
    },
    /// [`packaged::run`]; whether the tree is dirty (and so whether `--allow-dirty` is needed)
    /// is decided when the step starts, as earlier steps may have touched files such as
    /// Cargo.lock. `nextest`: whether the tests run under cargo-nextest.
    PackagedCrates { nextest: bool },
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

/// The steps that need none of the test tools, so they run while `setup` installs them.
const WITHOUT_TOOLS: [&str; 3] = ["fmt", "clippy", "docs"];

/// `cargo xtask setup` running in a child process, its output in a log file; a thread waits
/// for it, so the time it took is known however late it is asked.
struct Setup {
    waiting: Option<std::thread::JoinHandle<std::io::Result<(ExitStatus, Duration)>>>,
    log: PathBuf,
}

impl Setup {
    fn start() -> anyhow::Result<Setup> {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| project_root().join("target"), PathBuf::from);
        std::fs::create_dir_all(&target)
            .with_context(|| format!("cannot create {}", target.display()))?;
        let log = target.join("ci-setup.log");
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let exe = std::env::current_exe().context("cannot find the xtask binary")?;
        let started = Instant::now();
        let mut child = Command::new(exe)
            .arg("setup")
            .stdin(Stdio::null())
            .stdout(file.try_clone().context("cannot share the setup log")?)
            .stderr(file)
            .spawn()
            .context("cannot start `cargo xtask setup`")?;
        println!(
            "ci: installing the test tools beside the first steps (`cargo xtask setup`, log: {})",
            log.display()
        );
        let waiting = std::thread::spawn(move || {
            let status = child.wait()?;
            Ok((status, started.elapsed()))
        });
        Ok(Setup {
            waiting: Some(waiting),
            log,
        })
    }

    fn wait(&mut self) -> anyhow::Result<(ExitStatus, Duration)> {
        let waiting = self
            .waiting
            .take()
            .context("`cargo xtask setup` was waited for already")?;
        waiting
            .join()
            .map_err(|_| anyhow::anyhow!("the thread waiting for `cargo xtask setup` panicked"))?
            .context("cannot wait for `cargo xtask setup`")
    }

    /// Waits for the installation; its log is shown when it failed.
    fn finish(mut self) -> anyhow::Result<()> {
        let (status, elapsed) = self.wait()?;
        if !status.success() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!(
                "`cargo xtask setup` failed ({status}) after {}; its output:\n{log}\n\
                 rerun it alone with: cargo xtask setup",
                seconds(elapsed)
            );
        }
        println!(
            "\nci: test tools ready (installed in {}, beside the steps before; log: {})",
            seconds(elapsed),
            self.log.display()
        );
        Ok(())
    }
}

/// A run that fails early still lets the installation finish: a package manager killed midway
/// can leave the machine's package database broken.
impl Drop for Setup {
    fn drop(&mut self) {
        if self.waiting.is_some() {
            let _ = self.wait();
        }
    }
}

/// What the plan depends on, probed once at the start.
#[derive(Debug, Clone, Default)]
struct Environment {
    nextest: bool,
    deny: bool,
    /// The published crates: their tests run in the packaged crates step, not the test step.
    published: Vec<String>,
}

impl Environment {
    fn probe() -> anyhow::Result<Self> {
        Ok(Environment {
            nextest: succeeds(&mut cargo(["nextest", "--version"])),
            deny: succeeds(&mut cargo(["deny", "--version"])),
            published: tidy::published(&tidy::workspace()?),
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
        action: Action::Cargo {
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            env: Vec::new(),
        },
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
        Step {
            name: "docs",
            action: Action::Cargo {
                args: ["doc", "--workspace", "--no-deps", "--all-features"]
                    .map(str::to_owned)
                    .to_vec(),
                // Broken intra-doc links and malformed doc comments fail, as lints do.
                env: vec![("RUSTDOCFLAGS", "-D warnings")],
            },
        },
    ];
    // The published crates' tests run in the packaged crates step.
    let excluded: Vec<String> = env
        .published
        .iter()
        .flat_map(|name| ["--exclude".to_owned(), name.clone()])
        .collect();
    let workspace_step = |name, command: &[&str]| {
        let mut args: Vec<String> = command.iter().map(|arg| (*arg).to_owned()).collect();
        args.extend(excluded.iter().cloned());
        Step {
            name,
            action: Action::Cargo {
                args,
                env: Vec::new(),
            },
        }
    };
    if env.nextest {
        steps.push(workspace_step(
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
        steps.push(workspace_step(
            "doctests",
            &["test", "--doc", "--workspace", "--all-features"],
        ));
    } else {
        steps.push(workspace_step(
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
        name: "packaged crates",
        action: Action::PackagedCrates {
            nextest: env.nextest,
        },
    });
    steps.push(Step {
        name: "conformance",
        action: Action::Xtask {
            line: "cargo xtask conformance (on the test binaries the two test runs built)",
            run: conformance::run_after_ci_tests,
        },
    });
    steps
}

/// `NAME="value" cargo <args>`, as a user would type it.
fn cargo_line(args: &[String], env: &[(&str, &str)]) -> String {
    let mut line: Vec<String> = env
        .iter()
        .map(|(name, value)| format!("{name}={value:?}"))
        .collect();
    line.push(display(&cargo(args)));
    line.join(" ")
}

impl Step {
    fn line(&self) -> String {
        match &self.action {
            Action::Cargo { args, env } => cargo_line(args, env),
            Action::PackagedCrates { nextest } => packaged::line(*nextest),
            Action::Xtask { line, .. } => (*line).to_owned(),
            Action::Skip(reason) => (*reason).to_owned(),
        }
    }

    fn run(&self) -> anyhow::Result<()> {
        match &self.action {
            Action::Cargo { args, env } => {
                let mut command = cargo(args);
                command.envs(env.iter().copied());
                run_command(&mut command)
            }
            Action::PackagedCrates { nextest } => packaged::run(git_tree_is_dirty(), *nextest),
            Action::Xtask { run, .. } => run(),
            Action::Skip(_) => Ok(()),
        }
    }
}

fn seconds(duration: Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

/// A step's name as `--step` takes it: `packaged crates` is `packaged-crates`.
fn slug(name: &str) -> String {
    name.to_lowercase().replace(' ', "-")
}

/// The steps to run: all of them, or the one `--step` names.
fn select(steps: Vec<Step>, only: Option<&str>) -> anyhow::Result<Vec<Step>> {
    let Some(only) = only else { return Ok(steps) };
    let names: Vec<String> = steps.iter().map(|step| slug(step.name)).collect();
    match steps.into_iter().find(|step| slug(step.name) == slug(only)) {
        Some(step) => Ok(vec![step]),
        None => bail!(
            "`cargo xtask ci --step {only}`: no such step (steps: {})",
            names.join(", ")
        ),
    }
}

pub(crate) fn run(only: Option<&str>) -> anyhow::Result<()> {
    let started = Instant::now();
    let color = term_color();
    // One step alone installs the tools first; a whole run installs them beside the steps
    // that need none, and cargo-deny is then known to come (setup fails without it).
    let mut setup = None;
    if only.is_some() {
        crate::setup::ensure_test_tools()?;
    } else {
        setup = Some(Setup::start()?);
    }
    let mut env = Environment::probe()?;
    env.deny |= setup.is_some();
    let steps = select(plan(&env), only)?;
    println!(
        "ci: {} steps (nextest: {}, cargo-deny: {}, CARGO_TERM_COLOR={color})",
        steps.len(),
        yes_no(env.nextest),
        yes_no(env.deny),
    );
    if postgres::left_out() {
        println!(
            "\nci: !!! {}=0: the PostgreSQL backend's tests ({}::{}) and the gateway's \
             shared-state tests ({}) are LEFT OUT of this run (nextest filter `{}`) !!!",
            postgres::SWITCH_VAR,
            postgres::PACKAGE,
            postgres::TEST_TARGET,
            postgres::GATEWAY_MODULE,
            postgres::nextest_filter()
        );
    }
    // Stopped when `run` returns, whether a step failed or not.
    let mut cluster: Option<Cluster> = None;
    let mut timings = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        let position = format!("[{}/{}]", index + 1, steps.len());
        if let Action::Skip(reason) = &step.action {
            println!("\n==> {position} {}: {reason}", step.name);
            timings.push((step.name, None));
            continue;
        }
        if !WITHOUT_TOOLS.contains(&step.name) {
            if let Some(setup) = setup.take() {
                setup.finish()?;
            }
            // After the tools: its installation must not race setup's apt-get.
            if cluster.is_none() && !postgres::left_out() {
                cluster = Some(start_cluster()?);
            }
        }
        println!("\n==> {position} {}: {}", step.name, step.line());
        let step_started = Instant::now();
        let result = step.run();
        let elapsed = step_started.elapsed();
        if let Err(error) = result {
            bail!(
                "ci failed at step {position} `{}` after {}: {error:#}\n\
                 rerun it alone with: cargo xtask ci --step {} ({})",
                step.name,
                seconds(elapsed),
                slug(step.name),
                step.line()
            );
        }
        println!("<== {position} {}: ok in {}", step.name, seconds(elapsed));
        timings.push((step.name, Some(elapsed)));
    }
    println!("\nci: all steps passed in {}", seconds(started.elapsed()));
    for (name, elapsed) in timings {
        println!(
            "  {name:<16} {}",
            elapsed.map_or("skipped".to_owned(), seconds)
        );
    }
    Ok(())
}

/// The throwaway cluster of this run, its URL and CA file given to every step's cargo.
fn start_cluster() -> anyhow::Result<Cluster> {
    let started = Instant::now();
    let cluster = Cluster::start().with_context(|| {
        format!(
            "cannot start the PostgreSQL test cluster (set {}=0 to leave the PostgreSQL tests \
             out)",
            postgres::SWITCH_VAR
        )
    })?;
    println!(
        "\nci: PostgreSQL test cluster at {} (started in {}), exported to every step as {} \
         (its CA file as {})",
        cluster.url(),
        seconds(started.elapsed()),
        postgres::URL_VAR,
        postgres::CA_VAR
    );
    crate::cmd::export_to_children(cluster.exports());
    Ok(cluster)
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each step as `name: command line`.
    fn lines(env: &Environment) -> Vec<String> {
        plan(env)
            .iter()
            .map(|step| format!("{}: {}", step.name, step.line()))
            .collect()
    }

    #[test]
    fn the_steps_run_beside_the_tool_installation_come_first() {
        let env = Environment {
            nextest: true,
            deny: true,
            published: Vec::new(),
        };
        let names: Vec<&str> = plan(&env).iter().map(|step| step.name).collect();
        assert_eq!(names[..WITHOUT_TOOLS.len()], WITHOUT_TOOLS);
    }

    #[test]
    fn the_plan_with_every_tool() {
        let env = Environment {
            nextest: true,
            deny: true,
            published: vec!["clawgate".to_owned(), "clawgate-types".to_owned()],
        };
        assert_eq!(
            lines(&env),
            [
                "fmt: cargo fmt --all -- --check",
                "clippy: cargo clippy --workspace --all-targets --all-features -- -D warnings",
                "docs: RUSTDOCFLAGS=\"-D warnings\" cargo doc --workspace --no-deps --all-features",
                "tests: cargo nextest run --workspace --all-features --no-fail-fast \
                 --exclude clawgate --exclude clawgate-types",
                "doctests: cargo test --doc --workspace --all-features \
                 --exclude clawgate --exclude clawgate-types",
                "codegen: cargo xtask codegen --check",
                "tidy: cargo xtask tidy",
                "deny: cargo deny check bans licenses sources",
                &format!("packaged crates: {}", packaged::line(true)),
                "conformance: cargo xtask conformance (on the test binaries the two test runs \
                 built)",
            ]
        );
    }

    #[test]
    fn one_step_is_selected_by_its_name() {
        let env = Environment::default();
        let only = |name| {
            select(plan(&env), Some(name))
                .map(|steps| steps.iter().map(|step| step.name).collect::<Vec<_>>())
        };
        assert_eq!(only("docs").expect("a step"), ["docs"]);
        assert_eq!(
            only("packaged-crates").expect("a step"),
            ["packaged crates"]
        );
        assert_eq!(
            only("packaged crates").expect("a step"),
            ["packaged crates"]
        );
        let error = only("lint").expect_err("no such step").to_string();
        assert!(
            error.contains("no such step") && error.contains("packaged-crates"),
            "{error}"
        );
        assert_eq!(
            select(plan(&env), None).expect("all").len(),
            plan(&env).len()
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
        let packaged_at = lines
            .iter()
            .position(|line| line.starts_with("packaged crates: "));
        let conformance_at = lines
            .iter()
            .position(|line| line.starts_with("conformance: "));
        assert!(
            packaged_at.is_some() && conformance_at == packaged_at.map(|at| at + 1),
            "the conformance report reads what the packaged crates step built: {lines:?}"
        );
    }
}
