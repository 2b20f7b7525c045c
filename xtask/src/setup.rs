//! The test tools `cargo xtask ci` needs beyond cargo, installed once per machine so the README's
//! test command works on a fresh one: cargo-deny (licenses, bans, sources) and Debian's
//! Chromium + chromedriver (the chat page's browser test).

use std::path::Path;
use std::process::Command;

use anyhow::bail;

use crate::cmd::{cargo, run as run_command, succeeds};

const CARGO_DENY: &str = "cargo-deny@0.20.2";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

pub(crate) fn ensure_test_tools() -> anyhow::Result<()> {
    if !succeeds(&mut cargo(["deny", "--version"])) {
        println!("setup: installing {CARGO_DENY} (once per machine)");
        run_command(&mut cargo(["install", "--locked", CARGO_DENY]))?;
    }
    let custom_driver = std::env::var_os("CLAWGATE_CHROMEDRIVER").is_some();
    if !custom_driver && !Path::new(CHROMEDRIVER).exists() {
        install_chromium()?;
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
