//! The evidence about the messages we sent: the one way WhatsApp lets a send whose answer was
//! lost be settled (platform-apis-wave2 §1.2). Every outbound message carries its unit key in
//! `biz_opaque_callback_data`, and Meta echoes it in every `statuses[]` entry of that message
//! (`sent`, `delivered`, `read`, `failed`) together with its `wamid`.
//!
//! The evidence is the book [`STATUS_BOOK`] of the account's state in the gateway's store, so
//! every gateway sharing the store settles a send from what any of them recorded. Its records,
//! each under a key that makes its append repeatable:
//!
//! - `attempted:<unit key>`: durable *before* the request goes out. A key without it was never
//!   sent by this account, so it reconciles as not sent (the engine may send it).
//! - `accepted:<unit key>` (`wamid`): Graph answered with the `wamid`, or a `sent`,
//!   `delivered` or `read` status arrived. Statuses are durable before the webhook is answered
//!   200, so one Meta saw answered is never lost to a crash, and one we did not answer is
//!   delivered again (Meta retries for up to 7 days).
//! - `failed:<unit key>` (`wamid`, codes): the first `failed` status; a message can be
//!   `delivered` on one device and `failed` on another, so a failure never proves a message
//!   absent (the codes are for the operator).
//!
//! An earlier release kept the book in [`BOOK_FILE`] in the state directory; it is imported
//! once ([`StatusBook::import_legacy`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::state::{Book, ChannelState, LegacyFiles, StateError};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// The file an earlier release kept the book in (in the gateway's state directory), imported
/// once.
pub const BOOK_FILE: &str = "whatsapp-statuses.jsonl";

/// The book's name in the account's state.
pub const STATUS_BOOK: &str = "statuses";

/// Records older than this are pruned. An unknown send is reconciled within the engine's
/// window (minutes) and then parked for an operator; Meta retries a status for 7 days. Three
/// months is far beyond both, so an attempt is never forgotten while its send is in question.
const KEEP_FOR: Duration = Duration::from_secs(93 * 24 * 3_600);
/// At most this many records are kept (the newest): up to three per message, a bound far
/// above what a busy number writes in the days an unknown send can take.
const KEEP_NEWEST: u64 = 400_000;
/// How often a running channel prunes (besides at start).
const PRUNE_EVERY_MS: i64 = 24 * 3_600 * 1_000;
/// How many records of an imported file are written at once (the store batches them).
const IMPORT_BATCH: usize = 256;

const ATTEMPTED: &str = "attempted:";
const ACCEPTED: &str = "accepted:";
const FAILED: &str = "failed:";

/// What the book knows about one unit key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusEvidence {
    /// The unit key (`biz_opaque_callback_data`).
    pub key: String,
    /// A request of it was about to go out.
    #[serde(default)]
    pub attempted: bool,
    /// The message's `wamid`, once known.
    #[serde(default)]
    pub wamid: Option<String>,
    /// Graph answered with the `wamid`, or a `sent`/`delivered`/`read` status arrived:
    /// WhatsApp has the message.
    #[serde(default)]
    pub accepted: bool,
    /// The error codes of `failed` statuses.
    #[serde(default)]
    pub failed_codes: Vec<i64>,
}

/// Why the book could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum BookError {
    /// The store could not be read or written.
    #[error("the WhatsApp status book could not be {what}: {source}")]
    State {
        /// What was being done.
        what: &'static str,
        /// The store's error.
        #[source]
        source: StateError,
    },
    /// The book file of an earlier release could not be imported.
    #[error(
        "the WhatsApp status book of an earlier release ({BOOK_FILE} in the state directory) \
         could not be {what}: {source}; make it readable (or move it aside to give up its \
         evidence) and start again"
    )]
    Legacy {
        /// What was being done.
        what: &'static str,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

fn state_error(what: &'static str) -> impl FnOnce(StateError) -> BookError {
    move |source| BookError::State { what, source }
}

fn legacy_error(what: &'static str) -> impl FnOnce(std::io::Error) -> BookError {
    move |source| BookError::Legacy { what, source }
}

/// One record of the book (its key says which fact about which unit key it is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum Entry {
    Attempted,
    Accepted {
        wamid: String,
    },
    Failed {
        wamid: Option<String>,
        codes: Vec<i64>,
    },
}

/// The send evidence of one account, shared by the adapter (attempts, answers, settling) and
/// the webhook source (statuses). Every read goes to the store: another gateway may have
/// written the evidence.
#[derive(Debug, Clone)]
pub struct StatusBook {
    book: Book,
    state: ChannelState,
    /// When this instance last pruned (gateway clock).
    pruned_at: Arc<Mutex<i64>>,
}

impl StatusBook {
    /// The book of the account whose state is `state`; prunes what is too old to matter.
    pub async fn open(state: &ChannelState) -> Result<StatusBook, BookError> {
        let book = StatusBook {
            book: state.book(STATUS_BOOK),
            state: state.clone(),
            pruned_at: Arc::new(Mutex::new(i64::MIN)),
        };
        book.prune().await?;
        Ok(book)
    }

