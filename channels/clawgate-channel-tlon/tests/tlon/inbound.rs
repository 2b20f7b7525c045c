//! Events as the ship's subscriptions deliver them: DMs and group posts handed over after the
//! subscriptions are made, acked to Eyre only after the durable record (cumulatively, never past
//! an unrecorded event), our own posts never answered, mentions and participated threads, a
//! `quit` or a clog answered by subscribing again, dropped streams and gateway restarts resumed
//! from the same channel, and the session cookie as the only way in.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_tlon::simulator::{Ship, ShipConfig};
use serde_json::{Value, json};

use crate::peer::{NEST, OPEN_NEST, Peer, build, config};

/// A sink that records what it is handed and acks it — or holds the acks back.
pub(crate) struct Recorder {
    pub(crate) got: Mutex<Vec<Value>>,
    held: Mutex<Vec<Arc<dyn TransportAck>>>,
    ack: bool,
}

#[async_trait]
impl EventSink for Recorder {
    async fn deliver(&self, event: PushedEvent) {
        self.got.lock().unwrap().push(event.raw.clone());
        if self.ack {
            event.ack.ack();
        } else {
            self.held.lock().unwrap().push(event.ack);
        }
    }

    async fn stopped(&self) {
        std::future::pending::<()>().await;
    }
}

impl Recorder {
    pub(crate) fn texts(&self, receiver: &dyn MessageReceiveAdapter) -> Vec<String> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter_map(|raw| receiver.normalize(raw).ok())
            .filter_map(|n| n.message.body.map(|b| b.text))
            .collect()
    }

    pub(crate) fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }
}

