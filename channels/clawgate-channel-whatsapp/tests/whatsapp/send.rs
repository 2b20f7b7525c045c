//! Sends as the Cloud API answers them: `wamid` receipts, 4096-character chunks, quoted
//! replies, the 24-hour window as a permanent class (never a retry loop), rate limits
//! honoured, a revoked token, the number check at start, plain durable finals, and unknown
//! sends settled from their status webhooks after a restart.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_whatsapp::simulator::{Fault, FaultKind, GraphFault, SimulatorConfig};
use clawgate_channel_whatsapp::{WhatsAppFactory, WhatsAppSettings};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::clock::{Clock, ManualClock};
use clawgate_types::{IntentStatus, MessageRelation};
use serde_json::json;

use crate::peer::{Peer, VERIFY_TOKEN, quick};

/// An engine over `sender`, on the store in `dir` and a driven clock.
pub(crate) fn engine_in(
    dir: &std::path::Path,
    sender: Arc<dyn ChannelMessageAdapter>,
    clock: Arc<ManualClock>,
) -> (Messenger, Arc<clawgate_store_sqlite::SqliteStore>) {
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir));
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    let messenger = Messenger::new(store.clone(), vec![sender], policy, clock, "whatsapp-tests");
    (messenger, store)
}

pub(crate) fn reply(target: &MessageTarget, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, "whatsapp", target.clone(), text)
}

