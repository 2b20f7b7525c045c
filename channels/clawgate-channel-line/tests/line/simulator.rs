//! The simulator itself, over raw HTTP, against the Messaging API facts
//! (platform-apis-wave2 §5): reply tokens (single use, expiry, no retry key), push retry keys
//! (UUID only, 409 with the accepted request id and the original ids, forgotten after 24
//! hours, a refused request registers nothing), limits and error bodies, request ids, the two
//! 429s, and the lost-answer fault (the message landed, the answer did not).

use clawgate_channel_line::simulator::{
    Fault, FaultKind, LineSimulator, PUSH_PATH, REPLY_PATH, SimulatorConfig, Via,
};
use serde_json::{Value, json};

use crate::peer::quick;

struct Answer {
    status: u16,
    body: Value,
    request_id: Option<String>,
    accepted: Option<String>,
}

async fn call(sim: &LineSimulator, path: &str, body: Value, retry_key: Option<&str>) -> Answer {
    call_as(sim, &sim.access_token(), path, body, retry_key).await
}

async fn call_as(
    sim: &LineSimulator,
    token: &str,
    path: &str,
    body: Value,
    retry_key: Option<&str>,
) -> Answer {
    let mut request = reqwest::Client::new()
        .post(format!("{}{path}", sim.api_url()))
        .bearer_auth(token)
        .json(&body);
    if let Some(key) = retry_key {
        request = request.header("X-Line-Retry-Key", key);
    }
    let response = request.send().await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (request_id, accepted) = (
        header("x-line-request-id"),
        header("x-line-accepted-request-id"),
    );
    Answer {
        status: response.status().as_u16(),
        request_id,
        accepted,
        body: response.json().await.unwrap_or(Value::Null),
    }
}

fn text(t: &str) -> Value {
    json!({ "type": "text", "text": t })
}

const KEY: &str = "123e4567-e89b-42d3-a456-426614174000";

#[tokio::test]
async fn reply_tokens_work_once_and_not_after_expiry() {
    let sim = LineSimulator::start(quick()).await.unwrap();
    let user = sim.user("ada");
    let written = sim.user_writes(&user, "hi");
    let body = json!({ "replyToken": written.reply_token, "messages": [text("one"), text("two")] });
    let with_key = call(&sim, REPLY_PATH, body.clone(), Some(KEY)).await;
    assert_eq!(with_key.status, 400, "the Reply API takes no retry key");
    let first = call(&sim, REPLY_PATH, body.clone(), None).await;
    assert_eq!(first.status, 200);
    let sent = first.body["sentMessages"].as_array().unwrap();
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|m| {
        m["id"]
            .as_str()
            .unwrap()
            .chars()
            .all(|c| c.is_ascii_digit())
            && m["quoteToken"].is_string()
    }));
    let again = call(&sim, REPLY_PATH, body, None).await;
    assert_eq!(
        (again.status, again.body.clone()),
        (400, json!({ "message": "Invalid reply token" }))
    );
    let other = sim.user_writes(&user, "more");
    assert!(sim.expire_reply_token(&other.reply_token));
    let late = call(
        &sim,
        REPLY_PATH,
        json!({ "replyToken": other.reply_token, "messages": [text("late")] }),
        None,
    )
    .await;
    assert_eq!(late.body["message"], "Invalid reply token");
    let unknown = call(
        &sim,
        REPLY_PATH,
        json!({ "replyToken": "nope", "messages": [text("x")] }),
        None,
    )
    .await;
    assert_eq!(unknown.status, 400);
    let texts: Vec<String> = sim
        .bot_messages(&user)
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(texts, ["one", "two"], "refused replies send nothing");
    sim.stop().await;
}

#[tokio::test]
async fn a_token_past_its_event_age_is_invalid_even_when_redelivered() {
    // Twenty minutes shortened to none: a token is refused however fresh its delivery.
    let config = SimulatorConfig {
        reply_token_max_age: std::time::Duration::ZERO,
        ..quick()
    };
    let sim = LineSimulator::start(config).await.unwrap();
    let user = sim.user("ada");
    let written = sim.user_writes(&user, "hi");
    sim.redeliver(&written.event_id);
    let body = json!({ "replyToken": written.reply_token, "messages": [text("late")] });
    assert_eq!(
        call(&sim, REPLY_PATH, body, None).await.body["message"],
        "Invalid reply token"
    );
    assert!(sim.bot_messages(&user).is_empty());
    sim.stop().await;
}

#[tokio::test]
async fn a_repeated_retry_key_answers_409_with_the_original_ids_until_it_is_forgotten() {
    let sim = LineSimulator::start(quick()).await.unwrap();
    let user = sim.user("ada");
    let body = json!({ "to": user, "messages": [text("once")] });
    let bad = call(&sim, PUSH_PATH, body.clone(), Some("not-a-uuid")).await;
    assert_eq!(bad.status, 400);
    // A refused request registers no key: the same key with a valid body is a first request.
    let invalid = call(
        &sim,
        PUSH_PATH,
        json!({ "to": user, "messages": [] }),
        Some(KEY),
    )
    .await;
    assert_eq!(invalid.status, 400);
    assert_eq!(invalid.body["details"][0]["property"], "messages");
    let first = call(&sim, PUSH_PATH, body.clone(), Some(KEY)).await;
    assert_eq!(first.status, 200);
    let repeat = call(&sim, PUSH_PATH, body.clone(), Some(KEY)).await;
    assert_eq!(repeat.status, 409);
    assert_eq!(repeat.body["message"], "The retry key is already accepted");
    assert_eq!(repeat.body["sentMessages"], first.body["sentMessages"]);
    assert_eq!(repeat.accepted, first.request_id);
    assert_ne!(
        repeat.request_id, first.request_id,
        "every answer has its own request id"
    );
    assert_eq!(sim.bot_messages(&user).len(), 1);
    sim.expire_retry_keys();
    assert_eq!(call(&sim, PUSH_PATH, body, Some(KEY)).await.status, 200);
    assert_eq!(
        sim.bot_messages(&user).len(),
        2,
        "after 24 hours the key is a new request"
    );
    sim.stop().await;
}