/// Runs `plugin`'s feed into a fresh recorder.
pub(crate) fn run(
    plugin: &ChannelPlugin,
    ack: bool,
) -> (Arc<Recorder>, tokio::task::JoinHandle<()>) {
    let recorder = Arc::new(Recorder {
        got: Mutex::new(Vec::new()),
        held: Mutex::new(Vec::new()),
        ack,
    });
    let InboundSource::Pushed(feed) = plugin.source.clone() else {
        panic!("the Tlon source is pushed");
    };
    let sink: Arc<dyn EventSink> = recorder.clone();
    // As the gateway's source runner does: a feed that ends with an error (a request that
    // timed out on a loaded machine) is started again.
    let task = tokio::spawn(async move {
        while feed.run(sink.clone()).await.is_err() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
    (recorder, task)
}

pub(crate) async fn subscribed(peer: &Peer, count: usize) {
    peer.until("the chat and channels subscriptions", || {
        peer.ship.subscriptions().len() == count && peer.ship.open_streams() >= 1
    })
    .await;
}

#[tokio::test]
async fn dms_and_mentions_are_handed_over_and_acked_after_the_record() {
    let peer = Peer::start().await;
    let (recorder, task) = run(&peer.plugin, true);
    subscribed(&peer, 2).await;
    assert_eq!(
        peer.ship.subscriptions(),
        vec![
            ("chat".to_owned(), "/v3".to_owned()),
            ("channels".into(), "/v4".into())
        ]
    );
    let writ = peer.ship.dm_from("~nec", "hello bot");
    let post = peer.ship.post_from(NEST, "~bus", "what time is it?", true);
    peer.until("both events", || recorder.count() == 2).await;
    peer.until("everything acked", || peer.ship.unacked() == 0)
        .await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    let got = recorder.got.lock().unwrap().clone();
    let dm = receiver.normalize(&got[0]).unwrap();
    assert_eq!(dm.event_id, format!("dm:{writ}"));
    assert_eq!(dm.message.target, MessageTarget::direct("~nec"));
    assert_eq!(dm.message.body.unwrap().text, "hello bot");
    let mention = receiver.normalize(&got[1]).unwrap();
    assert_eq!(mention.event_id, format!("post:{NEST}/{post}"));
    assert_eq!(mention.message.target.id, NEST);
    assert_eq!(
        mention.message.target.thread_id.as_deref(),
        Some(post.as_str()),
        "the answer goes into the post's thread"
    );
    task.abort();
}

#[tokio::test]
async fn an_event_not_yet_recorded_is_never_acked_and_comes_again() {
    let peer = Peer::start().await;
    let (held, task) = run(&peer.plugin, false);
    subscribed(&peer, 2).await;
    peer.ship.dm_from("~nec", "first");
    peer.ship.dm_from("~nec", "second");
    peer.until("both handed over", || held.count() == 2).await;
    // Subscribe acks may go; the two diffs may not.
    peer.until("the control events acked", || peer.ship.unacked() == 2)
        .await;
    // The second is recorded, the first not: Eyre's ack is cumulative, so nothing moves.
    let acks = held.held.lock().unwrap().clone();
    acks[1].ack();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(peer.ship.unacked(), 2, "an ack of 2 would clear 1 as well");
    // A restart before the record: the same channel replays both.
    task.abort();
    let (again, task) = run(&peer.rebuilt().await, true);
    peer.until("the replay", || again.count() == 2).await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    assert_eq!(again.texts(receiver.as_ref()), vec!["first", "second"]);
    peer.until("all acked", || peer.ship.unacked() == 0).await;
    assert_eq!(
        peer.ship.subscriptions().len(),
        2,
        "the same channel: no new subscriptions"
    );
    task.abort();
}

#[tokio::test]
async fn the_same_event_twice_has_one_event_id() {
    let peer = Peer::start().await;
    let (recorder, task) = run(&peer.plugin, true);
    subscribed(&peer, 2).await;
    peer.ship.dm_from("~nec", "only once");
    peer.until("the event", || recorder.count() == 1).await;
    assert_eq!(peer.ship.repeat_diffs(), 1);
    peer.until("the repeat", || recorder.count() == 2).await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    let got = recorder.got.lock().unwrap().clone();
    let ids: Vec<_> = got
        .iter()
        .map(|raw| receiver.normalize(raw).unwrap().event_id)
        .collect();
    assert_eq!(
        ids[0], ids[1],
        "the engine's durable dedupe drops the second"
    );
    task.abort();
}

#[tokio::test]
async fn our_own_posts_and_unmentioned_posts_are_not_answered() {
    let peer = Peer::start().await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    let normalize_last = || receiver.normalize(&peer.ship.last_event().unwrap());
    // Our own DM, as the chat firehose echoes it.
    peer.plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound("own", "tlon", MessageTarget::direct("~nec"), "x"),
                "own",
            ),
            &RenderedMessageUnit::text(0, "from us"),
        )
        .await
        .unwrap();
    assert!(matches!(
        normalize_last(),
        Err(ReceiveError::Ignored { .. })
    ));
    // Our own post in a channel where every post is answered.
    peer.plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound("own-post", "tlon", MessageTarget::group(OPEN_NEST), "x"),
                "own-post",
            ),
            &RenderedMessageUnit::text(0, "also from us, ~zod"),
        )
        .await
        .unwrap();
    assert!(matches!(
        normalize_last(),
        Err(ReceiveError::Ignored { .. })
    ));
    // A group post without a mention; the same with one; the same in an open channel.
    peer.ship.post_from(NEST, "~nec", "just chatting", false);
    assert!(matches!(
        normalize_last(),
        Err(ReceiveError::Ignored { .. })
    ));
    peer.ship.post_from(NEST, "~nec", "help please", true);
    assert_eq!(
        normalize_last().unwrap().message.body.unwrap().text,
        "~zod help please"
    );
    peer.ship.post_from(OPEN_NEST, "~nec", "anyone", false);
    assert!(
        normalize_last().is_ok(),
        "an open channel answers every post"
    );
    // A mention typed as text counts too.
    peer.ship
        .post_from(NEST, "~nec", "hey ~zod, you there?", false);
    assert!(normalize_last().is_ok());
    // Malformed events are typed errors, never panics.
    for bad in [
        json!({}),
        json!({ "app": "chat", "event": { "whom": "~nec" } }),
        json!({ "app": "chat", "event": { "whom": "~nec", "id": "x", "response": { "add": { "essay": { "author": "~nec", "content": "not a story" } } } } }),
        json!({ "app": "channels", "event": { "nest": NEST, "response": { "post": { "id": "1" } } } }),
        json!({ "app": "groups", "event": {} }),
    ] {
        assert!(
            matches!(
                receiver.normalize(&bad),
                Err(ReceiveError::Malformed { .. })
            ),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn a_clogged_channel_is_kicked_and_the_feed_subscribes_again() {
    // A feed that never acks clogs the channel; Eyre kicks its subscriptions (`quit`).
    let ship_config = ShipConfig {
        clog_threshold: 3,
        clog_timeout: Duration::ZERO,
        ..config()
    };
    let peer = Peer::with(ship_config, json!({})).await;
    let (held, task) = run(&peer.plugin, false);
    subscribed(&peer, 2).await;
    for i in 0..4 {
        peer.ship.dm_from("~nec", &format!("clog {i}"));
    }
    peer.until("a kick", || peer.ship.acks_and_kicks().1 >= 2)
        .await;
    peer.until("subscribed again", || peer.ship.subscriptions().len() == 2)
        .await;
    // Recording what was held unclogs it; later events still come.
    for ack in held.held.lock().unwrap().drain(..) {
        ack.ack();
    }
    peer.until("the backlog acked", || peer.ship.unacked() <= 2)
        .await;
    let before = held.count();
    peer.ship.dm_from("~nec", "after the clog");
    peer.until("the next event", || held.count() > before).await;
    task.abort();
}

#[tokio::test]
async fn a_dropped_stream_and_a_reaped_channel_are_resumed() {
    let peer = Peer::start().await;
    let (recorder, task) = run(&peer.plugin, true);
    subscribed(&peer, 2).await;
    peer.ship.drop_streams();
    peer.ship.dm_from("~nec", "while away");
    peer.until("the event after the drop", || recorder.count() == 1)
        .await;
    // Its ack lands before the reap: a PUT (an ack too) creates a channel that does not exist,
    // so an ack arriving after the reap would bring the channel back empty (see the crate's
    // README, "Known gaps").
    peer.until("the event acked", || peer.ship.unacked() == 0)
        .await;
    peer.ship.reap_channels();
    peer.ship.drop_streams();
    subscribed(&peer, 2).await;
    peer.ship.dm_from("~nec", "on the new channel");
    peer.until("the event on the new channel", || recorder.count() == 2)
        .await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    assert_eq!(
        recorder.texts(receiver.as_ref()),
        vec!["while away", "on the new channel"]
    );
    task.abort();
}

#[tokio::test]
async fn without_a_session_nothing_is_read_or_done_and_a_wrong_code_stops_the_start() {
    let ship = Ship::start(config()).await.unwrap();
    let client = reqwest::Client::new();
    // No cookie: every channel and scry route is refused before the body is read.
    for (method, path, body) in [
        (
            "PUT",
            "/~/channel/intruder",
            r#"[{"id":1,"action":"poke","ship":"zod","app":"chat","mark":"chat-dm-action","json":{}}]"#,
        ),
        ("GET", "/~/channel/intruder", ""),
        ("GET", "/~/scry/chat/dm/~nec/writs/writ/id/~zod/1.json", ""),
    ] {
        let response = client
            .request(method.parse().unwrap(), format!("{}{path}", ship.url()))
            .header("cookie", "urbauth-~zod=0vforged")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 403, "{method} {path}");
    }
    assert_eq!(ship.applied_pokes(), 0);
    assert!(ship.subscriptions().is_empty());
    // A wrong +code is refused at start, naming the setting, never printing the code.
    let state = tempfile::tempdir().unwrap();
    let settings = json!({ "url": ship.url(), "ship": "~zod", "code_env": "TLON_CODE" });
    let setup = clawgate_conformance::channel_setup(3, "tlon", "default", settings, state.path());
    let error = clawgate_channel_tlon::TlonFactory
        .build_with_code(&setup, Secret::new("wrong-code-sampel"))
        .await
        .unwrap_err();
    assert_eq!(error.key, "channels[3].settings.code_env");
    assert!(error.reason.contains("refused the login code"), "{error}");
    assert!(!error.to_string().contains("wrong-code-sampel"));
    // The right one builds; Debug of the plugin shows no code either.
    let plugin = build(
        &ship,
        &json!({ "url": ship.url(), "ship": "~zod", "code_env": "X" }),
        state.path(),
    )
    .await;
    assert!(!format!("{plugin:?}").contains(ship.code()));
    let unset = clawgate_conformance::channel_setup(
        0,
        "tlon",
        "default",
        json!({ "url": ship.url(), "ship": "~zod", "code_env": "CLAWGATE_TLON_SURELY_UNSET" }),
        state.path(),
    );
    let error =
        clawgate_channel_sdk::ChannelFactory::build(&clawgate_channel_tlon::TlonFactory, unset)
            .await
            .unwrap_err();
    assert!(
        error.reason.contains("CLAWGATE_TLON_SURELY_UNSET"),
        "{error}"
    );
}

#[tokio::test]
async fn a_session_revoked_midway_is_renewed_by_logging_in_again() {
    let peer = Peer::start().await;
    let person = peer.person("relogin");
    peer.ship.revoke_sessions();
    peer.plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound("r", "tlon", person.clone(), "x"),
                "relogin",
            ),
            &RenderedMessageUnit::text(0, "still here"),
        )
        .await
        .unwrap();
    assert_eq!(peer.ship.our_dm_texts(&person.id), vec!["still here"]);
}
