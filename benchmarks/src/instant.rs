//! The instant platform and the messenger over it: what the SQLite and the PostgreSQL send
//! figures both drive, so both measure the engine and the store, not a platform.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clawgate_channel_sdk::{ChannelMessageAdapter, Reconciliation, SendContext, SendError};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions};
use clawgate_store::IntentStore;
use clawgate_store::testing::sample_intent;
use clawgate_types::clock::SystemClock;
use clawgate_types::{
    DeliveryCapabilities, MessageCapabilities, MessageReceiptPart, RenderedMessageUnit,
};

/// A platform that answers at once: the figures are the engine's and the store's.
#[derive(Debug, Default)]
pub(crate) struct InstantPlatform {
    capabilities: MessageCapabilities,
    pub(crate) sent: AtomicU64,
    /// What landed, by idempotency key and unit (kept only when it reconciles).
    landed: Option<Mutex<HashMap<(String, u32), MessageReceiptPart>>>,
}

impl InstantPlatform {
    /// Declares no delivery capability: every send is `pending`, `sending`, `sent`.
    pub(crate) fn plain() -> InstantPlatform {
        InstantPlatform::default()
    }

    /// Remembers what it accepted and answers "did this land?": the engine records the intent
    /// with its first attempt started, so every send is `sending`, `sent`.
    pub(crate) fn reconciling() -> InstantPlatform {
        let capabilities = MessageCapabilities::default()
            .with_delivery(DeliveryCapabilities::default().with_reconcile_unknown_send(true));
        InstantPlatform {
            capabilities,
            landed: Some(Mutex::default()),
            ..InstantPlatform::default()
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[async_trait]
impl ChannelMessageAdapter for InstantPlatform {
    fn channel(&self) -> &str {
        "qa"
    }

    fn capabilities(&self) -> &MessageCapabilities {
        &self.capabilities
    }

    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        let part = clawgate_store::testing::part(unit.index, &format!("p-{n}"));
        if let Some(landed) = &self.landed {
            lock(landed).insert((ctx.idempotency_key.clone(), unit.index), part.clone());
        }
        Ok(part)
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let Some(landed) = &self.landed else {
            return Ok(Reconciliation::Unresolved);
        };
        let key = (ctx.idempotency_key.clone(), unit.index);
        Ok(match lock(landed).get(&key) {
            Some(part) => Reconciliation::Sent(Box::new(part.clone())),
            None => Reconciliation::NotSent,
        })
    }
}

pub(crate) fn messenger(
    store: Arc<dyn IntentStore>,
    platform: InstantPlatform,
) -> (Messenger, Arc<InstantPlatform>) {
    let platform = Arc::new(platform);
    let messenger = Messenger::new(
        store,
        vec![platform.clone()],
        RetryPolicy::default(),
        Arc::new(SystemClock),
        "bench",
    );
    (messenger, platform)
}

/// The messenger a PostgreSQL phase drives: the plain instant platform, as the SQLite figures'.
pub(crate) fn bench_messenger(store: Arc<dyn IntentStore>) -> Messenger {
    messenger(store, InstantPlatform::plain()).0
}

/// One durable send with a time-ordered message id (intent; sending; receipt committed).
pub(crate) async fn one_send(messenger: &Messenger, n: u64) -> anyhow::Result<()> {
    let mut message = sample_intent(n, 0).message;
    message.id = clawgate_store::ids::new_id();
    let report = messenger.send(message, SendOptions::default()).await?;
    anyhow::ensure!(
        report.outcome.receipt().is_some(),
        "send failed: {report:?}"
    );
    Ok(())
}
