//! The simulator's Bot Connector as a plain HTTP client sees it (platform-apis-wave2 §12): the
//! token endpoint, the error envelope, `;messageid=` threads, the per-conversation send limits
//! with `Retry-After`, and the streaming rules of streaming-ux.md.

use std::time::Duration;

use clawgate_channel_teams::simulator::{
    ConversationKind, SEND_LIMITS, SimulatorConfig, StreamState, TeamsSimulator,
};
use serde_json::{Value, json};

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

async fn token(sim: &TeamsSimulator, secret: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(sim.token_url())
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", sim.app_id().as_str()),
            ("client_secret", secret),
            ("scope", "https://api.botframework.com/.default"),
        ])
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn encode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => {
                char::from(b).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

impl Client {
    async fn new(sim: &TeamsSimulator) -> Client {
        let (status, body) = token(sim, &sim.app_password()).await;
        assert_eq!(status, 200, "{body}");
        Client {
            http: reqwest::Client::new(),
            base: sim.service_url(),
            token: body["access_token"].as_str().unwrap().to_owned(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        conversation: &str,
        activity: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Option<u64>, Value) {
        let mut url = format!(
            "{}v3/conversations/{}/activities",
            self.base,
            encode(conversation)
        );
        if let Some(id) = activity {
            url = format!("{url}/{id}");
        }
        let mut request = self.http.request(method, url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let retry = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap());
        let text = response.text().await.unwrap();
        (
            status,
            retry,
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }

    async fn post(&self, conversation: &str, body: Value) -> (u16, Option<u64>, Value) {
        self.call(reqwest::Method::POST, conversation, None, Some(body))
            .await
    }
}

fn stream(kind: &str, text: &str, id: Option<&str>, stream_type: &str, seq: Option<u64>) -> Value {
    let mut info = json!({ "type": "streaminfo", "streamType": stream_type });
    if let Some(id) = id {
        info["streamId"] = json!(id);
    }
    if let Some(seq) = seq {
        info["streamSequence"] = json!(seq);
    }
    json!({ "type": kind, "text": text, "entities": [info] })
}

#[tokio::test]
async fn the_token_endpoint_grants_client_credentials_and_refuses_a_wrong_secret() {
    let sim = TeamsSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let (status, body) = token(&sim, &sim.app_password()).await;
    assert_eq!(status, 200);
    assert_eq!(body["token_type"], "Bearer");
    assert!(body["expires_in"].as_u64().unwrap() > 0);
    let (status, body) = token(&sim, "wrong").await;
    assert_eq!(status, 401);
    assert_eq!(body["error"], "invalid_client");
    assert!(
        body["error_description"]
            .as_str()
            .unwrap()
            .starts_with("AADSTS7000215")
    );
    // Without a token the connector answers its 401 page, not the error envelope.
    let chat = sim.personal_chat(&sim.person("ada"));
    let client = Client {
        token: "forged".into(),
        ..Client::new(&sim).await
    };
    let (status, _, body) = client
        .post(&chat, json!({ "type": "message", "text": "x" }))
        .await;
    assert_eq!(status, 401);
    assert_eq!(
        body["message"],
        "Authorization has been denied for this request."
    );
    assert!(sim.bot_visible(&chat).is_empty());
}

#[tokio::test]
async fn sends_replies_updates_and_deletes_answer_resource_responses() {
    let sim = TeamsSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let ada = sim.person("ada");
    let channel = sim.conversation(
        ConversationKind::Channel,
        "general",
        std::slice::from_ref(&ada),
    );
    let post = sim.person_writes(&channel, &ada, "a post", None).unwrap();
    let client = Client::new(&sim).await;
    let thread = format!("{channel};messageid={}", post.id);
    let (status, _, reply) = client
        .call(
            reqwest::Method::POST,
            &thread,
            Some(&post.id),
            Some(json!({ "type": "message", "text": "in the thread", "replyToId": post.id })),
        )
        .await;
    assert_eq!(status, 201, "{reply}");
    let id = reply["id"].as_str().unwrap().to_owned();
    let (status, _, _) = client
        .call(
            reqwest::Method::PUT,
            &thread,
            Some(&id),
            Some(json!({ "type": "message", "id": id, "text": "edited" })),
        )
        .await;
    assert_eq!(status, 200);
    let shown = sim.bot_visible(&channel);
    assert_eq!(shown.len(), 1);
    assert_eq!(
        (
            shown[0].text.as_str(),
            shown[0].thread.as_deref(),
            shown[0].updates
        ),
        ("edited", Some(post.id.as_str()), 1)
    );
    // A thread that does not exist, a reply to nothing, an update of nothing.
    let (status, _, body) = client
        .post(
            &format!("{channel};messageid=404"),
            json!({ "type": "message", "text": "x" }),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("ConversationNotFound"))
    );
    let (status, _, body) = client
        .post(
            &channel,
            json!({ "type": "message", "text": "x", "replyToId": "nope" }),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("BadArgument"))
    );
    let (status, _, body) = client
        .call(
            reqwest::Method::PUT,
            &channel,
            Some("123"),
            Some(json!({ "type": "message", "text": "x" })),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("ActivityNotFound"))
    );
    let (status, _, _) = client
        .call(reqwest::Method::DELETE, &thread, Some(&id), None)
        .await;
    assert_eq!(status, 200);
    assert!(sim.bot_visible(&channel).is_empty());
    let (status, _, _) = client
        .call(reqwest::Method::DELETE, &thread, Some(&id), None)
        .await;
    assert_eq!(status, 404, "deleted once");
    // Removed from the conversation: the roster refusal.
    sim.remove_bot(&channel);
    let (status, _, body) = client
        .post(&channel, json!({ "type": "message", "text": "x" }))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("BotNotInConversationRoster"))
    );
}

