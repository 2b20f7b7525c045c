//! The send journal: what this account sent, kept in the gateway's store (the account's
//! [`ChannelState`], book `imessage-sends`), each record durable before it is acted on.
//!
//! - `attempt:<unit key>` (chat, text, `tempGuid`, time): written *before* the request goes
//!   out. A unit key without one was never sent by this account, on any gateway: it reconciles
//!   as not sent.
//! - `guid:<unit key>`: the real `guid` of the chat.db row, from the server's answer or a row
//!   claimed for a send whose answer was lost.
//! - `taken:<guid>`: which unit a row was given to. A row is claimed by appending this record,
//!   and an append of a key already there changes nothing: two gateways settling two units
//!   with the same words cannot both take one row.
//!
//! Every decision reads the store, since another gateway on the same store may have written
//! the evidence. The journal also makes the sent-echo cache ([`crate::EchoCache`]) survive a
//! restart and see the sends of other gateways: the cache is fed the attempts younger than its
//! TTL when the channel opens, and the ones appended since whenever an own-account message
//! matches nothing ([`SendJournal::feed`]). Records older than [`RETENTION_MS`] are pruned when
//! the journal is opened.
//!
//! An earlier release kept the journal in [`JOURNAL_FILE`] in the state directory; it is
//! imported once ([`SendJournal::import_legacy`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::state::{Book, ChannelState, LegacyFiles, StateError};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tracing::warn;

use crate::echoes::EchoCache;

/// The file an earlier release kept the journal in (in the gateway's state directory), read
/// once by [`SendJournal::import_legacy`].
pub const JOURNAL_FILE: &str = "imessage-sends.jsonl";

/// How long records are kept (a week: far beyond the engine's reconciliation window).
pub const RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;

/// The book the journal is kept in.
const BOOK: &str = "imessage-sends";

/// At most this many records are kept (the newest): a bound for a busy account, far above
/// what a week of sends writes (three records a unit).
const KEEP_NEWEST: u64 = 300_000;

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The store could not be read or written.
    #[error("the iMessage send journal could not be {what}: {source}")]
    State {
        /// What was being done.
        what: &'static str,
        /// The store's error.
        #[source]
        source: StateError,
    },
    /// The journal file of an earlier release could not be imported.
    #[error(
        "the iMessage send journal of an earlier release ({JOURNAL_FILE} in the state \
         directory) could not be {what}: {source}; make it readable (or move it aside to give \
         up its records) and start again"
    )]
    Legacy {
        /// What was being done.
        what: &'static str,
        /// The file system's error.
        #[source]
        source: std::io::Error,
    },
}

fn state_error(what: &'static str) -> impl FnOnce(StateError) -> JournalError {
    move |source| JournalError::State { what, source }
}

/// A record of the book.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum Entry {
    /// `attempt:<key>`.
    Attempt {
        chat: String,
        text: String,
        temp_guid: String,
        at_ms: u64,
    },
    /// `guid:<key>`: the row of the unit.
    Guid { guid: String, temp_guid: String },
    /// `taken:<guid>`: the unit the row was given to.
    Taken { key: String },
}

/// A line of the earlier release's `imessage-sends.jsonl`.
#[derive(Debug, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum LegacyLine {
    Attempt {
        key: String,
        chat: String,
        text: String,
        temp_guid: String,
        at_ms: u64,
    },
    Answered {
        key: String,
        guid: String,
    },
    Claimed {
        key: String,
        guid: String,
    },
}

/// One attempted unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The chat's guid.
    pub chat: String,
    /// The text sent.
    pub text: String,
    /// The `tempGuid` it was sent with.
    pub temp_guid: String,
    /// When the first request of it was about to go out (ms since the epoch).
    pub at_ms: u64,
    /// Its real guid, once answered or claimed.
    pub guid: Option<String>,
}

/// The durable record of this account's sends (cheap to clone).
#[derive(Debug, Clone)]
pub struct SendJournal {
    book: Book,
    /// The last record fed to the echo cache.
    fed: Arc<Mutex<i64>>,
}

impl SendJournal {
    /// The journal of the account whose state is `state`; prunes what is older than
    /// [`RETENTION_MS`].
    pub async fn open(state: &ChannelState) -> Result<SendJournal, JournalError> {
        let book = state.book(BOOK);
        book.prune(Duration::from_millis(RETENTION_MS), KEEP_NEWEST)
            .await
            .map_err(state_error("pruned"))?;
        Ok(SendJournal {
            book,
            fed: Arc::new(Mutex::new(0)),
        })
    }

