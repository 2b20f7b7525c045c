//! Sends as a BlueBubbles server answers them: real guids as receipts, the unit key's
//! `tempGuid` on every attempt, chunks, failures classified (only a definite refusal is
//! retried), lost answers settled from the chat's rows or left unresolved (never resent),
//! Apple's edit and unsend windows, and a password that never prints.

use std::sync::Arc;

use clawgate_channel_imessage::simulator::{Fault, FaultKind, SimulatorConfig};
use clawgate_channel_imessage::{ImessageFactory, temp_guid_for};
use clawgate_channel_sdk::SideEffect;
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{SendOptions, SendOutcome};
use clawgate_types::clock::ManualClock;
use serde_json::{Value, json};

use crate::echoes::{engine, reply};
use crate::peer::{Peer, build, quick, settings};

fn unit(index: u32, text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(index, text)
}

fn context(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "imessage", target.clone(), ""),
        key,
    )
}

fn sends(peer: &Peer) -> Vec<clawgate_channel_imessage::simulator::CallRecord> {
    peer.sim
        .calls()
        .into_iter()
        .filter(|c| c.path == "/api/v1/message/text")
        .collect()
}

#[tokio::test]
async fn receipts_are_real_guids_and_every_attempt_carries_the_units_temp_guid() {
    let peer = Peer::start().await;
    let person = peer.person("receipts");
    let db = tempfile::tempdir().unwrap();
    let messenger = engine(
        db.path(),
        peer.plugin.sender.clone(),
        Arc::new(ManualClock::new(1_000)),
    );
    let text = format!("{} {}", "x".repeat(3_500), "y".repeat(1_000));
    let report = messenger
        .send(reply(&person.id, "r-1", &text), SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    let rows: Vec<_> = peer
        .sim
        .messages()
        .into_iter()
        .filter(|m| m.chat_guid == person.id)
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows.iter()
            .map(|m| m.text.clone())
            .collect::<String>()
            .replace(' ', ""),
        text.replace(' ', "")
    );
    let ids: Vec<_> = receipt
        .parts
        .iter()
        .map(|p| p.platform_message_id.clone())
        .collect();
    assert_eq!(ids, rows.iter().map(|m| m.guid.clone()).collect::<Vec<_>>());
    let calls = sends(&peer);
    assert_eq!(calls.len(), 2);
    for call in &calls {
        assert_eq!(call.body["chatGuid"], person.id.as_str());
        assert_eq!(call.body["method"], "private-api");
        let temp = call.body["tempGuid"].as_str().unwrap();
        assert!(temp.starts_with("clawgate-"), "{temp}");
    }
    assert_ne!(calls[0].body["tempGuid"], calls[1].body["tempGuid"]);
}

#[tokio::test]
async fn a_send_error_is_retried_with_the_same_temp_guid_and_lands_once() {
    let peer = Peer::start().await;
    let person = peer.person("retry");
    let adapter = peer.plugin.sender.clone();
    let ctx = context(&person, "retry-1");
    peer.sim.inject(Fault::new(FaultKind::SendError));
    let error = adapter
        .send_unit(&ctx, &unit(0, "second time lucky"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::Transient, SideEffect::None),
        "{error:?}"
    );
    assert!(
        peer.sim.our_texts(&person.id).is_empty(),
        "a failed message is nobody's"
    );
    let part = adapter
        .send_unit(&ctx, &unit(0, "second time lucky"))
        .await
        .unwrap();
    assert_eq!(peer.sim.our_texts(&person.id), vec!["second time lucky"]);
    let temps: Vec<Value> = sends(&peer)
        .iter()
        .map(|c| c.body["tempGuid"].clone())
        .collect();
    let key = ctx.unit_key(&unit(0, ""));
    assert_eq!(
        temps,
        vec![json!(temp_guid_for(&key)), json!(temp_guid_for(&key))]
    );
    assert!(!part.platform_message_id.is_empty());
}

