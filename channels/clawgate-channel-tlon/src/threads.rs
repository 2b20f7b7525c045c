//! The threads this account takes part in: once one of our replies landed in a group
//! channel's thread, later posts in that thread are answered without a mention (groups answer
//! only mentions otherwise). The record is the book [`THREADS_BOOK`] of the account's state in
//! the gateway's store (one record per thread, keyed `<nest> <parent post id>`), so a restart,
//! and another gateway sharing the store, keep answering in those threads.
//!
//! A reply is recorded when its poke's `ok` arrives, when recovery finds it landed, and again
//! after its receipt is committed ([`ChannelMessageAdapter::after_commit`]); recording is
//! idempotent. The receiver asks synchronously, so it reads a copy of the book held here; the
//! source brings the copy up to date with the book ([`ParticipatedThreads::catch_up`]) before
//! it hands an event over, so a thread another gateway recorded counts as soon as its record
//! is in the store.
//!
//! The book is not pruned: it grows by one record per thread we ever reply in, and a thread
//! forgotten would stop being answered without a mention.
//!
//! [`ChannelMessageAdapter::after_commit`]: clawgate_channel_sdk::ChannelMessageAdapter::after_commit

use std::collections::BTreeSet;
use std::sync::Mutex;

use clawgate_channel_sdk::state::{Book, ChannelState, LegacyFiles, StateError};
use tracing::info;

/// The book's name in the account's state.
pub const THREADS_BOOK: &str = "participated-threads";

