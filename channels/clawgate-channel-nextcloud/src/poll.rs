//! User mode's source: the OCS chat long poll,
//! `GET …/chat/{token}?lookIntoFuture=1&lastKnownMessageId=N&timeout=30&limit=100` (200 with the
//! messages after `N`, or 304 Not Modified when none came within `timeout`).
//!
//! Talk's message ids are unique and increasing on a server, so one durable watermark — the
//! engine's, the highest message id below which every message is finished — serves every
//! conversation: each is polled with `lastKnownMessageId` = the watermark. With several
//! conversations a poll must not hand over a message while a lower id elsewhere is still
//! unseen (the watermark would pass it): after a first round (a long poll in every
//! conversation, first answer wins; or an immediate look) shows messages up to id `M`, a second
//! immediate round reads every conversation again and only messages up to `M` are handed over —
//! any id up to `M` existed before that round began. A full page caps `M` at its last id.
//!
//! The conversations are the `conversations` setting, or (empty) every conversation the user
//! is in (`GET …/v4/room`, read again every poll). A new account starts at the present: the
//! newest message id when the channel was first built, kept in the gateway's store (the
//! account's value `talk-start`, written only where none is: so a restart before the first
//! finished message skips nothing, and two gateways starting at once agree on one start), until
//! the watermark is past it.

use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::state::{ChannelState, Swapped, ValueExpectation};
use clawgate_channel_sdk::{PollFrom, PollWait, PolledEvent, PollingFeed, SourceError};
use clawgate_types::DeliveryFailureKind;
use reqwest::Method;
use serde_json::{Value, json};

use crate::journal::{START_VALUE, Start};
use crate::ocs::{CallError, SPREED, TalkApi};

/// How the poller is set up.
#[derive(Debug, Clone)]
pub(crate) struct PollConfig {
    /// Fixed conversation tokens, or empty for all of the user's conversations.
    pub(crate) conversations: Vec<String>,
    /// The long poll's `timeout` (seconds, ≤ 60).
    pub(crate) timeout_s: u64,
    /// The page size (`limit`, ≤ 200).
    pub(crate) limit: u32,
    /// The account's state, where the start floor is kept.
    pub(crate) state: ChannelState,
}

/// The chat poller.
#[derive(Debug)]
pub struct ChatPoller {
    api: TalkApi,
    config: PollConfig,
    /// Messages at or below this id were there before the account started.
    floor: std::sync::Mutex<Option<i64>>,
}

fn source_error(error: &CallError, what: &str) -> SourceError {
    let kind = match error {
        CallError::Lost(_) => DeliveryFailureKind::Transient,
        other => other.kind(),
    };
    let mut e = SourceError::new(kind, format!("Nextcloud Talk {what}: {error:?}"));
    if let CallError::Refused {
        retry_after_ms: Some(ms),
        ..
    } = error
    {
        e = e.with_retry_after_ms(Some(*ms));
    }
    e
}

/// Why the start could not be set.
#[derive(Debug)]
pub(crate) enum StartError {
    /// Talk could not be asked for the newest messages.
    Call(CallError),
    /// The kept start could not be read or written.
    Kept(clawgate_channel_sdk::StateError),
    /// The kept start was removed while this one was written.
    Raced,
}

impl From<CallError> for StartError {
    fn from(error: CallError) -> StartError {
        StartError::Call(error)
    }
}

/// One conversation's page: its messages (ascending) and whether the page was full.
struct Page {
    messages: Vec<Value>,
    full: bool,
}

impl ChatPoller {
    pub(crate) fn new(api: TalkApi, config: PollConfig) -> ChatPoller {
        ChatPoller {
            api,
            config,
            floor: std::sync::Mutex::new(None),
        }
    }

    fn floor(&self) -> Option<i64> {
        *self
            .floor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The conversations to poll.
    pub(crate) async fn conversations(&self) -> Result<Vec<String>, CallError> {
        if !self.config.conversations.is_empty() {
            return Ok(self.config.conversations.clone());
        }
        let answer = self
            .api
            .call(
                Method::GET,
                &format!("{SPREED}/v4/room"),
                &[],
                None,
                &[],
                None,
            )
            .await?;
        Ok(answer
            .data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|room| room.get("token")?.as_str().map(str::to_owned))
            .collect())
    }

    fn set_floor(&self, after: i64) {
        *self
            .floor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(after);
    }

    /// Sets the start floor: the kept one, else the newest message id of every conversation
    /// now (then kept, unless another gateway kept one first: that one holds).
    pub(crate) async fn start_at_present(&self) -> Result<(), StartError> {
        if self.floor().is_some() {
            return Ok(());
        }
        if let Some(kept) = self
            .config
            .state
            .value::<Start>(START_VALUE)
            .await
            .map_err(StartError::Kept)?
        {
            self.set_floor(kept.value.after);
            return Ok(());
        }
        let mut newest = 0;
        for token in self.conversations().await? {
            let answer = self
                .api
                .call(
                    Method::GET,
                    &format!("{SPREED}/v1/chat/{token}"),
                    &[
                        ("lookIntoFuture", "0".into()),
                        ("limit", "1".into()),
                        ("setReadMarker", "0".into()),
                    ],
                    None,
                    &[],
                    None,
                )
                .await?;
            for message in answer.data.as_array().into_iter().flatten() {
                newest = newest.max(message.get("id").and_then(Value::as_i64).unwrap_or(0));
            }
        }
        let start = match self
            .config
            .state
            .swap(
                START_VALUE,
                ValueExpectation::Absent,
                &Start { after: newest },
            )
            .await
            .map_err(StartError::Kept)?
        {
            Swapped::Written(_) => newest,
            Swapped::Conflict(Some(kept)) => kept.value.after,
            // Absent and yet refused: removed in between; tried again on the next poll.
            Swapped::Conflict(None) => return Err(StartError::Raced),
        };
        self.set_floor(start);
        Ok(())
    }

