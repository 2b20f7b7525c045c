//! The cross-check with pysignalclijsonrpc (a client written against the real signal-cli
//! daemon): `tests/python/pysignalclijsonrpc_check.py` drives the simulator's HTTP endpoint
//! with it; the script's assertions are this test's, and this test then reads the simulator's
//! record of what the client sent.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/pysignalclijsonrpc`), or from `CLAWGATE_PYSIGNALCLIJSONRPC_PYTHON`.

use std::path::PathBuf;
use std::process::Command;

use clawgate_channel_signal::simulator::{SignalSimulator, SimulatorConfig};
use serde_json::Value;

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_PYSIGNALCLIJSONRPC_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/pysignalclijsonrpc/bin/python")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pysignalclijsonrpc_sends_through_the_http_endpoint() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs pysignalclijsonrpc into a venv \
         under the target directory), or point CLAWGATE_PYSIGNALCLIJSONRPC_PYTHON at a python \
         with pysignalclijsonrpc",
        python.display()
    );
    let sim = SignalSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let (person, untrusted, group) = ("+4915112345678", "+4915199999999", "R3JvdXBYWVo=");
    sim.create_group(group, "Team", &[person, untrusted]);
    // Their safety number changed: the group send reaches only `person`, a 1:1 send fails.
    sim.untrust(untrusted);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/pysignalclijsonrpc_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_RPC_URL", sim.rpc_url())
        .env("SIM_ACCOUNT", sim.account())
        .env("SIM_PERSON", person)
        .env("SIM_GROUP", group)
        .env("SIM_UNTRUSTED", untrusted);
    let output = tokio::task::spawn_blocking(move || command.output().expect("the python runs"))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the pysignalclijsonrpc check failed:\n{stderr}"
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["version"], "0.14.6");
    let landed = sim.landed();
    assert_eq!(landed.len(), 2, "{landed:?}");
    assert_eq!(landed[0].recipient.as_deref(), Some(person));
    assert_eq!(landed[0].body, "hello from pysignalclijsonrpc");
    assert_eq!(seen["direct"].as_u64(), Some(landed[0].timestamp));
    assert_eq!(landed[1].group_id.as_deref(), Some(group));
    assert_eq!(landed[1].delivered_to, vec![person.to_owned()]);
    assert!(
        seen["untrusted_error"]
            .as_str()
            .unwrap()
            .contains(untrusted),
        "{seen}"
    );
    assert_eq!(seen["group"].as_u64(), Some(landed[1].timestamp));
}