/// The file an earlier release kept the threads in (in the state directory), imported once.
pub const THREADS_FILE: &str = "participated-threads";

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ThreadsError {
    /// The store could not be read or written.
    #[error("the participated threads could not be {what}: {source}")]
    State {
        /// What was being done.
        what: &'static str,
        /// The store's error.
        #[source]
        source: StateError,
    },
    /// The file of an earlier release could not be imported.
    #[error(
        "the participated threads of an earlier release ({THREADS_FILE} in the state directory) \
         could not be {what}: {source}; make the file readable (or move it aside to give up its \
         threads) and start again"
    )]
    Legacy {
        /// What was being done.
        what: &'static str,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

fn state_error(what: &'static str) -> impl FnOnce(StateError) -> ThreadsError {
    move |source| ThreadsError::State { what, source }
}

fn legacy_error(what: &'static str) -> impl FnOnce(std::io::Error) -> ThreadsError {
    move |source| ThreadsError::Legacy { what, source }
}

#[derive(Debug, Default)]
struct Known {
    threads: BTreeSet<String>,
    /// The position of the last record of the book read into `threads`.
    seen: i64,
}

/// The participated threads of one account: `<nest> <parent post id>` pairs.
#[derive(Debug, Default)]
pub struct ParticipatedThreads {
    book: Option<Book>,
    known: Mutex<Known>,
}

fn key(nest: &str, parent: &str) -> String {
    format!("{nest} {parent}")
}

impl ParticipatedThreads {
    /// A record kept only in memory (tests, a channel without a store).
    pub fn in_memory() -> ParticipatedThreads {
        ParticipatedThreads::default()
    }

    /// The record of the account whose state is `state`, as far as it was written.
    pub async fn open(state: &ChannelState) -> Result<ParticipatedThreads, ThreadsError> {
        let threads = ParticipatedThreads {
            book: Some(state.book(THREADS_BOOK)),
            known: Mutex::default(),
        };
        threads.catch_up().await?;
        Ok(threads)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads what the book gained since this copy last read it (threads another gateway
    /// recorded).
    pub async fn catch_up(&self) -> Result<(), ThreadsError> {
        let Some(book) = &self.book else {
            return Ok(());
        };
        let after = self.lock().seen;
        let records = book
            .since::<serde_json::Value>(after)
            .await
            .map_err(state_error("read"))?;
        let mut known = self.lock();
        for record in records {
            known.seen = known.seen.max(record.seq);
            known.threads.insert(record.key);
        }
        Ok(())
    }

    /// Whether we replied in thread `parent` of channel `nest` (as far as this copy knows).
    pub fn contains(&self, nest: &str, parent: &str) -> bool {
        self.lock().threads.contains(&key(nest, parent))
    }

    /// Every recorded thread this copy knows, as `(nest, parent)`.
    pub fn all(&self) -> Vec<(String, String)> {
        self.lock()
            .threads
            .iter()
            .filter_map(|k| {
                let (nest, parent) = k.split_once(' ')?;
                Some((nest.to_owned(), parent.to_owned()))
            })
            .collect()
    }

    /// Records thread `parent` of `nest`, durably when there is a store; `Ok(true)` when it
    /// is new to this copy.
    pub async fn record(&self, nest: &str, parent: &str) -> Result<bool, ThreadsError> {
        let key = key(nest, parent);
        if self.lock().threads.contains(&key) {
            return Ok(false);
        }
        if let Some(book) = &self.book {
            book.append(&key, &serde_json::json!({}))
                .await
                .map_err(state_error("written"))?;
        }
        Ok(self.lock().threads.insert(key))
    }

    /// Imports the `participated-threads` file an earlier release wrote, then sets it aside;
    /// returns how many threads it held. Repeatable: a crash before the file is set aside
    /// imports it again and adds nothing (each thread is its own key).
    pub async fn import_legacy(&self, legacy: &LegacyFiles) -> Result<usize, ThreadsError> {
        let Some(bytes) = legacy.read(THREADS_FILE).map_err(legacy_error("read"))? else {
            return Ok(0);
        };
        let text = String::from_utf8_lossy(&bytes);
        let lines: BTreeSet<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.contains(' '))
            .collect();
        for line in &lines {
            if let Some((nest, parent)) = line.split_once(' ') {
                self.record(nest, parent).await?;
            }
        }
        legacy
            .retire(THREADS_FILE)
            .map_err(legacy_error("set aside"))?;
        info!(
            threads = lines.len(),
            "the {THREADS_FILE} of an earlier release was taken into the gateway's store"
        );
        Ok(lines.len())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn state(dir: &std::path::Path, account: &str) -> ChannelState {
        clawgate_conformance::channel_state(dir, "tlon", account)
    }

    #[tokio::test]
    async fn records_survive_a_reopen_repeat_harmlessly_and_reach_another_copy() {
        let dir = tempfile::tempdir().unwrap();
        let threads = ParticipatedThreads::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        let other = ParticipatedThreads::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        assert!(threads.record("chat/~zod/general", "170.1").await.unwrap());
        assert!(!threads.record("chat/~zod/general", "170.1").await.unwrap());
        let again = ParticipatedThreads::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        assert!(again.contains("chat/~zod/general", "170.1"));
        assert!(!again.contains("chat/~zod/general", "170.2"));
        assert_eq!(again.all().len(), 1);
        // A copy opened before the record (another gateway) knows it once it catches up.
        assert!(!other.contains("chat/~zod/general", "170.1"));
        other.catch_up().await.unwrap();
        assert!(other.contains("chat/~zod/general", "170.1"));
        // Recorded there too: nothing new in the book.
        assert!(other.record("chat/~zod/general", "170.1").await.is_ok());
        let records = state(dir.path(), "default")
            .book(THREADS_BOOK)
            .since::<serde_json::Value>(0)
            .await
            .unwrap();
        assert_eq!(records.len(), 1);
    }

    #[tokio::test]
    async fn two_accounts_on_one_store_keep_their_threads_apart() {
        let dir = tempfile::tempdir().unwrap();
        let first = ParticipatedThreads::open(&state(dir.path(), "first"))
            .await
            .unwrap();
        first.record("chat/~zod/general", "170.1").await.unwrap();
        let second = ParticipatedThreads::open(&state(dir.path(), "second"))
            .await
            .unwrap();
        second.catch_up().await.unwrap();
        assert!(!second.contains("chat/~zod/general", "170.1"));
        assert!(
            ParticipatedThreads::open(&state(dir.path(), "first"))
                .await
                .unwrap()
                .contains("chat/~zod/general", "170.1")
        );
    }

    #[tokio::test]
    async fn the_old_file_is_imported_once() {
        let old = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = "chat/~zod/general 170.1\nchat/~zod/general 170.2\n\n";
        std::fs::write(old.path().join(THREADS_FILE), file).unwrap();
        let legacy = LegacyFiles::in_dir(old.path());
        let threads = ParticipatedThreads::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        assert_eq!(threads.import_legacy(&legacy).await.unwrap(), 2);
        assert!(threads.contains("chat/~zod/general", "170.2"));
        assert!(
            old.path()
                .join(format!("{THREADS_FILE}.imported"))
                .is_file()
        );
        assert_eq!(threads.import_legacy(&legacy).await.unwrap(), 0);
        // A crash before the rename: imported again (by a new process), adding nothing.
        std::fs::write(old.path().join(THREADS_FILE), file).unwrap();
        let restarted = ParticipatedThreads::open(&state(dir.path(), "default"))
            .await
            .unwrap();
        assert_eq!(restarted.import_legacy(&legacy).await.unwrap(), 2);
        let records = state(dir.path(), "default")
            .book(THREADS_BOOK)
            .since::<serde_json::Value>(0)
            .await
            .unwrap();
        assert_eq!(records.len(), 2);
    }
}
