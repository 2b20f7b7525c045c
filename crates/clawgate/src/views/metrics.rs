//! `GET /v1/metrics`: the last minutes as per-minute figures (the operator console's charts).
//!
//! Computed from the listings the other views use (send intents created since the window began,
//! inbound records newest first), so it needs no query of its own in either store: the reply
//! intents' keys (`<channel>:reply:<event>:<generation>`) lead back to the inbound event, and
//! the latency of a reply is its receipt's `sentAt` minus the event's `receivedAt`.

use std::collections::{BTreeMap, HashMap};

use clawgate_store::{InboundStore, IntentCursor, IntentFilter, IntentStore};
use clawgate_types::{DurableSendIntent, IntentStatus, UnixMillis};
use serde::{Deserialize, Serialize};

use super::{INBOUND_COUNT_CAP, ViewError};

/// Minutes shown unless told otherwise.
pub const DEFAULT_METRICS_MINUTES: u32 = 60;
/// The longest window (a day): beyond it the listings read would grow without bound.
pub const MAX_METRICS_MINUTES: u32 = 24 * 60;
/// Intents read for one answer at most (newer ones are left out and `truncated` says so).
const INTENT_CAP: usize = 10_000;
const PAGE: u32 = 1_000;
const MINUTE_MS: i64 = 60_000;

/// `GET /v1/metrics` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsParams {
    /// Minutes of the window, the current one included (default 60, at most 1440).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minutes: Option<u32>,
}

/// `GET /v1/metrics`: throughput, reply latency and send outcomes per minute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsView {
    /// Start of the first minute.
    pub since: UnixMillis,
    /// When the figures were taken.
    pub until: UnixMillis,
    /// One entry per minute, oldest first (empty minutes included).
    pub minutes: Vec<MinuteFigures>,
    /// Intents created in the window, by their status now (every status, zero included).
    pub outcomes: BTreeMap<IntentStatus, u64>,
    /// Failed and unknown-outcome intents of the window by failure class (`rate_limited`…).
    pub failure_kinds: BTreeMap<String, u64>,
    /// More than 10 000 intents or inbound events fell in the window: the newest are left out.
    pub truncated: bool,
}

/// One minute of the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MinuteFigures {
    pub start: UnixMillis,
    /// Inbound events received.
    pub inbound: u64,
    /// Send intents whose delivery completed (receipt committed).
    pub sent: u64,
    /// Median inbound → final latency of the replies sent this minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p50_ms: Option<u64>,
    /// Slowest inbound → final latency of the replies sent this minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_max_ms: Option<u64>,
}

/// The inbound event a reply intent answers, from its key `<channel>:reply:<event>:<generation>`.
fn replied_event(intent: &DurableSendIntent) -> Option<&str> {
    let rest = intent
        .idempotency_key
        .strip_prefix(intent.channel.as_str())?
        .strip_prefix(":reply:")?;
    let (event, generation) = rest.rsplit_once(':')?;
    generation.parse::<u32>().ok().map(|_| event)
}

