//! The control API: what an out-of-process client can do with the simulator.

use serde_json::{Value, json};

use crate::Harness;

async fn control(h: &Harness, path: &str, body: Option<Value>) -> (u16, Value) {
    let url = format!("{}/control/{path}", h.sim.base_url());
    let request = match body {
        Some(body) => h.http.post(url).json(&body),
        None => h.http.get(url),
    };
    let response = request.send().await.expect("answer");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

#[tokio::test]
async fn chats_writes_faults_and_the_record_over_http() {
    let h = Harness::start().await;
    let (_, private) = control(
        &h,
        "private_chat",
        Some(json!({"id": 42, "first_name": "Zed"})),
    )
    .await;
    let chat = private["chat_id"].as_i64().expect("chat id");
    assert_eq!(chat, 42);
    let (_, forum) = control(&h, "supergroup", Some(json!({"title": "F", "forum": true}))).await;
    let forum = forum["chat_id"].as_i64().expect("forum id");
    let (_, topic) = control(&h, "topic", Some(json!({"chat_id": forum, "name": "T"}))).await;
    let topic = topic["message_thread_id"].as_i64().expect("thread id");
    let (status, update) = control(
        &h,
        "write",
        Some(json!({"chat_id": forum, "from": {"id": 42, "first_name": "Zed"}, "text": "in a topic", "thread_id": topic})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(update["message"]["message_thread_id"], json!(topic));
    let (_, edited) = control(
        &h,
        "edit",
        Some(json!({"chat_id": forum, "message_id": update["message"]["message_id"], "text": "edited"})),
    )
    .await;
    assert_eq!(edited["edited_message"]["text"], json!("edited"));

    let (status, _) = control(
        &h,
        "fault",
        Some(json!({"method": "sendMessage", "kind": "error", "status": 400, "description": "Bad Request: injected"})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        h.send(chat, "x").await.description(),
        "Bad Request: injected"
    );
    assert_eq!(h.send(chat, "y").await.status, 200);

    let (_, messages) = control(&h, &format!("messages/{chat}"), None).await;
    assert_eq!(messages[0]["text"], json!("y"));
    assert_eq!(messages[0]["from_bot_self"], json!(true));
    let (_, log) = control(&h, "log", None).await;
    let statuses: Vec<&Value> = log
        .as_array()
        .expect("array")
        .iter()
        .map(|r| &r["status"])
        .collect();
    assert_eq!(statuses, [&json!(400), &json!(200)]);
    assert_eq!(log[1]["method"], json!("sendMessage"));
    assert_eq!(log[1]["params"]["text"], json!("y"));

    h.call(
        "sendChatAction",
        json!({"chat_id": chat, "action": "typing"}),
    )
    .await
    .result();
    h.call(
        "sendMessageDraft",
        json!({"chat_id": chat, "draft_id": 3, "text": "dr"}),
    )
    .await
    .result();
    let (_, actions) = control(&h, &format!("chat_actions/{chat}"), None).await;
    assert_eq!(actions, json!(["typing"]));
    let (_, drafts) = control(&h, &format!("drafts/{chat}"), None).await;
    assert_eq!(
        (&drafts[0]["draft_id"], &drafts[0]["text"]),
        (&json!(3), &json!("dr"))
    );
    let (_, pending) = control(&h, "pending_updates", None).await;
    assert_eq!(pending["count"], json!(2), "the topic message and its edit");
    let (_, deliveries) = control(&h, "webhook_deliveries", None).await;
    assert_eq!(deliveries, json!([]));

    let (_, group) = control(&h, "group", Some(json!({"title": "G"}))).await;
    let group = group["chat_id"].as_i64().expect("group");
    let (_, upgraded) = control(&h, "upgrade", Some(json!({"chat_id": group}))).await;
    assert_eq!(
        h.send(group, "x").await.body["parameters"]["migrate_to_chat_id"],
        upgraded["chat_id"]
    );
    control(&h, "block", Some(json!({"user_id": 42}))).await;
    assert_eq!(h.send(chat, "z").await.status, 403);

    // Mistakes are explained, not panicked on.
    let (status, error) = control(
        &h,
        "write",
        Some(json!({"chat_id": 7, "from": {"id": 1}, "text": "x"})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|e| e.contains("no chat 7")),
        "{error}"
    );
    let (status, _) = control(&h, "fault", Some(json!({"kind": "meteor"}))).await;
    assert_eq!(status, 400);
    h.sim.stop().await;
}
