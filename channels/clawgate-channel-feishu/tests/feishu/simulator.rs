//! The simulator's own fidelity to platform-apis-wave2 §13, by raw HTTP (no channel code in
//! the way): tenant tokens and their errors, `code ≠ 0` bodies, `uuid` dedupe and its hour,
//! recall, history paging, CardKit sequences.

use std::time::Duration;

use clawgate_channel_feishu::simulator::{FeishuSimulator, SimulatorConfig};
use serde_json::{Value, json};

use crate::peer::quick;

struct Api {
    base: String,
    http: reqwest::Client,
    token: String,
}

impl Api {
    async fn new(sim: &FeishuSimulator) -> Api {
        let http = reqwest::Client::new();
        let base = sim.api_url();
        let answer: Value = http
            .post(format!(
                "{base}/open-apis/auth/v3/tenant_access_token/internal"
            ))
            .json(&json!({ "app_id": sim.config().app_id, "app_secret": sim.config().app_secret }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["code"], 0, "{answer}");
        let token = answer["tenant_access_token"].as_str().unwrap().to_owned();
        Api { base, http, token }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        (
            response.status().as_u16(),
            response.json().await.unwrap_or(Value::Null),
        )
    }
}

fn text(t: &str) -> String {
    json!({ "text": t }).to_string()
}

#[tokio::test]
async fn tenant_tokens_expire_and_bad_credentials_answer_feishus_bodies() {
    let sim = FeishuSimulator::start(SimulatorConfig {
        token_ttl: Duration::from_secs(3_600),
        ..quick()
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let token_url = format!(
        "{}/open-apis/auth/v3/tenant_access_token/internal",
        sim.api_url()
    );
    let ask = |secret: &str| {
        http.post(&token_url)
            .json(&json!({ "app_id": sim.config().app_id, "app_secret": secret }))
            .send()
    };
    let bad = ask("nope").await.unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    assert_eq!(
        bad.json::<Value>().await.unwrap(),
        json!({ "code": 10014, "msg": "app secret invalid",
        "error": { "log_id": "simulator", "troubleshooter": "https://open.feishu.cn/search?q=10014" } })
    );
    let first: Value = ask(&sim.config().app_secret)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let expire = first["expire"].as_u64().unwrap();
    assert!((3_590..=3_600).contains(&expire), "{first}");
    let again: Value = ask(&sim.config().app_secret)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        again["tenant_access_token"], first["tenant_access_token"],
        "more than 30 minutes left: the same token"
    );
    let api = Api::new(&sim).await;
    sim.expire_tokens();
    let (status, body) = api
        .call(reqwest::Method::GET, "/open-apis/bot/v3/info", None)
        .await;
    assert_eq!((status, body["code"].as_i64()), (400, Some(99_991_663)));
    let none = http
        .get(format!("{}/open-apis/bot/v3/info", sim.api_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(none.json::<Value>().await.unwrap()["code"], 99_991_661);
    sim.stop().await;
}

#[tokio::test]
async fn a_uuid_dedupes_for_its_hour_and_then_sends_again() {
    let sim = FeishuSimulator::start(quick()).await.unwrap();
    let api = Api::new(&sim).await;
    let chat = sim.group("g", &["ada"]);
    let create = || {
        api.call(
            reqwest::Method::POST,
            "/open-apis/im/v1/messages?receive_id_type=chat_id",
            Some(json!({ "receive_id": chat, "msg_type": "text", "content": text("once"), "uuid": "u-1" })),
        )
    };
    let (_, first) = create().await;
    let (_, second) = create().await;
    assert_eq!(first["data"]["message_id"], second["data"]["message_id"]);
    assert_eq!(sim.bot_messages(&chat).len(), 1);
    sim.expire_uuids();
    let (_, third) = create().await;
    assert_ne!(
        third["data"]["message_id"], first["data"]["message_id"],
        "the hour passed"
    );
    assert_eq!(sim.bot_messages(&chat).len(), 2);
    let (status, long) = api
        .call(
            reqwest::Method::POST,
            "/open-apis/im/v1/messages?receive_id_type=chat_id",
            Some(json!({ "receive_id": chat, "msg_type": "text", "content": text("x"), "uuid": "u".repeat(51) })),
        )
        .await;
    assert_eq!((status, long["code"].as_i64()), (400, Some(99_992_402)));
    // Recall, then recall again: the second is 230011.
    let id = first["data"]["message_id"].as_str().unwrap();
    let path = format!("/open-apis/im/v1/messages/{id}");
    assert_eq!(
        api.call(reqwest::Method::DELETE, &path, None).await.1["code"],
        0
    );
    assert_eq!(
        api.call(reqwest::Method::DELETE, &path, None).await.1["code"],
        230_011
    );
    sim.remove_bot(&chat);
    let (_, out) = api
        .call(
            reqwest::Method::POST,
            "/open-apis/im/v1/messages?receive_id_type=chat_id",
            Some(json!({ "receive_id": chat, "msg_type": "text", "content": text("x") })),
        )
        .await;
    assert_eq!(out["code"], 230_002);
    sim.stop().await;
}

#[tokio::test]
async fn history_pages_in_order_and_cards_need_increasing_sequences() {
    let sim = FeishuSimulator::start(quick()).await.unwrap();
    let api = Api::new(&sim).await;
    let chat = sim.group("g", &["ada"]);
    for n in 0..5 {
        sim.writes(&chat, "ada", &format!("m{n}"));
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut path = format!(
            "/open-apis/im/v1/messages?container_id_type=chat&container_id={chat}&page_size=2"
        );
        if let Some(token) = &token {
            path.push_str(&format!("&page_token={token}"));
        }
        let (_, page) = api.call(reqwest::Method::GET, &path, None).await;
        for item in page["data"]["items"].as_array().unwrap() {
            let content: Value =
                serde_json::from_str(item["body"]["content"].as_str().unwrap()).unwrap();
            seen.push(content["text"].as_str().unwrap().to_owned());
            assert_eq!(item["sender"]["sender_type"], "user");
        }
        match page["data"]["page_token"].as_str() {
            Some(next) if page["data"]["has_more"] == true => token = Some(next.to_owned()),
            _ => break,
        }
    }
    assert_eq!(seen, ["m0", "m1", "m2", "m3", "m4"]);
    let card = json!({ "schema": "2.0", "config": { "streaming_mode": true },
        "body": { "elements": [{ "tag": "markdown", "content": "", "element_id": "reply" }] } });
    let (_, created) = api
        .call(
            reqwest::Method::POST,
            "/open-apis/cardkit/v1/cards",
            Some(json!({ "type": "card_json", "data": card.to_string() })),
        )
        .await;
    let card_id = created["data"]["card_id"].as_str().unwrap().to_owned();
    let content = format!("/open-apis/cardkit/v1/cards/{card_id}/elements/reply/content");
    let put = |sequence: i64| {
        api.call(
            reqwest::Method::PUT,
            &content,
            Some(json!({ "content": "a", "sequence": sequence })),
        )
    };
    assert_eq!(put(5).await.1["code"], 0);
    assert_eq!(put(5).await.1["code"], 300_317);
    assert_eq!(put(4).await.1["code"], 300_317);
    assert!(sim.close_streaming(&card_id));
    assert_eq!(put(6).await.1["code"], 300_309);
    let (status, missing) = api
        .call(reqwest::Method::GET, "/open-apis/im/v1/nothing", None)
        .await;
    assert_eq!((status, missing["code"].as_i64()), (404, Some(404)));
    sim.stop().await;
}