    async fn prune(&self) -> Result<(), BookError> {
        let now = self.state.now_ms();
        {
            let mut pruned_at = self
                .pruned_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if now.saturating_sub(*pruned_at) < PRUNE_EVERY_MS {
                return Ok(());
            }
            *pruned_at = now;
        }
        self.book
            .prune(KEEP_FOR, KEEP_NEWEST)
            .await
            .map_err(state_error("pruned"))?;
        Ok(())
    }

    async fn find(&self, key: String) -> Result<Option<Entry>, BookError> {
        Ok(self
            .book
            .find::<Entry>(&key)
            .await
            .map_err(state_error("read"))?
            .map(|r| r.value))
    }

    async fn append(&self, key: String, entry: &Entry) -> Result<bool, BookError> {
        self.book
            .append(&key, entry)
            .await
            .map_err(state_error("written"))
    }

    /// What the book knows of `key`, read from the store.
    pub async fn get(&self, key: &str) -> Result<Option<StatusEvidence>, BookError> {
        let attempted = self.find(format!("{ATTEMPTED}{key}")).await?.is_some();
        let accepted = match self.find(format!("{ACCEPTED}{key}")).await? {
            Some(Entry::Accepted { wamid }) => Some(wamid),
            _ => None,
        };
        let failed = match self.find(format!("{FAILED}{key}")).await? {
            Some(Entry::Failed { wamid, codes }) => Some((wamid, codes)),
            _ => None,
        };
        if !attempted && accepted.is_none() && failed.is_none() {
            return Ok(None);
        }
        let (failed_wamid, failed_codes) = failed.unwrap_or_default();
        Ok(Some(StatusEvidence {
            key: key.to_owned(),
            attempted,
            accepted: accepted.is_some(),
            wamid: accepted.or(failed_wamid),
            failed_codes,
        }))
    }

    /// Records a request of `key` about to go out; durable when this returns `Ok`.
    pub async fn attempted(&self, key: &str) -> Result<(), BookError> {
        self.append(format!("{ATTEMPTED}{key}"), &Entry::Attempted)
            .await?;
        // Off the send's path: a day's pruning is not the send's business.
        let book = self.clone();
        tokio::spawn(async move {
            if let Err(error) = book.prune().await {
                warn!(%error, "the WhatsApp status book was not pruned; it is tried again tomorrow");
            }
        });
        Ok(())
    }

    /// Records Graph's answer to a send (`wamid`).
    pub async fn answered(&self, key: &str, wamid: &str) -> Result<(), BookError> {
        self.accepted(key, wamid).await
    }

    async fn accepted(&self, key: &str, wamid: &str) -> Result<(), BookError> {
        self.append(
            format!("{ACCEPTED}{key}"),
            &Entry::Accepted {
                wamid: wamid.to_owned(),
            },
        )
        .await
        .map(|_| ())
    }

