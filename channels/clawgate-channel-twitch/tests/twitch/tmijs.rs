//! The cross-check with a client written by others against the real TMI: tmi.js 1.8.5
//! (`tests/node/tmi_check.js`) connects to the simulator's IRC over WebSocket, logs in, joins,
//! receives a person's message with Twitch's tags, sends (no echo from the server; a repeat
//! within 30 s is dropped with `msg_duplicate`), replies, and fails to log in with a bad token.
//!
//! tmi.js comes from `cargo xtask setup` (`<target>/node/tmijs`), or from `CLAWGATE_TMIJS_DIR`
//! (a directory whose `node_modules` has tmi.js).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_twitch::simulator::Via;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::peer::{CHANNEL, Peer};

/// `<target>/node/tmijs/node_modules`, found from this test binary (`<target>/<profile>/deps/…`).
fn node_modules() -> PathBuf {
    if let Some(dir) = std::env::var_os("CLAWGATE_TMIJS_DIR") {
        return PathBuf::from(dir).join("node_modules");
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps")
        .join("node/tmijs/node_modules")
}

struct Tmi {
    child: Child,
    stdin: ChildStdin,
    events: mpsc::UnboundedReceiver<Value>,
    seen: Vec<Value>,
}

impl Tmi {
    fn start(ws_port: u16, login: &str, token: &str) -> Tmi {
        let modules = node_modules();
        assert!(
            modules.join("tmi.js").exists(),
            "{} has no tmi.js: run `cargo xtask setup` (it installs tmi.js 1.8.5 under the target \
             directory), or point CLAWGATE_TMIJS_DIR at a directory with node_modules/tmi.js",
            modules.display()
        );
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node/tmi_check.js");
        let mut child = Command::new("node")
            .arg(script)
            .env("NODE_PATH", &modules)
            .env("SIM_WS_PORT", ws_port.to_string())
            .env("SIM_LOGIN", login)
            .env("SIM_TOKEN", token)
            .env("SIM_CHANNEL", format!("#{CHANNEL}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node starts (install nodejs)");
        let stdin = child.stdin.take().unwrap();
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
        Tmi {
            child,
            stdin,
            events,
            seen: Vec::new(),
        }
    }

    /// The first event (from now on) for which `check` holds.
    async fn expect(&mut self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let wait = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let event = self.events.recv().await?;
                self.seen.push(event.clone());
                if check(&event) {
                    return Some(event);
                }
            }
        })
        .await;
        match wait {
            Ok(Some(event)) => event,
            _ => panic!("tmi.js never showed {what}; it showed {:#?}", self.seen),
        }
    }

    async fn command(&mut self, command: Value) {
        let line = format!("{command}\n");
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn quit(mut self) {
        self.command(json!({ "quit": true })).await;
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

fn is(event: &Value, name: &str) -> bool {
    event["event"] == name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmi_js_logs_in_joins_receives_sends_and_sees_drops() {
    let peer = Peer::start().await;
    let viewer = peer.sim.person("viewer");
    let mut tmi = Tmi::start(peer.sim.irc_ws_port(), &viewer.login, &viewer.token);
    tmi.expect("the connection", |e| is(e, "connected")).await;
    tmi.expect("its own join", |e| is(e, "joined")).await;
    let room = tmi.expect("the room state", |e| is(e, "roomstate")).await;
    assert_eq!(room["roomId"], json!(peer.sim.room_id(CHANNEL).unwrap()));

    // A person writes: tmi.js gets Twitch's tags.
    let ada = peer
        .sim
        .person_writes(CHANNEL, &peer.person, "hello from ada", None);
    let got = tmi
        .expect("ada's message", |e| {
            is(e, "message") && e["message"] == "hello from ada"
        })
        .await;
    assert_eq!(got["id"], json!(ada.id));
    assert_eq!(got["login"], "ada");
    assert_eq!(got["userId"], json!(peer.person.id));
    assert_eq!(got["self"], false);
    assert!(
        got["sentTs"]
            .as_str()
            .is_some_and(|t| t.parse::<u64>().is_ok())
    );

    // tmi.js sends: it lands once, from viewer, over IRC; a repeat within 30 s is dropped.
    tmi.command(json!({ "say": "hi from tmi" })).await;
    tmi.expect("the say resolved", |e| is(e, "said")).await;
    tmi.command(json!({ "say": "hi from tmi" })).await;
    let notice = tmi
        .expect("the duplicate notice", |e| is(e, "notice"))
        .await;
    assert_eq!(notice["msgid"], "msg_duplicate", "{notice}");
    // A reply with the tag tmi.js leaves to raw lines.
    tmi.command(json!({ "raw": format!("@reply-parent-msg-id={} PRIVMSG #{CHANNEL} :answering ada", ada.id) }))
        .await;
    // Our bot sends through Helix: tmi.js sees it from the bot's login.
    let plugin = peer.plugin.clone();
    let ctx = SendContext::new(
        ChannelMessage::outbound(
            "m1",
            "twitch",
            MessageTarget::group(format!("#{CHANNEL}")),
            "bot says hi",
        ),
        "k1",
    );
    let unit = RenderedMessageUnit::new(0, MessagePartKind::Text, json!({ "text": "bot says hi" }));
    plugin
        .sender
        .send_unit(&ctx, &unit)
        .await
        .expect("the bot's send");
    let bot = tmi
        .expect("the bot's message", |e| {
            is(e, "message") && e["message"] == "bot says hi"
        })
        .await;
    assert_eq!(bot["login"], json!(peer.bot_login()));
    tmi.command(json!({ "ping": true })).await;
    tmi.expect("a PONG for tmi.js's PING", |e| is(e, "pong"))
        .await;

    let from_viewer: Vec<_> = peer
        .sim
        .messages(CHANNEL)
        .into_iter()
        .filter(|m| m.sender_login == "viewer")
        .collect();
    let texts: Vec<&str> = from_viewer.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["hi from tmi", "answering ada"]);
    assert!(from_viewer.iter().all(|m| m.via == Via::Irc));
    assert_eq!(
        from_viewer[1].reply_parent.as_ref().map(|p| p.0.clone()),
        Some(ada.id.clone())
    );
    // No server echo: the only "hi from tmi" tmi.js saw is its own local one (self = true).
    let echoes = tmi
        .seen
        .iter()
        .filter(|e| is(e, "message") && e["message"] == "hi from tmi" && e["self"] == false)
        .count();
    assert_eq!(
        echoes, 0,
        "the server echoed our own PRIVMSG: {:#?}",
        tmi.seen
    );
    tmi.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmi_js_is_refused_with_a_bad_token() {
    let peer = Peer::start().await;
    let viewer = peer.sim.person("viewer");
    let mut tmi = Tmi::start(peer.sim.irc_ws_port(), &viewer.login, "not-the-token");
    let failed = tmi.expect("the refusal", |e| is(e, "connect_failed")).await;
    assert!(
        failed["reason"]
            .as_str()
            .is_some_and(|r| r.contains("Login authentication failed")),
        "{failed}"
    );
    assert_eq!(peer.sim.connections("viewer"), 0);
}
