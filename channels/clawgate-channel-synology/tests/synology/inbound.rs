//! Events as Synology Chat posts them: form fields checked by token before anything else,
//! DMs and channel trigger words, answered only after the durable record, a copy dropped by
//! its post id, and the channel's own integration posts never answered.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_synology::simulator::SimulatorConfig;
use serde_json::{Value, json};

use crate::peer::{HOOK_NAME, Peer, TRIGGER, quick};

/// A sink that records what it is handed and acks (or nacks) it.
struct Recorder {
    got: Mutex<Vec<Value>>,
    ack: bool,
}

#[async_trait]
impl EventSink for Recorder {
    async fn deliver(&self, event: PushedEvent) {
        self.got.lock().unwrap().push(event.raw.clone());
        if self.ack {
            event.ack.ack();
        } else {
            event.ack.nack("the store is down");
        }
    }

    async fn stopped(&self) {
        std::future::pending::<()>().await;
    }
}

/// The peer's listener feeding a fresh recorder (through the attachable source).
fn attach(peer: &Peer, ack: bool) -> (Arc<Recorder>, tokio::task::JoinHandle<()>) {
    let recorder = Arc::new(Recorder {
        got: Mutex::new(Vec::new()),
        ack,
    });
    let InboundSource::Pushed(feed) = peer.attached_plugin().source else {
        panic!("pushed");
    };
    let sink: Arc<dyn EventSink> = recorder.clone();
    let task = tokio::spawn(async move {
        let _ = feed.run(sink).await;
    });
    (recorder, task)
}

async fn settled(peer: &Peer) {
    assert!(peer.sim.deliveries_settled(Duration::from_secs(10)).await);
}

#[tokio::test]
async fn a_dm_is_handed_over_without_its_token_and_answered_204_after_the_record() {
    let peer = Peer::start().await;
    let (recorder, task) = attach(&peer, true);
    let person = peer.person("Ada");
    let post = peer.sim.person_dms_bot(&person.id, "hello bot");
    settled(&peer).await;
    let delivery = peer.sim.deliveries().pop().unwrap();
    assert_eq!(delivery.status, 204);
    let got = recorder.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["via"], "bot");
    assert_eq!(got[0]["fields"]["post_id"], post.to_string());
    assert!(
        got[0]["fields"].get("token").is_none(),
        "the token is not kept"
    );
    let normalized = peer
        .plugin
        .receiver
        .as_ref()
        .unwrap()
        .normalize(&got[0])
        .unwrap();
    assert_eq!(normalized.message.target, person);
    assert_eq!(normalized.event_id, format!("post:{post}"));
    task.abort();
}

#[tokio::test]
async fn without_the_durable_record_the_answer_is_500() {
    let peer = Peer::start().await;
    let (_recorder, task) = attach(&peer, false);
    let person = peer.person("nack");
    peer.sim.person_dms_bot(&person.id, "will it stick?");
    settled(&peer).await;
    assert_eq!(peer.sim.deliveries().pop().unwrap().status, 500);
    task.abort();
}

#[tokio::test]
async fn a_wrong_token_is_refused_before_anything_is_read() {
    let peer = Peer::start().await;
    let (recorder, task) = attach(&peer, true);
    let person = peer.person("forger");
    let fields = |token: &str, channel: Option<&str>| {
        let mut f = vec![
            ("token".to_owned(), token.to_owned()),
            ("user_id".into(), "4".into()),
            ("username".into(), person.id.clone()),
            ("post_id".into(), "1".into()),
            ("timestamp".into(), "1".into()),
            ("text".into(), "let me in".into()),
        ];
        if let Some(channel) = channel {
            f.push(("channel_id".into(), channel.into()));
        }
        f
    };
    let bot = peer.sim.bot_token();
    let outgoing = peer.channel.outgoing_token.clone().unwrap();
    for (token, channel) in [
        ("", None),
        ("not-the-token", None),
        (&bot[..bot.len() - 1], None),
        // The quotes belong to the API's URL, not to events.
        (&*format!("\"{bot}\""), None),
        // A channel's token with another channel's id.
        (outgoing.as_str(), Some("999")),
    ] {
        peer.sim
            .deliver_raw(&peer.webhook_url, fields(token, channel));
    }
    settled(&peer).await;
    let statuses: Vec<u16> = peer.sim.deliveries().iter().map(|d| d.status).collect();
    assert_eq!(statuses, vec![401; 5]);
    assert!(recorder.got.lock().unwrap().is_empty());
    task.abort();
}

#[tokio::test]
async fn a_channel_post_with_a_trigger_word_is_a_group_prompt() {
    let peer = Peer::start().await;
    let (recorder, task) = attach(&peer, true);
    let person = peer.person("Grace");
    let channel = peer.channel.channel_id;
    peer.sim
        .person_posts(&person.id, channel, "no trigger here");
    let post = peer
        .sim
        .person_posts(&person.id, channel, &format!("{TRIGGER} what is up?"));
    settled(&peer).await;
    let deliveries = peer.sim.deliveries();
    assert_eq!(deliveries.len(), 1, "only the triggered post is sent");
    assert_eq!(deliveries[0].field("trigger_word"), Some(TRIGGER));
    assert_eq!(deliveries[0].status, 204);
    let got = recorder.got.lock().unwrap().clone();
    let normalized = peer
        .plugin
        .receiver
        .as_ref()
        .unwrap()
        .normalize(&got[0])
        .unwrap();
    assert_eq!(normalized.message.target, peer.channel_target());
    assert_eq!(normalized.event_id, format!("post:{post}"));
    task.abort();
}

#[tokio::test]
async fn the_channels_own_posts_are_never_answered() {
    // Posts through the incoming webhook that start with the trigger word set the outgoing
    // webhook off (the simulator's echo): the receiver must drop them.
    let config = SimulatorConfig {
        echo_integration_posts: true,
        ..quick()
    };
    let peer = Peer::with(config, json!({})).await;
    let (recorder, task) = attach(&peer, true);
    let channel = peer.channel_target();
    let key = "own-1";
    peer.plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound(key, "synology", channel.clone(), "x"),
                key,
            ),
            &RenderedMessageUnit::text(0, format!("{TRIGGER} quoted back at us")),
        )
        .await
        .unwrap();
    settled(&peer).await;
    let got = recorder.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "the echo arrived");
    assert_eq!(got[0]["fields"]["username"], HOOK_NAME);
    let answer = peer.plugin.receiver.as_ref().unwrap().normalize(&got[0]);
    assert!(
        matches!(answer, Err(ReceiveError::Ignored { .. })),
        "{answer:?}"
    );
    task.abort();
}