#[tokio::test]
async fn limits_error_bodies_auth_and_the_two_429s() {
    let config = SimulatorConfig {
        monthly_push_limit: Some(1),
        ..quick()
    };
    let sim = LineSimulator::start(config).await.unwrap();
    let user = sim.user("ada");
    let six: Vec<Value> = (0..6).map(|i| text(&i.to_string())).collect();
    let too_many = call(
        &sim,
        PUSH_PATH,
        json!({ "to": user, "messages": six }),
        None,
    )
    .await;
    assert_eq!(too_many.status, 400);
    assert_eq!(
        too_many.body["details"],
        json!([{ "message": "Size must be between 1 and 5", "property": "messages" }])
    );
    let long = "x".repeat(5_001);
    let too_long = call(
        &sim,
        PUSH_PATH,
        json!({ "to": user, "messages": [text("ok"), text(&long)] }),
        None,
    )
    .await;
    assert_eq!(
        too_long.body,
        json!({ "message": "The request body has 1 error(s)",
        "details": [{ "message": "Length must be between 0 and 5000", "property": "messages[1].text" }] })
    );
    let exact = "y".repeat(5_000);
    assert_eq!(
        call(
            &sim,
            PUSH_PATH,
            json!({ "to": user, "messages": [text(&exact)] }),
            None
        )
        .await
        .status,
        200
    );
    let nobody = call(
        &sim,
        PUSH_PATH,
        json!({ "to": "Uffffffffffffffffffffffffffffffff", "messages": [text("x")] }),
        None,
    )
    .await;
    assert_eq!(
        (nobody.status, nobody.body["details"][0]["property"].clone()),
        (400, json!("to"))
    );
    let quota = call(
        &sim,
        PUSH_PATH,
        json!({ "to": user, "messages": [text("x")] }),
        None,
    )
    .await;
    assert_eq!(
        (quota.status, quota.body["message"].clone()),
        (429, json!("You have reached your monthly limit."))
    );
    sim.inject(Fault::on(REPLY_PATH, FaultKind::RateLimited));
    let written = sim.user_writes(&user, "hi");
    let body = json!({ "replyToken": written.reply_token, "messages": [text("r")] });
    let limited = call(&sim, REPLY_PATH, body.clone(), None).await;
    assert_eq!(limited.status, 429);
    assert_eq!(
        limited.body["message"],
        "The API rate limit has been exceeded. Try again later."
    );
    assert_eq!(
        call(&sim, REPLY_PATH, body, None).await.status,
        200,
        "a 429 used nothing up"
    );
    let refused = call_as(
        &sim,
        "wrong",
        PUSH_PATH,
        json!({ "to": user, "messages": [text("x")] }),
        None,
    )
    .await;
    assert_eq!(refused.status, 401);
    assert!(
        refused.body["message"]
            .as_str()
            .unwrap()
            .starts_with("Authentication failed")
    );
    assert!(refused.request_id.is_some());
    let texts: Vec<String> = sim
        .bot_messages(&user)
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(texts, [exact, "r".to_owned()]);
    sim.stop().await;
}

#[tokio::test]
async fn a_lost_answer_leaves_the_message_and_webhooks_carry_line_fields() {
    let sim = LineSimulator::start(quick()).await.unwrap();
    let user = sim.user("ada");
    let group = sim.group("team", std::slice::from_ref(&user));
    sim.inject(Fault::on(PUSH_PATH, FaultKind::LoseAnswer));
    let lost = reqwest::Client::new()
        .post(format!("{}{PUSH_PATH}", sim.api_url()))
        .bearer_auth(sim.access_token())
        .json(&json!({ "to": group, "messages": [text("landed")] }))
        .send()
        .await;
    assert!(
        lost.is_err() || lost.unwrap().bytes().await.is_err(),
        "no answer"
    );
    let landed = sim.bot_messages(&group);
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].via, Via::Push(None));
    assert!(!sim.calls().last().unwrap().answered);
    // A group message's event: group source with the member, a ULID event id, a reply token.
    let written = sim.member_writes(&group, &user, "in the group");
    let event = sim.event(&written.event_id).unwrap();
    assert_eq!(
        event["source"],
        json!({ "type": "group", "groupId": group, "userId": user })
    );
    assert_eq!(written.event_id.len(), 26);
    assert_eq!(event["deliveryContext"]["isRedelivery"], false);
    assert_eq!(event["mode"], "active");
    assert_eq!(event["message"]["type"], "text");
    assert!(event["message"]["quoteToken"].is_string());
    assert!(event["timestamp"].as_u64().is_some());
    let follow = sim.follow(&user);
    assert_eq!(sim.event(&follow).unwrap()["type"], "follow");
    assert_eq!(user.len(), 33);
    assert!(user.starts_with('U') && group.starts_with('C'));
    sim.stop().await;
}