    /// Records a status webhook of a message we sent (`failure`: the code of a `failed` one);
    /// durable when this returns `Ok`.
    pub async fn status(
        &self,
        key: &str,
        wamid: &str,
        status: &str,
        failure: Option<i64>,
    ) -> Result<(), BookError> {
        match status {
            "sent" | "delivered" | "read" => self.accepted(key, wamid).await,
            "failed" => self
                .append(
                    format!("{FAILED}{key}"),
                    &Entry::Failed {
                        wamid: Some(wamid.to_owned()),
                        codes: vec![failure.unwrap_or(-1)],
                    },
                )
                .await
                .map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Imports the `whatsapp-statuses.jsonl` an earlier release wrote, then sets it aside;
    /// returns how many keys it held. Repeatable: a crash before the file is set aside imports
    /// it again and adds nothing (every record is keyed).
    pub async fn import_legacy(&self, legacy: &LegacyFiles) -> Result<usize, BookError> {
        let Some(bytes) = legacy.read(BOOK_FILE).map_err(legacy_error("read"))? else {
            return Ok(0);
        };
        // One JSON line per change of a key's evidence; the last line of a key holds all of
        // it. A torn last line (a crash mid-write) does not parse and is skipped, as the
        // earlier release skipped it: nothing was acted on before its line was synced.
        let mut by_key = HashMap::new();
        for line in String::from_utf8_lossy(&bytes).lines() {
            if let Ok(evidence) = serde_json::from_str::<StatusEvidence>(line) {
                by_key.insert(evidence.key.clone(), evidence);
            }
        }
        let mut records = Vec::new();
        for evidence in by_key.values() {
            let key = &evidence.key;
            if evidence.attempted {
                records.push((format!("{ATTEMPTED}{key}"), Entry::Attempted));
            }
            match &evidence.wamid {
                Some(wamid) if evidence.accepted => records.push((
                    format!("{ACCEPTED}{key}"),
                    Entry::Accepted {
                        wamid: wamid.clone(),
                    },
                )),
                _ => {}
            }
            if !evidence.failed_codes.is_empty() {
                records.push((
                    format!("{FAILED}{key}"),
                    Entry::Failed {
                        wamid: evidence.wamid.clone(),
                        codes: evidence.failed_codes.clone(),
                    },
                ));
            }
        }
        let mut records = records.into_iter().peekable();
        while records.peek().is_some() {
            let mut writes = tokio::task::JoinSet::new();
            for (key, entry) in records.by_ref().take(IMPORT_BATCH) {
                let book = self.book.clone();
                writes.spawn(async move { book.append(&key, &entry).await });
            }
            while let Some(written) = writes.join_next().await {
                written
                    .map_err(|e| BookError::Legacy {
                        what: "imported",
                        source: std::io::Error::other(e),
                    })?
                    .map_err(state_error("written"))?;
            }
        }
        legacy
            .retire(BOOK_FILE)
            .map_err(legacy_error("set aside"))?;
        info!(
            keys = by_key.len(),
            "the {BOOK_FILE} of an earlier release was taken into the gateway's store"
        );
        Ok(by_key.len())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn state(dir: &std::path::Path, account: &str) -> ChannelState {
        clawgate_conformance::channel_state(dir, "whatsapp", account)
    }

    #[tokio::test]
    async fn evidence_survives_a_reopen_and_failures_never_erase_acceptance() {
        let dir = tempfile::tempdir().unwrap();
        let book = StatusBook::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        book.attempted("k#0").await.unwrap();
        book.status("k#0", "wamid.A", "failed", Some(131_026))
            .await
            .unwrap();
        let failed = book.get("k#0").await.unwrap().unwrap();
        assert!(!failed.accepted);
        assert_eq!(failed.wamid.as_deref(), Some("wamid.A"));
        book.status("k#0", "wamid.A", "delivered", None)
            .await
            .unwrap();
        book.status("k#0", "wamid.A", "read", None).await.unwrap();
        book.attempted("k#1").await.unwrap();
        book.answered("k#1", "wamid.B").await.unwrap();
        book.attempted("k#2").await.unwrap();
        book.status("k#3", "wamid.C", "queued", None).await.unwrap();
        // Another process on the same store.
        let again = StatusBook::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        let first = again.get("k#0").await.unwrap().unwrap();
        assert!(first.accepted && first.attempted);
        assert_eq!(first.failed_codes, vec![131_026]);
        assert_eq!(
            again.get("k#1").await.unwrap().unwrap().wamid.as_deref(),
            Some("wamid.B")
        );
        let only_attempted = again.get("k#2").await.unwrap().unwrap();
        assert!(only_attempted.attempted && !only_attempted.accepted);
        assert_eq!(again.get("k#3").await.unwrap(), None, "no status of ours");
        // attempted + failed + accepted for k#0 (read added nothing), two for k#1, one for k#2.
        let records = state(dir.path(), "default")
            .book(STATUS_BOOK)
            .since::<serde_json::Value>(0)
            .await
            .unwrap();
        assert_eq!(records.len(), 6, "{records:?}");
    }

    #[tokio::test]
    async fn the_old_file_is_imported_once() {
        let old = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        // As the earlier release wrote it: a line per change, the last of a key wins, a torn
        // line at the end.
        let file = concat!(
            r#"{"key":"a#0","attempted":true,"wamid":null,"accepted":false,"failed_codes":[]}"#,
            "\n",
            r#"{"key":"a#0","attempted":true,"wamid":"wamid.A","accepted":true,"failed_codes":[]}"#,
            "\n",
            r#"{"key":"b#0","attempted":true,"wamid":null,"accepted":false,"failed_codes":[]}"#,
            "\n",
            r#"{"key":"c#0","attempted":true,"wamid":"wamid.C","accepted":false,"failed_codes":[131047,131026]}"#,
            "\n",
            r#"{"key":"d#0","attem"#,
        );
        std::fs::write(old.path().join(BOOK_FILE), file).unwrap();
        let legacy = LegacyFiles::in_dir(old.path());
        let book = StatusBook::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        assert_eq!(book.import_legacy(&legacy).await.unwrap(), 3);
        let a = book.get("a#0").await.unwrap().unwrap();
        assert!(a.attempted && a.accepted);
        assert_eq!(a.wamid.as_deref(), Some("wamid.A"));
        let b = book.get("b#0").await.unwrap().unwrap();
        assert!(b.attempted && !b.accepted);
        let c = book.get("c#0").await.unwrap().unwrap();
        assert!(c.attempted && !c.accepted);
        assert_eq!(c.failed_codes, vec![131_047, 131_026]);
        assert_eq!(book.get("d#0").await.unwrap(), None);
        assert!(old.path().join(format!("{BOOK_FILE}.imported")).is_file());
        assert_eq!(book.import_legacy(&legacy).await.unwrap(), 0, "set aside");
        // A crash before the rename: imported again, adding nothing.
        std::fs::write(old.path().join(BOOK_FILE), file).unwrap();
        assert_eq!(book.import_legacy(&legacy).await.unwrap(), 3);
        let records = state(dir.path(), "default")
            .book(STATUS_BOOK)
            .since::<serde_json::Value>(0)
            .await
            .unwrap();
        assert_eq!(records.len(), 5, "{records:?}");
    }
}
