//! Where room events come from: `/sync` polled from the engine's durable watermark, whose
//! checkpoint is a `since` token.
//!
//! Each `/sync` answer is a batch: the message events after its `since` token, and the
//! `next_batch` token after them. Every event but the last of a batch carries the batch's own
//! `since` as its checkpoint (resuming there fetches the batch again; the finished events in it
//! are deduplicated by event id), the last carries `next_batch`. Within one process the batches
//! are kept until the watermark passes them, so an event polled again has the same position and
//! the events after an unfinished one are still polled. After a restart the batch is fetched
//! again from the durable token. An account's very first token is kept in its state in the
//! gateway's store (value `sync-start`), so events written before its first inbound event are
//! not skipped by a restart either.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::state::{Swapped, ValueExpectation};
use clawgate_channel_sdk::{
    ChannelState, ImportError, LegacyFiles, PollFrom, PollWait, PolledEvent, PollingFeed,
    SourceError,
};
use clawgate_types::DeliveryFailureKind;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tracing::{info, warn};

use crate::adapter::EncryptedRooms;
use crate::client::{MatrixApi, segment};

/// Events of one room per `/sync` answer; more sets the timeline `limited` flag.
const TIMELINE_LIMIT: u32 = 200;

/// The value holding the account's first `since` token (a JSON string).
pub(crate) const SYNC_START: &str = "sync-start";

/// The file an earlier release kept the first token in, in the gateway's state directory (one
/// name for every Matrix account).
pub(crate) const LEGACY_SYNC_START: &str = "matrix-sync-start";

