//! The cross-check with Tlon's own Eyre client: `@urbit/http-api` 3.0.0 (with `@urbit/aura`
//! 3.0.0 for ids; `tests/node/urbit_check.js`) opens a channel on the simulated ship, pokes
//! `hood` to open its airlock, subscribes to the `chat` agent over SSE, receives a DM, sends
//! one (its poke's `ok` read off the event stream), sees a refused poke's `err` reach its
//! `onError`, and scries a writ and a missing one.
//!
//! The library's own `connect()` treats any 2xx login answer as a failure ("Login failed with
//! status 204"), while Eyre answers a good login with 204: the script records that and logs in
//! with `fetch`, handing the cookie to the client, as a browser's cookie jar would.
//!
//! The packages come from `cargo xtask setup` (`<target>/node/urbit-http-api`), or from
//! `CLAWGATE_URBIT_HTTP_API_MODULES` (a `node_modules` with both).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use clawgate_channel_tlon::aura;
use clawgate_channel_tlon::simulator::{Fault, Ship};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::peer::config;

/// `<target>/node/urbit-http-api/node_modules`, found from this test binary
/// (`<target>/<profile>/deps/…`).
fn node_modules() -> PathBuf {
    if let Some(dir) = std::env::var_os("CLAWGATE_URBIT_HTTP_API_MODULES") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps")
        .join("node/urbit-http-api/node_modules")
}

struct Client {
    _child: Child,
    stdin: ChildStdin,
    events: mpsc::UnboundedReceiver<Value>,
    seen: Vec<Value>,
}

impl Client {
    fn start(ship: &Ship) -> Client {
        let modules = node_modules();
        assert!(
            modules.join("@urbit/http-api").exists() && modules.join("@urbit/aura").exists(),
            "{} has no @urbit/http-api and @urbit/aura: run `cargo xtask setup` (it installs \
             @urbit/http-api 3.0.0 and @urbit/aura 3.0.0 under the target directory), or point \
             CLAWGATE_URBIT_HTTP_API_MODULES at a node_modules with both",
            modules.display()
        );
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node/urbit_check.js");
        let mut child = Command::new("node")
            .arg(script)
            .env("NODE_PATH", &modules)
            .env("SHIP_URL", ship.url())
            .env("SHIP_CODE", ship.code())
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
        Client {
            _child: child,
            stdin,
            events,
            seen: Vec::new(),
        }
    }

    /// The first event named `name` from now on.
    async fn expect(&mut self, name: &str) -> Value {
        let wait = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let event = self.events.recv().await?;
                self.seen.push(event.clone());
                if event["event"] == name {
                    return Some(event);
                }
            }
        })
        .await;
        match wait {
            Ok(Some(event)) => event,
            _ => panic!(
                "@urbit/http-api never showed {name}; it showed {:#?}",
                self.seen
            ),
        }
    }

    async fn command(&mut self, command: Value) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urbit_http_api_pokes_subscribes_and_scries_the_simulated_ship() {
    let ship = Ship::start(config()).await.unwrap();
    let mut client = Client::start(&ship);
    let connect = client.expect("connect").await;
    assert_eq!(connect["ok"], false);
    assert_eq!(connect["error"], "Login failed with status 204");
    let login = client.expect("login").await;
    assert_eq!(login["status"], 204);
    assert_eq!(login["cookie"], "urbauth-~zod");
    client.expect("open").await;
    client.expect("subscribed").await;
    // A DM from ~nec reaches the library's subscription as a diff.
    let writ = ship.dm_from("~nec", "hello from nec");
    let fact = client.expect("fact").await;
    assert_eq!(fact["json"]["whom"], "~nec");
    assert_eq!(fact["json"]["id"], writ.as_str());
    assert_eq!(
        fact["json"]["response"]["add"]["essay"]["content"],
        json!([{ "inline": ["hello from nec"] }])
    );
    // A DM sent by the library: its poke's `ok` came on the stream; the id aura made is ours.
    let sent = 1_700_000_000_123_u64;
    client
        .command(json!({ "dm": { "to": "~nec", "text": "hi from http-api", "sent": sent } }))
        .await;
    let poked = client.expect("poked").await;
    assert_eq!(poked["ok"], true, "{poked}");
    let id = format!("~zod/{}", aura::format_ud(aura::da_from_unix_ms(sent)));
    assert_eq!(poked["id"], id.as_str());
    assert_eq!(ship.our_dm_texts("~nec"), vec!["hi from http-api"]);
    // A refused poke: the `err` event reaches onError.
    ship.inject(0, Fault::Nack("%chat: refused for the test".into()));
    client
        .command(json!({ "dm": { "to": "~nec", "text": "refused", "sent": sent + 1 } }))
        .await;
    let refused = client.expect("poked").await;
    assert_eq!(refused["ok"], false);
    assert_eq!(refused["err"], "%chat: refused for the test");
    assert_eq!(ship.our_dm_texts("~nec"), vec!["hi from http-api"]);
    // Scries: the writ by its id, and a missing one (404).
    let (author, ud) = id.split_once('/').unwrap();
    client
        .command(json!({ "scry": { "app": "chat", "path": format!("/dm/~nec/writs/writ/id/{author}/{ud}") } }))
        .await;
    let scried = client.expect("scried").await;
    assert_eq!(scried["value"]["seal"]["id"], id.as_str());
    assert_eq!(scried["value"]["essay"]["sent"], sent);
    client
        .command(json!({ "scry": { "app": "chat", "path": "/dm/~nec/writs/writ/id/~zod/1.000" } }))
        .await;
    assert_eq!(client.expect("scried").await["status"], 404);
    assert!(
        !client
            .seen
            .iter()
            .any(|e| e["event"] == "unhandled" || e["event"] == "fatal"),
        "{:#?}",
        client.seen
    );
    client.command(json!({ "quit": true })).await;
}