    /// Imports the `imessage-sends.jsonl` an earlier release wrote (what is younger than
    /// [`RETENTION_MS`] at `now_ms`, as that release kept it), then sets it aside; returns how
    /// many lines were imported. Repeatable: every record is keyed, so a crash before the file
    /// is set aside imports it again and adds nothing.
    pub async fn import_legacy(
        &self,
        legacy: &LegacyFiles,
        now_ms: u64,
    ) -> Result<usize, JournalError> {
        let legacy_error = |what| move |source| JournalError::Legacy { what, source };
        let Some(bytes) = legacy.read(JOURNAL_FILE).map_err(legacy_error("read"))? else {
            return Ok(0);
        };
        let mut imported = 0;
        // Unit key → tempGuid of the attempts kept.
        let mut kept: HashMap<String, String> = HashMap::new();
        for line in String::from_utf8_lossy(&bytes).lines() {
            // A torn last line (a crash mid-write) was never acted on: nothing was sent before
            // its attempt line was synced.
            let Ok(line) = serde_json::from_str::<LegacyLine>(line) else {
                if !line.trim().is_empty() {
                    warn!(
                        file = JOURNAL_FILE,
                        "skipping an unreadable line of the old send journal"
                    );
                }
                continue;
            };
            match line {
                LegacyLine::Attempt {
                    key,
                    chat,
                    text,
                    temp_guid,
                    at_ms,
                } => {
                    if at_ms.saturating_add(RETENTION_MS) < now_ms {
                        continue;
                    }
                    let attempt = self
                        .attempted(&key, &chat, &text, &temp_guid, at_ms)
                        .await?;
                    kept.insert(key, attempt.temp_guid);
                }
                LegacyLine::Answered { key, guid } | LegacyLine::Claimed { key, guid } => {
                    let Some(temp_guid) = kept.get(&key) else {
                        continue;
                    };
                    self.give(&key, &guid, temp_guid).await?;
                }
            }
            imported += 1;
        }
        legacy
            .retire(JOURNAL_FILE)
            .map_err(legacy_error("set aside"))?;
        Ok(imported)
    }

    /// Records a request of `key` about to go out; durable when this returns `Ok`. Returns the
    /// attempt as recorded (a retry, here or on another gateway, keeps the first one's
    /// `tempGuid` and time).
    pub async fn attempted(
        &self,
        key: &str,
        chat: &str,
        text: &str,
        temp_guid: &str,
        at_ms: u64,
    ) -> Result<Attempt, JournalError> {
        let entry = Entry::Attempt {
            chat: chat.to_owned(),
            text: text.to_owned(),
            temp_guid: temp_guid.to_owned(),
            at_ms,
        };
        self.book
            .append(&format!("attempt:{key}"), &entry)
            .await
            .map_err(state_error("written"))?;
        // The first attempt, whoever wrote it (ours only if it was pruned in between).
        Ok(self.attempt(key).await?.unwrap_or(Attempt {
            chat: chat.to_owned(),
            text: text.to_owned(),
            temp_guid: temp_guid.to_owned(),
            at_ms,
            guid: None,
        }))
    }

    /// Records the server's answer to a send of `key`: its row is `guid`.
    pub async fn answered(
        &self,
        key: &str,
        guid: &str,
        temp_guid: &str,
    ) -> Result<(), JournalError> {
        // The answer is the server's word: the row is the unit's even if a text match of
        // another unit took it first.
        self.give(key, guid, temp_guid).await?;
        Ok(())
    }

    /// Claims the row `guid` for `key`, whose answer was lost; durable when `Ok(true)`.
    /// `Ok(false)`: the row was given to another unit (by any gateway).
    pub async fn claim(
        &self,
        key: &str,
        guid: &str,
        temp_guid: &str,
    ) -> Result<bool, JournalError> {
        self.give(key, guid, temp_guid).await
    }

    /// Appends `taken:<guid>` (the claim) and then `guid:<key>`; true when the row is `key`'s.
    /// A crash in between leaves the row taken by `key`, which a later claim finds.
    async fn give(&self, key: &str, guid: &str, temp_guid: &str) -> Result<bool, JournalError> {
        let taken = format!("taken:{guid}");
        let claimed = self
            .book
            .append(
                &taken,
                &Entry::Taken {
                    key: key.to_owned(),
                },
            )
            .await
            .map_err(state_error("written"))?;
        let ours = claimed
            || match self
                .book
                .find::<Entry>(&taken)
                .await
                .map_err(state_error("read"))?
            {
                Some(record) => {
                    record.value
                        == Entry::Taken {
                            key: key.to_owned(),
                        }
                }
                None => false,
            };
        if ours {
            self.book
                .append(
                    &format!("guid:{key}"),
                    &Entry::Guid {
                        guid: guid.to_owned(),
                        temp_guid: temp_guid.to_owned(),
                    },
                )
                .await
                .map_err(state_error("written"))?;
        }
        Ok(ours)
    }

