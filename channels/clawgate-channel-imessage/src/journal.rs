//! The send journal: what this account sent, kept in the channel's state directory
//! ([`JOURNAL_FILE`], JSON lines, each synced before it is acted on).
//!
//! - **attempt** (unit key, chat, text, `tempGuid`, time): written *before* the request goes
//!   out. A unit key without one was never sent by this account: it reconciles as not sent.
//! - **answered** (key, guid): the server's answer (the real `guid` of the chat.db row).
//! - **claimed** (key, guid): a row found for a send whose answer was lost.
//!
//! The journal is also what makes the sent-echo cache ([`crate::EchoCache`]) survive a
//! restart: the cache is seeded from the attempts younger than its TTL when the channel opens.
//! Lines older than [`RETENTION_MS`] are dropped when the journal is opened (rewritten whole).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::warn;

/// The journal's name in the channel's state directory.
pub const JOURNAL_FILE: &str = "imessage-sends.jsonl";

/// How long attempts are kept (a week: far beyond the engine's reconciliation window).
pub const RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("the iMessage send journal {path}: {source} (check the state directory is writable)")]
pub struct JournalError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub(crate) enum Line {
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

#[derive(Debug, Default)]
struct Book {
    attempts: HashMap<String, Attempt>,
    /// Guids given to a send (answered or claimed).
    taken: HashSet<String>,
}

impl Book {
    fn apply(&mut self, line: Line) {
        match line {
            Line::Attempt {
                key,
                chat,
                text,
                temp_guid,
                at_ms,
            } => {
                // A retry of the same key keeps the first attempt: any of its rows is its row.
                self.attempts.entry(key).or_insert(Attempt {
                    chat,
                    text,
                    temp_guid,
                    at_ms,
                    guid: None,
                });
            }
            Line::Answered { key, guid } | Line::Claimed { key, guid } => {
                self.taken.insert(guid.clone());
                if let Some(attempt) = self.attempts.get_mut(&key) {
                    attempt.guid = Some(guid);
                }
            }
        }
    }

