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
async fn refusals_do_not_say_why_and_an_event_over_the_limit_gets_413_unread() {
    let peer = Peer::start().await;
    let (recorder, task) = attach(&peer, true);
    let person = peer.person("limits");
    let form = |token: &str, channel: Option<&str>, text: &str| {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("token", token)
            .append_pair("user_id", "4")
            .append_pair("username", &person.id)
            .append_pair("post_id", "1")
            .append_pair("timestamp", "1")
            .append_pair("text", text);
        if let Some(channel) = channel {
            form.append_pair("channel_id", channel);
        }
        form.finish()
    };
    let url = peer.webhook_url.clone();
    let post = |body: String| {
        let url = url.clone();
        async move {
            let response = reqwest::Client::new()
                .post(&url)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body)
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    // Two different failures: an unknown token, and a channel's token with another channel id.
    let outgoing = peer.channel.outgoing_token.clone().unwrap();
    let unknown = post(form("not-the-token", None, "hi")).await;
    let elsewhere = post(form(&outgoing, Some("999"), "hi")).await;
    assert_eq!(unknown, elsewhere);
    assert_eq!(unknown, (401, "unauthorized".to_owned()));
    // A genuine DM over the limit: refused for its size, never handed on.
    let text = "a".repeat(clawgate_channel_synology::MAX_BODY_BYTES);
    let big = form(&peer.sim.bot_token(), None, &text);
    let headers = [(
        "content-type",
        "application/x-www-form-urlencoded".to_owned(),
    )];
    assert_eq!(
        raw_post(&peer.webhook_url, &headers, big.as_bytes()).await,
        413
    );
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
