//! The cross-check with the client existing integrations use against the real Zalo Web:
//! zca-js 2.2.0 (`tests/node/zca_check.cjs`) logs in to the simulator with the account's
//! cookies, IMEI and user agent (its own signkey, `zcid` key derivation and AES parameters),
//! opens its listener (the cipher key frame, its pings, AES-GCM + zlib frames), sends to a
//! person and a group (msgId answers), sees its own messages come back with their cliMsgId
//! (what settles our lost answers), reads a person's message, and is closed with 3000 when
//! another session opens. A wrong cookie fails its login.
//!
//! zca-js hard-codes the login host; the script gives it a fetch (its `polyfill` option) that
//! sends that host's requests to the simulator. Everything else comes from the login.
//!
//! zca-js comes from `cargo xtask setup` (`<target>/node/zca-js`), or from
//! `CLAWGATE_ZCAJS_DIR` (a directory whose `node_modules` has zca-js).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use clawgate_channel_zalo_personal::simulator::{SimulatorConfig, ZaloWebSimulator};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::peer::{GROUP, UA, user_for};

/// `<target>/node/zca-js/node_modules`, found from this test binary (`<target>/<profile>/deps/…`).
fn node_modules() -> PathBuf {
    if let Some(dir) = std::env::var_os("CLAWGATE_ZCAJS_DIR") {
        return PathBuf::from(dir).join("node_modules");
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps")
        .join("node/zca-js/node_modules")
}

struct Zca {
    _child: Child,
    events: mpsc::UnboundedReceiver<Value>,
    /// Everything reported so far (an echo can come before its send's answer).
    log: Vec<Value>,
}

impl Zca {
    fn start(sim: &ZaloWebSimulator, cookie: &str, person: &str) -> Zca {
        let modules = node_modules();
        assert!(
            modules.join("zca-js").exists(),
            "{} has no zca-js: run `cargo xtask setup` (it installs zca-js 2.2.0 under the target \
             directory), or point CLAWGATE_ZCAJS_DIR at a directory with node_modules/zca-js",
            modules.display()
        );
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node/zca_check.cjs");
        let mut child = Command::new("node")
            .arg(script)
            .env("NODE_PATH", &modules)
            .env("SIM_URL", sim.url())
            .env("SIM_COOKIE", cookie)
            .env("SIM_IMEI", sim.imei())
            .env("SIM_UA", UA)
            .env("SIM_PERSON", person)
            .env("SIM_GROUP", GROUP)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node starts (install nodejs)");
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let event =
                    serde_json::from_str(&line).unwrap_or(json!({ "event": "raw", "line": line }));
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
        Zca {
            _child: child,
            events,
            log: Vec::new(),
        }
    }

    /// The first event reported matching `want`, waiting for it (with a deadline).
    async fn next(&mut self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(found) = self.log.iter().find(|e| want(e)) {
            return found.clone();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("zca-js never reported {what}"))
                .unwrap_or_else(|| panic!("zca-js ended before {what}"));
            assert!(
                event["event"] != "fatal" && event["event"] != "raw",
                "zca-js failed: {event}"
            );
            self.log.push(event.clone());
            if want(&event) {
                return event;
            }
        }
    }
}

/// A simulator whose service map names a Zalo-like host (zca-js sends its zalo.me cookies
/// only there; the script's fetch maps it back to the simulator).
fn zalo_hosts() -> SimulatorConfig {
    SimulatorConfig {
        service_base: Some("https://tt-chat1-wpa.chat.zalo.me".into()),
        ..SimulatorConfig::default()
    }
}

#[tokio::test]
async fn zca_js_logs_in_sends_listens_sees_its_echoes_and_is_closed_by_a_second_session() {
    let sim = ZaloWebSimulator::start(zalo_hosts()).await.unwrap();
    let person = user_for("zca-js");
    let mut zca = Zca::start(&sim, &sim.cookie(), &person);
    let login = zca.next("its login", |e| e["event"] != "error").await;
    assert_eq!(login["event"], "logged_in", "{login}");
    zca.next("its listener", |e| e["event"] == "connected")
        .await;
    let user = zca
        .next("the user send", |e| {
            e["event"] == "sent" && e["type"] == "user"
        })
        .await;
    let group = zca
        .next("the group send", |e| {
            e["event"] == "sent" && e["type"] == "group"
        })
        .await;
    let landed = sim.landed();
    assert_eq!(landed.len(), 2, "{landed:?}");
    assert_eq!(
        (
            landed[0].group,
            landed[0].thread.as_str(),
            landed[0].text.as_str()
        ),
        (false, person.as_str(), "hello from zca-js")
    );
    assert_eq!(
        (
            landed[1].group,
            landed[1].thread.as_str(),
            landed[1].text.as_str()
        ),
        (true, GROUP, "group hello from zca-js")
    );
    assert_eq!(user["msgId"], landed[0].msg_id.as_str());
    assert_eq!(group["msgId"], landed[1].msg_id.as_str());
    // Its own messages come back on the listener with the clientId it sent as cliMsgId.
    for (m, kind, thread) in [
        (&landed[0], "user", &person),
        (&landed[1], "group", &GROUP.to_owned()),
    ] {
        let echo = zca
            .next("an echo", |e| {
                e["event"] == "message" && e["msgId"] == m.msg_id.as_str()
            })
            .await;
        assert_eq!(echo["self"], true, "{echo}");
        assert_eq!(echo["type"], kind);
        assert_eq!(echo["threadId"], thread.as_str());
        assert_eq!(echo["cliMsgId"], m.cli_msg_id.as_str());
        assert_eq!(
            echo["uidFrom"],
            sim.uid(),
            "zca-js puts its own uid in for \"0\""
        );
    }
    // A person's message.
    let msg_id = sim.person_writes(&person, "chào zca-js");
    let heard = zca
        .next("the person's message", |e| {
            e["event"] == "message" && e["msgId"] == msg_id.as_str()
        })
        .await;
    assert_eq!(heard["self"], false);
    assert_eq!(heard["threadId"], person.as_str());
    assert_eq!(heard["content"], "chào zca-js");
    // Its pings arrive at the server's interval (1 s here).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sim.socket_stats().pings == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "zca-js never pinged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another session opens its listener: zca-js is closed with 3000 and does not come back.
    sim.kick();
    let closed = zca.next("its close", |e| e["event"] == "closed").await;
    assert_eq!(closed["code"], 3000, "{closed}");
    assert_eq!(sim.socket_stats().opened, 1);
    sim.stop();
}

#[tokio::test]
async fn zca_js_cannot_log_in_with_a_cookie_of_no_session() {
    let sim = ZaloWebSimulator::start(zalo_hosts()).await.unwrap();
    let mut zca = Zca::start(&sim, "zpw_sek=logged-out", &user_for("nobody"));
    let event = zca.next("its login", |_| true).await;
    assert_eq!(event["event"], "login_failed", "{event}");
    assert_eq!(sim.socket_stats().logins, 0);
    sim.stop();
}
