//! The reply journal: every reply call this channel started, durable in the gateway's store
//! before the call goes out, and a mark when LINE refused the call (nothing was sent). After a
//! restart, or on another gateway sharing the store, it tells a reply that never left (no
//! entry, or refused: safe to send, or to settle as a push) from one whose outcome is unknown
//! (an entry: LINE cannot say whether it landed). Pushes need none: their retry key settles
//! them.
//!
//! It is the book [`JOURNAL_BOOK`] of the account's state. A unit may be replied to more than
//! once (a refused reply is tried again with its token), so each attempt has its own records:
//! `start:<n>:<unit key>` before attempt `n` (1, 2, …) goes out and `refused:<n>:<unit key>`
//! when LINE refused it. A new attempt starts only after the one before was refused (an
//! unknown one is never repeated as a reply), so the last attempt says it all.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::state::{Book, ChannelState, LegacyFiles, StateError};
use tracing::{info, warn};

/// The book's name in the account's state.
pub(crate) const JOURNAL_BOOK: &str = "reply-journal";

/// Records older than this are pruned. A reply token lives at most 20 minutes and an unknown
/// reply is parked for an operator within the engine's reconciliation window; three months is
/// far beyond both, so a started reply is never forgotten while its outcome is in question.
const KEEP_FOR: Duration = Duration::from_secs(93 * 24 * 3_600);
/// At most this many records are kept (the newest): two per refused attempt, one per other
/// reply, far above what a busy account writes in the days an unknown reply can take.
const KEEP_NEWEST: u64 = 400_000;
/// How often a running channel prunes (besides at start).
const PRUNE_EVERY_MS: i64 = 24 * 3_600 * 1_000;

/// The file an earlier release kept channel `name`'s journal in (in the state directory).
pub(crate) fn legacy_file(name: &str) -> String {
    format!("{name}.reply-journal")
}

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    #[error("the LINE reply journal could not be {what}: {source}")]
    State {
        what: &'static str,
        #[source]
        source: StateError,
    },
    #[error(
        "the LINE reply journal of an earlier release ({file} in the state directory) could not \
         be {what}: {source}; make it readable (or move it aside to give up its entries) and \
         start again"
    )]
    Legacy {
        file: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn state_error(what: &'static str) -> impl FnOnce(StateError) -> JournalError {
    move |source| JournalError::State { what, source }
}

/// Started replies of one account, shared by the adapter's sends and reconciliations.
#[derive(Debug, Clone)]
pub(crate) struct ReplyJournal {
    book: Book,
    state: ChannelState,
    /// When this instance last pruned (gateway clock).
    pruned_at: Arc<Mutex<i64>>,
}

fn start_key(n: u32, key: &str) -> String {
    format!("start:{n}:{key}")
}

fn refused_key(n: u32, key: &str) -> String {
    format!("refused:{n}:{key}")
}

/// The last attempt of a unit: its number and whether LINE refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Last {
    n: u32,
    refused: bool,
}

impl ReplyJournal {
    /// The journal of the account whose state is `state`; prunes what is too old to matter.
    pub(crate) async fn open(state: &ChannelState) -> Result<ReplyJournal, JournalError> {
        let journal = ReplyJournal {
            book: state.book(JOURNAL_BOOK),
            state: state.clone(),
            pruned_at: Arc::new(Mutex::new(i64::MIN)),
        };
        journal.prune().await?;
        Ok(journal)
    }

