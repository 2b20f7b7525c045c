//! Sending against Synapse: transaction ids settling lost answers, relations and HTML as Matrix
//! content, previews as `m.replace` edits, the redaction fallback, rate limits, refused rooms,
//! tokens and encrypted rooms.

use std::sync::Arc;

use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{LiveOptions, SendOptions, SendOutcome};
use clawgate_types::MessageRelation;
use reqwest::Method;
use serde_json::{Value, json};

use crate::peer::{Peer, build};
use crate::proxy::FaultKind;
use clawgate_channel_matrix::testing::MessageLimit;

fn context(room: &str, id: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(id, "matrix", MessageTarget::group(room), ""),
        format!("test:{id}"),
    )
}

/// The context the engine shows a reply's preview under: the reply's key + `~preview`.
fn preview_context(ctx: &SendContext) -> SendContext {
    let mut preview = ctx.clone();
    preview.idempotency_key = format!("{}~preview", ctx.idempotency_key);
    preview
}

fn preview(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::new(0, MessagePartKind::Preview, json!({ "text": text }))
}

fn redacted(event: &Value) -> bool {
    event.pointer("/unsigned/redacted_because").is_some()
        || event.pointer("/content/body").is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_whose_answer_was_dropped_is_settled_by_its_transaction_id() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    let adapter = peer.plugin.sender.clone();
    let ctx = context(&room, "lost");
    let unit = RenderedMessageUnit::text(0, "answer lost on the way back");
    peer.proxy.inject(0, 1, FaultKind::LoseAnswer);
    let error = adapter.send_unit(&ctx, &unit).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible, "{error:?}");
    let landed = peer.gateway_messages(&room).await;
    assert_eq!(landed.len(), 1, "Synapse has the event: {landed:?}");
    let event_id = landed[0]["event_id"].as_str().unwrap().to_owned();
    // The engine asks first: the room history names the transaction id of our own event.
    let Reconciliation::Sent(found) = adapter.reconcile_unknown_send(&ctx, &unit).await.unwrap()
    else {
        panic!("the landed send reconciles as sent");
    };
    assert_eq!(found.platform_message_id, event_id);
    assert_eq!(found.edit_token.as_deref(), Some(room.as_str()));
    // A resend with the same transaction id is answered with the same event, not a second one.
    let again = adapter.send_unit(&ctx, &unit).await.unwrap();
    assert_eq!(
        again.platform_message_id, event_id,
        "same txnId, same event"
    );
    assert_eq!(
        peer.texts(&room).await,
        vec!["answer lost on the way back"],
        "exactly one message in Synapse's own history"
    );
    assert_eq!(peer.proxy.sends(), 2, "the resend reached Synapse");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_threads_and_html_are_matrix_relations_and_formats() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    let adapter = peer.plugin.sender.clone();
    let question = peer
        .write(
            &peer.ada,
            &room,
            json!({ "msgtype": "m.text", "body": "question" }),
        )
        .await;
    let question_id = question["event_id"].as_str().unwrap();
    let mut reply = context(&room, "reply");
    reply.message.relation = Some(MessageRelation::reply_to(question_id));
    adapter
        .send_unit(&reply, &RenderedMessageUnit::text(0, "an answer"))
        .await
        .unwrap();
    let mut threaded = context(&room, "thread");
    threaded.message.target.thread_id = Some(question_id.to_owned());
    let part = adapter
        .send_unit(&threaded, &RenderedMessageUnit::text(0, "in the thread"))
        .await
        .unwrap();
    assert_eq!(part.thread_id.as_deref(), Some(question_id));
    let html = context(&room, "html");
    adapter
        .send_unit(
            &html,
            &RenderedMessageUnit::new(
                0,
                MessagePartKind::Text,
                json!({ "text": "<b>bold</b> &amp; plain", "format": "html" }),
            ),
        )
        .await
        .unwrap();
    let sent = peer.gateway_messages(&room).await;
    assert_eq!(sent.len(), 3);
    assert_eq!(
        sent[0]["content"]["m.relates_to"]["m.in_reply_to"]["event_id"],
        question_id
    );
    let thread = &sent[1]["content"]["m.relates_to"];
    assert_eq!(thread["rel_type"], "m.thread");
    assert_eq!(thread["event_id"], question_id);
    assert_eq!(thread["is_falling_back"], true);
    assert_eq!(sent[2]["content"]["format"], "org.matrix.custom.html");
    assert_eq!(
        sent[2]["content"]["formatted_body"],
        "<b>bold</b> &amp; plain"
    );
    assert_eq!(sent[2]["content"]["body"], "bold & plain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_are_m_replace_edits_of_one_event_that_becomes_the_final() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    let (_dir, messenger, clock) = engine(&peer);
    let message = |text: &str| {
        ChannelMessage::outbound("live", "matrix", MessageTarget::group(room.clone()), text)
    };
    let mut live = messenger
        .begin_live(message(""), SendOptions::default(), LiveOptions::default())
        .await
        .unwrap();
    live.update("thinking").await.unwrap();
    clock.advance(1_000);
    live.update("thinking harder").await.unwrap();
    clock.advance(1_000);
    let report = live.finalize(message("the answer")).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let history = peer.history(&room).await;
    let ours: Vec<&Value> = history
        .iter()
        .filter(|e| e["sender"] == peer.gateway.user_id.as_str() && e["type"] == "m.room.message")
        .collect();
    let original = ours[0]["event_id"].as_str().unwrap();
    let edits: Vec<&str> = ours[1..]
        .iter()
        .map(|e| {
            assert_eq!(e["content"]["m.relates_to"]["rel_type"], "m.replace", "{e}");
            assert_eq!(e["content"]["m.relates_to"]["event_id"], original);
            e["content"]["m.new_content"]["body"].as_str().unwrap()
        })
        .collect();
    assert_eq!(edits, vec!["thinking harder", "the answer"]);
    assert_eq!(peer.texts(&room).await, vec!["the answer"], "one final");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_edit_redacts_the_preview_and_sends_the_final_fresh() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    let adapter = peer.plugin.sender.clone();
    let live = adapter.live().unwrap();
    let ctx = context(&room, "fallback");
    let shown = live
        .show(&preview_context(&ctx), &preview("draft"))
        .await
        .unwrap();
    // Synapse refuses the edit (as it refuses one too large).
    peer.proxy.inject(
        0,
        1,
        FaultKind::matrix(413, "M_TOO_LARGE", "event too large"),
    );
    let last = live
        .finalize(&ctx, &shown, &RenderedMessageUnit::text(0, "final"))
        .await
        .unwrap();
    assert_ne!(
        last.platform_message_id, shown.platform_message_id,
        "a new event"
    );
    let sent = peer.gateway_messages(&room).await;
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0]["event_id"], shown.platform_message_id.as_str());
    assert!(redacted(&sent[0]), "the preview is redacted: {}", sent[0]);
    assert_eq!(sent[1]["event_id"], last.platform_message_id.as_str());
    assert_eq!(peer.texts(&room).await, vec!["final"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_answering_another_event_than_its_preview_is_sent_fresh() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    let adapter = peer.plugin.sender.clone();
    let live = adapter.live().unwrap();
    let first = peer
        .write(
            &peer.ada,
            &room,
            json!({ "msgtype": "m.text", "body": "one" }),
        )
        .await;
    let second = peer
        .write(
            &peer.ada,
            &room,
            json!({ "msgtype": "m.text", "body": "two" }),
        )
        .await;
    let mut ctx = context(&room, "retarget");
    ctx.message.relation = Some(MessageRelation::reply_to(
        first["event_id"].as_str().unwrap(),
    ));
    let shown = live
        .show(&preview_context(&ctx), &preview("draft"))
        .await
        .unwrap();
    ctx.message.relation = Some(MessageRelation::reply_to(
        second["event_id"].as_str().unwrap(),
    ));
    let last = live
        .finalize(&ctx, &shown, &RenderedMessageUnit::text(0, "answer to two"))
        .await
        .unwrap();
    assert_ne!(last.platform_message_id, shown.platform_message_id);
    let sent = peer.gateway_messages(&room).await;
    assert!(redacted(&sent[0]), "the preview is redacted");
    assert_eq!(
        sent[1]["content"]["m.relates_to"]["m.in_reply_to"]["event_id"], second["event_id"],
        "an edit cannot move a reply: the final is a new event answering the new target"
    );
    assert_eq!(peer.texts(&room).await, vec!["answer to two"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synapse_rate_limits_are_classified_with_their_wait() {
    let peer = Peer::start_with(
        MessageLimit {
            per_second: 0.1,
            burst_count: 2,
        },
        json!({}),
    )
    .await;
    let room = peer.room(json!({})).await;
    let adapter = peer.plugin.sender.clone();
    let mut limited = None;
    let mut sent = 0;
    for i in 0..6 {
        let ctx = context(&room, &format!("burst-{i}"));
        match adapter
            .send_unit(&ctx, &RenderedMessageUnit::text(0, format!("burst {i}")))
            .await
        {
            Ok(_) => sent += 1,
            Err(error) => {
                limited = Some(error);
                break;
            }
        }
    }
    let error = limited.expect("Synapse limits a burst over rc_message");
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(error.retry_after_ms.is_some_and(|ms| ms > 0), "{error:?}");
    assert_eq!(error.platform_code.as_deref(), Some("429 M_LIMIT_EXCEEDED"));
    assert_eq!(
        peer.texts(&room).await.len(),
        sent,
        "the limited send shows nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_not_joined_is_forbidden_and_a_logged_out_token_is_refused() {
    let peer = Peer::start().await;
    let adapter = peer.plugin.sender.clone();
    let created = peer
        .synapse
        .call(
            &peer.ada,
            Method::POST,
            "createRoom",
            Some(json!({ "preset": "private_chat" })),
        )
        .await;
    let elsewhere = created["room_id"].as_str().unwrap();
    let error = adapter
        .send_unit(
            &context(elsewhere, "forbidden"),
            &RenderedMessageUnit::text(0, "x"),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(error.message.contains("M_FORBIDDEN"), "{error:?}");
    let room = peer.room(json!({})).await;
    peer.synapse
        .call(&peer.gateway, Method::POST, "logout", Some(json!({})))
        .await;
    let error = adapter
        .send_unit(
            &context(&room, "revoked"),
            &RenderedMessageUnit::text(0, "x"),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth, "{error:?}");
    assert!(error.message.contains("M_UNKNOWN_TOKEN"), "{error:?}");
    assert!(
        error.message.contains("token_env"),
        "says what to do: {error:?}"
    );
    assert!(
        !error.message.contains(&peer.gateway.token),
        "the token never prints"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_room_is_refused_and_nothing_is_sent_in_the_clear() {
    let peer = Peer::start().await;
    let room = peer
        .room(json!({ "initial_state": [{
            "type": "m.room.encryption", "state_key": "",
            "content": { "algorithm": "m.megolm.v1.aes-sha2" }
        }] }))
        .await;
    let error = peer
        .plugin
        .sender
        .send_unit(
            &context(&room, "secret"),
            &RenderedMessageUnit::text(0, "in the clear?"),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission, "{error:?}");
    assert!(error.message.contains("end-to-end encrypted"), "{error:?}");
    assert!(peer.gateway_messages(&room).await.is_empty());
    // An unencrypted room of the same account still works.
    let plain = peer.room(json!({})).await;
    peer.plugin
        .sender
        .send_unit(
            &context(&plain, "plain"),
            &RenderedMessageUnit::text(0, "fine"),
        )
        .await
        .unwrap();
    assert_eq!(peer.texts(&plain).await, vec!["fine"]);
    // The room turns encrypted later: once /sync shows it, nothing more goes there in the clear.
    peer.synapse
        .call(
            &peer.gateway,
            Method::PUT,
            &format!(
                "rooms/{}/state/m.room.encryption/",
                clawgate_channel_matrix::testing::enc(&plain)
            ),
            Some(json!({ "algorithm": "m.megolm.v1.aes-sha2" })),
        )
        .await;
    let InboundSource::Polling(feed) = &peer.plugin.source else {
        panic!("the Matrix source polls");
    };
    feed.poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap();
    let error = peer
        .plugin
        .sender
        .send_unit(
            &context(&plain, "after"),
            &RenderedMessageUnit::text(0, "now in the clear?"),
        )
        .await
        .unwrap_err();
    assert!(error.message.contains("end-to-end encrypted"), "{error:?}");
    assert_eq!(peer.texts(&plain).await, vec!["fine"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_factory_checks_the_token_and_names_each_bad_setting() {
    let peer = Peer::start().await;
    let state = tempfile::tempdir().unwrap();
    let setup = |settings: Value| {
        clawgate_conformance::channel_setup(2, "matrix", "default", settings, state.path())
    };
    let good = json!({
        "homeserver_url": peer.synapse.base, "user_id": peer.gateway.user_id,
        "token_env": "MATRIX_TOKEN",
    });
    let error = clawgate_channel_matrix::MatrixFactory
        .build_with_secrets(&setup(good.clone()), Secret::new("syt_wrong_token"))
        .await
        .unwrap_err();
    assert_eq!(error.key, "channels[2].settings.token_env");
    assert!(
        error.reason.contains("MATRIX_TOKEN") && error.reason.contains("M_UNKNOWN_TOKEN"),
        "{error}"
    );
    assert!(
        !error.reason.contains("syt_wrong_token"),
        "the token never prints: {error}"
    );
    let error = clawgate_channel_matrix::MatrixFactory
        .build_with_secrets(&setup(good.clone()), Secret::new(peer.ada.token.clone()))
        .await
        .unwrap_err();
    assert!(
        error.reason.contains("belongs to @ada"),
        "another account's token: {error}"
    );
    for (key, value, named) in [
        ("user_id", json!("clawgate"), "channels[2].settings.user_id"),
        (
            "allowed_rooms",
            json!(["#alias:localhost"]),
            "channels[2].settings.allowed_rooms[0]",
        ),
        (
            "homeserver_url",
            json!("localhost:8008"),
            "channels[2].settings.homeserver_url",
        ),
        (
            "poll_timeout_s",
            json!(600),
            "channels[2].settings.poll_timeout_s",
        ),
        (
            "pol_timeout_s",
            json!(5),
            "channels[2].settings.pol_timeout_s",
        ),
    ] {
        let mut settings = good.clone();
        settings[key] = value;
        let error = clawgate_channel_matrix::MatrixFactory
            .build_with_secrets(&setup(settings), Secret::new(peer.gateway.token.clone()))
            .await
            .unwrap_err();
        assert_eq!(error.key, named, "{error}");
    }
    if !cfg!(feature = "rustls") {
        let mut settings = good.clone();
        settings["homeserver_url"] = json!("https://matrix.example.org");
        let error = clawgate_channel_matrix::MatrixFactory
            .build_with_secrets(&setup(settings), Secret::new(peer.gateway.token.clone()))
            .await
            .unwrap_err();
        assert_eq!(error.key, "channels[2].settings.homeserver_url", "{error}");
        assert!(
            error.reason.contains("`rustls` feature"),
            "says what to do: {error}"
        );
    }
    let built = build(
        &peer.synapse.base,
        &peer.gateway,
        &peer.otherbot,
        state.path(),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(built.name(), "matrix");
    assert!(built.description.contains(&peer.gateway.user_id));
}

/// An engine over the peer's channel on a fresh state directory, with a driven clock.
pub(crate) fn engine(
    peer: &Peer,
) -> (
    tempfile::TempDir,
    clawgate_messages::Messenger,
    Arc<clawgate_types::clock::ManualClock>,
) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let clock = Arc::new(clawgate_types::clock::ManualClock::new(1_000));
    let messenger = clawgate_messages::Messenger::new(
        store,
        vec![peer.plugin.sender.clone()],
        clawgate_messages::RetryPolicy::default(),
        clock.clone(),
        "test",
    );
    (dir, messenger, clock)
}
