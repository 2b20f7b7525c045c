//! What every backend stores and refuses the same way: versioned JSON payloads, the column
//! spelling of enums, the session-key and summary checks, and the reasons a guarded intent save
//! is refused. Backends call these, so a row written by one reads the same in another and an
//! error says the same thing whichever database is behind the ports.

use clawgate_types::{
    DurableSendIntent, IntentStatus, SessionKey, SessionStateEventKind, from_json, to_json,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::model::{Claim, NewSessionEvent, WatchCursor};
use crate::{StoreError, StoreResult};

/// Payload format of stored send intents.
pub const INTENT_FORMAT: i64 = 1;
/// Payload format of stored session rows and leases.
pub const ROW_FORMAT: i64 = 1;

/// A value as its stored JSON text; `what` and `id` name it if it cannot be encoded.
pub fn encode<T: Serialize>(what: &'static str, id: &str, value: &T) -> StoreResult<String> {
    to_json(value).map_err(|source| StoreError::Decode {
        what,
        id: id.to_owned(),
        source,
    })
}

/// A stored payload of format `format`, refused when a newer build wrote it (the row is left
/// untouched) or when it does not decode.
pub fn decode<T: DeserializeOwned>(
    what: &'static str,
    id: String,
    format: i64,
    supported: i64,
    payload: &str,
) -> StoreResult<T> {
    if format > supported {
        return Err(StoreError::NewerPayloadFormat {
            what,
            id,
            found: format,
            supported,
        });
    }
    from_json(payload).map_err(|source| StoreError::Decode { what, id, source })
}

/// A send intent as stored.
pub fn encode_intent(intent: &DurableSendIntent) -> StoreResult<String> {
    encode("send intent", intent.id.as_str(), intent)
}

/// A stored send intent.
pub fn decode_intent(id: String, format: i64, payload: &str) -> StoreResult<DurableSendIntent> {
    decode("send intent", id, format, INTENT_FORMAT, payload)
}

/// "No send intent with id …".
pub fn intent_not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        what: "send intent",
        id: id.to_owned(),
    }
}

/// A stored status column.
pub fn parse_status(id: &str, text: &str) -> StoreResult<IntentStatus> {
    IntentStatus::parse(text).ok_or_else(|| {
        StoreError::InvalidInput(format!(
            "send intent {id} has unknown stored status {text:?}"
        ))
    })
}

/// The wire spelling of a unit enum (`human_direct_message`…), used as the column value.
pub fn enum_text<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        other => format!("{other:?}"),
    }
}

/// A unit enum from its column value.
pub fn enum_parse<T: DeserializeOwned>(what: &'static str, text: &str) -> StoreResult<T> {
    clawgate_types::from_json_value(serde_json::Value::String(text.to_owned())).map_err(|source| {
        StoreError::Decode {
            what,
            id: text.to_owned(),
            source,
        }
    })
}

/// A stored session key.
pub fn parse_key(text: &str) -> StoreResult<SessionKey> {
    SessionKey::parse(text).map_err(|e| {
        StoreError::InvalidInput(format!("stored session key {text:?} is invalid: {e}"))
    })
}

/// Column spellings of the event kinds that notify. Listed from every kind so a kind added to
/// the vocabulary is classified by `notifies()`, not by a second list kept here.
pub fn notifying_kinds() -> Vec<String> {
    use SessionStateEventKind::*;
    [
        Created,
        HumanDirectMessage,
        GoalChanged,
        ChildSpawned,
        RunCompleted,
        RunFailed,
        Compacted,
    ]
    .into_iter()
    .filter(|k| k.notifies())
    .map(|k| enum_text(&k))
    .collect()
}

/// A signal-log summary is one line: it describes, it never carries message content.
pub fn check_summary(event: &NewSessionEvent) -> StoreResult<()> {
    if event.summary.contains('\n') {
        return Err(StoreError::InvalidInput(
            "a signal-log summary is one line (no message content)".into(),
        ));
    }
    Ok(())
}

/// Only agent-qualified session keys may watch.
pub fn check_watcher(cursor: &WatchCursor) -> StoreResult<()> {
    if !cursor.watcher_key.can_watch() {
        return Err(StoreError::InvalidInput(format!(
            "watcher {} is not an agent-qualified session key; only those may watch",
            cursor.watcher_key
        )));
    }
    Ok(())
}

/// What a save does with the intent's claim columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimWrite {
    /// Take (or refresh) the writer's claim.
    Take,
    /// Leave the stored claim as it is (the writer has none).
    Keep,
    /// Clear it: nobody works on the intent in its new status.
    Release,
}

/// Whether a holder keeps its claim in `status`: while it still works on the intent — sending,
/// committing, or pending with nothing scheduled (a live stream between previews, a batch
/// re-rendered before its resend). A pending intent rescheduled for later is let go.
pub fn keeps_claim(status: IntentStatus, next_attempt_at: Option<i64>) -> bool {
    match status {
        IntentStatus::Sending | IntentStatus::Committing => true,
        IntentStatus::Pending => next_attempt_at.is_none(),
        _ => false,
    }
}

/// The claim columns a save writes: a status in which the holder keeps working takes (or
/// refreshes) the writer's claim, or keeps the stored one when the writer has none; any other
/// status releases it.
pub fn claim_write(keeps_claim: bool, claim: Option<&Claim>) -> ClaimWrite {
    match (keeps_claim, claim) {
        (false, _) => ClaimWrite::Release,
        (true, Some(_)) => ClaimWrite::Take,
        (true, None) => ClaimWrite::Keep,
    }
}

/// The columns a guarded save is checked against, as stored.
#[derive(Debug, Clone)]
pub struct StoredGuard {
    pub status: IntentStatus,
    pub claimed_by: Option<String>,
    pub claim_until: Option<i64>,
    pub attempt: i64,
}

/// A save of `intent` (at `attempt`, written at `updated_at`) expecting `expected` under
/// `claim` whose guarded write changed nothing: why, from the row as stored — another status,
/// another live holder's claim, or a copy older than another worker's attempt. `None`: none of
/// these, and the save may be written unguarded.
pub fn refused_save(
    id: &str,
    expected: IntentStatus,
    claim: Option<&Claim>,
    write: ClaimWrite,
    attempt: i64,
    updated_at: i64,
    stored: StoredGuard,
) -> Option<StoreError> {
    if stored.status != expected {
        return Some(StoreError::IntentStatusConflict {
            id: id.to_owned(),
            expected,
            actual: stored.status,
        });
    }
    let ours = claim.is_some_and(|c| stored.claimed_by.as_deref() == Some(c.token.as_str()));
    if let (Some(holder), Some(until)) = (stored.claimed_by, stored.claim_until) {
        let now = claim.map_or(updated_at, |c| c.now);
        if !ours && until > now {
            return Some(StoreError::ClaimHeld {
                id: id.to_owned(),
                holder,
                until_ms: until,
            });
        }
    }
    let pending = expected == IntentStatus::Pending;
    if write == ClaimWrite::Take && pending && !ours && stored.attempt >= attempt {
        let u32_of = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
        return Some(StoreError::StaleIntent {
            id: id.to_owned(),
            attempt: u32_of(attempt),
            stored_attempt: u32_of(stored.attempt),
        });
    }
    None
}
