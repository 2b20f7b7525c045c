//! The workspace the benches run in and the release binaries the process benches start (the
//! ACPX wrapper, the gateway), built by cargo before each run so the figures are of the current
//! source.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The workspace root: the parent of this package's directory.
pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benchmarks/ lives inside the workspace root")
        .to_path_buf()
}

/// Builds `package` with `cargo build --release` and returns its binary `name`, found beside
/// this benchmark binary: the cargo that ran us (`$CARGO`, with our environment, so the same
/// target directory) puts release binaries in the same directory.
pub(crate) fn binary(package: &str, name: &str) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let args = ["build", "--release", "--quiet", "--package", package];
    let line = format!("cargo {}", args.join(" "));
    let status = Command::new(cargo)
        .args(args)
        .current_dir(project_root())
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    let exe = std::env::current_exe().context("could not find the running benchmark binary")?;
    let path = exe
        .parent()
        .context("the benchmark binary has no directory")?
        .join(name);
    if !path.is_file() {
        bail!(
            "`{line}` built no {}: run the benches through `cargo xtask bench <suite>` or \
             `cargo run --release -p clawgate-benchmarks -- <suite>`, which build into the same \
             directory",
            path.display()
        );
    }
    Ok(path)
}
