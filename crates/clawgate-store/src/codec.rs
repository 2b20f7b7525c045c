//! What every backend stores and refuses the same way: versioned JSON payloads, the column
//! spelling of enums, the session-key and summary checks, the reasons a guarded intent save
//! is refused, the decoding of an inbound row, and the notice protocol's consume step.
//! Backends call these, so a row written by one reads the same in another, an error says the
//! same thing whichever database is behind the ports, and the protocol has one definition.

use clawgate_types::{
    DurableSendIntent, IntentStatus, SessionKey, SessionStateEventKind, StateVersion, UnixMillis,
    from_json, to_json,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::model::{
    Claim, ConsumedNotice, InboundRecord, InboundStatus, NewSessionEvent, SessionRow, WatchCursor,
};
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

/// Where a session row's payload holds session keys. The wire spelling of an agent's global
/// session is `global` (no agent), so these are written in their storage spelling instead.
const SESSION_ROW_KEYS: [&str; 8] = [
    "/sessionKey",
    "/ownerSessionKey",
    "/spawnedBy",
    "/parentSessionKey",
    "/acpOwner/sessionKey",
    "/acpOwner/ownerSessionKey",
    "/acpOwner/spawnedBy",
    "/acpOwner/parentSessionKey",
];

fn session_row_keys(row: &SessionRow) -> [Option<&SessionKey>; 8] {
    let acp = row.acp_owner.as_ref();
    [
        Some(&row.session_key),
        row.owner_session_key.as_ref(),
        row.spawned_by.as_ref(),
        row.parent_session_key.as_ref(),
        acp.map(|a| &a.session_key),
        acp.map(|a| &a.owner_session_key),
        acp.and_then(|a| a.spawned_by.as_ref()),
        acp.and_then(|a| a.parent_session_key.as_ref()),
    ]
}

fn session_row_keys_mut(row: &mut SessionRow) -> [Option<&mut SessionKey>; 8] {
    let (acp_key, acp_owner, acp_spawned, acp_parent) = match row.acp_owner.as_mut() {
        Some(a) => (
            Some(&mut a.session_key),
            Some(&mut a.owner_session_key),
            a.spawned_by.as_mut(),
            a.parent_session_key.as_mut(),
        ),
        None => (None, None, None, None),
    };
    [
        Some(&mut row.session_key),
        row.owner_session_key.as_mut(),
        row.spawned_by.as_mut(),
        row.parent_session_key.as_mut(),
        acp_key,
        acp_owner,
        acp_spawned,
        acp_parent,
    ]
}

/// A session row as stored: its keys in their storage spelling, so an agent's global session
/// (and a child it owns) reads back as that agent's, not as a bare `global`.
pub fn encode_session(row: &SessionRow) -> StoreResult<String> {
    let id = row.session_key.storage_key();
    let mut value: serde_json::Value =
        from_json(&encode("session", &id, row)?).map_err(|source| StoreError::Decode {
            what: "session",
            id: id.to_string(),
            source,
        })?;
    for (pointer, key) in SESSION_ROW_KEYS.iter().zip(session_row_keys(row)) {
        if let (Some(key), Some(slot)) = (key, value.pointer_mut(pointer)) {
            *slot = serde_json::Value::String(key.storage_key().into_owned());
        }
    }
    encode("session", &id, &value)
}

/// A stored session row; `stored_key` is its key column, which is the row's key.
pub fn decode_session(stored_key: &str, format: i64, payload: &str) -> StoreResult<SessionRow> {
    let mut value: serde_json::Value = decode(
        "session",
        stored_key.to_owned(),
        format,
        ROW_FORMAT,
        payload,
    )?;
    // Storage spellings are no wire keys: read them apart, put them back after decoding.
    let mut stored = [const { None }; 8];
    for (slot, pointer) in stored.iter_mut().zip(SESSION_ROW_KEYS) {
        if let Some(field) = value.pointer_mut(pointer)
            && let Some(text) = field.as_str()
        {
            *slot = Some(parse_key(text)?);
            *field = serde_json::Value::String(clawgate_types::GLOBAL_SESSION_KEY.to_owned());
        }
    }
    let mut row: SessionRow =
        from_json(&value.to_string()).map_err(|source| StoreError::Decode {
            what: "session",
            id: stored_key.to_owned(),
            source,
        })?;
    for (field, key) in session_row_keys_mut(&mut row).into_iter().zip(stored) {
        if let (Some(field), Some(key)) = (field, key) {
            *field = key;
        }
    }
    // The key column is the truth: a row stored as the one `global` before agents were told
    // apart (its payload says `global`) is its agent's global session after the migration.
    let key = parse_key(stored_key)?;
    if let Some(acp) = row.acp_owner.as_mut()
        && acp.session_key.storage_key() == row.session_key.storage_key()
    {
        acp.session_key = key.clone();
    }
    row.session_key = key;
    Ok(row)
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

/// A stored session key (as [`SessionKey::storage_key`] wrote it).
pub fn parse_key(text: &str) -> StoreResult<SessionKey> {
    SessionKey::from_storage(text).map_err(|e| {
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

/// A save may move an intent only along the lifecycle's transitions.
pub fn check_transition(id: &str, from: IntentStatus, to: IntentStatus) -> StoreResult<()> {
    from.transition_to(to)
        .map_err(|source| StoreError::IllegalTransition {
            id: id.to_owned(),
            source,
        })?;
    Ok(())
}

/// An inbound record's columns as the database returns them.
#[derive(Debug, Clone)]
pub struct InboundRow {
    pub channel: String,
    pub account_id: String,
    pub event_id: String,
    pub status: String,
    pub attempts: i64,
    pub payload: String,
    pub last_error: Option<String>,
    pub received_at: i64,
    pub updated_at: i64,
}

impl InboundRow {
    /// The record, or what about the row cannot be read.
    pub fn decode(self) -> StoreResult<InboundRecord> {
        let status = InboundStatus::parse(&self.status).ok_or_else(|| {
            StoreError::InvalidInput(format!(
                "inbound record {} has unknown status {:?}",
                self.event_id, self.status
            ))
        })?;
        let payload = from_json(&self.payload).map_err(|source| StoreError::Decode {
            what: "inbound record",
            id: self.event_id.clone(),
            source,
        })?;
        Ok(InboundRecord {
            channel: self.channel,
            account_id: self.account_id,
            event_id: self.event_id,
            status,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            payload,
            last_error: self.last_error,
            received_at: self.received_at,
            updated_at: self.updated_at,
        })
    }
}

/// The notice protocol, first half of a consume: what a cursor holds for a caller who saw the
/// notice at `seen`.
#[derive(Debug, Clone)]
pub enum NoticeToAck {
    /// A pending notice, frozen at `frozen`, to acknowledge with [`ack_notice`].
    Pending {
        cursor: WatchCursor,
        frozen: StateVersion,
    },
    /// Nothing to acknowledge (no cursor, nothing pending, or the notice was consumed
    /// elsewhere): the answer as it is.
    Nothing(ConsumedNotice),
}

/// The notice of `cursor` (as locked or read in the consume's transaction) the caller saw at
/// `seen`.
pub fn notice_to_ack(cursor: Option<WatchCursor>, seen: StateVersion) -> NoticeToAck {
    let unchanged = |cursor| {
        NoticeToAck::Nothing(ConsumedNotice {
            cursor,
            acked: false,
            reopened: false,
        })
    };
    match cursor {
        // A deletion notice is consumed only as such (`consume_deletion_notice`).
        Some(cursor) if cursor.target_deleted_by.is_some() => unchanged(Some(cursor)),
        Some(cursor) => match cursor.notified_version {
            Some(frozen) if cursor.acked_version == seen => NoticeToAck::Pending { cursor, frozen },
            _ => unchanged(Some(cursor)),
        },
        None => unchanged(None),
    }
}

/// What the target's log holds after a notice's frozen watermark, read by the backend in the
/// same transaction as the consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfterWatermark {
    /// The newest material event of another actor after the watermark.
    pub newest_material: Option<u64>,
    /// The target's head.
    pub head: u64,
    /// Events up to here were pruned.
    pub pruned_through: u64,
}

/// The notice protocol, second half: acknowledges the notice frozen at `frozen` on `cursor`
/// and reopens exactly one when material work of another actor came after it — or when pruned
/// history after the watermark may have held some (said once, at the head). The backend
/// writes the cursor's versions and `updated_at` as they are afterwards.
pub fn ack_notice(
    cursor: &mut WatchCursor,
    frozen: StateVersion,
    after: AfterWatermark,
    now: UnixMillis,
) -> ConsumedNotice {
    let reopen_at = match after.newest_material {
        Some(sequence) => Some(StateVersion(sequence)),
        None if after.pruned_through > frozen.0 => Some(StateVersion(after.head)),
        None => None,
    };
    cursor.acked_version = frozen;
    cursor.notified_version = reopen_at;
    cursor.material_version = cursor
        .material_version
        .max(frozen)
        .max(reopen_at.unwrap_or(frozen));
    cursor.updated_at = now;
    ConsumedNotice {
        cursor: Some(cursor.clone()),
        acked: true,
        reopened: reopen_at.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WatchSource;

    fn cursor(acked: u64, notified: Option<u64>) -> WatchCursor {
        WatchCursor {
            watcher_key: SessionKey::parse("agent:main:main").expect("a session key"),
            target_key: SessionKey::parse("agent:main:child").expect("a session key"),
            acked_version: StateVersion(acked),
            notified_version: notified.map(StateVersion),
            material_version: StateVersion(notified.unwrap_or(acked)),
            target_deleted_by: None,
            source: WatchSource::Spawn,
            created_at: 1,
            updated_at: 1,
        }
    }

    fn pending(cursor: WatchCursor, seen: u64) -> Option<(WatchCursor, StateVersion)> {
        match notice_to_ack(Some(cursor), StateVersion(seen)) {
            NoticeToAck::Pending { cursor, frozen } => Some((cursor, frozen)),
            NoticeToAck::Nothing(answer) => {
                assert!(!answer.acked && !answer.reopened && answer.cursor.is_some());
                None
            }
        }
    }

    #[test]
    fn only_the_notice_the_caller_saw_is_acknowledged() {
        assert!(pending(cursor(2, Some(5)), 2).is_some());
        assert!(
            pending(cursor(2, Some(5)), 1).is_none(),
            "consumed elsewhere"
        );
        assert!(pending(cursor(5, None), 5).is_none(), "nothing pending");
        let deleted = WatchCursor {
            target_deleted_by: Some("human:user-1".into()),
            ..cursor(2, Some(5))
        };
        assert!(
            pending(deleted, 2).is_none(),
            "a deletion notice is not consumed as a change notice"
        );
        assert!(matches!(
            notice_to_ack(None, StateVersion(0)),
            NoticeToAck::Nothing(ConsumedNotice { cursor: None, .. })
        ));
    }

    #[test]
    fn an_ack_reopens_once_for_later_material_work_or_pruned_history() {
        let ack = |after: AfterWatermark| {
            let mut c = cursor(2, Some(5));
            let answer = ack_notice(&mut c, StateVersion(5), after, 9);
            assert!(answer.acked);
            assert_eq!((c.acked_version, c.updated_at), (StateVersion(5), 9));
            (answer.reopened, c.notified_version, c.material_version)
        };
        let quiet = AfterWatermark {
            newest_material: None,
            head: 7,
            pruned_through: 3,
        };
        assert_eq!(ack(quiet), (false, None, StateVersion(5)));
        let material = AfterWatermark {
            newest_material: Some(6),
            ..quiet
        };
        assert_eq!(
            ack(material),
            (true, Some(StateVersion(6)), StateVersion(6))
        );
        // What was pruned after the watermark may have been material: one notice at the head.
        let pruned = AfterWatermark {
            pruned_through: 6,
            ..quiet
        };
        assert_eq!(ack(pruned), (true, Some(StateVersion(7)), StateVersion(7)));
    }
}
