//! Running child processes (mostly cargo) from the workspace root, with failures that name the
//! exact command line so it can be rerun by hand.

use std::ffi::OsString;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, bail};

/// The workspace root: the parent of this crate's directory.
pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ lives inside the workspace root")
        .to_path_buf()
}

/// Variables every cargo command (and test binary) started from here is given (the CI run's
/// test cluster URL):
/// this process cannot set its own environment without `unsafe`.
static CHILD_ENV: OnceLock<Vec<(String, String)>> = OnceLock::new();

/// Gives `vars` to every cargo command started from now on (once per process).
pub(crate) fn export_to_children(vars: Vec<(String, String)>) {
    let _ = CHILD_ENV.set(vars);
}

/// A `cargo <args>` command run from the workspace root, using the cargo that started us.
pub(crate) fn cargo<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(program);
    command
        .args(args.into_iter().map(Into::into))
        .current_dir(project_root())
        .env("CARGO_TERM_COLOR", term_color());
    with_exports(&mut command);
    command
}

/// Gives `command` the variables [`export_to_children`] set: for what is started without
/// cargo (the test binaries the conformance step runs).
pub(crate) fn with_exports(command: &mut Command) -> &mut Command {
    if let Some(vars) = CHILD_ENV.get() {
        command.envs(vars.iter().map(|(name, value)| (name, value)));
    }
    command
}

/// The color choice handed to every cargo we start, so cargo, rustc, clippy and nextest agree:
/// the user's `CARGO_TERM_COLOR` when set, else colors exactly when our stderr is a terminal
/// (plain text in CI logs; export `CARGO_TERM_COLOR=always` for a log viewer that renders ANSI).
pub(crate) fn term_color() -> String {
    match std::env::var("CARGO_TERM_COLOR") {
        Ok(choice) if !choice.is_empty() => choice,
        _ if std::io::stderr().is_terminal() => "always".to_owned(),
        _ => "never".to_owned(),
    }
}

/// The command line as a user would type it (`cargo fmt --all -- --check`).
pub(crate) fn display(command: &Command) -> String {
    let program = Path::new(command.get_program());
    // `$CARGO` is an absolute path to the toolchain's cargo; show the word users type.
    let program = if program.file_stem().is_some_and(|stem| stem == "cargo") {
        "cargo".to_owned()
    } else {
        program.display().to_string()
    };
    let args = command
        .get_args()
        .map(|arg| arg.to_string_lossy().into_owned());
    std::iter::once(program)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `command` with inherited stdio and fails unless it exits successfully.
pub(crate) fn run(command: &mut Command) -> anyhow::Result<()> {
    let line = display(command);
    let status = command
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs `command` and returns its stdout; stderr is passed through so cargo's messages stay
/// visible.
pub(crate) fn read_stdout(command: &mut Command) -> anyhow::Result<String> {
    let line = display(command);
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !output.status.success() {
        bail!("`{line}` failed ({})", output.status);
    }
    String::from_utf8(output.stdout).with_context(|| format!("`{line}` printed non-UTF-8 output"))
}

/// Whether `command` starts and exits successfully; its output is discarded. Used to probe
/// for optional tools (`cargo nextest --version`).
pub(crate) fn succeeds(command: &mut Command) -> bool {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