    async fn prune(&self) -> Result<(), JournalError> {
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

    async fn has(&self, record: &str) -> Result<bool, JournalError> {
        Ok(self
            .book
            .find::<serde_json::Value>(record)
            .await
            .map_err(state_error("read"))?
            .is_some())
    }

    async fn append(&self, record: &str) -> Result<(), JournalError> {
        self.book
            .append(record, &serde_json::json!({}))
            .await
            .map_err(state_error("written"))?;
        Ok(())
    }

    /// The last attempt of `key`, read from the store (another gateway may have made it).
    async fn last(&self, key: &str) -> Result<Option<Last>, JournalError> {
        let mut n = 0;
        while self.has(&start_key(n + 1, key)).await? {
            n += 1;
        }
        if n == 0 {
            return Ok(None);
        }
        Ok(Some(Last {
            n,
            refused: self.has(&refused_key(n, key)).await?,
        }))
    }

    /// Whether a reply of `key` was started and not refused: it may have landed.
    pub(crate) async fn started(&self, key: &str) -> Result<bool, JournalError> {
        Ok(matches!(
            self.last(key).await?,
            Some(Last { refused: false, .. })
        ))
    }

    /// Records that a reply of `key` starts now; returns once it is durable.
    pub(crate) async fn start(&self, key: &str) -> Result<(), JournalError> {
        let next = match self.last(key).await? {
            // Started and not refused: this is that attempt again.
            Some(Last { refused: false, .. }) => return Ok(()),
            Some(Last { n, refused: true }) => n + 1,
            None => 1,
        };
        self.append(&start_key(next, key)).await?;
        // Off the send's path: a day's pruning is not the send's business.
        let journal = self.clone();
        tokio::spawn(async move {
            if let Err(error) = journal.prune().await {
                warn!(%error, "the LINE reply journal was not pruned; it is tried again tomorrow");
            }
        });
        Ok(())
    }

    /// Records that LINE refused the reply of `key`: nothing of it was sent.
    pub(crate) async fn refused(&self, key: &str) -> Result<(), JournalError> {
        match self.last(key).await? {
            Some(Last { n, refused: false }) => self.append(&refused_key(n, key)).await,
            _ => Ok(()),
        }
    }

    /// Imports the `<name>.reply-journal` an earlier release wrote for channel `name`, then sets
    /// it aside; returns how many started replies it held. Repeatable: a crash before the file
    /// is set aside imports it again and adds nothing (each is the first attempt's record).
    pub(crate) async fn import_legacy(
        &self,
        legacy: &LegacyFiles,
        name: &str,
    ) -> Result<usize, JournalError> {
        let file = legacy_file(name);
        let legacy_error = |what| {
            let file = file.clone();
            move |source| JournalError::Legacy { file, what, source }
        };
        let Some(bytes) = legacy.read(&file).map_err(legacy_error("read"))? else {
            return Ok(0);
        };
        // A line per started reply, `!<key>` when LINE refused it; the last line of a key
        // wins. A reply refused in the end needs no record: no entry means the same.
        let mut started = std::collections::BTreeSet::new();
        for line in String::from_utf8_lossy(&bytes).lines() {
            match line.strip_prefix('!') {
                Some(refused) => started.remove(refused),
                None if !line.is_empty() => started.insert(line.to_owned()),
                None => false,
            };
        }
        for key in &started {
            self.append(&start_key(1, key)).await?;
        }
        legacy.retire(&file).map_err(legacy_error("set aside"))?;
        info!(
            started = started.len(),
            "the {file} of an earlier release was taken into the gateway's store"
        );
        Ok(started.len())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn state(dir: &std::path::Path, account: &str) -> ChannelState {
        clawgate_conformance::channel_state(dir, "line", account)
    }

    #[tokio::test]
    async fn started_replies_survive_a_reopen_and_a_refusal_clears_only_its_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let journal = ReplyJournal::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        assert!(!journal.started("k#0").await.unwrap());
        journal.start("k#0").await.unwrap();
        journal.start("k#0").await.unwrap();
        assert!(journal.started("k#0").await.unwrap());
        // Another process on the same store.
        let again = ReplyJournal::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        assert!(again.started("k#0").await.unwrap());
        assert!(!again.started("k#1").await.unwrap());
        again.refused("k#0").await.unwrap();
        assert!(!journal.started("k#0").await.unwrap());
        // Tried again after the refusal: started again, until refused again.
        journal.start("k#0").await.unwrap();
        assert!(again.started("k#0").await.unwrap());
        journal.refused("k#0").await.unwrap();
        assert!(!again.started("k#0").await.unwrap());
        let records: Vec<String> = state(dir.path(), "default")
            .book(JOURNAL_BOOK)
            .since::<serde_json::Value>(0)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.key)
            .collect();
        assert_eq!(
            records,
            [
                "start:1:k#0",
                "refused:1:k#0",
                "start:2:k#0",
                "refused:2:k#0"
            ]
        );
    }

    #[tokio::test]
    async fn two_accounts_on_one_store_keep_their_journals_apart() {
        let dir = tempfile::tempdir().unwrap();
        let first = ReplyJournal::open(&state(dir.path(), "first"))
            .await
            .unwrap();
        let second = ReplyJournal::open(&state(dir.path(), "second"))
            .await
            .unwrap();
        first.start("k#0").await.unwrap();
        assert!(first.started("k#0").await.unwrap());
        assert!(!second.started("k#0").await.unwrap());
        // A refusal of the second's own attempt leaves the first's alone.
        second.start("k#0").await.unwrap();
        second.refused("k#0").await.unwrap();
        assert!(first.started("k#0").await.unwrap());
    }

    #[tokio::test]
    async fn the_old_file_is_imported_once() {
        let old = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = "a#0\nb#0\n!b#0\nc#0\n!c#0\nc#0\n\n";
        std::fs::write(old.path().join("line-x.reply-journal"), file).unwrap();
        let legacy = LegacyFiles::in_dir(old.path());
        let journal = ReplyJournal::open(&state(dir.path(), "x")).await.unwrap();
        assert_eq!(journal.import_legacy(&legacy, "line-x").await.unwrap(), 2);
        assert!(journal.started("a#0").await.unwrap());
        assert!(!journal.started("b#0").await.unwrap(), "refused last");
        assert!(journal.started("c#0").await.unwrap(), "started again");
        assert!(old.path().join("line-x.reply-journal.imported").is_file());
        assert_eq!(journal.import_legacy(&legacy, "line-x").await.unwrap(), 0);
        // A crash before the rename: imported again, adding nothing.
        std::fs::write(old.path().join("line-x.reply-journal"), file).unwrap();
        assert_eq!(journal.import_legacy(&legacy, "line-x").await.unwrap(), 2);
        let records = state(dir.path(), "x")
            .book(JOURNAL_BOOK)
            .since::<serde_json::Value>(0)
            .await
            .unwrap();
        assert_eq!(records.len(), 2, "{records:?}");
    }
}
