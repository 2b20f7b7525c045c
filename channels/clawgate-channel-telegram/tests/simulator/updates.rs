//! getUpdates: confirmation by offset, negative offsets, holding, 409s, expiry, allowed_updates.

use std::time::{Duration, Instant};

use clawgate_channel_telegram::simulator::WriteOptions;
use serde_json::{Value, json};

use crate::{Harness, alice};

fn ids(answer: &crate::Answer) -> Vec<i64> {
    answer
        .result()
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|u| u["update_id"].as_i64())
        .collect()
}

#[tokio::test]
async fn offset_confirms_and_negative_offset_keeps_the_last() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    let first = h
        .sim
        .user_writes(chat, &alice(), "one", WriteOptions::default())["update_id"]
        .as_i64()
        .expect("id");
    for text in ["two", "three", "four"] {
        h.sim
            .user_writes(chat, &alice(), text, WriteOptions::default());
    }
    let all = h.call("getUpdates", json!({})).await;
    assert_eq!(
        ids(&all),
        [first, first + 1, first + 2, first + 3],
        "ids increase by one"
    );
    let message = &all.result()[0]["message"];
    assert_eq!(message["text"], json!("one"));
    assert_eq!(message["chat"]["type"], json!("private"));
    assert_eq!(message["from"]["is_bot"], json!(false));
    assert!(message["date"].is_i64());
    // Unconfirmed updates come again (offset = the oldest one confirms nothing). Each call here
    // uses a new offset: the server answers a repeat of the same offset within 0.5 s with one
    // update at most.
    assert_eq!(
        ids(&h
            .call("getUpdates", json!({"offset": first, "limit": 2}))
            .await),
        [first, first + 1]
    );
    // offset = last + 1 confirms everything before it.
    let rest = h.call("getUpdates", json!({"offset": first + 2})).await;
    assert_eq!(ids(&rest), [first + 2, first + 3]);
    assert_eq!(h.sim.pending_updates(), 2);
    // -1: only the newest remains, the rest is forgotten.
    assert_eq!(
        ids(&h.call("getUpdates", json!({"offset": -1})).await),
        [first + 3]
    );
    assert_eq!(h.sim.pending_updates(), 1);
    assert_eq!(
        ids(&h
            .call("getUpdates", json!({"offset": first + 4, "timeout": 0}))
            .await),
        Vec::<i64>::new()
    );
    assert_eq!(h.sim.pending_updates(), 0);
    h.sim.stop().await;
}

#[tokio::test]
async fn a_held_poll_wakes_when_an_update_arrives() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    let poll = {
        let http = h.http.clone();
        let url = h.url("getUpdates");
        tokio::spawn(async move {
            let started = Instant::now();
            let response = http
                .post(url)
                .json(&json!({"timeout": 20}))
                .send()
                .await
                .expect("answer");
            (started.elapsed(), crate::answer(response).await)
        })
    };
    wait_for_hold(&h).await;
    h.sim
        .user_writes(chat, &alice(), "wake up", WriteOptions::default());
    let (elapsed, answer) = poll.await.expect("poll task");
    assert_eq!(answer.result()[0]["message"]["text"], json!("wake up"));
    assert!(elapsed < Duration::from_secs(10), "woke after {elapsed:?}");
    h.sim.stop().await;
}

#[tokio::test]
async fn an_empty_hold_ends_at_its_timeout() {
    let h = Harness::start().await;
    let started = Instant::now();
    let answer = h.call("getUpdates", json!({"timeout": 1})).await;
    assert_eq!(answer.result(), &json!([]));
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(950) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    h.sim.stop().await;
}

/// Waits until the simulator holds a long poll (no sleep-and-hope: polls the record).
async fn wait_for_hold(h: &Harness) {
    let deadline = Instant::now() + Duration::from_secs(5);
    // A held poll is not in the log yet; it is in flight once the server has seen it.
    while Instant::now() < deadline {
        if h.sim.holding_long_poll() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no long poll was held within 5 s");
}

#[tokio::test]
async fn a_second_poller_ends_the_first_with_409() {
    let h = Harness::start().await;
    let first = {
        let http = h.http.clone();
        let url = h.url("getUpdates");
        tokio::spawn(async move {
            crate::answer(
                http.post(url)
                    .json(&json!({"timeout": 30}))
                    .send()
                    .await
                    .expect("answer"),
            )
            .await
        })
    };
    wait_for_hold(&h).await;
    let second = {
        let http = h.http.clone();
        let url = h.url("getUpdates");
        tokio::spawn(async move {
            crate::answer(
                http.post(url)
                    .json(&json!({"timeout": 1}))
                    .send()
                    .await
                    .expect("answer"),
            )
            .await
        })
    };
    let first = first.await.expect("first poll");
    assert_eq!(first.status, 409);
    assert_eq!(
        first.description(),
        "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
    );
    let second = second.await.expect("second poll");
    assert_eq!(second.result(), &json!([]));
    h.sim.stop().await;
}

#[tokio::test]
async fn getupdates_while_a_webhook_is_set_is_409() {
    let h = Harness::start().await;
    h.call("setWebhook", json!({"url": "http://127.0.0.1:9/hook"}))
        .await
        .result();
    let answer = h.call("getUpdates", json!({})).await;
    assert_eq!(answer.status, 409);
    assert_eq!(
        answer.description(),
        "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"
    );
    h.call("deleteWebhook", json!({})).await.result();
    assert_eq!(h.call("getUpdates", json!({})).await.status, 200);
    h.sim.stop().await;
}

#[tokio::test]
async fn updates_expire_after_24_hours() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    h.sim
        .user_writes(chat, &alice(), "old", WriteOptions::default());
    h.sim.advance_clock(Duration::from_secs(23 * 3600));
    h.sim
        .user_writes(chat, &alice(), "new", WriteOptions::default());
    assert_eq!(h.sim.pending_updates(), 2);
    h.sim.advance_clock(Duration::from_secs(2 * 3600));
    assert_eq!(h.sim.pending_updates(), 1);
    let answer = h.call("getUpdates", json!({})).await;
    let texts: Vec<&Value> = answer
        .result()
        .as_array()
        .expect("array")
        .iter()
        .map(|u| &u["message"]["text"])
        .collect();
    assert_eq!(texts, [&json!("new")]);
    h.sim.stop().await;
}