    /// What the store holds of `key` (any gateway's attempt).
    pub async fn attempt(&self, key: &str) -> Result<Option<Attempt>, JournalError> {
        let Some(record) = self
            .book
            .find::<Entry>(&format!("attempt:{key}"))
            .await
            .map_err(state_error("read"))?
        else {
            return Ok(None);
        };
        let Entry::Attempt {
            chat,
            text,
            temp_guid,
            at_ms,
        } = record.value
        else {
            return Ok(None);
        };
        let guid = match self
            .book
            .find::<Entry>(&format!("guid:{key}"))
            .await
            .map_err(state_error("read"))?
        {
            Some(record) => match record.value {
                Entry::Guid { guid, .. } => Some(guid),
                _ => None,
            },
            None => None,
        };
        Ok(Some(Attempt {
            chat,
            text,
            temp_guid,
            at_ms,
            guid,
        }))
    }

    /// Whether the row `guid` was given to a send (answered or claimed, by any gateway).
    pub async fn taken(&self, guid: &str) -> Result<bool, JournalError> {
        Ok(self
            .book
            .find::<Entry>(&format!("taken:{guid}"))
            .await
            .map_err(state_error("read"))?
            .is_some())
    }

    /// Feeds `echoes` the attempts (and their rows) appended since the last feed, by any
    /// gateway, that are younger than the cache's TTL at `now_ms`.
    pub async fn feed(&self, echoes: &EchoCache, now_ms: u64) -> Result<(), JournalError> {
        let mut fed = self.fed.lock().await;
        let since = now_ms.saturating_sub(echoes.ttl_ms());
        for record in self
            .book
            .since::<Entry>(*fed)
            .await
            .map_err(state_error("read"))?
        {
            *fed = record.seq;
            match record.value {
                Entry::Attempt {
                    chat,
                    text,
                    temp_guid,
                    at_ms,
                } if at_ms >= since => echoes.remember(&chat, &text, &temp_guid, at_ms, now_ms),
                Entry::Guid { guid, temp_guid } => echoes.learn_guid(&temp_guid, &guid),
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[tokio::test]
    async fn attempts_answers_and_claims_survive_a_reopen_and_a_row_goes_to_one_unit() {
        let dir = tempfile::tempdir().unwrap();
        let state = || clawgate_conformance::channel_state(dir.path(), "imessage", "default");
        let now = 10 * RETENTION_MS;
        let journal = SendJournal::open(&state()).await.unwrap();
        assert_eq!(journal.attempt("k#0").await.unwrap(), None);
        let first = journal
            .attempted("k#0", "iMessage;-;+1", "hi", "t0", now)
            .await
            .unwrap();
        // A retry keeps the first attempt.
        let again = journal
            .attempted("k#0", "iMessage;-;+1", "hi", "t-other", now + 5)
            .await
            .unwrap();
        assert_eq!(first, again);
        journal.answered("k#0", "G0", "t0").await.unwrap();
        journal
            .attempted("k#1", "iMessage;-;+1", "yo", "t1", now + 10)
            .await
            .unwrap();
        // Another gateway on the same store: a row given to one unit is not another's.
        let other = SendJournal::open(&state()).await.unwrap();
        assert!(
            !other.claim("k#2", "G0", "t2").await.unwrap(),
            "G0 is k#0's"
        );
        assert!(other.claim("k#1", "G1", "t1").await.unwrap());
        assert!(
            journal.claim("k#1", "G1", "t1").await.unwrap(),
            "claiming one's own row again"
        );
        drop(journal);
        let again = SendJournal::open(&state()).await.unwrap();
        assert_eq!(
            again.attempt("k#0").await.unwrap().unwrap().guid.as_deref(),
            Some("G0")
        );
        assert_eq!(
            again.attempt("k#1").await.unwrap().unwrap().guid.as_deref(),
            Some("G1")
        );
        assert!(again.taken("G0").await.unwrap() && again.taken("G1").await.unwrap());
        assert!(!again.taken("G2").await.unwrap());
        assert_eq!(again.attempt("k#2").await.unwrap(), None);
    }
}
