//! The channel-turn bridge: legacy turns keep the channel's own delivery (never a generic send
//! first) and are not durable unless the channel opts in; prepared turns still record and
//! finalize the inbound event.

use std::sync::{Arc, Mutex};

use clawgate_channel_qa::InboundRequest;
use clawgate_channel_sdk::TransportAck;
use clawgate_messages::channel_turn::{self, TurnDelivery};
use clawgate_messages::{AckController, ReceiveOptions, ReceiveOutcome, Receiver};
use clawgate_store::{InboundStatus, IntentFilter, IntentStore};
use clawgate_types::{DeliveryStatus, MessageDurabilityPolicy};

use crate::harness::{Harness, message};

struct NoopAck;

impl TransportAck for NoopAck {
    fn ack(&self) {}
    fn nack(&self, _: &str) {}
}

fn question(h: &Harness, text: &str) -> serde_json::Value {
    let m = h
        .platform
        .inject_inbound(
            "room-1",
            InboundRequest {
                text: text.into(),
                author_id: "alice".into(),
                author_is_bot: false,
                thread_id: None,
                reply_to_id: None,
                metadata: None,
            },
        )
        .unwrap();
    serde_json::to_value(m).unwrap()
}

fn receiver(h: &Harness) -> Receiver {
    Receiver::new(
        h.store.clone(),
        Arc::new(h.adapter()),
        Arc::new(h.adapter()),
        h.clock.clone(),
        ReceiveOptions::default(),
    )
}

async fn intents(h: &Harness) -> usize {
    h.store
        .list_intents(&IntentFilter {
            limit: 100,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simple_turn_calls_the_channels_callback_and_is_not_durable_by_default() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let raw = question(&h, "hi?");
    let delivered = Arc::new(Mutex::new(Vec::<String>::new()));
    let d = delivered.clone();
    let report = channel_turn::run(
        &receiver(&h),
        &messenger,
        &raw,
        &AckController::new(Arc::new(NoopAck)),
        TurnDelivery::default(),
        |inbound| async move {
            Ok(vec![message(
                "a1",
                &format!("re: {}", inbound.message.body.unwrap().text),
            )])
        },
        move |reply| {
            let d = d.clone();
            async move {
                d.lock().unwrap().push(reply.body.unwrap().text);
                Ok(vec!["callback-id-1".to_owned()])
            }
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(report.receive, ReceiveOutcome::Handled { .. }),
        "the inbound is recorded and finished"
    );
    assert_eq!(
        *delivered.lock().unwrap(),
        vec!["re: hi?"],
        "the caller's deliver callback ran"
    );
    assert_eq!(
        report.deliveries[0].platform_message_ids,
        vec!["callback-id-1"],
        "its ids come back"
    );
    assert_eq!(report.deliveries[0].status, DeliveryStatus::HandledVisible);
    assert_eq!(
        intents(&h).await,
        0,
        "no durable intent unless the channel opts in"
    );
    assert_eq!(
        h.platform.messages("room-1").len(),
        1,
        "no generic send happened (only the question)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_durable_policy_sends_through_send_contexts() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let raw = question(&h, "durable?");
    let report = channel_turn::run(
        &receiver(&h),
        &messenger,
        &raw,
        &AckController::new(Arc::new(NoopAck)),
        TurnDelivery::Durable(MessageDurabilityPolicy::Required),
        |_| async { Ok(vec![message("a2", "yes, durably")]) },
        |_| async { panic!("the channel callback is not used on the durable path") },
    )
    .await
    .unwrap();
    assert_eq!(intents(&h).await, 1, "the reply was a durable intent");
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 2);
    assert_eq!(
        report.deliveries[0].platform_message_ids,
        vec![landed[1].id.clone()],
        "durable delivery returns the platform ids"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prepared_turn_still_records_and_finalizes() {
    let h = Harness::new().await;
    let raw = question(&h, "prepared?");
    let ran = Arc::new(Mutex::new(false));
    let r = ran.clone();
    let outcome = channel_turn::run_prepared(
        &receiver(&h),
        &raw,
        &AckController::new(Arc::new(NoopAck)),
        |_| async move {
            *r.lock().unwrap() = true;
            Ok(())
        },
    )
    .await
    .unwrap();
    assert!(*ran.lock().unwrap(), "the channel's dispatcher ran");
    let ReceiveOutcome::Handled { record } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        record.status,
        InboundStatus::Completed,
        "recorded and finalized"
    );
}
