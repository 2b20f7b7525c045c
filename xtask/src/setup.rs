//! The test tools `cargo xtask ci` needs beyond cargo, installed once per machine so the README's
//! test command works on a fresh one: cargo-deny (licenses, bans, sources) and Debian's
//! Chromium + chromedriver (the chat page's browser test), and Synapse in a Python venv under
//! the target directory (`<target>/python/synapse`: the Matrix channel's tests run against a
//! real homeserver).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::bail;

use crate::cmd::{cargo, project_root, run as run_command, succeeds};

const CARGO_DENY: &str = "cargo-deny@0.20.2";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The Synapse release the Matrix channel's tests run against (its fixture names the same).
const SYNAPSE_VERSION: &str = "1.163.2";

pub(crate) fn ensure_test_tools() -> anyhow::Result<()> {
    if !succeeds(&mut cargo(["deny", "--version"])) {
        println!("setup: installing {CARGO_DENY} (once per machine)");
        run_command(&mut cargo(["install", "--locked", CARGO_DENY]))?;
    }
    let custom_driver = std::env::var_os("CLAWGATE_CHROMEDRIVER").is_some();
    if !custom_driver && !Path::new(CHROMEDRIVER).exists() {
        install_chromium()?;
    }
    ensure_synapse()?;
    Ok(())
}

/// `<target>/python/synapse`, where the Matrix tests look for Synapse (found from their test
/// binary, so the packaged crates' runs on the same target directory find it too).
fn synapse_venv() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| project_root().join("target"))
        .join("python")
        .join("synapse")
}

/// A venv with `matrix-synapse==SYNAPSE_VERSION` (from PyPI, about 20 s), unless one is there.
fn ensure_synapse() -> anyhow::Result<()> {
    let venv = synapse_venv();
    let python = venv.join("bin/python");
    let check = format!(
        "import importlib.metadata as m; assert m.version('matrix-synapse') == '{SYNAPSE_VERSION}'"
    );
    if succeeds(Command::new(&python).args(["-c", &check])) {
        return Ok(());
    }
    println!(
        "setup: installing matrix-synapse=={SYNAPSE_VERSION} into {} (once per machine)",
        venv.display()
    );
    let system_python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    if !succeeds(Command::new(&system_python).args(["-m", "venv", "--help"])) {
        bail!(
            "the Matrix tests need Python 3 with venv (Synapse runs in one): install python3 and \
             python3-venv (apt-get install python3-venv), or point PYTHON at such an interpreter"
        );
    }
    run_command(
        Command::new(&system_python)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
    )?;
    run_command(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("matrix-synapse=={SYNAPSE_VERSION}"),
    ]))?;
    if !succeeds(Command::new(&python).args(["-c", &check])) {
        bail!(
            "pip installed matrix-synapse but {} does not import it",
            python.display()
        );
    }
    Ok(())
}

/// `apt-get install chromium chromium-driver`, as root or through sudo.
fn install_chromium() -> anyhow::Result<()> {
    println!("setup: installing Debian's chromium and chromium-driver (once per machine)");
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    let apt = |args: &[&str]| {
        let mut command = if root {
            Command::new("apt-get")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.arg("apt-get");
            sudo
        };
        command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    if !root && !succeeds(Command::new("sudo").arg("-n").arg("true")) {
        bail!(
            "{CHROMEDRIVER} is missing and this user cannot install packages: install Debian's \
             chromium and chromium-driver (apt-get install chromium chromium-driver), or point \
             CLAWGATE_CHROMEDRIVER and CLAWGATE_CHROMIUM at a chromedriver and a Chromium"
        );
    }
    // A stale or partly unreachable package index may still hold these packages: try anyway.
    if let Err(error) = run_command(&mut apt(&["update", "-qq"])) {
        println!(
            "setup: apt-get update failed ({error:#}); trying the install with the current index"
        );
    }
    run_command(&mut apt(&[
        "install",
        "-y",
        "-qq",
        "chromium",
        "chromium-driver",
    ]))?;
    if !Path::new(CHROMEDRIVER).exists() {
        bail!("apt-get installed chromium-driver but {CHROMEDRIVER} is still missing");
    }
    Ok(())
}
