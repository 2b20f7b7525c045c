//! Events as Talk delivers them. Bot mode: signed webhooks checked before anything is parsed,
//! answered 200 only after the durable record, non-2xx (and so dropped by Talk, which never
//! retries) when the record cannot be made in time. User mode: the long poll (304 when
//! nothing came), the account's own and system messages never answered, a new account
//! starting at the present.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_nextcloud::simulator::{Op, SimulatorConfig};
use clawgate_channel_nextcloud::{WebhookConfig, WebhookSource, sign};
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

use crate::peer::{BotPeer, UserPeer, listening};

/// What a recording sink does with an event.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    Ack,
    Nack,
    /// Keeps the event unanswered (a store that hangs).
    Hold,
}

/// A sink that records what it is handed and answers as told.
struct Recorder {
    got: Mutex<Vec<Value>>,
    held: Mutex<Vec<PushedEvent>>,
    answer: Answer,
}

#[async_trait]
impl EventSink for Recorder {
    async fn deliver(&self, event: PushedEvent) {
        self.got.lock().unwrap().push(event.raw.clone());
        match self.answer {
            Answer::Ack => event.ack.ack(),
            Answer::Nack => event.ack.nack("the store is down"),
            Answer::Hold => self.held.lock().unwrap().push(event),
        }
    }

    async fn stopped(&self) {
        std::future::pending::<()>().await;
    }
}

