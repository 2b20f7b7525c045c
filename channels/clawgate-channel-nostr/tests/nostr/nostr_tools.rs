//! The cross-check with a client written by others: npm's nostr-tools (pinned; `cargo xtask
//! setup` installs it under the target directory, `<target>/node/nostr-tools`) opens the gift
//! wrap the channel published and wraps a DM back, which the relay serves to the channel's feed.
//! The script (`tests/js/nostr_tools_check.mjs`) speaks through stdin and stdout; the relay
//! traffic stays on this side (Node 20 has no WebSocket client of its own).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use nostr_sdk::{Event, Filter, JsonUtil, Kind};
use serde_json::{Value, json};

use crate::peer::Peer;

/// `<target>/node/nostr-tools`, found from this test binary (`<target>/<profile>/deps/…`).
fn tool_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .skip(1)
        .map(|dir| dir.join("node/nostr-tools"))
        .find(|dir| dir.join("node_modules/nostr-tools/package.json").exists())
        .unwrap_or_else(|| {
            panic!(
                "nostr-tools is missing: run `cargo xtask setup` (it installs nostr-tools 2.25.2 \
                 with npm under the target directory, <target>/node/nostr-tools)"
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nostr_tools_opens_our_gift_wrap_and_its_dm_reaches_the_channel() {
    let dir = tool_dir();
    // ESM resolves packages from the script's own directory.
    let script = dir.join("nostr_tools_check.mjs");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/js/nostr_tools_check.mjs"
        ),
        &script,
    )
    .unwrap();
    let peer = Peer::start().await;
    let adapter = peer.sender();
    let msg = ChannelMessage::outbound(
        "x1",
        "nostr",
        MessageTarget::direct(peer.person.id()),
        "grüße from clawgate",
    );
    let batch = adapter
        .render()
        .unwrap()
        .render(&msg, adapter.capabilities(), "cross-1")
        .unwrap();
    let part = adapter
        .send_unit(&SendContext::new(msg, "cross-1"), &batch.units[0])
        .await
        .unwrap();
    let wraps = peer
        .relay
        .stored(
            Filter::new()
                .kind(Kind::GiftWrap)
                .pubkey(peer.person.keys.public_key()),
        )
        .await;
    assert_eq!(wraps.len(), 1);
    assert_eq!(wraps[0].id.to_hex(), part.platform_message_id);
    let input = json!({
        "person_sk": peer.person.keys.secret_key().to_secret_hex(),
        "channel_pk": peer.keys.public_key().to_hex(),
        "wrap": serde_json::from_str::<Value>(&wraps[0].as_json()).unwrap(),
        "reply": "answer from nostr-tools",
    });
    let mut child = Command::new("node")
        .arg(&script)
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs (cargo xtask setup needs it for nostr-tools)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let opened = &answer["opened"];
    assert_eq!(opened["content"], "grüße from clawgate");
    assert_eq!(opened["kind"], 14);
    assert_eq!(opened["pubkey"], peer.keys.public_key().to_hex());
    assert_eq!(opened["tags"][0][1], peer.person.id());

    // nostr-tools' wrap, published to the relay, reaches the channel's feed and normalizes.
    let dm = Event::from_json(answer["dm"].to_string()).unwrap();
    let (sink, mut events) = crate::inbound::Sink::new();
    let InboundSource::Pushed(feed) = peer.plugin.source.clone() else {
        panic!("pushed source");
    };
    let sink = Arc::new(sink);
    let running = {
        let sink = sink.clone();
        tokio::spawn(async move { feed.run(sink).await })
    };
    peer.person.publish(&dm).await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    let normalized = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let raw = events.recv().await.unwrap();
            if let Ok(n) = receiver.normalize(&raw) {
                return n;
            }
        }
    })
    .await
    .expect("the DM from nostr-tools reaches the feed");
    assert_eq!(
        normalized.message.body.map(|b| b.text).as_deref(),
        Some("answer from nostr-tools")
    );
    assert_eq!(normalized.message.target.id, peer.person.id());
    sink.stop.send_replace(true);
    running.await.unwrap().unwrap();
}