#[tokio::test]
async fn allowed_updates_filters_new_updates_and_is_kept() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    let message_id = h
        .sim
        .user_writes(chat, &alice(), "v1", WriteOptions::default())["message"]["message_id"]
        .as_i64()
        .expect("id");
    let got = h
        .call("getUpdates", json!({"allowed_updates": ["edited_message"]}))
        .await;
    assert_eq!(
        got.result().as_array().map(Vec::len),
        Some(1),
        "queued before the call"
    );
    let offset = got.result()[0]["update_id"].as_i64().expect("id") + 1;
    h.sim
        .user_writes(chat, &alice(), "ignored", WriteOptions::default());
    h.sim.user_edits(chat, message_id, "v2");
    // allowed_updates omitted: the previous setting holds.
    let got = h.call("getUpdates", json!({"offset": offset})).await;
    let kinds: Vec<bool> = got
        .result()
        .as_array()
        .expect("array")
        .iter()
        .map(|u| u.get("edited_message").is_some())
        .collect();
    assert_eq!(kinds, [true]);
    assert_eq!(got.result()[0]["edited_message"]["text"], json!("v2"));
    assert!(got.result()[0]["edited_message"]["edit_date"].is_i64());
    h.sim.stop().await;
}

#[tokio::test]
async fn limit_and_timeout_are_clamped() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    for i in 0..3 {
        h.sim
            .user_writes(chat, &alice(), &format!("m{i}"), WriteOptions::default());
    }
    let answer = h.call("getUpdates", json!({"limit": 0})).await;
    assert_eq!(
        answer.result().as_array().map(Vec::len),
        Some(1),
        "limit 0 is clamped to 1"
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn stop_ends_a_held_poll_promptly() {
    let h = Harness::start().await;
    let poll = {
        let http = h.http.clone();
        let url = h.url("getUpdates");
        tokio::spawn(async move { http.post(url).json(&json!({"timeout": 50})).send().await })
    };
    wait_for_hold(&h).await;
    let started = Instant::now();
    h.sim.clone().stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "stop took {:?}",
        started.elapsed()
    );
    let answered = poll.await.expect("poll task");
    if let Ok(response) = answered {
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["result"], json!([]));
    }
    assert!(
        reqwest::get(h.url("getMe")).await.is_err(),
        "a stopped simulator accepts no calls"
    );
}

#[tokio::test]
async fn removal_and_migration_reach_the_bot_as_updates() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    let group = h.sim.group("Small");
    h.sim.block_bot(chat);
    let supergroup = h.sim.upgrade_to_supergroup(group);
    let answer = h.call("getUpdates", json!({})).await;
    let updates = answer.result().as_array().expect("array");
    assert_eq!(updates.len(), 3, "{updates:?}");
    assert_eq!(
        updates[0]["my_chat_member"]["new_chat_member"]["status"],
        json!("kicked")
    );
    assert_eq!(updates[0]["my_chat_member"]["chat"]["id"], json!(chat));
    assert_eq!(
        updates[1]["message"]["migrate_to_chat_id"],
        json!(supergroup)
    );
    assert_eq!(updates[2]["message"]["chat"]["id"], json!(supergroup));
    assert_eq!(updates[2]["message"]["migrate_from_chat_id"], json!(group));
    h.sim.stop().await;
}

#[tokio::test]
async fn conflicts_are_spaced_three_seconds_apart() {
    let h = Harness::start().await;
    h.call("setWebhook", json!({"url": "http://127.0.0.1:9/hook"}))
        .await
        .result();
    let started = Instant::now();
    assert_eq!(h.call("getUpdates", json!({})).await.status, 409);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the first 409 comes at once"
    );
    assert_eq!(h.call("getUpdates", json!({})).await.status, 409);
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "the second waits: {:?}",
        started.elapsed()
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn a_repeated_poll_within_three_seconds_is_held_anyway() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    assert_eq!(
        h.call("getUpdates", json!({"offset": 5})).await.result(),
        &json!([])
    );
    // Same offset, timeout 0, right away: the server holds it (at least 3 s) instead of
    // answering at once, so an update that arrives meanwhile is in the answer.
    let poll = {
        let http = h.http.clone();
        let url = h.url("getUpdates");
        tokio::spawn(async move {
            crate::answer(
                http.post(url)
                    .json(&json!({"offset": 5}))
                    .send()
                    .await
                    .expect("answer"),
            )
            .await
        })
    };
    wait_for_hold(&h).await;
    h.sim
        .user_writes(chat, &alice(), "meanwhile", WriteOptions::default());
    let answer = poll.await.expect("poll");
    assert_eq!(answer.result()[0]["message"]["text"], json!("meanwhile"));
    h.sim.stop().await;
}
