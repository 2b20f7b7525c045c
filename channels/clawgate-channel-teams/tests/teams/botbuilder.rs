//! The cross-check with Microsoft's own client code: Bot Builder's JWT validation
//! (`JwtTokenValidation.authenticateRequest`, the OpenID metadata pointed at the simulator's)
//! accepts every activity the simulator POSTs and refuses them for another app id or another
//! service URL; its `ConnectorClient` sends, replies in a channel thread, updates, deletes and
//! streams against the simulator, and its own throttling retry honours the simulator's 429.
//! `tests/js/botbuilder_check.js` holds Bot Builder's side; the simulator's record is judged here.
//!
//! Bot Builder fetches its own tokens through MSAL, which insists on an https authority: the
//! script asks the simulator's token endpoint with the same client-credentials form and hands
//! the token to `ConnectorClient` as `TokenCredentials`.
//!
//! The packages come from `cargo xtask setup` (pinned, under `<target>/node/botbuilder`), or
//! from `CLAWGATE_BOTBUILDER_MODULES` (a `node_modules` holding botframework-connector).

use std::path::PathBuf;
use std::process::Stdio;

use clawgate_channel_teams::simulator::{
    ConversationKind, Fault, FaultKind, Op, SimulatorConfig, StreamState, TeamsSimulator,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// `<target>/node/botbuilder/node_modules`, found from this test binary
/// (`<target>/<profile>/deps/…`).
fn modules() -> PathBuf {
    if let Some(dir) = std::env::var_os("CLAWGATE_BOTBUILDER_MODULES") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("node/botbuilder/node_modules")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bot_builder_validates_what_the_simulator_sends_and_drives_its_connector() {
    let modules = modules();
    assert!(
        modules.join("botframework-connector/package.json").exists(),
        "{} lacks botframework-connector: run `cargo xtask setup` (it installs botbuilder, \
         pinned, under the target directory), or point CLAWGATE_BOTBUILDER_MODULES at a \
         node_modules with it",
        modules.display()
    );
    let sim = TeamsSimulator::start(SimulatorConfig {
        stream_min_interval: std::time::Duration::ZERO,
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    let ada = sim.person("ada");
    let personal = sim.personal_chat(&ada);
    let channel = sim.conversation(
        ConversationKind::Channel,
        "general",
        std::slice::from_ref(&ada),
    );
    sim.person_writes(&personal, &ada, "hello bot builder", None)
        .unwrap();
    let post = sim
        .person_writes(&channel, &ada, "a post for bot builder", None)
        .unwrap();
    // Two installs and two messages.
    let expected = 4;
    sim.inject(Fault::on(Op::Send, FaultKind::RateLimited(1)).after(1));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/js/botbuilder_check.js");
    let mut child = tokio::process::Command::new("node")
        .arg(&script)
        .env("BOTBUILDER_MODULES", &modules)
        .env("SIM_APP_ID", sim.app_id())
        .env("SIM_APP_PASSWORD", sim.app_password())
        .env("SIM_SERVICE_URL", sim.service_url())
        .env("SIM_TOKEN_URL", sim.token_url())
        .env("SIM_OPENID_URL", sim.openid_url())
        .env("SIM_EXPECT", expected.to_string())
        .env("SIM_PERSONAL", &personal)
        .env("SIM_CHANNEL", &channel)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts (install Node.js 20 or later)");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut validated = Vec::new();
    let mut results = Vec::new();
    let mut done = false;
    while let Some(line) = stdout.next_line().await.unwrap() {
        if let Some(url) = line.strip_prefix("endpoint ") {
            sim.set_endpoint(Some(url));
        } else if let Some(rest) = line.strip_prefix("validated ") {
            validated.push(rest.to_owned());
        } else if let Some(json) = line.strip_prefix("result ") {
            results.push(serde_json::from_str::<Value>(json).unwrap());
        } else if line == "done" {
            done = true;
            break;
        }
    }
    let output = child.wait_with_output().await.unwrap();
    assert!(
        done && output.status.success(),
        "the Bot Builder script failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(validated.len(), expected, "{validated:?}");
    assert!(
        validated.iter().all(|v| v.ends_with(&sim.app_id())),
        "{validated:?}"
    );
    let refused = &results[0]["refused"];
    assert!(
        refused["otherApp"]
            .as_str()
            .unwrap()
            .contains("Invalid AppId"),
        "{refused}"
    );
    assert!(
        refused["moved"].as_str().unwrap().contains("ServiceUrl"),
        "{refused}"
    );
    let r = &results[1];
    assert_eq!(r["bad_token"]["status"], 401, "{r}");
    assert_eq!(r["bad_token"]["body"]["error"], "invalid_client", "{r}");
    assert_eq!(r["completed"]["status"], 403, "{r}");
    assert_eq!(r["missing"]["status"], 404, "{r}");
    assert_eq!(r["unauthenticated"]["status"], 401, "{r}");
    // The platform's own record.
    let mine = sim.bot_visible(&personal);
    let texts: Vec<&str> = mine.iter().map(|a| a.text.as_str()).collect();
    assert_eq!(
        texts,
        ["edited by bot builder", "The answer is 42."],
        "{mine:?}"
    );
    let stream = mine[1].stream.as_ref().unwrap();
    assert_eq!(stream.state, StreamState::Final);
    assert_eq!(stream.informative, ["Thinking"]);
    assert_eq!(stream.streamed, ["The answer"]);
    let deleted: Vec<_> = sim
        .activities(&personal)
        .into_iter()
        .filter(|a| a.deleted)
        .collect();
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0].text, "after a 429");
    let replies = sim.bot_visible(&channel);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].thread.as_deref(), Some(post.id.as_str()));
    assert_eq!(replies[0].reply_to_id.as_deref(), Some(post.id.as_str()));
    // Bot Builder's retry policy waited out the 429 and sent once more.
    let sends: Vec<u16> = sim
        .calls()
        .iter()
        .filter(|c| c.op == Op::Send && c.path.contains(&personal))
        .map(|c| c.status)
        .take(3)
        .collect();
    assert_eq!(sends, [201, 429, 201], "{sends:?}");
}
