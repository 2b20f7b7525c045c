//! The cross-check with a Zalo OA client someone else wrote: `tests/python/elizaos_zalo_check.py`
//! drives the simulator with elizaos-plugin-zalo's `ZaloClient` (token refresh with rotation,
//! the OA profile, consultation sends with the `access_token` header, an HTTP-200 failure
//! body raised as its `ApiError`); this test then reads the simulator's record of what the
//! client did. The plugin has no webhook code, so signatures are checked against the facts
//! only (the simulator's own tests).
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/elizaos-plugin-zalo`), or from `CLAWGATE_ZALO_PYTHON`.

use std::path::PathBuf;
use std::process::Command;

use clawgate_channel_zalo::simulator::ZaloSimulator;
use serde_json::Value;

use crate::peer::quick;

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_ZALO_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/elizaos-plugin-zalo/bin/python")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_party_zalo_client_refreshes_reads_the_oa_and_sends_through_the_simulator() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs elizaos-plugin-zalo into a venv \
         under the target directory), or point CLAWGATE_ZALO_PYTHON at a python with it",
        python.display()
    );
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let (open, closed) = ("8123456789012345678", "8987654321098765432");
    sim.open_window(open);
    sim.close_window(closed);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/elizaos_zalo_check.py");
    let (api, app, secret, refresh) = (
        sim.api_url(),
        sim.app_id(),
        sim.app_secret(),
        sim.authorize(),
    );
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args([&api, &app, &secret, &refresh, open, closed])
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the elizaos-plugin-zalo check failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let got: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(got["expires_in"], "90000");
    assert!(
        got["reused_refresh"].as_str().unwrap().contains("invalid"),
        "a reused refresh token is refused: {got}"
    );
    assert_eq!(got["rotated_refresh_works"], true);
    assert_eq!(got["oa_id"], sim.oa_id().as_str());
    assert_eq!(got["closed_window"], -230);
    assert_eq!(got["bad_token"], -216);
    assert_eq!(got["moved"], 2);
    // The platform's own record: one text landed, under the id the client was given.
    let landed = sim.sent(open);
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].text, "from elizaos-plugin-zalo");
    assert_eq!(got["message_id"], landed[0].msg_id.as_str());
    assert!(sim.sent(closed).is_empty());
    let refreshes: Vec<_> = sim
        .calls()
        .into_iter()
        .filter(|c| c.path == "/v4/oa/access_token")
        .collect();
    assert_eq!(refreshes.len(), 3);
    assert!(
        refreshes
            .iter()
            .all(|c| c.body["grant_type"] == "refresh_token")
    );
    assert_eq!(refreshes[0].body["app_id"], sim.app_id().as_str());
}