    /// One conversation's messages after `after`, waiting up to `wait_s` seconds.
    async fn page(
        api: TalkApi,
        token: String,
        after: i64,
        wait_s: u64,
        limit: u32,
    ) -> Result<Page, CallError> {
        let answer = api
            .call(
                Method::GET,
                &format!("{SPREED}/v1/chat/{token}"),
                &[
                    ("lookIntoFuture", "1".into()),
                    ("lastKnownMessageId", after.to_string()),
                    ("timeout", wait_s.to_string()),
                    ("limit", limit.to_string()),
                    ("setReadMarker", "0".into()),
                ],
                None,
                &[],
                Some(api.timeout() + Duration::from_secs(wait_s)),
            )
            .await?;
        let mut messages: Vec<Value> = if answer.status == 304 {
            Vec::new()
        } else {
            answer.data.as_array().cloned().unwrap_or_default()
        };
        let full = messages.len() >= limit as usize;
        for message in &mut messages {
            // A message object carries its token; set it for one that does not.
            if message.get("token").is_none() {
                message["token"] = json!(token);
            }
        }
        messages.sort_by_key(|m| m.get("id").and_then(Value::as_i64).unwrap_or(0));
        Ok(Page { messages, full })
    }

    /// Every conversation's page at once, without waiting.
    async fn sweep(&self, rooms: &[String], after: i64) -> Result<Vec<Page>, CallError> {
        let mut pages = Vec::with_capacity(rooms.len());
        for token in rooms {
            pages.push(
                Self::page(self.api.clone(), token.clone(), after, 0, self.config.limit).await?,
            );
        }
        Ok(pages)
    }

    /// The first conversation to show something, long-polling all at once.
    async fn first_news(&self, rooms: &[String], after: i64) -> Result<Vec<Page>, CallError> {
        let mut set = tokio::task::JoinSet::new();
        for token in rooms {
            set.spawn(Self::page(
                self.api.clone(),
                token.clone(),
                after,
                self.config.timeout_s,
                self.config.limit,
            ));
        }
        while let Some(joined) = set.join_next().await {
            let page = joined.map_err(|e| CallError::Lost(e.to_string()))??;
            if !page.messages.is_empty() {
                return Ok(vec![page]);
            }
        }
        Ok(Vec::new())
    }
}

fn max_id(pages: &[Page]) -> Option<i64> {
    let mut horizon: Option<i64> = None;
    for page in pages {
        let last = page
            .messages
            .last()
            .and_then(|m| m.get("id"))
            .and_then(Value::as_i64);
        horizon = match (horizon, last) {
            (h, None) => h,
            (None, Some(l)) => Some(l),
            (Some(h), Some(l)) => Some(h.max(l)),
        };
    }
    horizon
}

#[async_trait]
impl PollingFeed for ChatPoller {
    async fn poll(&self, from: &PollFrom, wait: PollWait) -> Result<Vec<PolledEvent>, SourceError> {
        if self.floor().is_none() {
            self.start_at_present().await.map_err(|e| match e {
                StartError::Call(e) => source_error(&e, "reading where to start"),
                StartError::Kept(e) => SourceError::new(
                    DeliveryFailureKind::Transient,
                    format!("Nextcloud Talk: where the chat starts could not be kept: {e}"),
                ),
                StartError::Raced => SourceError::new(
                    DeliveryFailureKind::Transient,
                    "Nextcloud Talk: the kept start changed while it was written; read again",
                ),
            })?;
        }
        let after = from.after.max(self.floor().unwrap_or(0));
        let rooms = self
            .conversations()
            .await
            .map_err(|e| source_error(&e, "listing conversations"))?;
        if rooms.is_empty() {
            if wait == PollWait::Long {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            return Ok(Vec::new());
        }
        let first = if wait == PollWait::Long {
            self.first_news(&rooms, after).await
        } else {
            self.sweep(&rooms, after).await
        }
        .map_err(|e| source_error(&e, "chat poll"))?;
        let Some(mut horizon) = max_id(&first) else {
            return Ok(Vec::new());
        };
        // Every id up to `horizon` existed before this second round began.
        let pages = if rooms.len() == 1 {
            first
        } else {
            self.sweep(&rooms, after)
                .await
                .map_err(|e| source_error(&e, "chat poll"))?
        };
        for page in pages.iter().filter(|p| p.full) {
            if let Some(last) = page
                .messages
                .last()
                .and_then(|m| m.get("id"))
                .and_then(Value::as_i64)
            {
                horizon = horizon.min(last);
            }
        }
        let mut events: Vec<PolledEvent> = pages
            .into_iter()
            .flat_map(|p| p.messages)
            .filter_map(|m| {
                let id = m.get("id")?.as_i64()?;
                (id > after && id <= horizon)
                    .then(|| PolledEvent::new(id, json!({ "via": "chat", "message": m })))
            })
            .collect();
        events.sort_by_key(|e| e.position);
        events.dedup_by_key(|e| e.position);
        Ok(events)
    }
}
