//! The simulator's own facts, checked with a plain HTTP client and a plain websocket (not the
//! channel's code): platform-apis §3 status codes, bodies, headers, the nonce window and the
//! Gateway protocol.

use std::time::Duration;

use clawgate_channel_discord::simulator::{
    DiscordSimulator, Limit, SimUser, SimulatorConfig, WriteOptions,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

struct Api {
    sim: DiscordSimulator,
    bot: SimUser,
    http: reqwest::Client,
}

impl Api {
    async fn start(config: SimulatorConfig) -> Api {
        let sim = DiscordSimulator::start(config).await.unwrap();
        let bot = sim.add_bot("raw");
        Api {
            sim,
            bot,
            http: reqwest::Client::new(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.sim.api_base()))
            .header(
                "Authorization",
                format!("Bot {}", self.bot.token.clone().unwrap()),
            );
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }

    async fn post(&self, channel: &str, body: Value) -> (u16, reqwest::header::HeaderMap, Value) {
        self.call(
            reqwest::Method::POST,
            &format!("/channels/{channel}/messages"),
            Some(body),
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_discords_statuses_codes_and_form_trees() {
    let api = Api::start(SimulatorConfig::fast()).await;
    let channel = api.sim.add_channel("errors");
    let unauthorized = api
        .http
        .post(format!(
            "{}/channels/{channel}/messages",
            api.sim.api_base()
        ))
        .header("Authorization", "Bot wrong")
        .json(&json!({"content": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status().as_u16(), 401);
    assert_eq!(
        unauthorized.json::<Value>().await.unwrap(),
        json!({"message": "401: Unauthorized", "code": 0})
    );
    let (status, _, body) = api
        .post(&channel, json!({ "content": "x".repeat(2001) }))
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["code"], 50035);
    assert_eq!(body["message"], "Invalid Form Body");
    assert_eq!(
        body["errors"]["content"]["_errors"][0]["code"],
        "BASE_TYPE_MAX_LENGTH"
    );
    let (status, _, _) = api
        .post(&channel, json!({ "content": "x".repeat(2000) }))
        .await;
    assert_eq!(status, 200, "2000 characters fit");
    let (status, _, body) = api.post(&channel, json!({ "content": "" })).await;
    assert_eq!((status, body["code"].clone()), (400, json!(50006)));
    let (status, _, body) = api.post("1", json!({ "content": "x" })).await;
    assert_eq!(
        (status, body["code"].clone(), body["message"].clone()),
        (404, json!(10003), json!("Unknown Channel"))
    );
    let (status, _, body) = api
        .post(
            &channel,
            json!({ "content": "x", "message_reference": { "message_id": "42" } }),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(
        body["errors"]["message_reference"]["_errors"][0]["code"],
        "REPLIES_UNKNOWN_MESSAGE"
    );
    let (status, _, body) = api
        .post(&channel, json!({ "content": "x", "message_reference": { "message_id": "42", "fail_if_not_exists": false } }))
        .await;
    assert_eq!(status, 200);
    assert!(body.get("message_reference").is_none());
    let (status, _, body) = api
        .post(&channel, json!({ "content": "x", "nonce": "n".repeat(26) }))
        .await;
    assert_eq!(
        (
            status,
            body["errors"]["nonce"]["_errors"][0]["code"].clone()
        ),
        (400, json!("BASE_TYPE_MAX_LENGTH"))
    );
    let person = api.sim.add_person("p");
    let theirs = api
        .sim
        .person_writes(&channel, &person, "mine", WriteOptions::default());
    let path = format!("/channels/{channel}/messages/{}", theirs.id);
    let (status, _, body) = api
        .call(reqwest::Method::PATCH, &path, Some(json!({"content": "y"})))
        .await;
    assert_eq!((status, body["code"].clone()), (403, json!(50005)));
    let (status, _, body) = api.call(reqwest::Method::DELETE, &path, None).await;
    assert_eq!((status, body["code"].clone()), (403, json!(50013)));
    let (status, _, body) = api
        .call(
            reqwest::Method::DELETE,
            &format!("/channels/{channel}/messages/99"),
            None,
        )
        .await;
    assert_eq!(
        (status, body["code"].clone(), body["message"].clone()),
        (404, json!(10008), json!("Unknown Message"))
    );
    api.sim.deny(&channel, &api.bot, "SEND_MESSAGES");
    let (status, _, body) = api.post(&channel, json!({ "content": "x" })).await;
    assert_eq!(
        (status, body["code"].clone(), body["message"].clone()),
        (403, json!(50013), json!("Missing Permissions"))
    );
    api.sim.deny(&channel, &api.bot, "VIEW_CHANNEL");
    let (status, _, body) = api
        .call(
            reqwest::Method::GET,
            &format!("/channels/{channel}/messages"),
            None,
        )
        .await;
    assert_eq!((status, body["code"].clone()), (403, json!(50001)));
    assert_eq!(
        api.sim.invalid_requests(),
        5,
        "the 401 and four 403s count toward the ban"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_have_snowflakes_and_history_reads_newest_first() {
    let api = Api::start(SimulatorConfig::fast()).await;
    let channel = api.sim.add_channel("history");
    let mut ids = Vec::new();
    for n in 0..5 {
        let (status, _, body) = api
            .post(
                &channel,
                json!({ "content": format!("m{n}"), "nonce": format!("n{n}") }),
            )
            .await;
        assert_eq!(status, 200);
        assert_eq!(body["nonce"], json!(format!("n{n}")));
        assert_eq!(body["author"]["bot"], json!(true));
        assert!(body["timestamp"].as_str().unwrap().ends_with("+00:00"));
        ids.push(body["id"].as_str().unwrap().parse::<u64>().unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "snowflakes increase");
    let ms = clawgate_channel_discord::wire::snowflake_ms(&ids[0].to_string()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        now.abs_diff(ms) < 60_000,
        "a snowflake carries its creation time"
    );
    let (_, _, page) = api
        .call(
            reqwest::Method::GET,
            &format!("/channels/{channel}/messages?limit=3"),
            None,
        )
        .await;
    let contents: Vec<_> = page
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(contents, vec!["m4", "m3", "m2"]);
    let (status, _, _) = api
        .call(
            reqwest::Method::GET,
            &format!("/channels/{channel}/messages?limit=101"),
            None,
        )
        .await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforce_nonce_dedupes_inside_the_window_only() {
    let api = Api::start(SimulatorConfig {
        nonce_window: Duration::from_secs(120),
        ..SimulatorConfig::fast()
    })
    .await;
    let channel = api.sim.add_channel("nonce");
    let body = json!({ "content": "once", "nonce": "abc", "enforce_nonce": true });
    let (_, _, first) = api.post(&channel, body.clone()).await;
    let (_, _, second) = api.post(&channel, body.clone()).await;
    assert_eq!(first["id"], second["id"]);
    assert_eq!(api.sim.messages(&channel).len(), 1);
    // Without enforce_nonce the nonce is only echoed.
    api.post(&channel, json!({ "content": "twice", "nonce": "xyz" }))
        .await;
    api.post(&channel, json!({ "content": "twice", "nonce": "xyz" }))
        .await;
    assert_eq!(api.sim.messages(&channel).len(), 3);
    api.sim.advance_clock(Duration::from_secs(121));
    let (_, _, third) = api.post(&channel, body).await;
    assert_ne!(
        first["id"], third["id"],
        "past the window a new message is created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_answer_with_rate_limit_headers_and_429s_with_float_retry_after() {
    let api = Api::start(SimulatorConfig {
        create_limit: Limit::new(2, Duration::from_secs(30)),
        ..SimulatorConfig::fast()
    })
    .await;
    let channel = api.sim.add_channel("bucket");
    let other = api.sim.add_channel("other");
    let (_, headers, _) = api.post(&channel, json!({ "content": "1" })).await;
    let header = |h: &reqwest::header::HeaderMap, name: &str| {
        h.get(name).map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(header(&headers, "x-ratelimit-limit").as_deref(), Some("2"));
    assert_eq!(
        header(&headers, "x-ratelimit-remaining").as_deref(),
        Some("1")
    );
    let bucket = header(&headers, "x-ratelimit-bucket").unwrap();
    let reset_after: f64 = header(&headers, "x-ratelimit-reset-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(reset_after > 0.0 && reset_after <= 30.0);
    let reset: f64 = header(&headers, "x-ratelimit-reset")
        .unwrap()
        .parse()
        .unwrap();
    assert!(reset > 1.7e9, "epoch seconds");
    api.post(&channel, json!({ "content": "2" })).await;
    let (status, headers, body) = api.post(&channel, json!({ "content": "3" })).await;
    assert_eq!(status, 429);
    assert_eq!(body["global"], json!(false));
    assert!(body["retry_after"].as_f64().unwrap() > 0.0);
    assert_eq!(
        header(&headers, "x-ratelimit-scope").as_deref(),
        Some("user")
    );
    assert!(header(&headers, "retry-after").is_some());
    assert_eq!(header(&headers, "x-ratelimit-bucket"), Some(bucket.clone()));
    // Buckets are per channel: another channel is not limited.
    let (status, headers, _) = api.post(&other, json!({ "content": "1" })).await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "x-ratelimit-bucket"), Some(bucket));
    assert_eq!(api.sim.invalid_requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_invalid_requests_get_the_client_banned() {
    let api = Api::start(SimulatorConfig {
        invalid_request_limit: 3,
        ..SimulatorConfig::fast()
    })
    .await;
    let channel = api.sim.add_channel("ban");
    api.sim.deny(&channel, &api.bot, "SEND_MESSAGES");
    for _ in 0..4 {
        assert_eq!(api.post(&channel, json!({ "content": "x" })).await.0, 403);
    }
    let free = api.sim.add_channel("free");
    let (status, _, body) = api.post(&free, json!({ "content": "x" })).await;
    assert_eq!(status, 429, "banned even where it could write");
    assert!(body["message"].as_str().unwrap().contains("blocked"));
}

async fn next_payload<S>(ws: &mut S) -> Value
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Text(text))) => return serde_json::from_str(&text).unwrap(),
            Some(Ok(Message::Close(frame))) => {
                return json!({ "close": frame.map(|f| u16::from(f.code)) });
            }
            Some(Ok(_)) => continue,
            other => panic!("the socket ended: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_speaks_hello_identify_ready_dispatch_and_resume() {
    let api = Api::start(SimulatorConfig::fast()).await;
    let (status, _, gateway) = api.call(reqwest::Method::GET, "/gateway/bot", None).await;
    assert_eq!(status, 200);
    let url = gateway["url"].as_str().unwrap().to_owned();
    assert_eq!(gateway["shards"], 1);
    let token = api.bot.token.clone().unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}/?v=10&encoding=json"))
        .await
        .unwrap();
    let hello = next_payload(&mut ws).await;
    assert_eq!(hello["op"], 10);
    assert!(hello["d"]["heartbeat_interval"].as_u64().unwrap() > 0);
    ws.send(Message::Text(
        json!({"op": 1, "d": null}).to_string().into(),
    ))
    .await
    .unwrap();
    assert_eq!(next_payload(&mut ws).await["op"], 11, "heartbeat ACK");
    ws.send(Message::Text(
        json!({"op": 2, "d": {"token": token, "intents": 33281, "properties": {}}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let ready = next_payload(&mut ws).await;
    assert_eq!(
        (ready["op"].clone(), ready["t"].clone(), ready["s"].clone()),
        (json!(0), json!("READY"), json!(1))
    );
    let session = ready["d"]["session_id"].as_str().unwrap().to_owned();
    assert!(
        ready["d"]["resume_gateway_url"]
            .as_str()
            .unwrap()
            .starts_with("ws://")
    );
    assert_eq!(ready["d"]["user"]["id"], json!(api.bot.id));
    let channel = api.sim.add_channel("gw");
    let person = api.sim.add_person("p");
    api.sim
        .person_writes(&channel, &person, "hello", WriteOptions::default());
    let create = next_payload(&mut ws).await;
    assert_eq!(
        (create["t"].clone(), create["s"].clone()),
        (json!("MESSAGE_CREATE"), json!(2))
    );
    assert_eq!(create["d"]["content"], "hello");
    assert_eq!(create["d"]["guild_id"], json!(api.sim.guild_id()));
    drop(ws);
    api.sim
        .person_writes(&channel, &person, "missed", WriteOptions::default());
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}/?v=10&encoding=json"))
        .await
        .unwrap();
    assert_eq!(next_payload(&mut ws).await["op"], 10);
    ws.send(Message::Text(
        json!({"op": 6, "d": {"token": token, "session_id": session, "seq": 2}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let replayed = next_payload(&mut ws).await;
    assert_eq!(
        (replayed["s"].clone(), replayed["d"]["content"].clone()),
        (json!(3), json!("missed"))
    );
    assert_eq!(next_payload(&mut ws).await["t"], "RESUMED");
    // An unknown session: op 9, not resumable.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}/?v=10&encoding=json"))
        .await
        .unwrap();
    next_payload(&mut ws).await;
    ws.send(Message::Text(
        json!({"op": 6, "d": {"token": token, "session_id": "nope", "seq": 1}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    assert_eq!(
        next_payload(&mut ws).await,
        json!({"op": 9, "d": false, "s": null, "t": null})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_closes_with_discords_codes_and_hides_content_without_the_intent() {
    let api = Api::start(SimulatorConfig::fast()).await;
    let url = api.sim.gateway_url();
    let open = || async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}/?v=10&encoding=json"))
            .await
            .unwrap();
        next_payload(&mut ws).await;
        ws
    };
    let mut ws = open().await;
    ws.send(Message::Text(
        json!({"op": 2, "d": {"token": "bad", "intents": 512}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    assert_eq!(next_payload(&mut ws).await, json!({"close": 4004}));
    let mut ws = open().await;
    ws.send(Message::Text(json!({"op": 3, "d": {}}).to_string().into()))
        .await
        .unwrap();
    assert_eq!(next_payload(&mut ws).await, json!({"close": 4003}));
    let mut ws = open().await;
    ws.send(Message::Text("not json".to_string().into()))
        .await
        .unwrap();
    assert_eq!(next_payload(&mut ws).await, json!({"close": 4002}));
    let mut ws = open().await;
    ws.send(Message::Text(
        json!({"op": 2, "d": {"token": api.bot.token.clone().unwrap(), "intents": 1u64 << 40}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    assert_eq!(next_payload(&mut ws).await, json!({"close": 4013}));
    // GUILD_MESSAGES without MESSAGE_CONTENT: other people's text is empty.
    let mut ws = open().await;
    ws.send(Message::Text(
        json!({"op": 2, "d": {"token": api.bot.token.clone().unwrap(), "intents": 512}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    assert_eq!(next_payload(&mut ws).await["t"], "READY");
    let channel = api.sim.add_channel("c");
    let person = api.sim.add_person("p");
    api.sim
        .person_writes(&channel, &person, "secret text", WriteOptions::default());
    let create = next_payload(&mut ws).await;
    assert_eq!(create["d"]["content"], "");
}