    fn lines(&self) -> Vec<Line> {
        let mut lines = Vec::new();
        let mut attempts: Vec<_> = self.attempts.iter().collect();
        attempts.sort_by_key(|(_, a)| a.at_ms);
        for (key, a) in attempts {
            lines.push(Line::Attempt {
                key: key.clone(),
                chat: a.chat.clone(),
                text: a.text.clone(),
                temp_guid: a.temp_guid.clone(),
                at_ms: a.at_ms,
            });
            if let Some(guid) = &a.guid {
                lines.push(Line::Answered {
                    key: key.clone(),
                    guid: guid.clone(),
                });
            }
        }
        lines
    }
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    book: Mutex<Book>,
    file: Mutex<std::fs::File>,
}

/// The durable record of this account's sends.
#[derive(Debug, Clone)]
pub struct SendJournal {
    inner: Arc<Inner>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SendJournal {
    /// Opens (or creates) the journal in `dir`, reading what earlier runs recorded and
    /// dropping what is older than [`RETENTION_MS`] before `now_ms`.
    pub fn open(dir: &Path, now_ms: u64) -> Result<SendJournal, JournalError> {
        let path = dir.join(JOURNAL_FILE);
        let error = |source| JournalError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(error)?;
        let mut book = Book::default();
        let mut read = 0usize;
        if let Ok(file) = std::fs::File::open(&path) {
            for line in std::io::BufReader::new(file).lines() {
                let line = line.map_err(error)?;
                read += 1;
                // A torn last line (a crash mid-write) was never acted on: nothing is sent
                // before its attempt line is synced.
                match serde_json::from_str::<Line>(&line) {
                    Ok(line) => book.apply(line),
                    Err(e) if !line.trim().is_empty() => {
                        warn!(path = %path.display(), error = %e, "skipping an unreadable send-journal line");
                    }
                    Err(_) => {}
                }
            }
        }
        let before = book.attempts.len();
        book.attempts
            .retain(|_, a| a.at_ms.saturating_add(RETENTION_MS) >= now_ms);
        if book.attempts.len() < before || read > 2 * book.lines().len() + 16 {
            // Rewritten whole, then renamed over the old one: a crash leaves one or the other.
            let fresh = path.with_extension("jsonl.tmp");
            let mut bytes = Vec::new();
            for line in book.lines() {
                bytes.extend(serde_json::to_vec(&line).unwrap_or_default());
                bytes.push(b'\n');
            }
            std::fs::write(&fresh, &bytes).map_err(error)?;
            std::fs::File::open(&fresh)
                .and_then(|f| f.sync_all())
                .map_err(error)?;
            std::fs::rename(&fresh, &path).map_err(error)?;
            book = Book::default();
            for line in String::from_utf8_lossy(&bytes).lines() {
                if let Ok(line) = serde_json::from_str::<Line>(line) {
                    book.apply(line);
                }
            }
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(error)?;
        Ok(SendJournal {
            inner: Arc::new(Inner {
                path,
                book: Mutex::new(book),
                file: Mutex::new(file),
            }),
        })
    }

    async fn append(&self, line: Line) -> Result<(), JournalError> {
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        let inner = self.inner.clone();
        let written = tokio::task::spawn_blocking(move || {
            let mut file = lock(&inner.file);
            file.write_all(&bytes)?;
            file.sync_data()
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        written.map_err(|source| JournalError {
            path: self.inner.path.clone(),
            source,
        })?;
        lock(&self.inner.book).apply(line);
        Ok(())
    }

    /// Records a request of `key` about to go out; durable when this returns `Ok`. Returns the
    /// attempt as recorded (a retry keeps the first one's `tempGuid` and time).
    pub async fn attempted(
        &self,
        key: &str,
        chat: &str,
        text: &str,
        temp_guid: &str,
        at_ms: u64,
    ) -> Result<Attempt, JournalError> {
        if let Some(attempt) = self.attempt(key) {
            return Ok(attempt);
        }
        self.append(Line::Attempt {
            key: key.to_owned(),
            chat: chat.to_owned(),
            text: text.to_owned(),
            temp_guid: temp_guid.to_owned(),
            at_ms,
        })
        .await?;
        self.attempt(key).ok_or_else(|| JournalError {
            path: self.inner.path.clone(),
            source: std::io::Error::other("the attempt line was written but not applied"),
        })
    }

    /// Records the server's answer to a send of `key`.
    pub async fn answered(&self, key: &str, guid: &str) -> Result<(), JournalError> {
        self.append(Line::Answered {
            key: key.to_owned(),
            guid: guid.to_owned(),
        })
        .await
    }

    /// Records a row found for `key` after its answer was lost; durable when `Ok`.
    pub async fn claimed(&self, key: &str, guid: &str) -> Result<(), JournalError> {
        self.append(Line::Claimed {
            key: key.to_owned(),
            guid: guid.to_owned(),
        })
        .await
    }

    /// What the journal knows of `key`.
    pub fn attempt(&self, key: &str) -> Option<Attempt> {
        lock(&self.inner.book).attempts.get(key).cloned()
    }

    /// Whether `guid` was given to a send (answered or claimed).
    pub fn taken(&self, guid: &str) -> bool {
        lock(&self.inner.book).taken.contains(guid)
    }

    /// The attempts made at or after `since_ms` (to seed the echo cache after a restart).
    pub fn attempts_since(&self, since_ms: u64) -> Vec<Attempt> {
        let mut recent: Vec<Attempt> = lock(&self.inner.book)
            .attempts
            .values()
            .filter(|a| a.at_ms >= since_ms)
            .cloned()
            .collect();
        recent.sort_by_key(|a| a.at_ms);
        recent
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[tokio::test]
    async fn attempts_answers_and_claims_survive_a_reopen_and_old_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let now = 10 * RETENTION_MS;
        let journal = SendJournal::open(dir.path(), now).unwrap();
        assert_eq!(journal.attempt("k#0"), None);
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
        journal.answered("k#0", "G0").await.unwrap();
        journal
            .attempted("k#1", "iMessage;-;+1", "yo", "t1", now + 10)
            .await
            .unwrap();
        journal.claimed("k#1", "G1").await.unwrap();
        journal
            .attempted("old", "iMessage;-;+1", "yo", "t2", now - RETENTION_MS - 1)
            .await
            .unwrap();
        drop(journal);
        let again = SendJournal::open(dir.path(), now + 20).unwrap();
        assert_eq!(again.attempt("k#0").unwrap().guid.as_deref(), Some("G0"));
        assert_eq!(again.attempt("k#1").unwrap().guid.as_deref(), Some("G1"));
        assert!(again.taken("G0") && again.taken("G1") && !again.taken("G2"));
        assert_eq!(again.attempt("old"), None, "older than the retention");
        assert_eq!(again.attempts_since(now + 5).len(), 1);
    }
}
