//! `clawgate outbox`, `/v1/outbox`: the send intents, and the operator's retry and cancel, which
//! go through the transition table and the store's compare-and-set.

use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::{
    DeliveryFailure, DeliveryFailureKind, DurableSendIntent, FailureReason, IntentId, IntentStatus,
    UnixMillis,
};
use serde::{Deserialize, Serialize};

use super::{ViewError, limit_of, preview};

/// `GET /v1/outbox` query, `clawgate outbox list` options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxListParams {
    /// Comma-separated statuses (`failed,unknown_after_send`); all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// At most this many intents (default 50, at most 1000), oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /v1/outbox`: send intents, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxList {
    pub intents: Vec<IntentSummary>,
    /// More intents match than the limit allowed.
    pub more: bool,
}

/// One send intent as a listing shows it (`GET /v1/outbox/{id}` has the whole intent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IntentSummary {
    pub id: IntentId,
    pub status: IntentStatus,
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    /// The conversation (target id) the message goes to.
    pub target: String,
    pub idempotency_key: String,
    /// Send attempts so far.
    pub attempt: u32,
    /// Times the platform was asked about the current unknown outcome.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reconciliations: u32,
    /// Class of the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_kind: Option<DeliveryFailureKind>,
    /// Why the intent failed (beyond the class of its last attempt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<FailureReason>,
    /// The adapter's description of the last failure (never message content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<UnixMillis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMillis>,
    pub created_at: UnixMillis,
    pub updated_at: UnixMillis,
    /// A live reply whose stream has not produced its final: nothing to send. If its gateway
    /// is gone, recovery removes its preview and cancels it, and the message's turn runs again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub awaits_final: bool,
    /// The message text, whitespace collapsed, at most 80 characters.
    pub preview: String,
}

fn is_zero(count: &u32) -> bool {
    *count == 0
}

impl IntentSummary {
    pub fn of(intent: &DurableSendIntent) -> IntentSummary {
        let failure = intent.failure.as_ref();
        let text = match &intent.message.body {
            Some(body) => body.text.clone(),
            // A batch rendered without a body (media…): show what its units say.
            None => intent
                .batch
                .iter()
                .flat_map(|b| &b.units)
                .filter_map(|u| u.payload.get("text").and_then(|t| t.as_str()))
                .collect::<Vec<_>>()
                .join(" "),
        };
        IntentSummary {
            id: intent.id.clone(),
            status: intent.status,
            channel: intent.channel.clone(),
            account_id: intent.account_id.clone(),
            target: intent.message.target.id.clone(),
            idempotency_key: intent.idempotency_key.clone(),
            attempt: intent.attempt,
            reconciliations: intent.reconciliations,
            failure_kind: failure.map(|f| f.kind),
            failure_reason: failure.and_then(|f| f.reason),
            failure_message: failure.map(|f| f.message.clone()),
            next_attempt_at: intent.next_attempt_at,
            expires_at: intent.expires_at,
            created_at: intent.created_at,
            updated_at: intent.updated_at,
            awaits_final: intent.awaits_final(),
            preview: preview(&text),
        }
    }
}

/// `POST /v1/outbox/{id}/retry` and `/cancel`: what changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxAction {
    pub intent: IntentSummary,
    pub previous_status: IntentStatus,
    /// Something the operator should know about the change (a possible duplicate…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Parses `failed,unknown_after_send` (spaces allowed).
pub fn parse_statuses(text: &str) -> Result<Vec<IntentStatus>, ViewError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            IntentStatus::parse(s).ok_or_else(|| {
                let known: Vec<&str> = clawgate_types::ALL_INTENT_STATUSES
                    .iter()
                    .map(|s| s.as_str())
                    .collect();
                ViewError::BadRequest(format!(
                    "unknown intent status {s:?}: use one of {}",
                    known.join(", ")
                ))
            })
        })
        .collect()
}

