//! IRCv3 against a real InspIRCd 3: capability negotiation, labeled sends whose receipt is the
//! server's echo (its `msgid`, as a second client sees the line land), our echoes never
//! answered, and PING receipts when the server grants none of it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_sdk::SideEffect;
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::clock::SystemClock;
use serde_json::json;
use tokio::sync::watch;

use crate::behaviour::Collect;
use crate::peer::{CHANNEL, NICK, build, link, settings};
use clawgate_channel_irc::register::WANTED_CAPS;
use clawgate_channel_irc::testing::{Client, Inspircd, Ircv3};

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A server, a person who reads message tags in the channel, and the channel, registered.
async fn setup(ircv3: Ircv3) -> (Inspircd, Client, ChannelPlugin) {
    let server = Inspircd::start(ircv3);
    // Only a server with the IRCv3 modules offers message-tags.
    let caps: &[&str] = match ircv3 {
        Ircv3::On | Ircv3::EchoOnly => &["message-tags"],
        Ircv3::Off => &[],
    };
    let person = Client::connect_with_caps(server.port, "ada", caps);
    person.join(CHANNEL);
    let plugin = build(settings(server.port, json!({}))).await;
    let (nick, _) = link(&plugin)
        .wait_up(Duration::from_secs(20))
        .await
        .expect("the channel registers");
    let head = format!(":{nick}!");
    block(|| person.wait_for(0, |l| l.contains(&head) && l.contains(" JOIN ")));
    (server, person, plugin)
}