pub(crate) async fn statuses(store: &clawgate_store_sqlite::SqliteStore) -> Vec<IntentStatus> {
    store
        .list_intents(&IntentFilter {
            limit: 10,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.status)
        .collect()
}

#[tokio::test]
async fn long_replies_are_chunked_at_4096_and_quote_the_question_once() {
    let peer = Peer::start().await;
    let person = peer.person("chunks");
    let question = peer
        .sim
        .person_writes(&person.id, "Ada", "tell me everything");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, _store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock);
    let text = format!("{} {}", "a".repeat(4_000), "b".repeat(3_000));
    let message = reply(&person, "chunks-1", &text)
        .with_relation(MessageRelation::reply_to(question.clone()));
    let report = messenger
        .send(message, SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    let landed = peer.sim.sent(&person.id);
    assert_eq!(landed.len(), 2);
    assert!(
        landed
            .iter()
            .all(|m| m.text.as_ref().unwrap().chars().count() <= 4_096)
    );
    assert_eq!(
        landed
            .iter()
            .map(|m| m.text.clone().unwrap())
            .collect::<String>(),
        text
    );
    assert_eq!(landed[0].context.as_deref(), Some(question.as_str()));
    assert_eq!(landed[1].context, None, "only the first chunk quotes");
    assert!(landed.iter().all(|m| !m.preview_url));
    // Receipts are the wamids WhatsApp gave; each chunk carries its own unit key.
    let ids: Vec<_> = receipt
        .parts
        .iter()
        .map(|p| p.platform_message_id.clone())
        .collect();
    assert_eq!(
        ids,
        landed.iter().map(|m| m.wamid.clone()).collect::<Vec<_>>()
    );
    assert!(ids.iter().all(|id| id.starts_with("wamid.")));
    let keys: Vec<_> = landed
        .iter()
        .map(|m| m.callback_data.clone().unwrap())
        .collect();
    assert!(
        keys[0].ends_with("#0") && keys[1].ends_with("#1"),
        "{keys:?}"
    );
    assert_eq!(
        keys[0].trim_end_matches("#0"),
        keys[1].trim_end_matches("#1")
    );
}

#[tokio::test]
async fn outside_the_24_hour_window_a_send_fails_once_and_is_not_retried() {
    let peer = Peer::start().await;
    let person = peer.person("window");
    peer.sim.close_window(&person.id);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    let report = messenger
        .send(reply(&person, "late-1", "too late"), SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Failed { failure, .. } = report.outcome else {
        panic!("outside the window a send fails for good: {report:?}")
    };
    assert_eq!(failure.kind, DeliveryFailureKind::Permission);
    assert_eq!(failure.platform_code.as_deref(), Some("131047"));
    assert_ne!(failure.reason, None);
    assert!(failure.message.contains("24 hours"), "{}", failure.message);
    clock.advance(3_600_000);
    messenger.recover().await.unwrap();
    let sends = peer
        .sim
        .calls()
        .iter()
        .filter(|c| c.path.ends_with("/messages"))
        .count();
    assert_eq!(sends, 1, "never a retry loop");
    assert!(peer.sim.sent(&person.id).is_empty());
    assert_eq!(statuses(&store).await, vec![IntentStatus::Failed]);
    // Once the person writes again, the window is open.
    peer.sim.person_writes(&person.id, "Ada", "back");
    let report = messenger
        .send(
            reply(&person, "late-2", "welcome back"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
}

#[tokio::test]
async fn rate_limits_are_honoured_by_code_whatever_the_http_status() {
    let peer = Peer::start().await;
    let person = peer.person("throttle");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, _store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    let cases = [
        (GraphFault::code(131_056), 6_000),
        (GraphFault::code(130_429).with_status(429), 1_000),
        (GraphFault::code(80_007), 60_000),
        (GraphFault::code(4), 60_000),
    ];
    for (n, (fault, wait)) in cases.into_iter().enumerate() {
        let code = fault.code;
        peer.sim.inject(Fault::new(FaultKind::Refuse(fault)));
        let report = messenger
            .send(
                reply(&person, &format!("limit-{n}"), &format!("paced {n}")),
                SendOptions::default(),
            )
            .await
            .unwrap();
        let SendOutcome::RetryScheduled {
            next_attempt_at,
            failure,
            ..
        } = report.outcome
        else {
            panic!("{code}: {report:?}")
        };
        assert_eq!(failure.kind, DeliveryFailureKind::RateLimit, "{code}");
        assert_eq!(failure.retry_after_ms, Some(wait), "{code}");
        assert!(next_attempt_at >= clock.now_ms() + wait as i64, "{code}");
        clock.advance(wait as i64 + 1);
        messenger.recover().await.unwrap();
    }
    assert_eq!(
        peer.texts(&person.id),
        vec!["paced 0", "paced 1", "paced 2", "paced 3"],
        "each lands once, after its wait"
    );
}

#[tokio::test]
async fn a_revoked_token_waits_for_configuration_and_names_the_setting() {
    let peer = Peer::start().await;
    let person = peer.person("revoked");
    peer.sim.revoke_token();
    let part = peer
        .plugin
        .sender
        .send_unit(
            &SendContext::new(reply(&person, "r-1", ""), "r-1"),
            &RenderedMessageUnit::text(0, "hello"),
        )
        .await
        .unwrap_err();
    assert_eq!(part.kind, DeliveryFailureKind::Auth);
    assert_eq!(part.side_effect, SideEffect::None);
    assert!(part.message.contains("token_env"), "{}", part.message);
    assert!(peer.sim.sent(&person.id).is_empty());
}

#[tokio::test]
async fn the_factory_checks_the_token_and_the_number_and_names_the_key() {
    let peer = Peer::start().await;
    let state = tempfile::tempdir().unwrap();
    let settings = |number: &str| {
        json!({
            "token_env": "WA_TOKEN", "app_secret_env": "WA_SECRET", "verify_token_env": "WA_VERIFY",
            "phone_number_id": number, "webhook_listen": "127.0.0.1:9",
            "api_base": peer.sim.api_url(),
        })
    };
    let build = |settings: serde_json::Value, token: &str| {
        let setup =
            clawgate_conformance::channel_setup(3, "whatsapp", "default", settings, state.path());
        let token = Secret::new(token);
        async move {
            WhatsAppFactory
                .build_with_secrets(&setup, token, Secret::new("s"), Secret::new(VERIFY_TOKEN))
                .await
        }
    };
    let error = build(settings(&peer.sim.phone_number_id()), "EAAG-wrong")
        .await
        .unwrap_err();
    assert_eq!(error.key, "channels[3].settings.token_env", "{error}");
    assert!(error.reason.contains("WA_TOKEN"), "{error}");
    let error = build(settings("999999"), &peer.sim.token())
        .await
        .unwrap_err();
    assert_eq!(error.key, "channels[3].settings.phone_number_id", "{error}");
    let mut typo = settings(&peer.sim.phone_number_id());
    typo["phone_numer_id"] = json!("1");
    let error = build(typo, &peer.sim.token()).await.unwrap_err();
    assert_eq!(error.key, "channels[3].settings.phone_numer_id", "{error}");
    let plugin = build(settings(&peer.sim.phone_number_id()), &peer.sim.token())
        .await
        .unwrap();
    assert!(
        plugin.description.contains("+15550783881"),
        "{}",
        plugin.description
    );
    // Secrets never print.
    assert!(!format!("{:?}", plugin.sender.capabilities()).contains(&peer.sim.token()));
    let parsed: WhatsAppSettings =
        serde_json::from_value(settings(&peer.sim.phone_number_id())).unwrap();
    assert!(!format!("{parsed:?}").contains(&peer.sim.token()));
}

#[tokio::test]
async fn finals_are_plain_durable_sends_without_previews_or_edits() {
    // The test plan's "simple durable finals" line: the intent (with its whole batch) is
    // durable before any I/O, and the final is one send per chunk, never edited.
    let peer = Peer::start().await;
    let person = peer.person("plain");
    let capabilities = peer.plugin.sender.capabilities();
    assert!(
        capabilities.live.is_none(),
        "WhatsApp declares no live previews"
    );
    assert!(peer.plugin.sender.live().is_none());
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock);
    // The platform refuses the first attempt: the intent must already be durable then.
    peer.sim.inject(Fault::code(131_000));
    let report = messenger
        .send(
            reply(&person, "final-1", "the answer"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(report.durable);
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "{report:?}"
    );
    let intents = store
        .list_intents(&IntentFilter {
            limit: 10,
            ..IntentFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(intents.len(), 1);
    assert!(
        intents[0].batch.is_some(),
        "the rendered final is stored before I/O"
    );
    drop(messenger);
    // A restart sends it from the stored intent alone.
    let clock = Arc::new(ManualClock::new(60_000));
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock);
    messenger.recover().await.unwrap();
    assert_eq!(peer.texts(&person.id), vec!["the answer"]);
    assert_eq!(statuses(&store).await, vec![IntentStatus::Sent]);
    let methods: Vec<_> = peer.sim.calls().iter().map(|c| c.method.clone()).collect();
    assert!(
        methods.iter().all(|m| m == "GET" || m == "POST"),
        "{methods:?}"
    );
}

#[tokio::test]
async fn an_unknown_send_is_settled_by_its_status_webhook_after_a_restart() {
    let peer = Peer::start().await;
    let person = peer.person("settle");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    // Statuses wait while the callback URL is unset (the gateway is down).
    peer.sim.set_webhook_url(None);
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    {
        let (messenger, _store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
        let report = messenger
            .send(
                reply(&person, "lost-1", "exactly once"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
    }
    // Restarted, before the status arrived: still unknown, never resent.
    clock.advance(60_000);
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    messenger.recover().await.unwrap();
    assert_eq!(statuses(&store).await, vec![IntentStatus::UnknownAfterSend]);
    assert_eq!(peer.sim.sent(&person.id).len(), 1);
    // Meta delivers the held statuses once the listener is back; the next pass settles it.
    peer.sim.set_webhook_url(Some(&peer.webhook_url));
    assert!(peer.sim.statuses_settled(Duration::from_secs(20)).await);
    clock.advance(60_000);
    messenger.recover().await.unwrap();
    assert_eq!(statuses(&store).await, vec![IntentStatus::Sent]);
    let landed = peer.sim.sent(&person.id);
    assert_eq!(landed.len(), 1, "sent exactly once");
    let intent = store
        .list_intents(&IntentFilter {
            limit: 1,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .remove(0);
    let receipt = intent.receipt.or(intent.partial_receipt).unwrap();
    assert_eq!(receipt.parts[0].platform_message_id, landed[0].wamid);
}

#[tokio::test]
async fn a_send_that_fails_after_acceptance_is_reported_by_its_status() {
    // Meta reports some failures only in a `failed` status webhook (an accepted send that
    // could not be delivered). The send is accepted; the book keeps the code.
    let peer = Peer::with(
        SimulatorConfig {
            window_refused_synchronously: false,
            ..quick()
        },
        json!({}),
    )
    .await;
    let person = peer.person("async");
    peer.sim.close_window(&person.id);
    let sender = peer.plugin.sender.clone();
    let ctx = SendContext::new(reply(&person, "async-1", ""), "async-1");
    let unit = RenderedMessageUnit::text(0, "late");
    let part = sender.send_unit(&ctx, &unit).await.unwrap();
    assert!(peer.sim.statuses_settled(Duration::from_secs(20)).await);
    let landed = peer.sim.sent(&person.id).remove(0);
    assert_eq!(landed.wamid, part.platform_message_id);
    assert_eq!(landed.status, "failed");
    let book = peer.status_book().await;
    let evidence = book.get("async-1#0").await.unwrap().unwrap();
    assert_eq!(evidence.failed_codes, vec![131_047]);
}

#[tokio::test]
async fn a_key_never_attempted_reconciles_as_not_sent_and_an_attempt_without_evidence_stays_unknown()
 {
    let peer = Peer::start().await;
    let person = peer.person("evidence");
    let sender = peer.plugin.sender.clone();
    let never = SendContext::new(reply(&person, "never", ""), "never");
    let unit = RenderedMessageUnit::text(0, "x");
    assert_eq!(
        sender.reconcile_unknown_send(&never, &unit).await.unwrap(),
        Reconciliation::NotSent
    );
    // A request that went out and was never answered, with no status (a connection that
    // dropped before Meta read it, or a status still held): unknown, not "not sent".
    peer.sim.inject(Fault::new(FaultKind::ServerError(502)));
    let tried = SendContext::new(reply(&person, "tried", ""), "tried");
    let error = sender.send_unit(&tried, &unit).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    assert_eq!(
        sender.reconcile_unknown_send(&tried, &unit).await.unwrap(),
        Reconciliation::Unresolved
    );
    assert!(peer.sim.sent(&person.id).is_empty());
}
