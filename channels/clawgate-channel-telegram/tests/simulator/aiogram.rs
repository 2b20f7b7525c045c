//! The cross-check with a client written by others against the real Bot API: aiogram 3 runs
//! `tests/python/aiogram_check.py` against the simulator; the script's assertions are this test's.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/aiogram`), or from `CLAWGATE_AIOGRAM_PYTHON` (a python with aiogram 3).

use std::path::PathBuf;
use std::process::Command;

use crate::{Harness, alice};

/// `<target>/python/aiogram/bin/python`, found from this test binary (`<target>/<profile>/deps/…`).
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_AIOGRAM_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/aiogram/bin/python")
}

#[tokio::test]
async fn aiogram_drives_the_simulator() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs aiogram into a venv under the target \
         directory; `cargo xtask ci` does it too), or point CLAWGATE_AIOGRAM_PYTHON at a python \
         with aiogram 3",
        python.display()
    );
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/aiogram_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_BASE_URL", h.sim.base_url())
        .env("SIM_TOKEN", h.sim.token())
        .env("SIM_BOT_ID", h.sim.bot_user_id().to_string())
        .env("SIM_CHAT_ID", chat.to_string())
        .env("SIM_USER_ID", alice().id.to_string());
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the aiogram script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // What aiogram did is in the record: hello (edited), the reply deleted, the user's message.
    let messages = h.sim.messages(chat);
    let texts: Vec<(bool, Option<String>, u32)> = messages
        .iter()
        .map(|m| (m.from_bot_self, m.text.clone(), m.edit_count))
        .collect();
    assert_eq!(
        texts,
        [
            (true, Some("Hello again".to_owned()), 1),
            (false, Some("from a user".to_owned()), 0)
        ]
    );
    let refused: Vec<(String, u16)> = h
        .sim
        .log()
        .into_iter()
        .filter(|r| r.status != 200)
        .map(|r| (r.method, r.status))
        .collect();
    assert_eq!(
        refused,
        [
            ("editMessageText".to_owned(), 400),
            ("sendMessage".to_owned(), 429),
            ("getUpdates".to_owned(), 409)
        ]
    );
    h.sim.stop().await;
}
