//! The Web API methods: envelope, token checks, errors, limits, ts values, metadata, history,
//! replies, edits, deletes and streams.

use std::time::Duration;

use clawgate_channel_slack::simulator::{ConversationKind, Fault, FaultKind, SimulatorConfig};
use serde_json::json;

use crate::Harness;

#[tokio::test]
async fn tokens_are_checked_in_the_header_or_a_form_field() {
    let h = Harness::start().await;
    let url = format!("{}auth.test", h.sim.api_url());
    let none: serde_json::Value = h
        .http
        .post(&url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(none, json!({ "ok": false, "error": "not_authed" }));
    let wrong: serde_json::Value = h
        .http
        .post(&url)
        .bearer_auth("xoxb-wrong")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(wrong["error"], "invalid_auth");
    // Form mode: the token and the arguments in an urlencoded body, metadata as JSON text.
    let form: serde_json::Value = h
        .http
        .post(format!("{}chat.postMessage", h.sim.api_url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "token={}&channel={}&text=hello+form&metadata=%7B%22event_type%22%3A%22t%22%2C%22event_payload%22%3A%7B%22k%22%3A1%7D%7D",
            h.sim.token(),
            h.channel
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(form["ok"], true, "{form}");
    assert_eq!(form["message"]["text"], "hello form");
    assert_eq!(
        form["message"]["metadata"]["event_payload"],
        json!({ "k": 1 })
    );
    // A JSON body carries the token only in the header.
    let json_token: serde_json::Value = h
        .http
        .post(format!("{}auth.test", h.sim.api_url()))
        .json(&json!({ "token": h.sim.token() }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(json_token["error"], "not_authed");
    h.sim.revoke_token();
    assert_eq!(h.error("auth.test", json!({})).await, "token_revoked");
    h.sim.stop().await;
}

#[tokio::test]
async fn ts_values_are_slack_shaped_and_increase_per_channel() {
    let h = Harness::with(SimulatorConfig {
        rate_limits: false,
        ..SimulatorConfig::default()
    })
    .await;
    let mut last = String::new();
    for n in 0..20 {
        let ts = h.post(&h.channel, &format!("m{n}")).await["ts"]
            .as_str()
            .unwrap()
            .to_owned();
        let (secs, micros) = ts.split_once('.').unwrap();
        assert_eq!((secs.len(), micros.len()), (10, 6), "{ts}");
        assert!(ts > last, "{ts} after {last}");
        last = ts;
    }
    h.sim.stop().await;
}

#[tokio::test]
async fn post_errors_follow_the_catalogue_and_change_nothing() {
    let h = Harness::start().await;
    let outside = h
        .sim
        .create_conversation("outside", ConversationKind::Public, false);
    let archived = h
        .sim
        .create_conversation("old", ConversationKind::Public, true);
    h.sim.archive(&archived);
    let cases = [
        (
            json!({ "channel": "C0NOPE", "text": "x" }),
            "channel_not_found",
        ),
        (json!({ "channel": outside, "text": "x" }), "not_in_channel"),
        (json!({ "channel": archived, "text": "x" }), "is_archived"),
        (json!({ "channel": h.channel }), "no_text"),
        (
            json!({ "channel": h.channel, "text": "a", "markdown_text": "b" }),
            "markdown_text_conflict",
        ),
        (
            json!({ "channel": h.channel, "text": "a", "metadata": { "event_type": 3 } }),
            "invalid_metadata_schema",
        ),
        (
            json!({ "channel": h.channel, "text": "a", "metadata": "{not json" }),
            "invalid_metadata_format",
        ),
    ];
    for (args, error) in cases {
        let (status, body) = h.call("chat.postMessage", args.clone()).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (200, Some(error)),
            "{args}"
        );
    }
    assert!(h.sim.every_message().is_empty());
    // Longer than 40,000 characters: truncated with a warning, not refused.
    let body = h.post(&h.channel, &"x".repeat(40_010)).await;
    assert_eq!(body["warning"], "message_truncated");
    assert_eq!(h.sim.messages(&h.channel)[0].text.len(), 40_000);
    let (status, body) = h.call("chat.nope", json!({})).await;
    assert_eq!((status, &body["error"]), (404, &json!("unknown_method")));
    h.sim.stop().await;
}

#[tokio::test]
async fn posting_is_limited_per_channel_with_429_and_retry_after() {
    let h = Harness::start().await;
    let other = h
        .sim
        .create_conversation("other", ConversationKind::Public, true);
    for n in 0..3 {
        h.post(&h.channel, &format!("burst {n}")).await;
    }
    let response = h
        .http
        .post(format!("{}chat.postMessage", h.sim.api_url()))
        .bearer_auth(h.sim.token())
        .json(&json!({ "channel": h.channel, "text": "one too many" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body, json!({ "ok": false, "error": "ratelimited" }));
    assert_eq!(
        h.sim.messages(&h.channel).len(),
        3,
        "a limited post lands nothing"
    );
    // The limit is per channel.
    h.post(&other, "elsewhere").await;
    h.sim.stop().await;
}

#[tokio::test]
async fn metadata_round_trips_through_history_only_when_asked_for() {
    let h = Harness::start().await;
    let meta = json!({ "event_type": "clawgate_message", "event_payload": { "key": "k#0" } });
    let (_, posted) = h
        .call(
            "chat.postMessage",
            json!({ "channel": h.channel, "text": "with meta", "metadata": meta }),
        )
        .await;
    let ts = posted["ts"].as_str().unwrap();
    let (_, reply) = h
        .call(
            "chat.postMessage",
            json!({ "channel": h.channel, "text": "in thread", "thread_ts": ts, "metadata": meta }),
        )
        .await;
    let (_, history) = h
        .call(
            "conversations.history",
            json!({ "channel": h.channel, "include_all_metadata": true }),
        )
        .await;
    assert_eq!(
        history["messages"].as_array().unwrap().len(),
        1,
        "replies stay in the thread"
    );
    assert_eq!(history["messages"][0]["metadata"], meta);
    let (_, bare) = h
        .call("conversations.history", json!({ "channel": h.channel }))
        .await;
    assert!(bare["messages"][0].get("metadata").is_none());
    let (_, replies) = h
        .call(
            "conversations.replies",
            json!({ "channel": h.channel, "ts": ts, "include_all_metadata": true }),
        )
        .await;
    let messages = replies["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[1]["ts"], reply["ts"]);
    assert_eq!(messages[1]["metadata"], meta);
    assert_eq!(
        h.error(
            "conversations.replies",
            json!({ "channel": h.channel, "ts": "1.000000" })
        )
        .await,
        "thread_not_found"
    );
    // Metadata omitted on update keeps the old one; `{}` removes it.
    h.call(
        "chat.update",
        json!({ "channel": h.channel, "ts": ts, "text": "edited" }),
    )
    .await;
    assert_eq!(h.sim.messages(&h.channel)[0].metadata, Some(meta.clone()));
    h.call(
        "chat.update",
        json!({ "channel": h.channel, "ts": ts, "text": "edited", "metadata": {} }),
    )
    .await;
    assert_eq!(h.sim.messages(&h.channel)[0].metadata, None);
    h.sim.stop().await;
}

#[tokio::test]
async fn updates_and_deletes_answer_with_their_documented_errors() {
    let h = Harness::start().await;
    let ts = h.post(&h.channel, "mine").await["ts"]
        .as_str()
        .unwrap()
        .to_owned();
    let theirs = h.sim.person_writes(&h.channel, &h.person, "theirs", None);
    let update = |ts: &str, text: &str| json!({ "channel": h.channel, "ts": ts, "text": text });
    assert_eq!(
        h.error("chat.update", update("1.000000", "x")).await,
        "message_not_found"
    );
    assert_eq!(
        h.error("chat.update", update(&theirs.ts, "x")).await,
        "cant_update_message"
    );
    assert_eq!(
        h.error("chat.update", update(&ts, &"x".repeat(4_001)))
            .await,
        "msg_too_long"
    );
    assert_eq!(
        h.error("chat.update", json!({ "channel": h.channel, "ts": ts }))
            .await,
        "no_text"
    );
    // The same text twice is no error on Slack.
    for _ in 0..2 {
        let (_, body) = h.call("chat.update", update(&ts, "same")).await;
        assert_eq!(body["ok"], true, "{body}");
    }
    h.sim.close_edit_window(&h.channel, &ts);
    assert_eq!(
        h.error("chat.update", update(&ts, "late")).await,
        "edit_window_closed"
    );
    assert_eq!(
        h.error(
            "chat.delete",
            json!({ "channel": h.channel, "ts": theirs.ts })
        )
        .await,
        "cant_delete_message"
    );
    let (_, deleted) = h
        .call("chat.delete", json!({ "channel": h.channel, "ts": ts }))
        .await;
    assert_eq!(
        deleted,
        json!({ "ok": true, "channel": h.channel, "ts": ts })
    );
    assert_eq!(
        h.error("chat.delete", json!({ "channel": h.channel, "ts": ts }))
            .await,
        "message_not_found"
    );
    assert_eq!(
        h.sim.messages(&h.channel).len(),
        1,
        "the person's message only"
    );
    assert_eq!(
        h.sim.all_messages(&h.channel).len(),
        2,
        "the record keeps the deleted one"
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn streams_need_a_thread_and_a_recipient_and_move_through_their_states() {
    let h = Harness::start().await;
    let question = h.sim.person_writes(&h.channel, &h.person, "question", None);
    let start = |extra: serde_json::Value| {
        let mut args = json!({ "channel": h.channel, "markdown_text": "Hel" });
        for (k, v) in extra.as_object().unwrap() {
            args[k] = v.clone();
        }
        args
    };
    assert_eq!(
        h.error("chat.startStream", start(json!({}))).await,
        "invalid_arguments"
    );
    assert_eq!(
        h.error(
            "chat.startStream",
            start(json!({ "thread_ts": question.ts }))
        )
        .await,
        "invalid_arguments",
        "a channel stream names its recipient"
    );
    let (_, started) = h
        .call(
            "chat.startStream",
            start(
                json!({ "thread_ts": question.ts, "recipient_user_id": h.person,
                          "recipient_team_id": h.sim.team_id() }),
            ),
        )
        .await;
    let ts = started["ts"].as_str().unwrap().to_owned();
    let at = |extra: serde_json::Value| {
        let mut args = json!({ "channel": h.channel, "ts": ts });
        for (k, v) in extra.as_object().unwrap() {
            args[k] = v.clone();
        }
        args
    };
    assert_eq!(
        h.error("chat.update", at(json!({ "text": "x" }))).await,
        "streaming_state_conflict"
    );
    h.call("chat.appendStream", at(json!({ "markdown_text": "lo" })))
        .await;
    let (_, stopped) = h
        .call(
            "chat.stopStream",
            at(json!({ "markdown_text": "!", "metadata": { "event_type": "t", "event_payload": {} } })),
        )
        .await;
    assert_eq!(stopped["message"]["text"], "Hello!");
    assert_eq!(
        h.error("chat.appendStream", at(json!({ "markdown_text": "x" })))
            .await,
        "message_not_in_streaming_state"
    );
    assert_eq!(
        h.error(
            "chat.appendStream",
            json!({ "channel": h.channel, "ts": question.ts, "markdown_text": "x" })
        )
        .await,
        "message_not_owned_by_app"
    );
    // After the stop it is an ordinary message.
    let (_, edited) = h
        .call("chat.update", at(json!({ "text": "Hello, edited" })))
        .await;
    assert_eq!(edited["ok"], true, "{edited}");
    // A person stops a stream from Slack's UI.
    let (_, again) = h
        .call(
            "chat.startStream",
            start(
                json!({ "thread_ts": question.ts, "recipient_user_id": h.person,
                          "recipient_team_id": h.sim.team_id() }),
            ),
        )
        .await;
    let second = again["ts"].as_str().unwrap();
    h.sim.stop_stream_by_user(&h.channel, second);
    assert_eq!(
        h.error(
            "chat.appendStream",
            json!({ "channel": h.channel, "ts": second, "markdown_text": "x" })
        )
        .await,
        "stopped_by_user"
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn faults_refuse_without_effect_or_apply_and_lose_the_answer() {
    let h = Harness::start().await;
    h.sim
        .inject(Fault::on("chat.postMessage", FaultKind::ServerError(503)));
    let response = h
        .http
        .post(format!("{}chat.postMessage", h.sim.api_url()))
        .bearer_auth(h.sim.token())
        .json(&json!({ "channel": h.channel, "text": "a" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    h.sim
        .inject(Fault::on("chat.postMessage", FaultKind::RateLimited(7)));
    let response = h
        .http
        .post(format!("{}chat.postMessage", h.sim.api_url()))
        .bearer_auth(h.sim.token())
        .json(&json!({ "channel": h.channel, "text": "b" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    assert_eq!(response.headers()["retry-after"], "7");
    h.sim
        .inject(Fault::once(FaultKind::Error("not_in_channel".into())));
    assert_eq!(
        h.error(
            "chat.postMessage",
            json!({ "channel": h.channel, "text": "c" })
        )
        .await,
        "not_in_channel"
    );
    assert!(
        h.sim.messages(&h.channel).is_empty(),
        "refusals land nothing"
    );
    h.sim
        .inject(Fault::on("chat.postMessage", FaultKind::LoseAnswer));
    let lost = h
        .http
        .post(format!("{}chat.postMessage", h.sim.api_url()))
        .bearer_auth(h.sim.token())
        .json(&json!({ "channel": h.channel, "text": "landed" }))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(lost.is_err(), "the answer was cut: {lost:?}");
    let texts: Vec<String> = h
        .sim
        .messages(&h.channel)
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(texts, ["landed"]);
    let calls = h.sim.calls();
    let last = calls.last().unwrap();
    assert_eq!(
        (last.method.as_str(), last.answered),
        ("chat.postMessage", false)
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn history_bounds_by_oldest_latest_and_inclusive() {
    let h = Harness::with(SimulatorConfig {
        rate_limits: false,
        ..SimulatorConfig::default()
    })
    .await;
    let mut ts = Vec::new();
    for n in 0..4 {
        ts.push(
            h.post(&h.channel, &format!("m{n}")).await["ts"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let texts = |body: &serde_json::Value| -> Vec<String> {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["text"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, between) = h
        .call(
            "conversations.history",
            json!({ "channel": h.channel, "oldest": ts[0], "latest": ts[3] }),
        )
        .await;
    assert_eq!(
        texts(&between),
        ["m2", "m1"],
        "newest first, bounds excluded"
    );
    let (_, inclusive) = h
        .call(
            "conversations.history",
            json!({ "channel": h.channel, "oldest": ts[0], "latest": ts[3], "inclusive": true }),
        )
        .await;
    assert_eq!(texts(&inclusive), ["m3", "m2", "m1", "m0"]);
    let outside = h
        .sim
        .create_conversation("outside", ConversationKind::Public, false);
    assert_eq!(
        h.error("conversations.history", json!({ "channel": outside }))
            .await,
        "not_in_channel"
    );
    h.sim.stop().await;
}
