//! The Helix cross-check with a client written by others against the real Twitch API:
//! `@twurple/api` 8.2.0 (`tests/node/twurple_check.js`) sends through the simulator's Helix via
//! twurple's own mock-server switch (`TWURPLE_MOCK_API_PORT`), validating its token first: a
//! message lands, a repeat is dropped (twurple's `ChatMessageDroppedError`, `msg_duplicate`),
//! a reply carries its parent, and a wrong token is refused.
//!
//! twurple comes from `cargo xtask setup` (`<target>/node/twurple`), or from
//! `CLAWGATE_TWURPLE_DIR` (a directory whose `node_modules` has @twurple/api and @twurple/auth).

use std::path::PathBuf;

use clawgate_channel_twitch::simulator::Via;
use serde_json::Value;

use crate::peer::{CHANNEL, Peer};

fn node_modules() -> PathBuf {
    if let Some(dir) = std::env::var_os("CLAWGATE_TWURPLE_DIR") {
        return PathBuf::from(dir).join("node_modules");
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps")
        .join("node/twurple/node_modules")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twurple_sends_through_the_simulated_helix_and_sees_drops_as_drops() {
    let modules = node_modules();
    assert!(
        modules.join("@twurple/api").exists(),
        "{} has no @twurple/api: run `cargo xtask setup` (it installs @twurple/api and \
         @twurple/auth 8.2.0 under the target directory), or point CLAWGATE_TWURPLE_DIR at a \
         directory with them in node_modules",
        modules.display()
    );
    let peer = Peer::start().await;
    let config = peer.sim.config();
    let ada = peer
        .sim
        .person_writes(CHANNEL, &peer.person, "hi all", None);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node/twurple_check.js");
    let output = tokio::process::Command::new("node")
        .arg(script)
        .env("NODE_PATH", &modules)
        .env("TWURPLE_MOCK_API_PORT", peer.sim.helix_port().to_string())
        .env("SIM_CLIENT_ID", &config.client_id)
        .env("SIM_TOKEN", &config.bot_token)
        .env("SIM_USER_ID", &config.bot_user_id)
        .env("SIM_BROADCASTER_ID", peer.sim.room_id(CHANNEL).unwrap())
        .env("SIM_PARENT_ID", &ada.id)
        .output()
        .await
        .expect("node starts (install nodejs)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let results: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or(Value::String(l.to_owned())))
        .collect();
    let by = |label: &str| {
        results
            .iter()
            .find(|r| r["label"] == label)
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "no {label:?} from twurple: {stdout}\n{}",
                    String::from_utf8_lossy(&output.stderr)
                )
            })
    };
    assert!(output.status.success(), "{stdout}");
    by("done");
    let first = by("first");
    assert_eq!(first["sent"], true, "{first}");
    let repeat = by("repeat");
    assert_eq!(repeat["dropped"], true, "{repeat}");
    assert!(
        repeat["message"]
            .as_str()
            .is_some_and(|m| m.contains("identical")),
        "{repeat}"
    );
    assert_eq!(by("reply")["sent"], true);
    let wrong = by("wrong token");
    assert!(wrong["error"].is_string(), "refused: {wrong}");

    let mine: Vec<_> = peer
        .sim
        .messages(CHANNEL)
        .into_iter()
        .filter(|m| m.sender_login == config.bot_login)
        .collect();
    let texts: Vec<&str> = mine.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["hello from twurple", "answering ada"]);
    assert_eq!(mine[0].id, first["id"].as_str().unwrap());
    assert!(mine.iter().all(|m| m.via == Via::Helix));
    assert_eq!(
        mine[1].reply_parent.as_ref().map(|p| p.0.clone()),
        Some(ada.id.clone())
    );
}
