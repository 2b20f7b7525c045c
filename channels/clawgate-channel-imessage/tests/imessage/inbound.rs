//! The webhook listener as BlueBubbles posts to it: the URL's token checked before anything
//! else (401, nothing parsed, nothing handed on), people's messages handed on with their guid
//! as the event id, our own and other own-account messages and non-message events dropped,
//! and a second copy of an event deduplicated by the engine.

use std::time::Duration;

use clawgate_channel_imessage::simulator::SimulatorConfig;
use clawgate_channel_sdk::prelude::*;
use serde_json::json;

use crate::echoes::Run;
use crate::peer::{TOKEN, quick};

async fn post(url: &str, body: &str) -> u16 {
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_without_the_right_token_is_refused_before_it_is_read() {
    let sim = clawgate_channel_imessage::simulator::BlueBubblesSimulator::start(quick())
        .await
        .unwrap();
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let state = tempfile::tempdir().unwrap();
    let run = Run::open(&sim, state.path(), port, json!({})).await;
    let chat = sim.dm("+15550005555");
    let guid = sim.person_writes(&chat, "+15550005555", "forged?");
    let event =
        json!({ "type": "new-message", "data": sim.serialized(&guid).unwrap() }).to_string();
    let base = format!("http://127.0.0.1:{port}/bluebubbles/webhook");
    for url in [
        base.clone(),
        format!("{base}?token="),
        format!("{base}?token=webhook-token-0123456789abcde"),
        format!("{base}?token={TOKEN}x"),
        format!("{base}?password={TOKEN}"),
    ] {
        assert_eq!(post(&url, &event).await, 401, "{url}");
        // Not even parsed: garbage without the token is 401, not 400.
        assert_eq!(post(&url, "{not json").await, 401, "{url}");
    }
    assert_eq!(run.account().counts.refused(), 10);
    assert!(run.sink.texts().is_empty(), "nothing handed on");
    // With the token: parsed (400 for garbage), and the event handed on.
    let good = format!("{base}?token={TOKEN}");
    assert_eq!(post(&good, "{not json").await, 400);
    assert_eq!(post(&good, &event).await, 200);
    assert_eq!(run.sink.texts(), vec!["forged?"]);
    run.crash().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_do_not_say_why_and_an_event_over_the_limit_gets_413_unread() {
    let sim = clawgate_channel_imessage::simulator::BlueBubblesSimulator::start(quick())
        .await
        .unwrap();
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let state = tempfile::tempdir().unwrap();
    let run = Run::open(&sim, state.path(), port, json!({})).await;
    let chat = sim.dm("+15550007777");
    let guid = sim.person_writes(&chat, "+15550007777", "hello");
    let event =
        json!({ "type": "new-message", "data": sim.serialized(&guid).unwrap() }).to_string();
    let base = format!("http://127.0.0.1:{port}/bluebubbles/webhook");
    let answer = |url: String| {
        let event = event.clone();
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .body(event)
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    // Two different failures: no token, and a wrong one.
    let missing = answer(base.clone()).await;
    let wrong = answer(format!("{base}?token={TOKEN}x")).await;
    assert_eq!(missing, wrong);
    assert_eq!(missing, (401, "unauthorized".to_owned()));
    // A person's message over the limit, with the right token: refused for its size, never
    // handed on.
    let mut data = sim.serialized(&guid).unwrap();
    data["text"] = json!("a".repeat(clawgate_channel_imessage::MAX_BODY_BYTES));
    let big = json!({ "type": "new-message", "data": data }).to_string();
    let headers = [("content-type", "application/json".to_owned())];
    let url = format!("{base}?token={TOKEN}");
    assert_eq!(raw_post(&url, &headers, big.as_bytes()).await, 413);
    assert!(run.sink.texts().is_empty(), "nothing reached the engine");
    run.crash().await;
}

/// The status of the answer to `body` posted to `url` over a bare connection, read while the
/// body is still being written: the listener answers a body over its limit before reading it
/// and closes, which an HTTP client reports as a failed send. The sending side stays open
/// until the answer is read (a server may drop a request whose client hung up).
async fn raw_post(url: &str, headers: &[(&str, String)], body: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (authority, path) = url.trim_start_matches("http://").split_once('/').unwrap();
    let stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let mut head = format!(
        "POST /{path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let body = body.to_vec();
    let writer = tokio::spawn(async move {
        if write.write_all(head.as_bytes()).await.is_ok() {
            let _ = write.write_all(&body).await;
        }
        write
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), read.read_to_end(&mut answer)).await;
    writer.abort();
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_new_messages_from_people_are_handed_on() {
    let sim = clawgate_channel_imessage::simulator::BlueBubblesSimulator::start(SimulatorConfig {
        echo_delay: Duration::from_millis(10),
        ..quick()
    })
    .await
    .unwrap();
    let port = clawgate_conformance::ports::reserve_loopback_port();
    sim.set_webhook(Some(&format!(
        "http://127.0.0.1:{port}/bluebubbles/webhook?token={TOKEN}"
    )));
    let state = tempfile::tempdir().unwrap();
    let run = Run::open(&sim, state.path(), port, json!({})).await;
    let chat = sim.dm("+15550006666");
    let group = sim.group("family", &["+15550006666", "+15550006667"]);
    sim.person_writes(&chat, "+15550006666", "in the DM");
    sim.person_writes(&group, "+15550006667", "in the group");
    // Typed on the bot's Mac: isFromMe, not ours, not answered in the default mode.
    sim.own_device_writes(&chat, "typed on the Mac");
    // An edit of a message: `updated-message`, dropped.
    let sent = run
        .plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound("k", "imessage", MessageTarget::direct(&chat), ""),
                "k",
            ),
            &RenderedMessageUnit::text(0, "ours"),
        )
        .await
        .unwrap();
    run.plugin
        .sender
        .edit(
            &SendContext::new(
                ChannelMessage::outbound("k", "imessage", MessageTarget::direct(&chat), ""),
                "k",
            ),
            &sent,
            &RenderedMessageUnit::text(0, "ours, edited"),
        )
        .await
        .unwrap();
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    // Two chats: their webhooks race each other, so only the set is fixed, not the order.
    let mut texts = run.sink.texts();
    texts.sort();
    assert_eq!(texts, vec!["in the DM", "in the group"]);
    let counts = &run.account().counts;
    assert_eq!((counts.echoes(), counts.own()), (1, 1));
    assert!(
        sim.deliveries().iter().all(|d| d.status == 200),
        "{:?}",
        sim.deliveries()
    );
    // What the engine gets normalizes to the chat and the handle; the group is a group.
    let receiver = run.plugin.receiver.clone().unwrap();
    let group_event = json!({ "type": "new-message", "data": sim.serialized(&sim.person_writes(&group, "+15550006667", "again")).unwrap() });
    let inbound = receiver.normalize(&group_event).unwrap();
    assert_eq!(inbound.message.target, MessageTarget::group(&group));
    assert_eq!(inbound.message.sender.unwrap().id, "+15550006667");
    assert_eq!(
        receiver.normalize(&group_event).unwrap().event_id,
        inbound.event_id
    );
    run.crash().await;
}