#[tokio::test]
async fn lost_answers_are_settled_from_the_chats_rows_or_stay_unresolved_never_resent() {
    let peer = Peer::start().await;
    let person = peer.person("lost");
    let adapter = peer.plugin.sender.clone();
    // One row per fault: a lost answer, a 504; then a request that died before any row, and
    // one whose tempGuid is still in flight.
    let cases = [
        ("after-row", FaultKind::LoseAnswer, "same words"),
        ("timeout", FaultKind::Timeout, "same words"),
        ("no-row", FaultKind::LoseRequest, "never landed"),
    ];
    let mut settled = Vec::new();
    for (key, fault, text) in cases {
        peer.sim.inject(Fault::new(fault));
        let ctx = context(&person, key);
        let error = adapter.send_unit(&ctx, &unit(0, text)).await.unwrap_err();
        assert_eq!(error.side_effect, SideEffect::Possible, "{key}: {error:?}");
        settled.push((ctx, text));
    }
    let held = context(&person, "in-flight");
    peer.sim
        .hold_in_flight(&temp_guid_for(&held.unit_key(&unit(0, ""))));
    let error = adapter
        .send_unit(&held, &unit(0, "queued"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible, "{error:?}");
    assert!(error.message.contains("already queued"), "{error:?}");
    // Two identical texts whose answers were lost each get their own row.
    let mut guids = Vec::new();
    for (ctx, text) in &settled[..2] {
        match adapter
            .reconcile_unknown_send(ctx, &unit(0, text))
            .await
            .unwrap()
        {
            Reconciliation::Sent(part) => guids.push(part.platform_message_id),
            other => panic!("a landed unit reconciles as sent: {other:?}"),
        }
    }
    let rows: Vec<String> = peer
        .sim
        .messages()
        .into_iter()
        .filter(|m| m.text == "same words")
        .map(|m| m.guid)
        .collect();
    assert_eq!(guids, rows, "each unit settles to its own row, in order");
    // No row, no proof either way: unresolved, asked again later, never sent twice.
    for (ctx, text) in [(&settled[2].0, "never landed"), (&held, "queued")] {
        assert_eq!(
            adapter
                .reconcile_unknown_send(ctx, &unit(0, text))
                .await
                .unwrap(),
            Reconciliation::Unresolved
        );
    }
    // Settling again gives the same answers (the claims are durable), and never a resend.
    match adapter
        .reconcile_unknown_send(&settled[0].0, &unit(0, "same words"))
        .await
        .unwrap()
    {
        Reconciliation::Sent(part) => assert_eq!(part.platform_message_id, guids[0]),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        adapter
            .reconcile_unknown_send(&context(&person, "never-tried"), &unit(0, "x"))
            .await
            .unwrap(),
        Reconciliation::NotSent,
        "no attempt line: it never left"
    );
    assert_eq!(sends(&peer).len(), 4);
}

#[tokio::test]
async fn an_unknown_final_is_reconciled_by_the_engine_after_a_restart() {
    let peer = Peer::start().await;
    let person = peer.person("restart");
    let db = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    peer.sim.inject(Fault::new(FaultKind::Timeout));
    let report = engine(db.path(), peer.plugin.sender.clone(), clock.clone())
        .send(
            reply(&person.id, "unknown-1", "did it land?"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    // A new account on the same state directory (its journal) and store.
    let again = build(&peer.sim, peer.state.path(), peer.settings.clone())
        .await
        .unwrap();
    clock.advance(60_000);
    let messenger = engine(db.path(), again.sender.clone(), clock);
    messenger.recover().await.unwrap();
    assert_eq!(peer.sim.our_texts(&person.id), vec!["did it land?"]);
    assert_eq!(sends(&peer).len(), 1, "never sent twice");
}

#[tokio::test]
async fn edits_and_unsends_keep_apples_windows_and_are_refused_for_sms() {
    let peer = Peer::start().await;
    let person = peer.person("edits");
    let adapter = peer.plugin.sender.clone();
    let ctx = context(&person, "edit-1");
    let mut part = adapter.send_unit(&ctx, &unit(0, "v0")).await.unwrap();
    for n in 1..=5 {
        part = adapter
            .edit(&ctx, &part, &unit(0, &format!("v{n}")))
            .await
            .unwrap();
    }
    let before = peer.sim.calls().len();
    let error = adapter.edit(&ctx, &part, &unit(0, "v6")).await.unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::InvalidPayload, SideEffect::None)
    );
    assert_eq!(peer.sim.calls().len(), before, "refused before any request");
    assert_eq!(peer.sim.our_texts(&person.id), vec!["v5"]);
    // Past the windows (the Mac's clock moved on): the server refuses, nothing changes.
    let fresh = context(&person, "edit-2");
    let late = adapter.send_unit(&fresh, &unit(0, "late")).await.unwrap();
    peer.sim.advance(16 * 60 * 1000);
    let error = adapter
        .edit(&fresh, &late, &unit(0, "too late"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::InvalidPayload, SideEffect::None),
        "{error:?}"
    );
    let error = adapter.delete(&fresh, &late).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::InvalidPayload, "{error:?}");
    assert_eq!(peer.sim.our_texts(&person.id), vec!["v5", "late"]);
    // Within 2 minutes an unsend works.
    let gone = context(&person, "edit-3");
    let part = adapter.send_unit(&gone, &unit(0, "oops")).await.unwrap();
    adapter.delete(&gone, &part).await.unwrap();
    assert_eq!(peer.sim.our_texts(&person.id), vec!["v5", "late"]);
    // SMS: neither, and nothing is asked of the server.
    let sms = MessageTarget::direct(peer.sim.sms("+15550007777"));
    let sms_ctx = context(&sms, "sms-1");
    let part = adapter
        .send_unit(&sms_ctx, &unit(0, "plain sms"))
        .await
        .unwrap();
    let before = peer.sim.calls().len();
    assert!(adapter.edit(&sms_ctx, &part, &unit(0, "x")).await.is_err());
    assert!(adapter.delete(&sms_ctx, &part).await.is_err());
    assert_eq!(peer.sim.calls().len(), before);
}

