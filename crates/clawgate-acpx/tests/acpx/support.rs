use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clawgate_acpx::{ControllerConfig, LifecycleController, ProcessTable, Timing};
use clawgate_store::SessionRow;
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::{LeaseId, SessionKey};

pub(crate) type Controller = LifecycleController;

pub(crate) fn key(text: &str) -> SessionKey {
    SessionKey::parse(text).unwrap()
}

pub(crate) fn store(dir: &Path) -> Arc<SqliteStore> {
    Arc::new(clawgate_store_sqlite::testing::open_store(dir))
}

pub(crate) fn fast_timing() -> Timing {
    Timing {
        grace: Duration::from_millis(40),
        kill_wait: Duration::from_millis(40),
        poll: Duration::from_millis(1),
    }
}

pub(crate) async fn controller(
    store: Arc<dyn clawgate_store::Store>,
    table: Arc<dyn ProcessTable>,
    wrapper: &Path,
    timing: Timing,
) -> Controller {
    let mut config = ControllerConfig::new(wrapper.to_path_buf());
    config.timing = timing;
    LifecycleController::new(store, table, config)
        .await
        .unwrap()
}

pub(crate) fn session_row(key: &SessionKey, lease: Option<LeaseId>) -> SessionRow {
    SessionRow {
        session_key: key.clone(),
        agent_id: "codex".into(),
        owner_session_key: None,
        spawned_by: None,
        parent_session_key: None,
        label: None,
        acp_owner: None,
        lease_id: lease,
        acp_session_id: None,
        created_at: 1,
        updated_at: 1,
        reset_at: None,
        deleted_at: None,
    }
}

/// Polls `check` until it holds or `within` passes (tests never sleep to wait).
pub(crate) async fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The directory cargo put this crate's binaries in (the wrapper root of the real tests).
pub(crate) fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_clawgate-acp-test-agent"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub(crate) fn test_agent() -> String {
    env!("CARGO_BIN_EXE_clawgate-acp-test-agent").to_owned()
}

/// The wrapper binary, built once per test run into the same target directory. It lives in
/// another package (the layering forbids a dependency on it), so cargo does not build it for
/// these tests by itself.
pub(crate) fn wrapper_bin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Ok(path) = std::env::var("CLAWGATE_TEST_WRAPPER") {
                return PathBuf::from(path);
            }
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["build", "--quiet", "-p", "clawgate-acpx-wrapper"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo to build clawgate-acpx-wrapper");
            assert!(status.success(), "building clawgate-acpx-wrapper failed");
            let path = bin_dir().join("clawgate-acpx-wrapper");
            assert!(path.exists(), "{} missing after the build", path.display());
            path
        })
        .clone()
}