pub async fn outbox_list<S: IntentStore + ?Sized>(
    store: &S,
    params: &OutboxListParams,
) -> Result<OutboxList, ViewError> {
    let limit = limit_of(params.limit)?;
    let filter = IntentFilter {
        statuses: parse_statuses(params.status.as_deref().unwrap_or(""))?,
        channel: params.channel.clone(),
        after: None,
        // One more than shown tells whether more exist.
        limit: limit + 1,
    };
    let mut intents = store.list_intents(&filter).await?;
    let more = intents.len() > limit as usize;
    intents.truncate(limit as usize);
    Ok(OutboxList {
        intents: intents.iter().map(IntentSummary::of).collect(),
        more,
    })
}

async fn load_intent<S: IntentStore + ?Sized>(
    store: &S,
    id: &str,
) -> Result<DurableSendIntent, ViewError> {
    let parsed = IntentId::parse(id).map_err(|e| ViewError::BadRequest(e.to_string()))?;
    store.load_intent(&parsed).await?.ok_or_else(|| {
        ViewError::NotFound(format!(
            "no send intent {id}: `clawgate outbox list` shows the intents (sent and cancelled \
             ones are removed after `retention.outbox_days`)"
        ))
    })
}

/// `GET /v1/outbox/{id}`: the whole stored intent.
pub async fn outbox_show<S: IntentStore + ?Sized>(
    store: &S,
    id: &str,
) -> Result<DurableSendIntent, ViewError> {
    load_intent(store, id).await
}

/// Why an operator action does not apply to a status.
fn not_applicable(action: &str, id: &str, status: IntentStatus) -> ViewError {
    let why = match status {
        IntentStatus::Pending => "it is pending: the gateway sends it when it is due",
        IntentStatus::Sending | IntentStatus::Committing => {
            "it is being sent right now: wait for the outcome and look again"
        }
        IntentStatus::Sent => "it was sent already",
        IntentStatus::Cancelled => "it was cancelled, which is final",
        IntentStatus::Failed | IntentStatus::UnknownAfterSend => "its status forbids it",
    };
    ViewError::Conflict(format!(
        "cannot {action} send intent {id} ({status}): {why}"
    ))
}

/// Failed or unknown-outcome intent → `pending`, due now, with a fresh attempt budget and
/// time-to-live (the operator decided it should go out after all).
///
/// For `unknown_after_send` this is the operator's explicit choice: the units without a
/// receipt are sent again, which duplicates them on a platform without reconciliation if they
/// had landed.
pub async fn outbox_retry<S: IntentStore + ?Sized>(
    store: &S,
    id: &str,
    now: UnixMillis,
) -> Result<OutboxAction, ViewError> {
    let mut intent = load_intent(store, id).await?;
    let previous = intent.status;
    if !matches!(
        previous,
        IntentStatus::Failed | IntentStatus::UnknownAfterSend
    ) || !previous.can_transition_to(IntentStatus::Pending)
    {
        return Err(not_applicable("retry", id, previous));
    }
    // An expired intent would expire again at once: give it its time-to-live anew.
    let ttl = intent
        .expires_at
        .map(|at| at.saturating_sub(intent.created_at).max(0));
    intent.expires_at = ttl.map(|ttl| now.saturating_add(ttl));
    intent.status = IntentStatus::Pending;
    intent.attempt = 0;
    intent.reconciliations = 0;
    intent.next_attempt_at = Some(now);
    intent.updated_at = now;
    store.save_intent(&intent, previous, None).await?;
    let warning = (previous == IntentStatus::UnknownAfterSend).then(|| {
        "the earlier outcome was unknown: units without a receipt are sent again, which \
         duplicates them on a platform without reconciliation if they had landed"
            .to_owned()
    });
    Ok(OutboxAction {
        intent: IntentSummary::of(&intent),
        previous_status: previous,
        warning,
    })
}