pub async fn metrics<S: IntentStore + InboundStore + ?Sized>(
    store: &S,
    params: &MetricsParams,
    now: UnixMillis,
) -> Result<MetricsView, ViewError> {
    let minutes = params.minutes.unwrap_or(DEFAULT_METRICS_MINUTES);
    if minutes == 0 || minutes > MAX_METRICS_MINUTES {
        return Err(ViewError::BadRequest(format!(
            "minutes must be between 1 and {MAX_METRICS_MINUTES}, not {minutes}"
        )));
    }
    let since = (now.div_euclid(MINUTE_MS) - i64::from(minutes - 1)) * MINUTE_MS;
    let bucket =
        |at: UnixMillis| (at >= since && at <= now).then(|| ((at - since) / MINUTE_MS) as usize);
    let mut figures: Vec<MinuteFigures> = (0..i64::from(minutes))
        .map(|n| MinuteFigures {
            start: since + n * MINUTE_MS,
            inbound: 0,
            sent: 0,
            latency_p50_ms: None,
            latency_max_ms: None,
        })
        .collect();

    // Newest first: everything of the window unless the cap cut it.
    let inbound = store.list_inbound(None, INBOUND_COUNT_CAP).await?;
    let mut truncated = inbound.len() >= INBOUND_COUNT_CAP as usize
        && inbound.last().is_some_and(|r| r.received_at >= since);
    let mut received_at = HashMap::new();
    for record in &inbound {
        if let Some(n) = bucket(record.received_at) {
            figures[n].inbound += 1;
            received_at.insert(
                (
                    record.channel.as_str(),
                    record.account_id.as_str(),
                    record.event_id.as_str(),
                ),
                record.received_at,
            );
        }
    }

    // Intents created in the window, oldest first, a page at a time.
    let mut intents = Vec::new();
    let mut after = IntentCursor {
        created_at: since,
        id: String::new(),
    };
    loop {
        let page = store
            .list_intents(&IntentFilter {
                after: Some(after.clone()),
                limit: PAGE,
                ..IntentFilter::default()
            })
            .await?;
        let full = page.len() == PAGE as usize;
        if let Some(last) = page.last() {
            after = IntentCursor::of(last);
        }
        intents.extend(page);
        if intents.len() >= INTENT_CAP {
            truncated |= full;
            intents.truncate(INTENT_CAP);
            break;
        }
        if !full {
            break;
        }
    }

    let mut outcomes: BTreeMap<IntentStatus, u64> = clawgate_types::ALL_INTENT_STATUSES
        .into_iter()
        .map(|s| (s, 0))
        .collect();
    let mut failure_kinds = BTreeMap::new();
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); figures.len()];
    for intent in &intents {
        *outcomes.entry(intent.status).or_default() += 1;
        if matches!(
            intent.status,
            IntentStatus::Failed | IntentStatus::UnknownAfterSend
        ) && let Some(failure) = &intent.failure
        {
            // The class's wire name (`rate_limited`…), as the intent's JSON spells it.
            let kind = serde_json::to_value(failure.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            *failure_kinds.entry(kind).or_default() += 1;
        }
        let Some(receipt) = intent
            .receipt
            .as_ref()
            .filter(|_| intent.status == IntentStatus::Sent)
        else {
            continue;
        };
        let Some(n) = bucket(receipt.sent_at) else {
            continue;
        };
        figures[n].sent += 1;
        let account = intent.account_id.as_deref().unwrap_or_default();
        if let Some(event) = replied_event(intent)
            && let Some(at) = received_at.get(&(intent.channel.as_str(), account, event))
        {
            latencies[n].push(receipt.sent_at.saturating_sub(*at).max(0).unsigned_abs());
        }
    }
    for (minute, mut samples) in figures.iter_mut().zip(latencies) {
        if samples.is_empty() {
            continue;
        }
        samples.sort_unstable();
        minute.latency_p50_ms = Some(samples[(samples.len() - 1) / 2]);
        minute.latency_max_ms = samples.last().copied();
    }
    Ok(MetricsView {
        since,
        until: now,
        minutes: figures,
        outcomes,
        failure_kinds,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;
    use clawgate_store::testing::sample_intent;
    use clawgate_store_sqlite::{SqliteOptions, SqliteStore};
    use clawgate_types::MessageReceipt;

    #[test]
    fn a_reply_key_names_its_event() {
        let mut intent = sample_intent(1, 1_000);
        intent.channel = "qa".into();
        intent.idempotency_key = "qa:reply:ev:7:2".into();
        assert_eq!(replied_event(&intent), Some("ev:7"));
        intent.idempotency_key = "qa:busy:ev".into();
        assert_eq!(replied_event(&intent), None);
    }

    /// A sent reply and the event it answers: the latency is the receipt's `sentAt` minus the
    /// event's `receivedAt`, counted in the minute the reply was sent.
    #[tokio::test]
    async fn a_reply_latency_runs_from_its_inbound_event_to_its_receipt() {
        let store = SqliteStore::open_in_memory(SqliteOptions::default()).unwrap();
        let received = 5 * MINUTE_MS + 1_000;
        let key = clawgate_store::InboundKey {
            channel: "qa".into(),
            account_id: "default".into(),
            event_id: "ev:1".into(),
        };
        store
            .record_inbound(&key, &serde_json::json!({}), received)
            .await
            .unwrap();
        let mut reply = sample_intent(1, received + 100);
        reply.channel = "qa".into();
        reply.account_id = Some("default".into());
        reply.idempotency_key = "qa:reply:ev:1:0".into();
        store.insert_intent(&reply, None).await.unwrap();
        for (from, to) in [
            (IntentStatus::Pending, IntentStatus::Sending),
            (IntentStatus::Sending, IntentStatus::Committing),
            (IntentStatus::Committing, IntentStatus::Sent),
        ] {
            reply.status = to;
            if to == IntentStatus::Sent {
                reply.receipt = Some(MessageReceipt::from_parts(vec![], received + 2_500));
            }
            store.save_intent(&reply, from, None).await.unwrap();
        }
        let view = metrics(
            &store,
            &MetricsParams { minutes: Some(2) },
            6 * MINUTE_MS - 1,
        )
        .await
        .unwrap();
        let minute = &view.minutes[1];
        assert_eq!((minute.inbound, minute.sent), (1, 1));
        assert_eq!(minute.latency_p50_ms, Some(2_500));
        assert_eq!(minute.latency_max_ms, Some(2_500));
        assert_eq!(view.minutes[0].latency_p50_ms, None);
    }

    #[tokio::test]
    async fn sent_intents_land_in_their_minute_and_old_ones_are_left_out() {
        let store = SqliteStore::open_in_memory(SqliteOptions::default()).unwrap();
        let now = 10 * MINUTE_MS + 30_000;
        let old = sample_intent(1, MINUTE_MS);
        store.insert_intent(&old, None).await.unwrap();
        let mut fresh = sample_intent(2, 9 * MINUTE_MS + 5_000);
        store.insert_intent(&fresh, None).await.unwrap();
        fresh.status = IntentStatus::Sending;
        store
            .save_intent(&fresh, IntentStatus::Pending, None)
            .await
            .unwrap();
        fresh.status = IntentStatus::Committing;
        store
            .save_intent(&fresh, IntentStatus::Sending, None)
            .await
            .unwrap();
        fresh.status = IntentStatus::Sent;
        fresh.receipt = Some(MessageReceipt::from_parts(vec![], 10 * MINUTE_MS + 1_000));
        store
            .save_intent(&fresh, IntentStatus::Committing, None)
            .await
            .unwrap();
        let params = MetricsParams { minutes: Some(3) };
        let view = metrics(&store, &params, now).await.unwrap();
        assert_eq!(view.since, 8 * MINUTE_MS);
        assert_eq!(view.minutes.len(), 3);
        let sent: Vec<u64> = view.minutes.iter().map(|m| m.sent).collect();
        assert_eq!(sent, [0, 0, 1]);
        assert_eq!(view.outcomes[&IntentStatus::Sent], 1);
        assert_eq!(
            view.outcomes[&IntentStatus::Pending],
            0,
            "the intent created before the window is not counted"
        );
        let bad = MetricsParams { minutes: Some(0) };
        assert_eq!(
            metrics(&store, &bad, now).await.unwrap_err().http_status(),
            400
        );
    }
}