/// A webhook listener with `secret` and `deadline`, feeding a fresh recorder; its URL.
async fn listener(
    secret: &str,
    deadline: Duration,
    answer: Answer,
) -> (String, Arc<Recorder>, tokio::task::JoinHandle<()>) {
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let source = WebhookSource::new(WebhookConfig {
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        path: "/hook".into(),
        secret: Secret::new(secret),
        answer_deadline: deadline,
    });
    let recorder = Arc::new(Recorder {
        got: Mutex::new(Vec::new()),
        held: Mutex::new(Vec::new()),
        answer,
    });
    let sink: Arc<dyn EventSink> = recorder.clone();
    let task = tokio::spawn(async move {
        let _ = source.run(sink).await;
    });
    let url = format!("http://127.0.0.1:{port}/hook");
    listening(&url).await;
    (url, recorder, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_message_is_handed_over_and_answered_200_after_the_record() {
    let peer = BotPeer::start().await;
    let secret = peer.sim.config().bot_secret.clone();
    let (url, recorder, task) = listener(&secret, Duration::from_secs(4), Answer::Ack).await;
    peer.sim.set_bot_url(Some(&url));
    let target = peer.conversation("hello");
    let id = peer
        .sim
        .person_writes(&target.id, "ada", "Ada", "hello bot");
    assert!(peer.sim.deliveries_settled(Duration::from_secs(10)).await);
    let deliveries = peer.sim.deliveries();
    // The Join (bot enabled) and the message: both answered 200.
    assert!(deliveries.iter().all(|d| d.status == 200), "{deliveries:?}");
    let got = recorder.got.lock().unwrap().clone();
    let message = got.iter().find(|e| e["event"]["type"] == "Create").unwrap();
    let normalized = peer
        .plugin
        .receiver
        .as_ref()
        .unwrap()
        .normalize(message)
        .unwrap();
    assert_eq!(normalized.event_id, format!("talk:{id}"));
    assert_eq!(normalized.message.target, target);
    assert_eq!(normalized.message.sender.as_ref().unwrap().id, "users/ada");
    // The Join is not a message: ignored, never answered.
    let join = got.iter().find(|e| e["event"]["type"] == "Join").unwrap();
    assert!(matches!(
        peer.plugin.receiver.as_ref().unwrap().normalize(join),
        Err(ReceiveError::Ignored { .. })
    ));
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_signature_is_refused_before_parsing_and_nothing_is_recorded() {
    let peer = BotPeer::start().await;
    let secret = peer.sim.config().bot_secret.clone();
    let (url, recorder, task) = listener(&secret, Duration::from_secs(4), Answer::Ack).await;
    let body = json!({ "type": "Create", "actor": { "type": "Person", "id": "users/eve",
        "name": "Eve" }, "object": { "id": 1, "name": "message",
        "content": "{\"message\":\"let me in\",\"parameters\":[]}" },
        "target": { "id": "abc", "name": "x" } })
    .to_string();
    let random = "r".repeat(64);
    let good = sign::signature(&secret, &random, body.as_bytes());
    let cases = [
        // Signed with another secret.
        (
            body.clone(),
            random.clone(),
            sign::signature("not-the-secret", &random, body.as_bytes()),
        ),
        // A valid signature of another body.
        (format!("{body} "), random.clone(), good.clone()),
        // A valid signature with another random.
        (body.clone(), "s".repeat(64), good.clone()),
        // No signature.
        (body.clone(), random.clone(), String::new()),
        // Not JSON, and badly signed: refused for the signature, never parsed.
        ("{not json".to_owned(), random.clone(), good.clone()),
    ];
    for (body, random, signature) in &cases {
        peer.sim.deliver_raw(&url, body, random, signature);
    }
    assert!(peer.sim.deliveries_settled(Duration::from_secs(10)).await);
    let statuses: Vec<u16> = peer.sim.deliveries().iter().map(|d| d.status).collect();
    assert_eq!(statuses, vec![401; 5]);
    assert!(recorder.got.lock().unwrap().is_empty());
    // The same body correctly signed gets through.
    peer.sim.deliver_raw(&url, &body, &random, &good);
    assert!(peer.sim.deliveries_settled(Duration::from_secs(10)).await);
    assert_eq!(peer.sim.deliveries().pop().unwrap().status, 200);
    assert_eq!(recorder.got.lock().unwrap().len(), 1);
    // Correctly signed garbage is a 400, not a panic and not a record.
    let garbage = "[1, 2]";
    peer.sim.deliver_raw(
        &url,
        garbage,
        &random,
        &sign::signature(&secret, &random, garbage.as_bytes()),
    );
    assert!(peer.sim.deliveries_settled(Duration::from_secs(10)).await);
    assert_eq!(peer.sim.deliveries().pop().unwrap().status, 400);
    assert_eq!(recorder.got.lock().unwrap().len(), 1);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_do_not_say_why_and_an_event_over_the_limit_gets_413_unread() {
    let secret = "s".repeat(40);
    let (url, recorder, task) = listener(&secret, Duration::from_secs(4), Answer::Ack).await;
    let event = |text: &str| {
        json!({ "type": "Create", "actor": { "type": "Person", "id": "users/ada",
            "name": "Ada" }, "object": { "id": 7, "name": "message",
            "content": json!({ "message": text, "parameters": [] }).to_string() },
            "target": { "id": "abc", "name": "x" } })
        .to_string()
    };
    let body = event("hello");
    let random = "r".repeat(64);
    let post = |headers: Vec<(&'static str, String)>| {
        let mut request = reqwest::Client::new().post(&url).body(body.clone());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    // Two different failures: no signature, and another secret's.
    let missing = post(Vec::new()).await;
    let wrong = post(vec![
        ("x-nextcloud-talk-random", random.clone()),
        (
            "x-nextcloud-talk-signature",
            sign::signature("not-the-secret", &random, body.as_bytes()),
        ),
    ])
    .await;
    assert_eq!(missing, wrong);
    assert_eq!(missing, (401, "unauthorized".to_owned()));
    // A genuine, signed event over the limit: refused for its size, never handed on.
    let big = event(&"a".repeat(clawgate_channel_nextcloud::MAX_BODY_BYTES));
    let headers = [
        ("content-type", "application/json".to_owned()),
        ("x-nextcloud-talk-random", random.clone()),
        (
            "x-nextcloud-talk-signature",
            sign::signature(&secret, &random, big.as_bytes()),
        ),
    ];
    assert_eq!(raw_post(&url, &headers, big.as_bytes()).await, 413);
    assert!(
        recorder.got.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    task.abort();
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
async fn a_webhook_that_could_not_be_recorded_is_answered_non_2xx_and_talk_drops_it() {
    let peer = BotPeer::start().await;
    let secret = peer.sim.config().bot_secret.clone();
    // A store that never answers: the listener gives up at its deadline, under Talk's 5 s.
    let (url, recorder, task) = listener(&secret, Duration::from_millis(300), Answer::Hold).await;
    let target = peer.conversation("unrecorded");
    peer.sim.set_bot_url(Some(&url));
    peer.sim
        .person_writes(&target.id, "ada", "Ada", "will it stick?");
    // A store that refuses at once.
    let (url2, _recorder2, task2) = listener(&secret, Duration::from_secs(4), Answer::Nack).await;
    peer.sim.set_bot_url(Some(&url2));
    peer.sim
        .person_writes(&target.id, "ada", "Ada", "and this one?");
    assert!(peer.sim.deliveries_settled(Duration::from_secs(10)).await);
    let deliveries: Vec<_> = peer
        .sim
        .deliveries()
        .into_iter()
        .filter(|d| d.message_id().is_some())
        .collect();
    assert_eq!(deliveries.len(), 2, "one attempt each: Talk never retries");
    for delivery in &deliveries {
        assert_eq!(delivery.status, 503, "{delivery:?}");
        assert!(delivery.dropped());
        assert!(
            delivery.elapsed_ms < 5_000,
            "answered within Talk's timeout"
        );
    }
    assert_eq!(recorder.got.lock().unwrap().len(), 1);
    task.abort();
    task2.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_webhook_is_given_up_by_talk_after_its_timeout() {
    // The simulator's sender as Talk's: one attempt, then nothing (here a 300 ms timeout).
    let peer = BotPeer::with(
        SimulatorConfig {
            webhook_timeout: Duration::from_millis(300),
            ..SimulatorConfig::default()
        },
        json!({}),
    )
    .await;
    let secret = peer.sim.config().bot_secret.clone();
    let (url, recorder, task) = listener(&secret, Duration::from_secs(4), Answer::Hold).await;
    peer.sim.set_bot_url(Some(&url));
    let target = peer.conversation("timeout");
    peer.sim.person_writes(&target.id, "ada", "Ada", "slow?");
    assert!(peer.sim.deliveries_settled(Duration::from_secs(10)).await);
    let message = peer
        .sim
        .deliveries()
        .into_iter()
        .find(|d| d.message_id().is_some())
        .unwrap();
    assert_eq!(message.status, 0);
    assert!(message.dropped());
    assert_eq!(
        recorder
            .got
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e["event"]["type"] == "Create")
            .count(),
        1,
        "delivered once, never again"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_long_poll_answers_304_when_nothing_comes() {
    let peer = UserPeer::with(SimulatorConfig::default(), json!({ "poll_timeout_s": 1 })).await;
    let room = peer.conversation("quiet");
    let newest = peer.sim.messages(&room.id).last().unwrap().id;
    let InboundSource::Polling(feed) = peer.plugin.source.clone() else {
        panic!("user mode polls");
    };
    let started = std::time::Instant::now();
    let events = feed
        .poll(&PollFrom::new(newest, None), PollWait::Long)
        .await
        .unwrap();
    assert!(events.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900), "it waited");
    assert!(
        peer.sim
            .calls()
            .iter()
            .any(|c| c.op == Some(Op::ChatRead) && c.status == 304)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polled_messages_after_the_watermark_are_events_and_own_messages_are_never_answered() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("poll");
    let InboundSource::Polling(feed) = peer.plugin.source.clone() else {
        panic!("user mode polls");
    };
    let receiver = peer.plugin.receiver.clone().unwrap();
    let first = peer
        .sim
        .person_writes(&target.id, "ada", "Ada", "question one");
    let key = "own-1";
    peer.plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound(key, "nextcloud", target.clone(), "x"),
                key,
            ),
            &RenderedMessageUnit::text(0, "my own answer"),
        )
        .await
        .unwrap();
    let second = peer
        .sim
        .person_writes(&target.id, "ada", "Ada", "question two");
    let events = feed
        .poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap();
    let answered: Vec<String> = events
        .iter()
        .filter_map(|e| receiver.normalize(&e.raw).ok())
        .map(|n| n.message.body.unwrap().text)
        .collect();
    assert_eq!(answered, vec!["question one", "question two"]);
    assert!(events.iter().any(|e| matches!(
        receiver.normalize(&e.raw),
        Err(ReceiveError::Ignored { .. })
    )));
    assert!(events.windows(2).all(|w| w[0].position < w[1].position));
    // From the watermark on: only what came after it (lastKnownMessageId).
    let later = feed
        .poll(&PollFrom::new(first, None), PollWait::Immediate)
        .await
        .unwrap();
    assert!(later.iter().all(|e| e.position > first));
    assert!(later.iter().any(|e| e.position == second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_account_starts_at_the_present() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("history");
    peer.sim
        .person_writes(&target.id, "ada", "Ada", "before the start");
    // A new account (a fresh state directory): it starts at the newest message.
    let fresh = tempfile::tempdir().unwrap();
    let plugin = UserPeer::build(&peer.sim, fresh.path(), &json!({}))
        .await
        .unwrap();
    peer.sim
        .person_writes(&target.id, "ada", "Ada", "after the start");
    let InboundSource::Polling(feed) = plugin.source.clone() else {
        panic!("user mode polls");
    };
    let texts: Vec<String> = feed
        .poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| plugin.receiver.as_ref().unwrap().normalize(&e.raw).ok())
        .map(|n| n.message.body.unwrap().text)
        .collect();
    assert_eq!(texts, vec!["after the start"]);
    // Built again on the same state (a restart before anything finished): the kept start
    // holds, and nothing written meanwhile is skipped.
    peer.sim
        .person_writes(&target.id, "ada", "Ada", "while it was down");
    let again = UserPeer::build(&peer.sim, fresh.path(), &json!({}))
        .await
        .unwrap();
    let InboundSource::Polling(feed) = again.source.clone() else {
        panic!("user mode polls");
    };
    let texts: Vec<String> = feed
        .poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| again.receiver.as_ref().unwrap().normalize(&e.raw).ok())
        .map(|n| n.message.body.unwrap().text)
        .collect();
    assert_eq!(texts, vec!["after the start", "while it was down"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_never_hands_over_a_message_while_a_lower_id_elsewhere_is_unseen() {
    // Two conversations read one after the other. Conversation A's read is slow: while its
    // (empty) page is on the way, A gets message 10 and then B gets message 11, which B's read
    // shows. Handing over 11 alone would move the watermark past 10 for good.
    let peer = UserPeer::start().await;
    let a = peer
        .sim
        .add_conversation("a", clawgate_channel_nextcloud::simulator::RoomType::Group);
    let b = peer
        .sim
        .add_conversation("b", clawgate_channel_nextcloud::simulator::RoomType::Group);
    let state = tempfile::tempdir().unwrap();
    let plugin = UserPeer::build(
        &peer.sim,
        state.path(),
        &json!({ "conversations": [a.token, b.token] }),
    )
    .await
    .unwrap();
    let InboundSource::Polling(feed) = plugin.source.clone() else {
        panic!("user mode polls");
    };
    let start = peer.sim.all_messages().last().unwrap().id;
    peer.sim
        .inject(clawgate_channel_nextcloud::simulator::Fault::new(
            Some(Op::ChatRead),
            clawgate_channel_nextcloud::simulator::FaultKind::Stall(Duration::from_millis(400)),
        ));
    let from = PollFrom::new(start, None);
    let poll = feed.poll(&from, PollWait::Immediate);
    let writes = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let low = peer
            .sim
            .person_writes(&a.token, "ada", "Ada", "lower id, in a");
        let high = peer
            .sim
            .person_writes(&b.token, "ada", "Ada", "higher id, in b");
        (low, high)
    };
    let (events, (low, high)) = tokio::join!(poll, writes);
    let positions: Vec<i64> = events.unwrap().iter().map(|e| e.position).collect();
    // The second round sees both: neither is left behind.
    assert_eq!(
        positions,
        vec![low, high],
        "{high} must not come without {low}"
    );
}