/// Pending, failed or unknown-outcome intent → `cancelled` (final), reason
/// `operator_cancelled`.
pub async fn outbox_cancel<S: IntentStore + ?Sized>(
    store: &S,
    id: &str,
    now: UnixMillis,
) -> Result<OutboxAction, ViewError> {
    let mut intent = load_intent(store, id).await?;
    let previous = intent.status;
    if !matches!(
        previous,
        IntentStatus::Pending | IntentStatus::Failed | IntentStatus::UnknownAfterSend
    ) || !previous.can_transition_to(IntentStatus::Cancelled)
    {
        return Err(not_applicable("cancel", id, previous));
    }
    intent.status = IntentStatus::Cancelled;
    intent.next_attempt_at = None;
    intent.failure = Some(DeliveryFailure {
        kind: DeliveryFailureKind::Cancelled,
        message: "cancelled by an operator".into(),
        reason: Some(FailureReason::OperatorCancelled),
        retry_after_ms: None,
        platform_code: None,
        at: now,
    });
    intent.updated_at = now;
    store.save_intent(&intent, previous, None).await?;
    let warning = (previous == IntentStatus::UnknownAfterSend)
        .then(|| "the outcome was unknown: the platform may show the message anyway".to_owned());
    Ok(OutboxAction {
        intent: IntentSummary::of(&intent),
        previous_status: previous,
        warning,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;
    use clawgate_store::testing::sample_intent;
    use clawgate_store_sqlite::{SqliteOptions, SqliteStore};

    fn store() -> SqliteStore {
        SqliteStore::open_in_memory(SqliteOptions::default()).unwrap()
    }

    #[test]
    fn statuses_parse_with_a_helpful_error() {
        assert_eq!(
            parse_statuses("failed, unknown_after_send").unwrap(),
            [IntentStatus::Failed, IntentStatus::UnknownAfterSend]
        );
        assert_eq!(parse_statuses("").unwrap(), []);
        let err = parse_statuses("failed,lost").unwrap_err().to_string();
        assert!(
            err.contains("\"lost\"") && err.contains("unknown_after_send"),
            "{err}"
        );
    }

    #[test]
    fn intent_summary_carries_the_failure_and_a_preview() {
        let mut intent = sample_intent(1, 1_000);
        intent.status = IntentStatus::Failed;
        intent.failure = Some(DeliveryFailure {
            kind: DeliveryFailureKind::Auth,
            message: "token rejected".into(),
            reason: Some(FailureReason::AwaitingConfiguration),
            retry_after_ms: None,
            platform_code: Some("401".into()),
            at: 2_000,
        });
        let summary = IntentSummary::of(&intent);
        assert_eq!(summary.status, IntentStatus::Failed);
        assert_eq!(summary.target, "room-1");
        assert_eq!(summary.failure_kind, Some(DeliveryFailureKind::Auth));
        assert_eq!(
            summary.failure_reason,
            Some(FailureReason::AwaitingConfiguration)
        );
        assert_eq!(summary.preview, "reply 1");
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["failureReason"], "awaiting_configuration");
        assert_eq!(json["idempotencyKey"], "key-1");
        assert!(
            json.get("nextAttemptAt").is_none(),
            "absent, not null: {json}"
        );
    }

    /// One row per (start status, action): whether the operator may do it.
    #[tokio::test]
    async fn operator_actions_follow_the_transition_table() {
        use IntentStatus::*;
        let cases: &[(IntentStatus, &str, bool)] = &[
            (Failed, "retry", true),
            (UnknownAfterSend, "retry", true),
            (Pending, "retry", false),
            (Sending, "retry", false),
            (Sent, "retry", false),
            (Cancelled, "retry", false),
            (Pending, "cancel", true),
            (Failed, "cancel", true),
            (UnknownAfterSend, "cancel", true),
            (Sending, "cancel", false),
            (Committing, "cancel", false),
            (Sent, "cancel", false),
        ];
        let store = store();
        for (n, (start, action, allowed)) in cases.iter().enumerate() {
            let intent = sample_intent(n as u64 + 1, 1_000);
            store.insert_intent(&intent, None).await.unwrap();
            // Walk the intent to its start status through legal moves.
            let path: &[IntentStatus] = match start {
                Pending => &[],
                Sending => &[Sending],
                Committing => &[Sending, Committing],
                UnknownAfterSend => &[Sending, UnknownAfterSend],
                Sent => &[Sending, Committing, Sent],
                Failed => &[Failed],
                Cancelled => &[Cancelled],
            };
            let mut current = intent.clone();
            current.reconciliations = 7;
            for next in path {
                let before = current.status;
                current.status = *next;
                store.save_intent(&current, before, None).await.unwrap();
            }
            let id = intent.id.as_str();
            let result = match *action {
                "retry" => outbox_retry(&store, id, 5_000).await,
                _ => outbox_cancel(&store, id, 5_000).await,
            };
            let case = format!("{action} from {start}");
            match (result, allowed) {
                (Ok(done), true) => {
                    let expected = if *action == "retry" {
                        Pending
                    } else {
                        Cancelled
                    };
                    assert_eq!(done.intent.status, expected, "{case}");
                    assert_eq!(done.previous_status, *start, "{case}");
                    assert_eq!(done.warning.is_some(), *start == UnknownAfterSend, "{case}");
                    let stored = store.load_intent(&intent.id).await.unwrap().unwrap();
                    assert_eq!(stored.status, expected, "{case}: stored");
                    if expected == Pending {
                        assert_eq!(stored.next_attempt_at, Some(5_000), "{case}: due now");
                        assert_eq!(
                            (stored.attempt, stored.reconciliations),
                            (0, 0),
                            "{case}: fresh budget"
                        );
                    } else {
                        let reason = stored.failure.and_then(|f| f.reason);
                        assert_eq!(reason, Some(FailureReason::OperatorCancelled), "{case}");
                    }
                }
                (Err(ViewError::Conflict(message)), false) => {
                    assert!(message.contains(start.as_str()), "{case}: {message}");
                }
                (other, _) => panic!("{case}: unexpected {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn retry_gives_an_expired_intent_its_time_to_live_again() {
        let store = store();
        let mut intent = sample_intent(1, 1_000);
        intent.expires_at = Some(61_000);
        store.insert_intent(&intent, None).await.unwrap();
        intent.status = IntentStatus::Failed;
        store
            .save_intent(&intent, IntentStatus::Pending, None)
            .await
            .unwrap();
        let done = outbox_retry(&store, intent.id.as_str(), 100_000)
            .await
            .unwrap();
        assert_eq!(done.intent.expires_at, Some(160_000));
    }

    #[tokio::test]
    async fn unknown_intents_are_404_and_bad_ids_400() {
        let store = store();
        let missing = outbox_show(&store, "no-such-intent").await.unwrap_err();
        assert_eq!(missing.http_status(), 404, "{missing}");
        let bad = outbox_show(&store, "spaces are not ids").await.unwrap_err();
        assert_eq!(bad.http_status(), 400, "{bad}");
    }

    #[tokio::test]
    async fn listings_say_when_more_exist() {
        let store = store();
        for n in 1..=3 {
            store
                .insert_intent(&sample_intent(n, 1_000 + n as i64), None)
                .await
                .unwrap();
        }
        let params = |limit| OutboxListParams {
            limit: Some(limit),
            ..OutboxListParams::default()
        };
        let two = outbox_list(&store, &params(2)).await.unwrap();
        assert_eq!(two.intents.len(), 2);
        assert!(two.more);
        let all = outbox_list(&store, &params(3)).await.unwrap();
        assert!(!all.more);
        assert!(outbox_list(&store, &params(0)).await.is_err());
        let failed = OutboxListParams {
            status: Some("failed".into()),
            ..OutboxListParams::default()
        };
        assert!(
            outbox_list(&store, &failed)
                .await
                .unwrap()
                .intents
                .is_empty()
        );
    }
}
