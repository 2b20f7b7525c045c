//! The simulator's own shape, as a client that is not the channel sees it: DSM's envelope
//! with HTTP 200 for failures, the codes, the quoted token, the two user-id spaces.

use clawgate_channel_synology::simulator::{Conversation, SynologySimulator};
use serde_json::{Value, json};

use crate::peer::quick;

async fn call(sim: &SynologySimulator, query: &str, payload: Option<Value>) -> (u16, Value) {
    let url = format!("{}/webapi/entry.cgi?{query}", sim.base_url());
    let http = reqwest::Client::new();
    let request = match payload {
        Some(p) => http
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("payload", &p.to_string())
                    .finish(),
            ),
        None => http.get(url),
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn q(method: &str, token: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("api", "SYNO.Chat.External")
        .append_pair("method", method)
        .append_pair("version", "2")
        .append_pair("token", token)
        .finish()
}

#[tokio::test]
async fn failures_are_http_200_with_dsm_codes() {
    let sim = SynologySimulator::start(quick()).await.unwrap();
    let bot = format!("\"{}\"", sim.bot_token());
    let cases = [
        (
            "api=SYNO.Chat.Other&method=user_list&version=2".to_owned(),
            102,
        ),
        (q("post_list", &bot), 103),
        (q("user_list", &bot).replace("version=2", "version=9"), 104),
        (q("user_list", &sim.bot_token()), 404),
        (q("user_list", "\"wrong\""), 404),
    ];
    for (query, code) in cases {
        let (status, body) = call(&sim, &query, None).await;
        assert_eq!(status, 200, "{query}");
        assert_eq!(body["success"], false, "{query}");
        assert_eq!(body["error"]["code"], code, "{query}");
    }
    let (_, body) = call(&sim, &q("chatbot", &bot), Some(json!({ "text": "no one" }))).await;
    assert_eq!(body["error"]["code"], 117);
    let (_, body) = call(
        &sim,
        &q("chatbot", &bot),
        Some(json!({ "text": "x", "user_ids": [424242] })),
    )
    .await;
    assert_eq!(body["error"]["code"], 117);
    let (_, body) = call(
        &sim,
        &q("chatbot", &bot),
        Some(json!({ "text": "x".repeat(2001), "user_ids": [1] })),
    )
    .await;
    assert_eq!(body["error"]["code"], 117);
    assert!(sim.posts().is_empty(), "refusals post nothing");
}

#[tokio::test]
async fn user_list_names_the_ids_chatbot_wants_and_posts_are_rate_limited() {
    let sim = SynologySimulator::start(clawgate_channel_synology::simulator::SimulatorConfig {
        min_send_interval: std::time::Duration::from_secs(30),
        ..quick()
    })
    .await
    .unwrap();
    let ada = sim.add_user("ada", "Ada L.");
    let bot = format!("\"{}\"", sim.bot_token());
    let (_, body) = call(&sim, &q("user_list", &bot), None).await;
    assert_eq!(body["success"], true);
    let users = body["data"]["users"].as_array().unwrap();
    assert_eq!(users[0]["username"], "ada");
    assert_eq!(users[0]["user_id"], ada.user_id);
    let (_, body) = call(
        &sim,
        &q("chatbot", &bot),
        Some(json!({ "text": "hi", "user_ids": [ada.user_id] })),
    )
    .await;
    assert_eq!(body, json!({ "success": true }));
    let (_, body) = call(
        &sim,
        &q("chatbot", &bot),
        Some(json!({ "text": "again", "user_ids": [ada.user_id] })),
    )
    .await;
    assert_eq!(body["error"]["code"], 411);
    let posts = sim.posts();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].conversation, Conversation::Direct(ada.user_id));
    let channel = sim.add_channel("general", "hook");
    let (_, body) = call(&sim, &q("channel_list", &bot), None).await;
    assert_eq!(
        body["data"]["channels"][0]["channel_id"],
        channel.channel_id
    );
    // The incoming webhook's token posts into its own channel only; GET with the payload in
    // the query works as well.
    let query = format!(
        "{}&payload={}",
        q("incoming", &format!("\"{}\"", channel.incoming_token)),
        form_urlencoded::byte_serialize(json!({ "text": "to all" }).to_string().as_bytes())
            .collect::<String>()
    );
    let (_, body) = call(&sim, &query, None).await;
    assert_eq!(body, json!({ "success": true }));
    assert_eq!(sim.integration_texts_in(channel.channel_id), vec!["to all"]);
}