fn context(plugin: &ChannelPlugin, id: &str) -> SendContext {
    let message = ChannelMessage::outbound(id, plugin.name(), MessageTarget::group(CHANNEL), "");
    SendContext::new(message, format!("test:{id}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspircd_grants_the_ircv3_caps_and_a_send_s_receipt_is_its_echo_msgid() {
    let (_server, person, plugin) = setup(Ircv3::On).await;
    let mut caps = link(&plugin).capabilities();
    caps.sort();
    let mut wanted: Vec<String> = WANTED_CAPS.iter().map(|c| (*c).to_owned()).collect();
    wanted.sort();
    assert_eq!(caps, wanted, "every capability asked for is granted");

    let receipt = plugin
        .sender
        .send_unit(
            &context(&plugin, "one"),
            &RenderedMessageUnit::text(0, "hello over IRCv3"),
        )
        .await
        .expect("sent");
    block(|| person.sync());
    let landed = person.tagged_texts_from(NICK, CHANNEL);
    assert_eq!(landed.len(), 1, "{landed:?}");
    let (msgid, text) = &landed[0];
    assert_eq!(text, "hello over IRCv3");
    assert_eq!(
        msgid.as_deref(),
        Some(receipt.platform_message_id.as_str()),
        "the receipt is the msgid the server gave the line, as others see it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_line_final_gets_one_labeled_echo_and_msgid_per_line() {
    let (_server, person, plugin) = setup(Ircv3::On).await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let messenger = Messenger::new(
        store,
        vec![plugin.sender.clone()],
        RetryPolicy::default(),
        Arc::new(SystemClock),
        "irc-tests",
    );
    let text = "first line\nsecond line\n\nthird line";
    let message =
        ChannelMessage::outbound("multi", plugin.name(), MessageTarget::group(CHANNEL), text);
    let report = messenger
        .send(message, SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("sent: {report:?}");
    };
    block(|| person.sync());
    let landed = person.tagged_texts_from(NICK, CHANNEL);
    let texts: Vec<&str> = landed.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, vec!["first line", "second line", "third line"]);
    let ids: Vec<&str> = receipt
        .parts
        .iter()
        .map(|p| p.platform_message_id.as_str())
        .collect();
    let msgids: Vec<&str> = landed
        .iter()
        .map(|(m, _)| m.as_deref().expect("a msgid on each line"))
        .collect();
    assert_eq!(ids, msgids, "each part's receipt is its own line's msgid");
    let distinct: std::collections::BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_labeled_echoes_never_reach_the_feed() {
    our_echoes_never_reach_the_feed(Ircv3::On).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_echo_message_alone_receipts_are_pings_and_echoes_still_never_reach_the_feed() {
    our_echoes_never_reach_the_feed(Ircv3::EchoOnly).await;
}

async fn our_echoes_never_reach_the_feed(ircv3: Ircv3) {
    let (_server, person, plugin) = setup(ircv3).await;
    let caps = link(&plugin).capabilities();
    assert!(caps.iter().any(|c| c == "echo-message"), "{caps:?}");
    assert_eq!(
        caps.iter().any(|c| c == "labeled-response"),
        ircv3 == Ircv3::On,
        "{caps:?}"
    );
    let sink = Arc::new(Collect {
        events: Mutex::new(Vec::new()),
        stop: watch::channel(false).0,
    });
    let InboundSource::Pushed(feed) = plugin.source.clone() else {
        panic!("an IRC channel has a pushed source");
    };
    let running = tokio::spawn({
        let sink = sink.clone();
        async move { feed.run(sink).await }
    });
    for (n, text) in ["an answer", "claw: talking to myself"]
        .into_iter()
        .enumerate()
    {
        let receipt = plugin
            .sender
            .send_unit(
                &context(&plugin, &format!("echo-{n}")),
                &RenderedMessageUnit::text(0, text),
            )
            .await
            .expect("sent");
        // Labeled: the echo's msgid; echo alone: a PING fence's synthetic receipt.
        assert_eq!(
            receipt.platform_message_id.starts_with("irc-"),
            ircv3 == Ircv3::EchoOnly,
            "{}",
            receipt.platform_message_id
        );
    }
    // The server echoed both lines before taking the person's (its lines are in order).
    block(|| {
        person.send(&format!("PRIVMSG {CHANNEL} :{NICK}: a question"));
        person.sync();
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while sink.events.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the person's line reached the feed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another round trip through the server: anything queued behind the question is in too.
    plugin
        .sender
        .send_unit(
            &context(&plugin, "echo-last"),
            &RenderedMessageUnit::text(0, "after"),
        )
        .await
        .expect("sent");
    let events = sink.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "only the person's line: {events:#?}");
    assert!(
        events[0]["line"]
            .as_str()
            .unwrap()
            .contains(":ada!ada@127.0.0.1 PRIVMSG #conformance :claw: a question"),
        "{events:#?}"
    );
    // It normalizes like a plain line, its tags notwithstanding.
    let receiver = plugin.receiver.clone().unwrap();
    let inbound = receiver.normalize(&events[0]).unwrap();
    assert_eq!(inbound.message.body.unwrap().text, "a question");
    sink.stop.send_replace(true);
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_labeled_refusal_is_its_class_and_nothing_lands() {
    let (_server, person, plugin) = setup(Ircv3::On).await;
    // The person opened the channel (op) and moderates it: the channel has no voice.
    block(|| {
        let mark = person.mark();
        person.send(&format!("MODE {CHANNEL} +m"));
        person.wait_for(mark, |l| l.contains(" MODE ") && l.contains("+m"));
    });
    let error = plugin
        .sender
        .send_unit(
            &context(&plugin, "refused"),
            &RenderedMessageUnit::text(0, "muted"),
        )
        .await
        .expect_err("refused");
    assert_eq!(error.kind, DeliveryFailureKind::Permission, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None);
    assert_eq!(error.platform_code.as_deref(), Some("404"));
    let error = plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound("x", plugin.name(), MessageTarget::direct("nobody"), ""),
                "test:nobody",
            ),
            &RenderedMessageUnit::text(0, "anyone?"),
        )
        .await
        .expect_err("no such nick");
    assert_eq!(error.kind, DeliveryFailureKind::NotFound, "{error:?}");
    block(|| person.sync());
    assert!(person.texts_from(NICK, CHANNEL).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_caps_receipts_fall_back_to_ping_fences() {
    let (_server, person, plugin) = setup(Ircv3::Off).await;
    assert!(
        link(&plugin).capabilities().is_empty(),
        "{:?}",
        link(&plugin).capabilities()
    );
    let receipt = plugin
        .sender
        .send_unit(
            &context(&plugin, "plain"),
            &RenderedMessageUnit::text(0, "plain IRC"),
        )
        .await
        .expect("sent");
    assert!(
        receipt.platform_message_id.starts_with("irc-"),
        "a synthetic receipt: {}",
        receipt.platform_message_id
    );
    block(|| person.sync());
    assert_eq!(person.texts_from(NICK, CHANNEL), vec!["plain IRC"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_to_a_server_granting_less_falls_back_for_that_connection() {
    let (mut server, person, plugin) = setup(Ircv3::On).await;
    let labeled = plugin
        .sender
        .send_unit(
            &context(&plugin, "before"),
            &RenderedMessageUnit::text(0, "labeled"),
        )
        .await
        .expect("sent");
    assert!(!labeled.platform_message_id.starts_with("irc-"));
    drop(person);
    // The same port, now without the IRCv3 modules.
    block(|| server.restart_with(Ircv3::Off));
    let person = Client::connect(server.port, "ada");
    person.join(CHANNEL);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // Back on, and in the channel (the person is in it already, whoever joined first).
        if link(&plugin)
            .current()
            .is_some_and(|(_, session)| session > 1)
            && link(&plugin).joined().contains(&CHANNEL.to_owned())
        {
            break;
        }
        assert!(Instant::now() < deadline, "the channel reconnected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        link(&plugin).capabilities().is_empty(),
        "{:?}",
        link(&plugin).capabilities()
    );
    let plain = plugin
        .sender
        .send_unit(
            &context(&plugin, "after"),
            &RenderedMessageUnit::text(0, "fenced"),
        )
        .await
        .expect("sent");
    assert!(
        plain.platform_message_id.starts_with("irc-"),
        "a PING fence's receipt: {}",
        plain.platform_message_id
    );
    block(|| person.sync());
    assert_eq!(person.texts_from(NICK, CHANNEL), vec!["fenced"]);
}
