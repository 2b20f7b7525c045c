//! The envelope and every row of the error table the simulator implements.

use std::time::Duration;

use clawgate_channel_telegram::simulator::{SimUser, SimulatorConfig, WriteOptions};
use serde_json::{Value, json};

use crate::{Harness, alice, bob};

#[tokio::test]
async fn envelope_key_order_and_status() {
    let h = Harness::start().await;
    let response = h
        .http
        .post(h.url("sendMessage"))
        .json(&json!({"chat_id": 1, "text": "x"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status().as_u16(), 400);
    let text = response.text().await.expect("body");
    assert_eq!(
        text,
        r#"{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}"#
    );
    let me = h.call("getMe", json!({})).await;
    assert_eq!(me.status, 200);
    assert_eq!(me.result()["id"], json!(h.sim.bot_user_id()));
    assert_eq!(me.result()["is_bot"], json!(true));
    assert_eq!(me.result()["username"], json!("clawgate_test_bot"));
    assert_eq!(h.sim.bot_user_id(), 123_456_789);
    let config = format!("{:?}", SimulatorConfig::default());
    assert!(
        !config.contains("AAtest"),
        "the token stays out of Debug: {config}"
    );
    assert!(config.contains("123456789"), "{config}");
    h.sim.stop().await;
}

#[tokio::test]
async fn token_and_method_errors() {
    let h = Harness::start().await;
    let base = h.sim.base_url();
    let cases: &[(&str, String, u16, &str)] = &[
        (
            "wrong token",
            format!("{base}/bot123456789:wrong/getMe"),
            401,
            "Unauthorized",
        ),
        (
            "malformed token",
            format!("{base}/botnonsense/getMe"),
            401,
            "Unauthorized: invalid token specified",
        ),
        (
            "unknown method",
            h.url("sendTelepathy"),
            404,
            "Not Found: method not found",
        ),
    ];
    for (name, url, status, description) in cases {
        let answer = crate::answer(h.http.get(url).send().await.expect("answer")).await;
        assert_eq!(answer.status, *status, "{name}");
        assert_eq!(answer.body["error_code"], json!(status), "{name}");
        assert_eq!(answer.body["ok"], json!(false), "{name}");
        assert_eq!(answer.description(), *description, "{name}");
    }
    let refused: Vec<(String, u16)> = h
        .sim
        .log()
        .into_iter()
        .map(|r| (r.method, r.status))
        .collect();
    assert_eq!(
        refused,
        [
            ("getMe".to_owned(), 401),
            ("getMe".to_owned(), 401),
            ("sendTelepathy".to_owned(), 404)
        ],
        "refused calls are in the log too"
    );
    // Method names are case-insensitive; the log keeps the canonical case.
    let answer = crate::answer(h.http.get(h.url("GETME")).send().await.expect("answer")).await;
    assert_eq!(answer.status, 200);
    let log = h.sim.log();
    assert_eq!(log.last().map(|r| r.method.as_str()), Some("getMe"));
    h.sim.stop().await;
}

/// One row per case of §1.2 reached through sendMessage / editMessageText / deleteMessage.
#[tokio::test]
async fn error_table() {
    let h = Harness::start().await;
    let sim = &h.sim;
    let private = sim.private_chat(&alice());
    let blocked = sim.private_chat(&bob());
    sim.block_bot(bob().id);
    let gone = sim.private_chat(&SimUser::person(1003, "Gone"));
    sim.deactivate_user(gone);
    let group = sim.group("Family");
    let kicked_group = sim.group("Old friends");
    sim.kick_bot(kicked_group);
    let kicked_super = sim.supergroup("Work", false);
    sim.kick_bot(kicked_super);
    let channel = sim.channel("News");
    sim.kick_bot(channel);
    let forum = sim.supergroup("Forum", true);
    let upgraded = sim.group("Growing");
    let new_id = sim.upgrade_to_supergroup(upgraded);
    let user_message = sim.user_writes(private, &alice(), "hello there", WriteOptions::default())
        ["message"]["message_id"]
        .as_i64()
        .expect("id");
    let own = h.send(private, "mine").await.result()["message_id"]
        .as_i64()
        .expect("id");
    let not_modified = "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message";

    let cases: Vec<(&str, &str, Value, u16, &str)> = vec![
        (
            "unknown chat",
            "sendMessage",
            json!({"chat_id": 999, "text": "x"}),
            400,
            "Bad Request: chat not found",
        ),
        (
            "empty chat_id",
            "sendMessage",
            json!({"text": "x"}),
            400,
            "Bad Request: chat_id is empty",
        ),
        (
            "empty text",
            "sendMessage",
            json!({"chat_id": private, "text": ""}),
            400,
            "Bad Request: message text is empty",
        ),
        (
            "blank after parsing",
            "sendMessage",
            json!({"chat_id": private, "text": "<b> </b>", "parse_mode": "HTML"}),
            400,
            "Bad Request: message text is empty",
        ),
        (
            "too long",
            "sendMessage",
            json!({"chat_id": private, "text": "x".repeat(4097)}),
            400,
            "Bad Request: message is too long",
        ),
        (
            "bad markup",
            "sendMessage",
            json!({"chat_id": private, "text": "<b>x", "parse_mode": "HTML"}),
            400,
            "Bad Request: can't parse entities: Can't find end tag corresponding to start tag \"b\"",
        ),
        (
            "bad v2 markup",
            "sendMessage",
            json!({"chat_id": private, "text": "1.5", "parse_mode": "MarkdownV2"}),
            400,
            "Bad Request: can't parse entities: Character '.' is reserved and must be escaped with the preceding '\\'",
        ),
        (
            "blocked",
            "sendMessage",
            json!({"chat_id": blocked, "text": "x"}),
            403,
            "Forbidden: bot was blocked by the user",
        ),
        (
            "kicked group",
            "sendMessage",
            json!({"chat_id": kicked_group, "text": "x"}),
            403,
            "Forbidden: bot was kicked from the group chat",
        ),
        (
            "kicked supergroup",
            "sendMessage",
            json!({"chat_id": kicked_super, "text": "x"}),
            403,
            "Forbidden: bot was kicked from the supergroup chat",
        ),
        (
            "not in channel",
            "sendMessage",
            json!({"chat_id": channel, "text": "x"}),
            403,
            "Forbidden: bot is not a member of the channel chat",
        ),
        (
            "unknown topic",
            "sendMessage",
            json!({"chat_id": forum, "text": "x", "message_thread_id": 77}),
            400,
            "Bad Request: message thread not found",
        ),
        (
            "reply target missing",
            "sendMessage",
            json!({"chat_id": private, "text": "x", "reply_parameters": {"message_id": 999}}),
            400,
            "Bad Request: message to be replied not found",
        ),
        (
            "quote not in target",
            "sendMessage",
            json!({"chat_id": private, "text": "x", "reply_parameters": {"message_id": user_message, "quote": "absent"}}),
            400,
            "Bad Request: QUOTE_TEXT_INVALID",
        ),
        (
            "edit missing",
            "editMessageText",
            json!({"chat_id": private, "message_id": 999, "text": "x"}),
            400,
            "Bad Request: message to edit not found",
        ),
        (
            "edit others'",
            "editMessageText",
            json!({"chat_id": private, "message_id": user_message, "text": "x"}),
            400,
            "Bad Request: message can't be edited",
        ),
        (
            "edit identical",
            "editMessageText",
            json!({"chat_id": private, "message_id": own, "text": "mine"}),
            400,
            not_modified,
        ),
        (
            "delete missing",
            "deleteMessage",
            json!({"chat_id": private, "message_id": 999}),
            400,
            "Bad Request: message to delete not found",
        ),
        (
            "delete others' in a group",
            "deleteMessage",
            json!({"chat_id": group, "message_id": sim.user_writes(group, &alice(), "hi", WriteOptions::default())["message"]["message_id"]}),
            400,
            "Bad Request: message can't be deleted",
        ),
        (
            "chat action",
            "sendChatAction",
            json!({"chat_id": private, "action": "dancing"}),
            400,
            "Bad Request: wrong parameter action in request",
        ),
    ];
    for (name, method, params, status, description) in &cases {
        let answer = h.call(method, params.clone()).await;
        assert_eq!(answer.status, *status, "{name}: {answer:?}");
        assert_eq!(answer.body["error_code"], json!(status), "{name}");
        assert_eq!(answer.description(), *description, "{name}");
    }
    // The migrated group: 400 with parameters.migrate_to_chat_id.
    let answer = h.send(upgraded, "x").await;
    assert_eq!(answer.status, 400);
    assert_eq!(
        answer.description(),
        "Bad Request: group chat was upgraded to a supergroup chat"
    );
    assert_eq!(
        answer.body["parameters"]["migrate_to_chat_id"],
        json!(new_id)
    );
    assert!(h.send(new_id, "x").await.status == 200);
    // None of the refusals left a message behind.
    let texts: Vec<Option<String>> = sim.messages(private).into_iter().map(|m| m.text).collect();
    assert_eq!(
        texts,
        [Some("hello there".to_owned()), Some("mine".to_owned())]
    );
    h.sim.clone().stop().await;
}

#[tokio::test]
async fn rate_limit_refuses_with_retry_after_and_no_effect() {
    let h = Harness::with(SimulatorConfig::default()).await;
    let chat = h.sim.private_chat(&alice());
    let mut statuses = Vec::new();
    for i in 0..5 {
        statuses.push(h.send(chat, &format!("m{i}")).await);
    }
    let codes: Vec<u16> = statuses.iter().map(|a| a.status).collect();
    assert_eq!(
        codes,
        [200, 200, 200, 429, 429],
        "a burst of 3, then flood control"
    );
    let refused = &statuses[3];
    assert_eq!(refused.description(), "Too Many Requests: retry after 1");
    assert_eq!(refused.body["parameters"]["retry_after"], json!(1));
    assert_eq!(refused.retry_after_header.as_deref(), Some("1"));
    assert_eq!(
        h.sim.messages(chat).len(),
        3,
        "a refused call has no effect"
    );
    // Another chat has its own budget; the first recovers once time passes.
    let other = h.sim.private_chat(&bob());
    assert_eq!(h.send(other, "x").await.status, 200);
    h.sim.advance_clock(Duration::from_secs(1));
    assert_eq!(h.send(chat, "later").await.status, 200);
    // 20 messages per minute into one group: one message a second passes the per-chat limit,
    // but over a minute only the group's 20 plus its refill (one per 3 s) get through.
    let group = h.sim.group("Busy");
    let mut sent = 0;
    for _ in 0..60 {
        h.sim.advance_clock(Duration::from_secs(1));
        if h.send(group, "g").await.status == 200 {
            sent += 1;
        }
    }
    assert!((38..=41).contains(&sent), "{sent} of 60 sent in 60 s");
    // About 30 messages a second across chats: 60 chats at once get 30 plus what the bot's
    // budget regained while the loop ran (real time also moves the simulated clock).
    let chats: Vec<i64> = (0..60)
        .map(|i| h.sim.private_chat(&SimUser::person(5000 + i, "U")))
        .collect();
    h.sim.advance_clock(Duration::from_secs(5));
    let started = std::time::Instant::now();
    let mut sent = 0;
    for chat in &chats {
        if h.send(*chat, "broadcast").await.status == 200 {
            sent += 1;
        }
    }
    let regained = (started.elapsed().as_secs_f64() * 30.0).ceil() as usize;
    assert!(
        (30..=30 + regained + 1).contains(&sent),
        "{sent} of 60 sent, {regained} regained"
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn drafts_private_only_and_when_allowed() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    let group = h.sim.group("G");
    let ok = h
        .call(
            "sendMessageDraft",
            json!({"chat_id": chat, "draft_id": 7, "text": "<i>thinking</i>", "parse_mode": "HTML"}),
        )
        .await;
    assert_eq!(ok.result(), &json!(true));
    let refused = h
        .call(
            "sendMessageDraft",
            json!({"chat_id": group, "draft_id": 7, "text": "x"}),
        )
        .await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.description(), "Bad Request: TEXTDRAFT_PEER_INVALID");
    let drafts = h.sim.drafts(chat);
    assert_eq!(drafts.len(), 1);
    assert_eq!(
        (drafts[0].draft_id, drafts[0].text.as_str()),
        (7, "thinking")
    );
    assert!(h.sim.drafts(group).is_empty());
    h.sim.stop().await;

    let h = Harness::with(SimulatorConfig {
        drafts_allowed: false,
        rate_limits: false,
        ..SimulatorConfig::default()
    })
    .await;
    let chat = h.sim.private_chat(&SimUser::person(5, "Eve"));
    let refused = h
        .call(
            "sendMessageDraft",
            json!({"chat_id": chat, "draft_id": 1, "text": "x"}),
        )
        .await;
    assert_eq!(refused.description(), "Bad Request: TEXTDRAFT_PEER_INVALID");
    assert!(h.sim.drafts(chat).is_empty());
    h.sim.stop().await;
}