#[tokio::test]
async fn the_eighth_send_in_two_seconds_is_throttled_with_retry_after() {
    let sim = TeamsSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let chat = sim.personal_chat(&sim.person("ada"));
    let other = sim.personal_chat(&sim.person("bo"));
    let client = Client::new(&sim).await;
    let mut statuses = Vec::new();
    let mut retry = None;
    for n in 0..9 {
        let (status, after, body) = client
            .post(&chat, json!({ "type": "message", "text": format!("n{n}") }))
            .await;
        if status == 429 {
            assert_eq!(body["error"]["code"], "Throttled", "{body}");
            retry = after;
        }
        statuses.push(status);
    }
    // 7 a second: the eighth within the second is refused (the limits: {SEND_LIMITS:?}).
    assert_eq!(SEND_LIMITS[0], (Duration::from_secs(1), 7));
    assert_eq!(&statuses[..7], &[201; 7], "{statuses:?}");
    assert_eq!(statuses[7], 429, "{statuses:?}");
    assert!(retry.is_some_and(|s| s >= 1), "{retry:?}");
    assert_eq!(
        sim.bot_visible(&chat).len(),
        7,
        "a refused send shows nothing"
    );
    // Per conversation: another chat is not held back.
    let (status, _, _) = client
        .post(&other, json!({ "type": "message", "text": "x" }))
        .await;
    assert_eq!(status, 201);
}

