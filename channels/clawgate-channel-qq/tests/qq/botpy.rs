//! The cross-check with the QQ client Tencent wrote: `tests/python/botpy_check.py` drives the
//! simulator with qq-botpy (botpy 1.2.1, tencent-connect/botpy): its token fetch, a passive C2C
//! reply, the same `(msg_id, msg_seq)` again (which QQ refuses with 40054005 and botpy raises),
//! a second reply under the next `msg_seq`, an image uploaded by URL and sent as `msg_type 7`,
//! a group reply, and a wrong secret; this test then reads the simulator's record of what the
//! client did. botpy has no HTTP-callback code (it uses the WebSocket gateway), so callback
//! signatures are checked against the vector of Tencent's Go SDK instead (`signature` tests).
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/qq-botpy`), or from `CLAWGATE_QQ_BOTPY_PYTHON`.

use std::path::PathBuf;
use std::process::Command;

use clawgate_channel_qq::simulator::{QqSimulator, SimChat};
use serde_json::Value;

use crate::peer::quick;

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_QQ_BOTPY_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/qq-botpy/bin/python")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tencents_botpy_fetches_a_token_replies_and_meets_the_40054005_repeat_on_the_simulator() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs qq-botpy into a venv under the \
         target directory), or point CLAWGATE_QQ_BOTPY_PYTHON at a python with qq-botpy",
        python.display()
    );
    let sim = QqSimulator::start(quick()).await.unwrap();
    let (user, group, member) = ("E4F4AEA33253A2797FB897C50B81D7ED", "G9F2C61A", "M77");
    let msg_id = sim.person_writes(user, "你好 botpy");
    let group_msg = sim.member_writes(group, member, "hi all");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/botpy_check.py");
    let args = [
        sim.api_url(),
        sim.app_id(),
        sim.secret(),
        user.to_owned(),
        msg_id.clone(),
        group.to_owned(),
        group_msg.clone(),
    ];
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args(args)
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the qq-botpy check failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let got: Value = serde_json::from_slice(&output.stdout).unwrap();
    // botpy read `expires_in` (a string) and sent `QQBot <token>` with its app id.
    let left = got["token_left"].as_i64().unwrap();
    assert!((7_100..=7_200).contains(&left), "{got}");
    assert_eq!(got["auth_scheme"], "QQBot");
    assert_eq!(got["union_appid"], sim.app_id().as_str());
    assert_eq!(
        got["repeat"], "ServerError: 消息被去重，请检查请求msgseq",
        "botpy raises the dedupe answer: {got}"
    );
    assert!(
        got["wrong_secret"].as_str().unwrap().contains("100016"),
        "{got}"
    );
    // The platform's own record: three replies to the person under seqs 1, 2, 3 (the repeat
    // left nothing), one to the group.
    let landed = sim.messages(&SimChat::User(user.to_owned()));
    let shape: Vec<_> = landed
        .iter()
        .map(|m| (m.id.clone(), m.msg_type, m.msg_seq, m.reply_to.clone()))
        .collect();
    let to = Some(msg_id.clone());
    assert_eq!(
        shape,
        vec![
            (
                got["id"].as_str().unwrap().to_owned(),
                0,
                Some(1),
                to.clone()
            ),
            (
                got["second_id"].as_str().unwrap().to_owned(),
                0,
                Some(2),
                to.clone()
            ),
            (
                got["picture_id"].as_str().unwrap().to_owned(),
                7,
                Some(3),
                to.clone()
            ),
        ]
    );
    assert_eq!(
        landed[2].media,
        Some((1, "https://img.example/botpy.png".to_owned()))
    );
    let groups = sim.messages(&SimChat::Group(group.to_owned()));
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].reply_to.as_deref(), Some(group_msg.as_str()));
    let dedupes = sim
        .calls()
        .into_iter()
        .filter(|c| c.code == 40_054_005)
        .count();
    assert_eq!(dedupes, 1);
}
