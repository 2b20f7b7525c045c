//! Test peer: a gateway-side process that sends through the QA platform and can be stopped
//! dead at a lifecycle boundary, then restarted to recover.
//!
//! usage:
//!   send-worker send    STATE_DIR BASE_URL TOKEN idempotent|plain BOUNDARY TEXT
//!   send-worker recover STATE_DIR BASE_URL TOKEN idempotent|plain
//!   send-worker turns   STATE_DIR BASE_URL TOKEN idempotent|plain BOUNDARY
//!   send-worker live    STATE_DIR BASE_URL TOKEN idempotent|plain
//!
//! In `send` mode, reaching BOUNDARY (intent_recorded, unit_delivered_N, platform_accepted)
//! prints `STOPPED <boundary>` and freezes the process until the test
//! kills it with SIGKILL. `recover` runs recovery passes until nothing is due, then prints the
//! status of every intent.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_qa::QaAdapter;
use clawgate_messages::{Boundary, LifecycleProbe, Messenger, RetryPolicy, SendOptions};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_store_sqlite::{SqliteOptions, SqliteStore};
use clawgate_types::clock::SystemClock;
use clawgate_types::{IntentId, IntentStatus};

struct StopAt(String);

impl LifecycleProbe for StopAt {
    fn reached(&self, boundary: Boundary, _intent: &IntentId) {
        let name = match boundary {
            Boundary::IntentRecorded => "intent_recorded".to_owned(),
            Boundary::UnitDelivered { index } => format!("unit_delivered_{index}"),
            Boundary::PlatformAccepted => "platform_accepted".to_owned(),
        };
        if name == self.0 {
            println!("STOPPED {name}");
            let _ = std::io::stdout().flush();
            // Frozen exactly here until SIGKILL.
            loop {
                std::thread::park();
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, dir, base, token, variant) = match args.as_slice() {
        [mode, dir, base, token, variant, ..] => (mode, dir, base, token, variant),
        _ => anyhow::bail!(
            "usage: send-worker send|recover STATE_DIR BASE_URL TOKEN VARIANT [BOUNDARY TEXT]"
        ),
    };
    let adapter = match variant.as_str() {
        "idempotent" => QaAdapter::new(base, token),
        "plain" => QaAdapter::without_idempotency(base, token),
        other => anyhow::bail!("unknown variant {other}"),
    };
    let store = Arc::new(SqliteStore::open_state_dir(
        dir.as_ref(),
        SqliteOptions::default(),
    )?);
    let policy = RetryPolicy {
        base_delay_ms: 50,
        reconcile_delay_ms: 50,
        ..RetryPolicy::default()
    };
    let messenger = Messenger::new(
        store.clone(),
        vec![Arc::new(adapter)],
        policy,
        Arc::new(SystemClock),
        "crash-test",
    );
    match mode.as_str() {
        "send" => {
            let [.., boundary, text] = args.as_slice() else {
                anyhow::bail!("send needs BOUNDARY TEXT")
            };
            let messenger = messenger.with_probe(Arc::new(StopAt(boundary.clone())));
            let report = messenger
                .send(
                    clawgate_e2e::qa_message("crash", text),
                    SendOptions::default(),
                )
                .await?;
            println!("DONE {:?}", report.outcome);
        }
        "turns" => {
            let [.., boundary] = args.as_slice() else {
                anyhow::bail!("turns needs BOUNDARY (or `none`)")
            };
            turns(
                store.clone(),
                messenger,
                adapter_for_turns(variant, base, token)?,
                boundary,
            )
            .await?;
        }
        "live" => {
            // A reply streaming as a live preview when the process dies.
            let mut live = messenger
                .begin_live(
                    clawgate_e2e::qa_message("streamed", ""),
                    SendOptions::default(),
                    clawgate_messages::LiveOptions::default(),
                )
                .await?;
            live.update("half of an ans").await?;
            println!("STOPPED live_preview");
            let _ = std::io::stdout().flush();
            loop {
                std::thread::park();
            }
        }
        "recover" => {
            for _ in 0..100 {
                messenger.recover().await?;
                let busy = store
                    .list_intents(&IntentFilter {
                        statuses: vec![
                            IntentStatus::Pending,
                            IntentStatus::Sending,
                            IntentStatus::Committing,
                        ],
                        limit: 10,
                        ..IntentFilter::default()
                    })
                    .await?;
                let unknown = store
                    .list_intents(&IntentFilter {
                        statuses: vec![IntentStatus::UnknownAfterSend],
                        limit: 10,
                        ..IntentFilter::default()
                    })
                    .await?;
                if busy.is_empty() && unknown.iter().all(|i| i.next_attempt_at.is_none()) {
                    break;
                }
                // Reconciliations and retries are scheduled 50 ms out in real time.
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
            let all = store
                .list_intents(&IntentFilter {
                    limit: 100,
                    ..IntentFilter::default()
                })
                .await?;
            for intent in all {
                println!("INTENT {} {}", intent.id, intent.status);
            }
        }
        other => anyhow::bail!("unknown mode {other}"),
    }
    Ok(())
}

fn adapter_for_turns(variant: &str, base: &str, token: &str) -> anyhow::Result<QaAdapter> {
    Ok(match variant {
        "idempotent" => QaAdapter::new(base, token),
        "plain" => QaAdapter::without_idempotency(base, token),
        other => anyhow::bail!("unknown variant {other}"),
    })
}

/// A gateway's inbound loop: recover pending replies, then poll updates from the durable
/// watermark and answer each with one durable reply. `inbound_recorded` freezes the process
/// right after an update was recorded (before its reply); `reply_accepted` after a reply landed
/// on the platform (before its receipt is committed).
async fn turns(
    store: Arc<SqliteStore>,
    messenger: Messenger,
    adapter: QaAdapter,
    boundary: &str,
) -> anyhow::Result<()> {
    use clawgate_channel_sdk::TransportAck;
    use clawgate_messages::{
        AckController, PollingWatermark, ReceiveOptions, ReceiveOutcome, Receiver,
    };
    struct NoAck;
    impl TransportAck for NoAck {
        fn ack(&self) {}
        fn nack(&self, _: &str) {}
    }
    let clock = Arc::new(SystemClock);
    let messenger = if boundary == "reply_accepted" {
        messenger.with_probe(Arc::new(StopAt("platform_accepted".into())))
    } else {
        messenger
    };
    messenger.recover().await?;
    let receiver = Receiver::new(
        store.clone(),
        Arc::new(adapter.clone()),
        Arc::new(adapter.clone()),
        clock.clone(),
        ReceiveOptions::default(),
    );
    let key = clawgate_store::WatermarkKey {
        channel: "qa".into(),
        account_id: "bot".into(),
        source: "updates".into(),
    };
    let mut watermark = PollingWatermark::open(store.clone(), clock, key).await?;
    loop {
        let updates = adapter
            .get_updates(watermark.next_offset(), 0)
            .await
            .map_err(|e| anyhow::anyhow!(e.message))?;
        if updates.is_empty() {
            break;
        }
        for update in updates {
            if !watermark.accept(update.update_id) {
                continue;
            }
            let raw = serde_json::to_value(&update.message)?;
            let ack = AckController::new(Arc::new(NoAck));
            let messenger = messenger.clone();
            let outcome = receiver
                .receive(&raw, &ack, |inbound| async move {
                    if boundary == "inbound_recorded" {
                        println!("STOPPED inbound_recorded");
                        let _ = std::io::stdout().flush();
                        loop {
                            std::thread::park();
                        }
                    }
                    let text = inbound.message.body.map(|b| b.text).unwrap_or_default();
                    // One reply per inbound event: its id (and so its idempotency key) is
                    // derived from the event, so a replayed turn never makes a second reply.
                    let reply = clawgate_e2e::qa_message(
                        &format!("reply-{}", inbound.event_id),
                        &format!("re: {text}"),
                    );
                    messenger
                        .send(reply, SendOptions::default())
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
                .await?;
            if matches!(
                outcome,
                ReceiveOutcome::Handled { .. } | ReceiveOutcome::Duplicate { .. }
            ) {
                watermark.finish(update.update_id).await?;
            }
        }
    }
    println!("DRAINED {}", watermark.safe());
    Ok(())
}