#[tokio::test]
async fn a_stream_starts_continues_in_order_and_ends_with_its_final() {
    let sim = TeamsSimulator::start(SimulatorConfig {
        stream_min_interval: Duration::ZERO,
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    let chat = sim.personal_chat(&sim.person("ada"));
    let client = Client::new(&sim).await;
    let (status, _, body) = client
        .post(&chat, stream("typing", "", None, "streaming", Some(1)))
        .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("should include text")
    );
    let (status, _, start) = client
        .post(
            &chat,
            stream("typing", "Searching…", None, "informative", Some(1)),
        )
        .await;
    assert_eq!(status, 201, "{start}");
    let id = start["id"].as_str().unwrap().to_owned();
    let (status, _, body) = client
        .post(
            &chat,
            stream("typing", "The", Some(&id), "streaming", Some(2)),
        )
        .await;
    assert_eq!((status, body), (202, json!({})));
    // Out of order: a 202 that says it was dropped.
    let (status, _, body) = client
        .post(
            &chat,
            stream("typing", "Th", Some(&id), "streaming", Some(2)),
        )
        .await;
    assert_eq!(status, 202);
    assert_eq!(
        body["error"]["code"],
        "ContentStreamSequenceOrderPreConditionFailed"
    );
    let (status, _, _) = client
        .post(
            &chat,
            stream("typing", "The answer", Some(&id), "streaming", Some(3)),
        )
        .await;
    assert_eq!(status, 202);
    let (status, _, body) = client
        .post(
            &chat,
            stream("message", "The answer is 42.", Some(&id), "final", None),
        )
        .await;
    assert_eq!((status, body["id"].as_str()), (200, Some(id.as_str())));
    let shown = sim.bot_visible(&chat);
    assert_eq!(shown.len(), 1, "the stream is the message");
    let s = shown[0].stream.as_ref().unwrap();
    assert_eq!(shown[0].text, "The answer is 42.");
    assert_eq!(
        (
            s.state,
            s.informative.as_slice(),
            s.streamed.as_slice(),
            s.dropped
        ),
        (
            StreamState::Final,
            &["Searching…".to_owned()][..],
            &["The".to_owned(), "The answer".to_owned()][..],
            1
        )
    );
    // Completed: no more content.
    let (status, _, body) = client
        .post(
            &chat,
            stream("typing", "more", Some(&id), "streaming", Some(4)),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("ContentStreamNotAllowed"))
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already completed")
    );
}

#[tokio::test]
async fn streams_are_refused_outside_one_on_one_chats_too_fast_stopped_too_large_and_too_long() {
    // A minute between stream requests: the second of two is always too soon.
    let sim = TeamsSimulator::start(SimulatorConfig {
        stream_min_interval: Duration::from_secs(60),
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    let ada = sim.person("ada");
    let chat = sim.personal_chat(&ada);
    let group = sim.conversation(
        ConversationKind::GroupChat,
        "crew",
        std::slice::from_ref(&ada),
    );
    let client = Client::new(&sim).await;
    let (status, _, body) = client
        .post(&group, stream("typing", "x", None, "streaming", Some(1)))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("ContentStreamNotAllowed"))
    );
    let (_, _, start) = client
        .post(&chat, stream("typing", "a", None, "streaming", Some(1)))
        .await;
    let id = start["id"].as_str().unwrap().to_owned();
    let (status, _, _) = client
        .post(
            &chat,
            stream("typing", "ab", Some(&id), "streaming", Some(2)),
        )
        .await;
    assert_eq!(status, 429);
    // The person pressed Stop.
    assert!(sim.cancel_stream(&id));
    let (status, _, body) = client
        .post(&chat, stream("message", "done", Some(&id), "final", None))
        .await;
    assert_eq!(status, 403);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cancelled by user")
    );
    // Too large.
    let (_, _, start) = client
        .post(&chat, stream("typing", "c", None, "streaming", Some(1)))
        .await;
    let big = start["id"].as_str().unwrap().to_owned();
    let (status, _, body) = client
        .post(
            &chat,
            stream("message", &"x".repeat(30_000), Some(&big), "final", None),
        )
        .await;
    assert_eq!(status, 403);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too large")
    );
    assert!(sim.bot_visible(&chat).iter().all(|a| !a.is_final_message()));

    // Past the total streaming time (shortened to 100 ms; the wait is longer than that).
    let sim = TeamsSimulator::start(SimulatorConfig {
        stream_max_duration: Duration::from_millis(100),
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    let chat = sim.personal_chat(&sim.person("ada"));
    let client = Client::new(&sim).await;
    let (_, _, start) = client
        .post(&chat, stream("typing", "b", None, "streaming", Some(1)))
        .await;
    let late = start["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, _, body) = client
        .post(&chat, stream("message", "done", Some(&late), "final", None))
        .await;
    assert_eq!(status, 403);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exceeded streaming time")
    );
}
