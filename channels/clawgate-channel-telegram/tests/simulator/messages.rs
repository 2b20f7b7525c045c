//! Sending, editing, deleting; chats, topics, ids; the ways parameters arrive.

use std::time::Duration;

use clawgate_channel_telegram::simulator::{SimUser, WriteOptions};
use serde_json::json;

use crate::{Harness, alice, bob};

#[tokio::test]
async fn send_edit_delete_and_the_record() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    let sent = h
        .call(
            "sendMessage",
            json!({"chat_id": chat, "text": "<b>Hi</b> &amp; welcome", "parse_mode": "HTML",
                   "link_preview_options": {"is_disabled": true}}),
        )
        .await;
    let message = sent.result();
    assert_eq!(message["text"], json!("Hi & welcome"));
    assert_eq!(
        message["entities"],
        json!([{"type": "bold", "offset": 0, "length": 2}])
    );
    assert_eq!(
        message["chat"],
        json!({"id": chat, "type": "private", "first_name": "Alice", "username": "alice"})
    );
    assert_eq!(message["from"]["is_bot"], json!(true));
    assert_eq!(message["from"]["id"], json!(h.sim.bot_user_id()));
    assert_eq!(
        message["link_preview_options"],
        json!({"is_disabled": true})
    );
    let id = message["message_id"].as_i64().expect("id");

    let edited = h
        .call(
            "editMessageText",
            json!({"chat_id": chat, "message_id": id, "text": "Hi again"}),
        )
        .await;
    assert_eq!(edited.result()["text"], json!("Hi again"));
    assert!(edited.result()["edit_date"].is_i64());
    let stored = &h.sim.messages(chat)[0];
    assert_eq!(stored.text.as_deref(), Some("Hi again"));
    assert_eq!(stored.edit_count, 1);
    assert!(stored.from_bot_self);
    assert_eq!(stored.raw, *edited.result());

    let deleted = h
        .call("deleteMessage", json!({"chat_id": chat, "message_id": id}))
        .await;
    assert_eq!(deleted.result(), &json!(true));
    assert!(h.sim.messages(chat).is_empty());
    let methods: Vec<(String, u16, bool)> = h
        .sim
        .log()
        .into_iter()
        .map(|r| (r.method, r.status, r.answered))
        .collect();
    assert_eq!(
        methods,
        [
            ("sendMessage".to_owned(), 200, true),
            ("editMessageText".to_owned(), 200, true),
            ("deleteMessage".to_owned(), 200, true)
        ]
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn per_chat_message_ids_and_chat_shapes() {
    let h = Harness::start().await;
    let a = h.sim.private_chat(&alice());
    let b = h.sim.private_chat(&bob());
    let group = h.sim.group("Family");
    let supergroup = h.sim.supergroup("Work", false);
    let channel = h.sim.channel("News");
    assert_eq!(
        (a, b),
        (alice().id, bob().id),
        "a private chat's id is the user's"
    );
    assert!(group < 0 && !group.to_string().starts_with("-100"));
    assert!(supergroup.to_string().starts_with("-100") && channel.to_string().starts_with("-100"));
    for chat in [a, b, group, supergroup, channel] {
        let ids: Vec<i64> = [
            h.send(chat, "1").await.result()["message_id"].as_i64(),
            h.send(chat, "2").await.result()["message_id"].as_i64(),
        ]
        .into_iter()
        .flatten()
        .collect();
        assert_eq!(ids, [1, 2], "chat {chat} counts its own ids");
    }
    let types: Vec<String> = [a, group, supergroup, channel]
        .iter()
        .map(|c| {
            h.sim.messages(*c)[0].raw["chat"]["type"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(types, ["private", "group", "supergroup", "channel"]);
    let post = &h.sim.messages(channel)[0].raw;
    assert!(post.get("from").is_none() && post["sender_chat"]["id"] == json!(channel));
    let info = h.call("getChat", json!({"chat_id": group})).await;
    assert_eq!(info.result()["title"], json!("Family"));
    assert_eq!(info.result()["type"], json!("group"));
    h.sim.stop().await;
}

#[tokio::test]
async fn topics_replies_and_quotes() {
    let h = Harness::start().await;
    let forum = h.sim.supergroup("Forum", true);
    let topic = h.sim.create_topic(forum, "Ideas");
    let update = h.sim.user_writes(
        forum,
        &alice(),
        "what about tea",
        WriteOptions {
            thread_id: Some(topic),
            reply_to: None,
        },
    );
    let message = &update["message"];
    assert_eq!(message["message_thread_id"], json!(topic));
    assert_eq!(message["is_topic_message"], json!(true));
    assert_eq!(message["chat"]["is_forum"], json!(true));
    assert_eq!(message["from"]["is_bot"], json!(false));
    let asked = message["message_id"].as_i64().expect("id");

    let reply = h
        .call(
            "sendMessage",
            json!({"chat_id": forum, "message_thread_id": topic, "text": "tea is good",
                   "reply_parameters": {"message_id": asked, "quote": "tea"}}),
        )
        .await;
    let reply = reply.result();
    assert_eq!(reply["message_thread_id"], json!(topic));
    assert_eq!(reply["reply_to_message"]["message_id"], json!(asked));
    assert_eq!(reply["quote"]["text"], json!("tea"));
    assert_eq!(reply["quote"]["position"], json!(11));
    let stored = h.sim.messages(forum).pop().expect("reply stored");
    assert_eq!(
        (
            stored.thread_id,
            stored.reply_to_message_id,
            stored.quote.as_deref()
        ),
        (Some(topic), Some(asked), Some("tea"))
    );
    // A missing target with allow_sending_without_reply: sent, not a reply.
    let loose = h
        .call(
            "sendMessage",
            json!({"chat_id": forum, "text": "x", "reply_parameters": {"message_id": 999, "allow_sending_without_reply": true}}),
        )
        .await;
    assert!(loose.result().get("reply_to_message").is_none());
    // A user's reply carries the replied message.
    let answer = h.sim.user_writes(
        forum,
        &bob(),
        "agreed",
        WriteOptions {
            thread_id: Some(topic),
            reply_to: Some(asked),
        },
    );
    assert_eq!(
        answer["message"]["reply_to_message"]["text"],
        json!("what about tea")
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn bots_do_not_see_bots() {
    let h = Harness::start().await;
    let group = h.sim.group("Mixed");
    let other_bot = SimUser::bot(2001, "Helper");
    let update = h
        .sim
        .user_writes(group, &other_bot, "beep", WriteOptions::default());
    assert!(update.is_null());
    let seen = h.call("getUpdates", json!({})).await;
    assert_eq!(seen.result(), &json!([]));
    assert_eq!(h.sim.pending_updates(), 0);
    let visible = h.sim.messages(group);
    assert_eq!(visible.len(), 1);
    assert_eq!(visible[0].raw["from"]["is_bot"], json!(true));
    h.sim
        .user_writes(group, &alice(), "hi", WriteOptions::default());
    let seen = h.call("getUpdates", json!({})).await;
    assert_eq!(seen.result().as_array().map(Vec::len), Some(1));
    h.sim.stop().await;
}

#[tokio::test]
async fn delete_window_is_48_hours_of_simulated_time() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    let young = h.send(chat, "young").await.result()["message_id"].clone();
    let old = h.send(chat, "old").await.result()["message_id"].clone();
    h.sim.advance_clock(Duration::from_secs(47 * 3600));
    let ok = h
        .call(
            "deleteMessage",
            json!({"chat_id": chat, "message_id": young}),
        )
        .await;
    assert_eq!(ok.result(), &json!(true));
    h.sim.advance_clock(Duration::from_secs(3600));
    let refused = h
        .call("deleteMessage", json!({"chat_id": chat, "message_id": old}))
        .await;
    assert_eq!(
        refused.description(),
        "Bad Request: message can't be deleted"
    );
    assert_eq!(h.sim.messages(chat).len(), 1);
    let later = h.send(chat, "later").await.result()["date"]
        .as_i64()
        .expect("date");
    assert!(later - h.sim.messages(chat)[0].date >= 48 * 3600);
    h.sim.stop().await;
}

#[tokio::test]
async fn delete_messages_skips_missing_ones() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    for text in ["a", "b", "c"] {
        h.send(chat, text).await;
    }
    let answer = h
        .call(
            "deleteMessages",
            json!({"chat_id": chat, "message_ids": [1, 3, 99]}),
        )
        .await;
    assert_eq!(answer.result(), &json!(true));
    let left: Vec<i64> = h.sim.messages(chat).iter().map(|m| m.message_id).collect();
    assert_eq!(left, [2]);
    h.sim.stop().await;
}

#[tokio::test]
async fn parameters_by_query_string_form_and_multipart() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    let by_query = crate::answer(
        h.http
            .get(format!(
                "{}?chat_id={chat}&text=via%20query+string",
                h.url("sendmessage")
            ))
            .send()
            .await
            .expect("answer"),
    )
    .await;
    assert_eq!(by_query.result()["text"], json!("via query string"));
    let by_form = h
        .call_raw(
            &h.url("sendMessage"),
            "application/x-www-form-urlencoded",
            format!("chat_id={chat}&text=%3Cb%3Eform%3C%2Fb%3E&parse_mode=HTML"),
        )
        .await;
    assert_eq!(by_form.result()["text"], json!("form"));
    let boundary = "simboundary";
    let multipart = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n{chat}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"text\"\r\n\r\nvia multipart\r\n--{boundary}--\r\n"
    );
    let by_multipart = h
        .call_raw(
            &h.url("sendMessage"),
            &format!("multipart/form-data; boundary={boundary}"),
            multipart,
        )
        .await;
    assert_eq!(by_multipart.result()["text"], json!("via multipart"));
    let upload = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n{chat}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\nPNG\r\n--{boundary}--\r\n"
    );
    let refused = h
        .call_raw(
            &h.url("sendPhoto"),
            &format!("multipart/form-data; boundary={boundary}"),
            upload,
        )
        .await;
    assert_eq!(refused.status, 400);
    assert!(
        refused.description().contains("as an HTTP URL"),
        "{refused:?}"
    );
    let texts: Vec<String> = h
        .sim
        .messages(chat)
        .into_iter()
        .filter_map(|m| m.text)
        .collect();
    assert_eq!(texts, ["via query string", "form", "via multipart"]);
    h.sim.stop().await;
}

#[tokio::test]
async fn media_by_url_and_dead_links() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    // A URL served on loopback: the simulator's own getMe is a fetchable URL.
    let fetchable = h.url("getMe");
    let sent = h
        .call(
            "sendPhoto",
            json!({"chat_id": chat, "photo": fetchable, "caption": "<i>look</i>", "parse_mode": "HTML"}),
        )
        .await;
    assert_eq!(sent.result()["caption"], json!("look"));
    assert!(sent.result()["photo"][0]["file_id"].is_string());
    let dead: Vec<(&str, String)> = vec![
        ("foreign host", "https://example.com/cat.png".to_owned()),
        ("404", format!("{}/no/such/file.png", h.sim.base_url())),
    ];
    for (name, url) in &dead {
        let answer = h
            .call("sendDocument", json!({"chat_id": chat, "document": url}))
            .await;
        assert_eq!(answer.status, 400, "{name}");
        assert_eq!(
            answer.description(),
            "Bad Request: failed to get HTTP URL content",
            "{name}"
        );
    }
    let gif = h
        .call(
            "sendAnimation",
            json!({"chat_id": chat, "animation": fetchable}),
        )
        .await;
    assert!(gif.result()["animation"]["file_id"].is_string());
    assert_eq!(gif.result()["document"], gif.result()["animation"]);
    let reused = h
        .call(
            "sendPhoto",
            json!({"chat_id": chat, "photo": sent.result()["photo"][0]["file_id"]}),
        )
        .await;
    assert_eq!(
        reused.status, 200,
        "a file_id the server issued is reusable"
    );
    let bogus = h
        .call("sendPhoto", json!({"chat_id": chat, "photo": "nonsense"}))
        .await;
    assert_eq!(
        bogus.description(),
        "Bad Request: wrong file identifier/HTTP URL specified"
    );
    let long_caption = h
        .call(
            "sendPhoto",
            json!({"chat_id": chat, "photo": fetchable, "caption": "c".repeat(1025)}),
        )
        .await;
    assert_eq!(
        long_caption.description(),
        "Bad Request: message caption is too long"
    );
    let messages = h.sim.messages(chat);
    let kinds: Vec<&str> = messages
        .iter()
        .filter_map(|m| m.media.as_ref().map(|m| m.kind.as_str()))
        .collect();
    assert_eq!(kinds, ["photo", "animation", "photo"]);
    assert_eq!(
        messages[2].media.as_ref().map(|m| m.url.as_str()),
        Some(fetchable.as_str())
    );
    let media = messages[0].media.as_ref().expect("media");
    assert_eq!(
        (media.kind.as_str(), media.url.as_str()),
        ("photo", fetchable.as_str())
    );
    assert_eq!(messages[0].caption.as_deref(), Some("look"));
    h.sim.stop().await;
}

#[tokio::test]
async fn chat_actions_are_recorded() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    for action in ["typing", "upload_photo"] {
        let answer = h
            .call("sendChatAction", json!({"chat_id": chat, "action": action}))
            .await;
        assert_eq!(answer.result(), &json!(true));
    }
    assert_eq!(h.sim.chat_actions(chat), ["typing", "upload_photo"]);
    h.sim.stop().await;
}
