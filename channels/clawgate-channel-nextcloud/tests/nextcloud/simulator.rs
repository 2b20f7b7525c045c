//! The simulator as Talk's documents describe it, over raw HTTP: the OCS envelope, 401 with
//! statuscode 997, 304 long polls and `X-Chat-Last-Given`, history pages, the bot API's 201
//! without an id and its signature over random ‖ message, the send refusals (403, 404, 412,
//! 413, 429), and the webhook signature over random ‖ body.

use std::time::Duration;

use clawgate_channel_nextcloud::sign;
use clawgate_channel_nextcloud::simulator::{
    Fault, FaultKind, NextcloudSimulator, Op, RoomType, SimulatorConfig,
};
use serde_json::{Value, json};

struct Client {
    http: reqwest::Client,
    base: String,
    user: String,
    password: String,
}

impl Client {
    fn new(sim: &NextcloudSimulator) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: format!("{}/ocs/v2.php/apps/spreed/api", sim.base_url()),
            user: sim.config().user.clone(),
            password: sim.config().app_password.clone(),
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("OCS-APIRequest", "true")
            .header("Accept", "application/json")
            .basic_auth(&self.user, Some(&self.password))
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            headers,
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_api_speaks_the_ocs_envelope_and_long_polls_with_304() {
    let sim = NextcloudSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let room = sim.add_conversation("team", RoomType::Group);
    let client = Client::new(&sim);
    // Wrong credentials: 401, statuscode 997.
    let (status, body, _) = client
        .send(
            client
                .http
                .get(format!("{}/v1/chat/{}", client.base, room.token))
                .header("OCS-APIRequest", "true")
                .header("Accept", "application/json")
                .basic_auth("clawgate", Some("wrong")),
        )
        .await;
    assert_eq!(
        (status, body["ocs"]["meta"]["statuscode"].clone()),
        (401, json!(997))
    );
    // A send: 201 with the message, its id and referenceId.
    let (status, body, _) = client
        .send(
            client
                .request(reqwest::Method::POST, &format!("/v1/chat/{}", room.token))
                .json(&json!({ "message": "hi", "referenceId": "a".repeat(64) })),
        )
        .await;
    assert_eq!(status, 201);
    assert_eq!(body["ocs"]["meta"]["status"], "ok");
    let id = body["ocs"]["data"]["id"].as_i64().unwrap();
    assert_eq!(body["ocs"]["data"]["referenceId"], "a".repeat(64));
    // The long poll after it: nothing within 1 s → 304 with no body.
    let started = std::time::Instant::now();
    let (status, body, _) = client
        .send(client.request(
            reqwest::Method::GET,
            &format!(
                "/v1/chat/{}?lookIntoFuture=1&lastKnownMessageId={id}&timeout=1",
                room.token
            ),
        ))
        .await;
    assert_eq!((status, body), (304, Value::Null));
    assert!(started.elapsed() >= Duration::from_millis(900));
    // A waiting poll is woken by a new message, with X-Chat-Last-Given.
    let poll = client.send(client.request(
        reqwest::Method::GET,
        &format!(
            "/v1/chat/{}?lookIntoFuture=1&lastKnownMessageId={id}&timeout=30",
            room.token
        ),
    ));
    let writer = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        sim.person_writes(&room.token, "ada", "Ada", "woken")
    };
    let ((status, body, headers), new_id) = tokio::join!(poll, writer);
    assert_eq!(status, 200);
    assert_eq!(body["ocs"]["data"][0]["message"], "woken");
    assert_eq!(
        headers["x-chat-last-given"].to_str().unwrap(),
        new_id.to_string()
    );
    // History backwards: newest first, paged by lastKnownMessageId.
    let (_, body, headers) = client
        .send(client.request(
            reqwest::Method::GET,
            &format!("/v1/chat/{}?lookIntoFuture=0&limit=2", room.token),
        ))
        .await;
    let ids: Vec<i64> = body["ocs"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![new_id, id]);
    let oldest: i64 = headers["x-chat-last-given"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let (_, body, _) = client
        .send(client.request(
            reqwest::Method::GET,
            &format!(
                "/v1/chat/{}?lookIntoFuture=0&limit=2&lastKnownMessageId={oldest}",
                room.token
            ),
        ))
        .await;
    assert_eq!(
        body["ocs"]["data"][0]["systemMessage"],
        "conversation_created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_are_refused_as_talk_refuses_them() {
    let sim = NextcloudSimulator::start(SimulatorConfig {
        max_length: 10,
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    let client = Client::new(&sim);
    let room = sim.add_conversation("team", RoomType::Group);
    let send = |token: &str, text: &str| {
        client
            .request(reqwest::Method::POST, &format!("/v1/chat/{token}"))
            .json(&json!({ "message": text }))
    };
    assert_eq!(client.send(send(&room.token, "")).await.0, 400);
    assert_eq!(client.send(send(&room.token, "12345678901")).await.0, 413);
    assert_eq!(client.send(send("nosuchroom", "x")).await.0, 404);
    sim.update_conversation(&room.token, |r| r.read_only = true);
    assert_eq!(client.send(send(&room.token, "x")).await.0, 403);
    sim.update_conversation(&room.token, |r| {
        r.read_only = false;
        r.lobby = true;
    });
    assert_eq!(client.send(send(&room.token, "x")).await.0, 412);
    sim.update_conversation(&room.token, |r| r.lobby = false);
    sim.inject(Fault::new(Some(Op::ChatSend), FaultKind::Refuse(429)));
    let (status, body, _) = client.send(send(&room.token, "x")).await;
    assert_eq!(
        (status, body["ocs"]["meta"]["status"].clone()),
        (429, json!("failure"))
    );
    assert_eq!(sim.user_texts(&room.token), Vec::<String>::new());
    assert_eq!(client.send(send(&room.token, "x")).await.0, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bot_api_answers_201_without_an_id_and_checks_random_plus_message() {
    let sim = NextcloudSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let client = Client::new(&sim);
    let room = sim.add_conversation("team", RoomType::Group);
    let secret = sim.config().bot_secret.clone();
    let bot_send = |token: &str, text: &str, random: &str, signature: &str| {
        client
            .http
            .post(format!("{}/v1/bot/{token}/message", client.base))
            .header("OCS-APIRequest", "true")
            .header("Accept", "application/json")
            .header("X-Nextcloud-Talk-Bot-Random", random)
            .header("X-Nextcloud-Talk-Bot-Signature", signature)
            .json(&json!({ "message": text, "referenceId": "b".repeat(64) }))
    };
    let random = "q".repeat(32);
    let good = sign::signature(&secret, &random, b"hello");
    // Not enabled in this conversation yet: not verified.
    assert_eq!(
        client
            .send(bot_send(&room.token, "hello", &random, &good))
            .await
            .0,
        401
    );
    sim.enable_bot(&room.token);
    let (status, body, _) = client
        .send(bot_send(&room.token, "hello", &random, &good))
        .await;
    assert_eq!(status, 201);
    assert_eq!(body["ocs"]["data"], Value::Null, "no message id");
    // The signature covers the message text, not the JSON body.
    let over_body = sign::signature(
        &secret,
        &random,
        json!({ "message": "hello", "referenceId": "b".repeat(64) })
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        client
            .send(bot_send(&room.token, "hello", &random, &over_body))
            .await
            .0,
        401
    );
    // A random under 32 characters is refused.
    let short = "q".repeat(31);
    let short_sig = sign::signature(&secret, &short, b"hello");
    assert_eq!(
        client
            .send(bot_send(&room.token, "hello", &short, &short_sig))
            .await
            .0,
        401
    );
    let landed = sim.messages(&room.token);
    let bots: Vec<_> = landed.iter().filter(|m| m.actor_type == "bots").collect();
    assert_eq!(bots.len(), 1);
    assert_eq!(bots[0].reference_id, "b".repeat(64));
    assert_eq!(sim.bot_texts(&room.token), vec!["hello"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_signed_over_random_and_body_and_bots_wake_no_bots() {
    let sim = NextcloudSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String, String)>::new()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let keep = keep.clone();
            async move {
                let h = |n: &str| headers.get(n).unwrap().to_str().unwrap().to_owned();
                keep.lock().unwrap().push((
                    h("x-nextcloud-talk-random"),
                    h("x-nextcloud-talk-signature"),
                    body,
                ));
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    sim.set_bot_url(Some(&url));
    let room = sim.add_conversation("team", RoomType::Group);
    sim.enable_bot(&room.token);
    sim.person_writes(&room.token, "ada", "Ada", "hi bot");
    sim.other_bot_writes(&room.token, "other", "bots wake no bots");
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    let got = got.lock().unwrap().clone();
    assert_eq!(
        got.len(),
        2,
        "Join and the person's message; nothing for the bot's"
    );
    for (random, signature, body) in &got {
        assert!(random.len() >= 32);
        assert!(sign::verify(
            &sim.config().bot_secret,
            random,
            body.as_bytes(),
            signature
        ));
    }
    // Each event is its own asynchronous POST (as Talk's): they may arrive in any order.
    let events: Vec<Value> = got
        .iter()
        .map(|(_, _, body)| serde_json::from_str(body).unwrap())
        .collect();
    let mut types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    types.sort_unstable();
    assert_eq!(types, vec!["Create", "Join"]);
    let create = events.iter().find(|e| e["type"] == "Create").unwrap();
    assert_eq!(create["actor"]["id"], "users/ada");
    assert_eq!(create["target"]["id"], room.token);
    let content: Value =
        serde_json::from_str(create["object"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content["message"], "hi bot");
    assert!(
        sim.deliveries()
            .iter()
            .all(|d| d.status == 200 && !d.dropped())
    );
}
