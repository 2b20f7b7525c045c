//! The cross-check with mattermostdriver: `tests/python/mattermostdriver_check.py` drives REST
//! and the WebSocket as a person (create with `pending_post_id`, threads, refusals, patch,
//! `since`, delete, the challenge and `hello`); the script's assertions are this test's.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/mattermostdriver`), or from `CLAWGATE_MATTERMOSTDRIVER_PYTHON`.

use std::path::PathBuf;
use std::process::Command;

use clawgate_channel_mattermost::simulator::{MattermostSimulator, SimulatorConfig};

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_MATTERMOSTDRIVER_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/mattermostdriver/bin/python")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mattermostdriver_drives_rest_and_the_websocket() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs mattermostdriver into a venv under \
         the target directory), or point CLAWGATE_MATTERMOSTDRIVER_PYTHON at a python with \
         mattermostdriver",
        python.display()
    );
    let sim = MattermostSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let person = sim.add_person("ada");
    let bot = sim.add_bot("clawgate");
    let channel = sim.add_channel("town-square", &[&person, &bot]);
    let other = sim.add_channel("elsewhere", &[&bot]);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/mattermostdriver_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_PORT", sim.port().to_string())
        .env("SIM_TOKEN", &person.token)
        .env("SIM_CHANNEL", &channel)
        .env("SIM_OTHER", &other);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the mattermostdriver script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // What the driver did is in the record: one post for the repeated pending_post_id (edited),
    // the reply deleted, the socket's post.
    let visible: Vec<String> = sim
        .visible(&channel)
        .into_iter()
        .map(|p| p.message)
        .collect();
    assert_eq!(visible, ["edited by mattermostdriver", "over the socket"]);
    assert_eq!(
        sim.posts(&channel).len(),
        3,
        "the deleted reply stays in the record"
    );
    assert!(sim.posts(&other).is_empty());
}
