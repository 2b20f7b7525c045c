//! What the contract suite does not name, against ngircd.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{ReceiveError, SideEffect};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::clock::SystemClock;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::peer::{CHANNEL, NICK, Peer, build, link, settings};
use clawgate_channel_irc::testing::{Client, Ngircd, Penalties};

fn context(plugin: &ChannelPlugin, target: &str, id: &str) -> SendContext {
    let message = ChannelMessage::outbound(id, plugin.name(), MessageTarget::group(target), "");
    SendContext::new(message, format!("test:{id}"))
}

fn unit(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_multibyte_text_is_split_under_512_bytes_as_relayed_and_rejoins() {
    // The longest nick the server allows makes the relayed prefix as long as it gets.
    let nick = "claw-with-a-rather-long-nick";
    let server = Ngircd::start(Penalties::Off);
    let person = Client::connect(server.port, "ada");
    person.join(CHANNEL);
    let plugin = build(settings(server.port, json!({ "nick": nick }))).await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let messenger = Messenger::new(
        store,
        vec![plugin.sender.clone()],
        RetryPolicy::default(),
        Arc::new(SystemClock),
        "irc-tests",
    );
    link(&plugin)
        .wait_up(Duration::from_secs(20))
        .await
        .unwrap();
    // Lines are split for the prefix the server relays, once the channel has seen it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while link(&plugin).relayed_prefix().is_none() {
        assert!(Instant::now() < deadline, "the channel saw its own JOIN");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = "Grüße aus Köln — 東京からこんにちは — 😀🎉 ".repeat(12);
    let second = "x".repeat(1200);
    let text = format!("{first}\n\n{second}\nend");
    let message =
        ChannelMessage::outbound("long", plugin.name(), MessageTarget::group(CHANNEL), &text);
    let report = messenger
        .send(message, SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("sent: {report:?}");
    };
    block(|| person.sync());
    let head = format!(":{nick}!");
    let relayed: Vec<String> = person
        .lines()
        .into_iter()
        .filter(|l| l.starts_with(&head) && l.contains(" PRIVMSG "))
        .collect();
    assert_eq!(
        relayed.len(),
        receipt.parts.len(),
        "one line per receipt part"
    );
    for line in &relayed {
        assert!(
            line.len() + 2 <= 512,
            "{} bytes as relayed: {line}",
            line.len() + 2
        );
    }
    let texts = person.texts_from(nick, CHANNEL);
    // The first line wraps at spaces (each taken out), the second is cut mid-run, the empty
    // line is not sent.
    let xs = texts.iter().position(|t| t.starts_with('x')).unwrap();
    assert_eq!(texts[..xs].join(" "), first.trim_end(), "{texts:#?}");
    assert_eq!(texts[xs..texts.len() - 1].concat(), second);
    assert_eq!(texts.last().map(String::as_str), Some("end"));
    assert!(
        texts.len() >= 6,
        "both long lines were split: {}",
        texts.len()
    );
    assert!(
        relayed.iter().any(|l| l.len() + 2 > 480),
        "pieces use the line, not a timid fraction of it: {:?}",
        relayed
            .iter()
            .map(|l| (
                l.len() + 2,
                l.split(' ').next().unwrap_or_default().to_owned()
            ))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_control_paces_lines_and_the_server_keeps_us() {
    // ngircd's own penalties on; the channel's default flood settings.
    let server = Ngircd::start(Penalties::On);
    let person = Client::connect(server.port, "ada");
    person.join(CHANNEL);
    let mut overrides = settings(server.port, json!({}));
    for key in [
        "flood_burst_bytes",
        "flood_bytes_per_second",
        "flood_min_line_bytes",
    ] {
        overrides.as_object_mut().unwrap().remove(key);
    }
    let plugin = build(overrides).await;
    let (_, session) = link(&plugin)
        .wait_up(Duration::from_secs(20))
        .await
        .unwrap();
    let lines: Vec<String> = (0..12)
        .map(|i| format!("{i:02} {}", "f".repeat(197)))
        .collect();
    let started = Instant::now();
    for (i, text) in lines.iter().enumerate() {
        let ctx = context(&plugin, CHANNEL, &format!("flood-{i}"));
        plugin
            .sender
            .send_unit(&ctx, &unit(text))
            .await
            .unwrap_or_else(|e| panic!("line {i}: {e:?}"));
    }
    let elapsed = started.elapsed();
    // Each unit is its PRIVMSG (~224 bytes with CRLF) and a PING costing the minimum line
    // (192): 12 × 416 bytes, less the 1024-byte burst, at 512 bytes a second.
    let paced = Duration::from_secs_f64((12.0 * 416.0 - 1024.0) / 512.0);
    assert!(
        elapsed >= paced.mul_f64(0.9),
        "lines went out faster than the bucket allows: {elapsed:?}"
    );
    assert_eq!(
        link(&plugin).current().map(|(_, s)| s),
        Some(session),
        "the server never dropped us"
    );
    block(|| person.sync());
    assert_eq!(
        person.texts_from(NICK, CHANNEL),
        lines,
        "every line, once, in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_server_restart_the_channel_reconnects_rejoins_and_delivers() {
    let mut server = Ngircd::start(Penalties::Off);
    let plugin = build(settings(server.port, json!({ "send_wait_ms": 400 }))).await;
    let (_, first) = link(&plugin)
        .wait_up(Duration::from_secs(20))
        .await
        .unwrap();
    server.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while link(&plugin).current().is_some() {
        assert!(Instant::now() < deadline, "the channel saw the server go");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(link(&plugin).joined().is_empty());
    // While the server is down a send fails as not sent: nothing was written.
    let error = plugin
        .sender
        .send_unit(&context(&plugin, CHANNEL, "down"), &unit("while down"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Transient, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None, "{error:?}");
    server.restart();
    let person = Client::connect(server.port, "ada");
    let mark = person.mark();
    person.join(CHANNEL);
    let head = format!(":{NICK}!");
    // The channel is back in: it joins after the person, or the person's NAMES list it.
    block(|| {
        person.wait_for(mark, |l| {
            (l.starts_with(&head) && l.contains(" JOIN "))
                || (l.contains(" 353 ")
                    && l.split(' ')
                        .any(|w| w.trim_start_matches([':', '@']) == NICK))
        })
    });
    let (_, second) = link(&plugin)
        .wait_up(Duration::from_secs(20))
        .await
        .unwrap();
    assert!(second > first, "a new connection: {first} → {second}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while link(&plugin).joined() != vec![CHANNEL.to_owned()] {
        assert!(
            Instant::now() < deadline,
            "joined again: {:?}",
            link(&plugin).joined()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    plugin
        .sender
        .send_unit(&context(&plugin, CHANNEL, "back"), &unit("back again"))
        .await
        .unwrap();
    block(|| person.sync());
    assert_eq!(person.texts_from(NICK, CHANNEL), vec!["back again"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_nick_moves_to_the_alternate_and_answers_to_it() {
    let server = Ngircd::start(Penalties::Off);
    let squatter = Client::connect(server.port, NICK);
    squatter.join(CHANNEL);
    let plugin = build(settings(server.port, json!({ "answer_all": false }))).await;
    let (nick, _) = link(&plugin)
        .wait_up(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(nick, format!("{NICK}_"));
    plugin
        .sender
        .send_unit(
            &context(&plugin, CHANNEL, "alt"),
            &unit("hello from the alternate"),
        )
        .await
        .unwrap();
    block(|| squatter.sync());
    assert_eq!(
        squatter.texts_from(&nick, CHANNEL),
        vec!["hello from the alternate"]
    );
    // Lines addressed to the nick we have are answered; the taken one is someone else's.
    let receiver = plugin.receiver.clone().unwrap();
    let to_us = clawgate_channel_irc::inbound_event(
        &format!(":ada!~ada@h PRIVMSG {CHANNEL} :{nick}: hi"),
        &nick,
        "1",
    );
    assert!(receiver.normalize(&to_us).is_ok());
    let to_squatter = clawgate_channel_irc::inbound_event(
        &format!(":ada!~ada@h PRIVMSG {CHANNEL} :{NICK}: hi"),
        &nick,
        "2",
    );
    assert!(matches!(
        receiver.normalize(&to_squatter),
        Err(ReceiveError::Ignored { .. })
    ));
}

/// A sink that keeps what the feed hands over.
pub(crate) struct Collect {
    pub(crate) events: Mutex<Vec<Value>>,
    pub(crate) stop: watch::Sender<bool>,
}

#[async_trait]
impl EventSink for Collect {
    async fn deliver(&self, event: PushedEvent) {
        self.events.lock().unwrap().push(event.raw);
    }

    async fn stopped(&self) {
        let _ = self.stop.subscribe().wait_for(|s| *s).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_and_ctcp_reach_the_feed_but_are_never_answered() {
    let peer = Peer::start().await;
    let sink = Arc::new(Collect {
        events: Mutex::new(Vec::new()),
        stop: watch::channel(false).0,
    });
    let InboundSource::Pushed(feed) = peer.plugin.source.clone() else {
        panic!("an IRC channel has a pushed source");
    };
    let running = tokio::spawn({
        let sink = sink.clone();
        async move { feed.run(sink).await }
    });
    block(|| {
        peer.person
            .send(&format!("NOTICE {CHANNEL} :{NICK}: a notice"));
        peer.person
            .send(&format!("PRIVMSG {NICK} :\u{1}VERSION\u{1}"));
        peer.person.send(&format!(
            "PRIVMSG {CHANNEL} :\u{1}ACTION waves at {NICK}\u{1}"
        ));
        peer.person
            .send(&format!("PRIVMSG {CHANNEL} :just chatting"));
        peer.person
            .send(&format!("PRIVMSG {CHANNEL} :{NICK}: a question"));
        peer.person
            .send(&format!("PRIVMSG {NICK} :a private question"));
        peer.person.sync();
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while sink.events.lock().unwrap().len() < 6 {
        assert!(
            Instant::now() < deadline,
            "the feed handed over {:?}",
            sink.events.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let receiver = peer.plugin.receiver.clone().unwrap();
    let outcomes: Vec<Result<String, String>> = sink
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|raw| match receiver.normalize(raw) {
            Ok(inbound) => Ok(inbound.message.body.map(|b| b.text).unwrap_or_default()),
            Err(ReceiveError::Ignored { reason, .. }) => Err(reason),
            Err(other) => panic!("{other}"),
        })
        .collect();
    assert!(outcomes[..4].iter().all(Result::is_err), "{outcomes:#?}");
    assert_eq!(outcomes[4], Ok("a question".to_owned()));
    assert_eq!(outcomes[5], Ok("a private question".to_owned()));
    let ids: std::collections::BTreeSet<String> = sink
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|raw| raw["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 6, "each line its own event id");
    sink.stop.send_replace(true);
    running.await.unwrap().unwrap();
    // The channel said nothing on its own (no automatic replies to the NOTICE or CTCP).
    assert!(peer.said(CHANNEL).is_empty());
    assert!(
        !peer
            .person
            .lines()
            .iter()
            .any(|l| l.starts_with(&format!(":{NICK}!")) && l.contains(" NOTICE "))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_against_a_server_without_it_is_refused_with_the_reason() {
    let server = Ngircd::start(Penalties::Off);
    let setup = clawgate_conformance::channel_setup_in_memory(
        0,
        "irc",
        "default",
        settings(
            server.port,
            json!({ "sasl_account": "claw", "send_wait_ms": 5000 }),
        ),
    );
    let plugin = clawgate_channel_irc::IrcFactory
        .build_with_secrets(&setup, Some(Secret::new("hunter2")))
        .await
        .unwrap();
    let error = plugin
        .sender
        .send_unit(&context(&plugin, CHANNEL, "sasl"), &unit("never"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth, "{error:?}");
    let reason = link(&plugin).refused().expect("refused");
    assert!(
        reason.contains("does not offer the sasl capability"),
        "{reason}"
    );
    assert!(!format!("{plugin:?}{error:?}{reason}").contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kicked_channel_joins_again_and_keeps_talking() {
    let peer = Peer::start().await;
    let mark = peer.person.mark();
    let head = format!(":{NICK}!");
    block(|| {
        peer.person.send(&format!("KICK {CHANNEL} {NICK} :out"));
        peer.person
            .wait_for(mark, |l| l.starts_with(&head) && l.contains(" JOIN "));
    });
    peer.plugin
        .sender
        .send_unit(
            &context(&peer.plugin, CHANNEL, "kicked"),
            &unit("still here"),
        )
        .await
        .unwrap();
    assert_eq!(peer.said(CHANNEL), vec!["still here"]);
}

/// SplitMix64: a seeded sequence, the same on every machine.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// Multi-line replies through the engine with connections dropped right after seeded lines
/// (the server has the line, the channel never hears back), the engine restarted after each:
/// counted on the person's side, no line ever lands twice, a sent reply shows every line once,
/// and a reply left unknown shows its lines up to the lost one and nothing after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_at_seeded_points_never_put_a_line_twice() {
    use clawgate_store::{IntentFilter, IntentStore};
    use clawgate_types::IntentStatus;
    use clawgate_types::clock::ManualClock;

    let seed = std::env::var("CLAWGATE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64)
        });
    eprintln!("irc lost-answer matrix: seed {seed} (CLAWGATE_CRASH_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let peer = Peer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let engine = || {
        let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
        let policy = RetryPolicy {
            base_delay_ms: 1_000,
            reconcile_delay_ms: 1_000,
            ..RetryPolicy::default()
        };
        let messenger = Messenger::new(
            store.clone(),
            vec![peer.plugin.sender.clone()],
            policy,
            clock.clone(),
            "irc-matrix",
        );
        (store, messenger)
    };
    let mut lost = std::collections::HashMap::new();
    for n in 0..12u64 {
        let lines = 1 + rng.below(3);
        let text: Vec<String> = (0..lines).map(|l| format!("m{n} line {l}")).collect();
        if rng.below(3) == 0 {
            let at = rng.below(lines);
            peer.proxy.lose_answer_after(u32::try_from(at).unwrap());
            lost.insert(format!("m{n}"), at);
        }
        let (_, messenger) = engine();
        let message = ChannelMessage::outbound(
            format!("m{n}"),
            peer.plugin.name(),
            MessageTarget::group(CHANNEL),
            text.join("\n"),
        );
        messenger
            .send(message, SendOptions::default())
            .await
            .unwrap();
        drop(messenger);
        // A restart: a fresh engine on the same state recovers whatever is due.
        clock.advance(60_000);
        let (_, messenger) = engine();
        messenger.recover().await.unwrap();
        link(&peer.plugin)
            .wait_up(Duration::from_secs(20))
            .await
            .unwrap();
    }
    let seen = peer.said(CHANNEL);
    let mut counts = std::collections::HashMap::<&str, usize>::new();
    for line in &seen {
        *counts.entry(line.as_str()).or_default() += 1;
    }
    assert!(
        counts.values().all(|c| *c == 1),
        "seed {seed}: a line landed twice: {seen:#?}"
    );
    let (store, _) = engine();
    let intents = store
        .list_intents(&IntentFilter {
            limit: 100,
            ..IntentFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(intents.len(), 12);
    for intent in intents {
        let id = intent.message.id.clone();
        let lines: Vec<String> = intent
            .message
            .body
            .as_ref()
            .unwrap()
            .text
            .lines()
            .map(str::to_owned)
            .collect();
        let landed: Vec<&String> = lines
            .iter()
            .filter(|l| counts.contains_key(l.as_str()))
            .collect();
        match lost.get(&id) {
            None => {
                assert_eq!(intent.status, IntentStatus::Sent, "seed {seed}: {id}");
                assert_eq!(
                    landed.len(),
                    lines.len(),
                    "seed {seed}: {id} shows every line"
                );
            }
            Some(at) => {
                assert_eq!(
                    intent.status,
                    IntentStatus::UnknownAfterSend,
                    "seed {seed}: {id}"
                );
                let through = usize::try_from(*at).unwrap() + 1;
                assert_eq!(
                    landed,
                    lines[..through].iter().collect::<Vec<_>>(),
                    "seed {seed}: {id} shows its lines up to the lost one, none after"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_password_logs_in_and_a_wrong_one_is_refused() {
    let server = Ngircd::start_with(Penalties::Off, Some("s3cret-pass"));
    let build_with = |password: &'static str| {
        let setup = clawgate_conformance::channel_setup_in_memory(
            0,
            "irc",
            "default",
            settings(server.port, json!({ "send_wait_ms": 5000 })),
        );
        async move {
            clawgate_channel_irc::IrcFactory
                .build_with_secrets(&setup, Some(Secret::new(password)))
                .await
                .unwrap()
        }
    };
    let good = build_with("s3cret-pass").await;
    let (nick, _) = link(&good).wait_up(Duration::from_secs(20)).await.unwrap();
    assert_eq!(nick, NICK);
    let bad = build_with("wrong-pass").await;
    let error = bad
        .sender
        .send_unit(&context(&bad, CHANNEL, "bad"), &unit("never"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None);
    let reason = link(&bad).refused().expect("refused");
    assert!(
        !format!("{bad:?}{error:?}{reason}").contains("wrong-pass"),
        "{reason}"
    );
}