#[tokio::test]
async fn without_the_private_api_nothing_live_is_declared_and_sends_use_applescript() {
    let peer = Peer::with(
        SimulatorConfig {
            private_api: false,
            ..quick()
        },
        json!({ "private_api": false }),
    )
    .await;
    let adapter = peer.plugin.sender.clone();
    assert!(!adapter.capabilities().can_edit() && !adapter.capabilities().can_delete());
    assert!(adapter.capabilities().reconciles_unknown_sends());
    let person = peer.person("applescript");
    let ctx = context(&person, "as-1");
    let part = adapter.send_unit(&ctx, &unit(0, "hello")).await.unwrap();
    assert_eq!(sends(&peer)[0].body["method"], "apple-script");
    assert!(adapter.edit(&ctx, &part, &unit(0, "x")).await.is_err());
    // Finals are never previewed.
    assert!(!adapter.previews(&ctx.message));
}

#[tokio::test]
async fn a_wrong_password_stops_the_start_naming_the_setting_and_never_prints() {
    let peer = Peer::start().await;
    let setup = clawgate_conformance::channel_setup(
        0,
        "imessage",
        "default",
        peer.settings.clone(),
        peer.state.path(),
    );
    let error = ImessageFactory
        .build_with_secrets(
            &setup,
            Secret::new("not-the-password"),
            Secret::new(crate::peer::TOKEN),
        )
        .await
        .unwrap_err();
    assert_eq!(error.key, "channels[0].settings.password_env", "{error}");
    assert!(!error.to_string().contains("not-the-password"), "{error}");
    // The right password works, and nothing the account prints names it.
    let plugin = build(
        &peer.sim,
        peer.state.path(),
        settings(&peer.sim, 1, &json!({})),
    )
    .await
    .unwrap();
    let printed = format!("{:?} {:?}", plugin, plugin.sender.capabilities());
    assert!(!printed.contains(&peer.sim.password()), "{printed}");
    let unauthorized: Vec<_> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| !c.authorized)
        .collect();
    assert_eq!(unauthorized.len(), 1);
}

#[tokio::test]
async fn a_preview_spends_at_most_four_edits_and_keeps_the_fifth_for_the_final() {
    let peer = Peer::start().await;
    let person = peer.person("preview");
    let db = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let messenger = engine(db.path(), peer.plugin.sender.clone(), clock.clone());
    assert!(peer.plugin.sender.previews(&reply(&person.id, "p", "x")));
    let mut live = messenger
        .begin_live(
            reply(&person.id, "preview-1", ""),
            SendOptions::default(),
            clawgate_messages::LiveOptions::default(),
        )
        .await
        .unwrap();
    let mut text = String::from("streaming");
    for n in 0..9 {
        text.push_str(&format!(" w{n}"));
        live.update(&text).await.unwrap();
        clock.advance(1_100);
    }
    let report = live
        .finalize(reply(&person.id, "preview-1", "the whole final"))
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    assert_eq!(peer.sim.our_texts(&person.id), vec!["the whole final"]);
    let edits = peer
        .sim
        .calls()
        .iter()
        .filter(|c| c.path.ends_with("/edit"))
        .count();
    assert_eq!(edits, 5, "four updates and the final");
    assert!(peer.sim.messages().iter().all(|m| m.edits <= 5));
    // SMS chats are never previewed.
    let sms = peer.sim.sms("+15550008888");
    assert!(!peer.plugin.sender.previews(&reply(&sms, "p", "x")));
}