/// Imports the first token an earlier release kept in [`LEGACY_SYNC_START`], once (see
/// [`ChannelState::import_values`]: a token already stored wins). An empty file holds no token
/// and is set aside.
pub(crate) async fn import_legacy_sync_start(
    state: &ChannelState,
    legacy: &LegacyFiles,
) -> Result<(), ImportError> {
    let imported = state
        .import_values(legacy, LEGACY_SYNC_START, |bytes| {
            let token = String::from_utf8_lossy(bytes).trim().to_owned();
            Ok((!token.is_empty()).then_some((SYNC_START, token)))
        })
        .await?;
    if imported.written > 0 {
        info!("the Matrix sync start token of an earlier release was imported");
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
struct SyncAnswer {
    next_batch: String,
    #[serde(default)]
    rooms: SyncRooms,
}

#[derive(Debug, Default, Deserialize)]
struct SyncRooms {
    #[serde(default)]
    join: Map<String, Value>,
    #[serde(default)]
    invite: Map<String, Value>,
}

/// One `/sync` answer as positions: the events after `since`, numbered from `base + 1`.
#[derive(Debug, Clone)]
struct Batch {
    since: String,
    base: i64,
    events: Vec<Value>,
    next: String,
}

/// How the source joins rooms it is invited to.
#[derive(Debug, Clone)]
pub(crate) struct JoinPolicy {
    pub(crate) auto_join: bool,
    pub(crate) allowed_rooms: Vec<String>,
}

/// `/sync` long polling.
#[derive(Debug)]
pub struct SyncSource {
    api: MatrixApi,
    user_id: String,
    timeout_s: u64,
    joins: JoinPolicy,
    encrypted: EncryptedRooms,
    /// The account's state, where its first `since` token is kept.
    state: ChannelState,
    /// The batches the watermark has not passed yet, in order (each `since` is the previous
    /// `next`).
    chain: Mutex<Vec<Batch>>,
}

fn filter() -> String {
    let filter = json!({
        "room": {
            "timeline": {
                "limit": TIMELINE_LIMIT,
                "types": ["m.room.message", "m.room.encrypted", "m.room.encryption"],
            },
            "state": { "types": ["m.room.encryption"] },
            "ephemeral": { "types": [] },
            "account_data": { "types": [] },
        },
        "presence": { "types": [] },
        "account_data": { "types": [] },
    });
    segment(&filter.to_string())
}

impl SyncSource {
    pub(crate) fn new(
        api: MatrixApi,
        user_id: &str,
        timeout_s: u64,
        joins: JoinPolicy,
        encrypted: EncryptedRooms,
        state: ChannelState,
    ) -> SyncSource {
        SyncSource {
            api,
            user_id: user_id.to_owned(),
            timeout_s,
            joins,
            encrypted,
            state,
            chain: Mutex::new(Vec::new()),
        }
    }

    fn chain(&self) -> std::sync::MutexGuard<'_, Vec<Batch>> {
        self.chain
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn sync(&self, since: Option<&str>, timeout_ms: u64) -> Result<SyncAnswer, SourceError> {
        let mut path = format!("sync?timeout={timeout_ms}&filter={}", filter());
        if let Some(since) = since {
            path.push_str(&format!("&since={}", segment(since)));
        }
        self.api
            .call(Method::GET, &path, None, Duration::from_millis(timeout_ms))
            .await
            .map_err(|e| e.into_source_error("sync"))
    }

    /// The token polling starts from when the engine has none: the one kept in the account's
    /// state, or (first start) the homeserver's current one, kept there.
    async fn start_token(&self) -> Result<String, SourceError> {
        let unusable = |e: clawgate_channel_sdk::StateError| {
            SourceError::new(
                DeliveryFailureKind::Transient,
                format!("the Matrix sync start token cannot be kept: {e}"),
            )
        };
        if let Some(kept) = self
            .state
            .value::<String>(SYNC_START)
            .await
            .map_err(unusable)?
        {
            return Ok(kept.value);
        }
        let answer = self.sync(None, 0).await?;
        // Invites that came before the first start are only in this first answer.
        self.join_invites(&answer.rooms.invite).await;
        // Only where none is kept: a token another start of this account kept first is older,
        // so listening from it misses nothing.
        if let Swapped::Conflict(Some(kept)) = self
            .state
            .swap(SYNC_START, ValueExpectation::Absent, &answer.next_batch)
            .await
            .map_err(unusable)?
        {
            return Ok(kept.value);
        }
        info!(user = %self.user_id, "Matrix account listens from now on (earlier history is not answered)");
        Ok(answer.next_batch)
    }

    fn room_allowed(&self, room: &str) -> bool {
        self.joins.allowed_rooms.is_empty() || self.joins.allowed_rooms.iter().any(|r| r == room)
    }

    async fn join_invites(&self, invites: &Map<String, Value>) {
        for room in invites.keys() {
            if !self.joins.auto_join {
                info!(
                    room,
                    "invited; auto_join is off, so the invite waits for an operator"
                );
                continue;
            }
            if !self.room_allowed(room) {
                info!(room, "invited to a room outside allowed_rooms; not joining");
                continue;
            }
            match self
                .api
                .call::<Value>(
                    Method::POST,
                    &format!("join/{}", segment(room)),
                    Some(&json!({})),
                    Duration::ZERO,
                )
                .await
            {
                Ok(_) => info!(room, "joined a room on invite"),
                Err(error) => {
                    warn!(room, error = %error.into_source_error("join").message, "an invite could not be joined");
                }
            }
        }
    }

    /// The events of an answer the engine sees: others' messages, each with its room id.
    fn events_of(&self, answer: &SyncAnswer) -> Vec<Value> {
        let mut events = Vec::new();
        for (room, joined) in &answer.rooms.join {
            if joined.pointer("/timeline/limited") == Some(&Value::Bool(true)) {
                warn!(
                    room,
                    limit = TIMELINE_LIMIT,
                    "more events arrived in a room than one sync returns; the older ones are not answered"
                );
            }
            let state = joined.pointer("/state/events").and_then(Value::as_array);
            let timeline = joined.pointer("/timeline/events").and_then(Value::as_array);
            let all = state.into_iter().chain(timeline).flatten();
            for event in all {
                let kind = event
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let sender = event
                    .get("sender")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                match kind {
                    "m.room.encryption" => {
                        self.encrypted.set(room, true);
                        warn!(
                            room,
                            "this room is end-to-end encrypted: the channel does not decrypt, its messages are not answered and nothing is sent there"
                        );
                    }
                    "m.room.message" | "m.room.encrypted" if sender != self.user_id => {
                        let mut event = event.clone();
                        if let Some(map) = event.as_object_mut() {
                            map.insert("room_id".into(), Value::String(room.clone()));
                        }
                        events.push(event);
                    }
                    _ => {}
                }
            }
        }
        events
    }
}

#[async_trait]
impl PollingFeed for SyncSource {
    async fn poll(&self, from: &PollFrom, wait: PollWait) -> Result<Vec<PolledEvent>, SourceError> {
        let token = match &from.checkpoint {
            Some(token) => token.clone(),
            None => self.start_token().await?,
        };
        // The kept batches from `token` on, and their events after the watermark.
        let (mut polled, tail_token, tail_base) = {
            let mut chain = self.chain();
            let keep_from = chain.iter().position(|b| b.since == token).or_else(|| {
                chain
                    .iter()
                    .position(|b| b.next == token && !b.events.is_empty())
                    .map(|i| i + 1)
            });
            match keep_from {
                Some(i) => {
                    chain.drain(..i);
                }
                None => chain.clear(),
            }
            let mut polled = Vec::new();
            for batch in chain.iter() {
                let last = batch.events.len().saturating_sub(1);
                for (k, event) in batch.events.iter().enumerate() {
                    let position = batch.base + i64::try_from(k).unwrap_or(i64::MAX) + 1;
                    if position > from.after {
                        let checkpoint = if k == last { &batch.next } else { &batch.since };
                        polled.push(
                            PolledEvent::new(position, event.clone())
                                .with_checkpoint(checkpoint.clone()),
                        );
                    }
                }
            }
            let (tail_token, tail_base) = chain.last().map_or_else(
                || (token.clone(), from.after),
                |b| {
                    (
                        b.next.clone(),
                        b.base + i64::try_from(b.events.len()).unwrap_or(0),
                    )
                },
            );
            (polled, tail_token, tail_base)
        };
        let timeout_ms = if polled.is_empty() && wait == PollWait::Long {
            self.timeout_s.saturating_mul(1_000)
        } else {
            0
        };
        let answer = self.sync(Some(&tail_token), timeout_ms).await?;
        if !answer.rooms.invite.is_empty() {
            self.join_invites(&answer.rooms.invite).await;
        }
        let events = self.events_of(&answer);
        let mut chain = self.chain();
        // Another poll may have moved the chain meanwhile: only extend the tail it was taken from.
        let tail_now = chain.last().map_or(token.as_str(), |b| b.next.as_str());
        if tail_now != tail_token {
            return Ok(polled);
        }
        if events.is_empty() {
            // Nothing to answer up to `next_batch`: the empty stretch is one batch, whose end
            // may move on (no event carries it as a checkpoint).
            match chain.last_mut() {
                Some(last) if last.events.is_empty() => last.next = answer.next_batch,
                _ => chain.push(Batch {
                    since: tail_token,
                    base: tail_base,
                    events: Vec::new(),
                    next: answer.next_batch,
                }),
            }
            return Ok(polled);
        }
        let last = events.len() - 1;
        for (k, event) in events.iter().enumerate() {
            let position = tail_base + i64::try_from(k).unwrap_or(i64::MAX) + 1;
            let checkpoint = if k == last {
                &answer.next_batch
            } else {
                &tail_token
            };
            polled.push(
                PolledEvent::new(position, event.clone()).with_checkpoint(checkpoint.clone()),
            );
        }
        chain.push(Batch {
            since: tail_token,
            base: tail_base,
            events,
            next: answer.next_batch,
        });
        Ok(polled)
    }
}
