//! The evidence about our sends: the one way a send whose answer was lost can be settled.
//! Zalo Web has no idempotency and no message lookup, but every send carries a `clientId` we
//! choose, and the listener pushes the account's own messages back (the frames zca-js emits
//! with `selfListen`) with that id as `cliMsgId` next to Zalo's `msgId`. So:
//!
//! - **attempt** (key, `clientId`, time): written and synced *before* the request goes out.
//!   A key without one was never sent: it reconciles as not sent. A retry of the same key
//!   (after a refusal) adds its own `clientId`.
//! - **answered** (key, `msgId`): Zalo's answer.
//! - **echo** (`cliMsgId`, `msgId`): our own message seen on the listener, for a `clientId`
//!   of an attempt; synced when seen.
//!
//! An attempt with neither an answer nor an echo stays unknown while its echo can still
//! come ([`SendBook::settle`] is given the window); after it, nothing can ever tell (no
//! catch-up after a disconnect, no lookup), and the send is undecidable: parked, never resent.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::warn;

/// The name of the book in the channel's state directory.
pub const BOOK_FILE: &str = "zalo-personal-sends.jsonl";

/// What the book says of one unit key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// No request of it ever went out.
    NeverSent,
    /// Zalo has it: its `msgId` (answered, or echoed on the listener).
    Landed(String),
    /// Sent at this time (ms), neither answered nor echoed yet.
    Pending {
        /// When its first attempt went out.
        at_ms: u64,
    },
}

/// Why the book could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("the Zalo Personal send book {path}: {source} (check the state directory is writable)")]
pub struct BookError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum Line {
    Attempt {
        key: String,
        client_id: u64,
        at_ms: u64,
    },
    Answered {
        key: String,
        msg_id: String,
    },
    Echo {
        client_id: u64,
        msg_id: String,
    },
}

#[derive(Debug, Default)]
struct Book {
    /// key → (first attempt time, Zalo's id once known).
    attempts: HashMap<String, (u64, Option<String>)>,
    /// clientId → key.
    clients: HashMap<u64, String>,
}

impl Book {
    fn apply(&mut self, line: Line) {
        match line {
            Line::Attempt {
                key,
                client_id,
                at_ms,
            } => {
                self.attempts.entry(key.clone()).or_insert((at_ms, None));
                self.clients.insert(client_id, key);
            }
            Line::Answered { key, msg_id } => {
                if let Some(attempt) = self.attempts.get_mut(&key) {
                    attempt.1 = Some(msg_id);
                }
            }
            Line::Echo { client_id, msg_id } => {
                if let Some(key) = self.clients.get(&client_id)
                    && let Some(attempt) = self.attempts.get_mut(key)
                    && attempt.1.is_none()
                {
                    attempt.1 = Some(msg_id);
                }
            }
        }
    }
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    book: Mutex<Book>,
    file: Mutex<std::fs::File>,
}

/// The durable record of send evidence, shared by the adapter (attempts, answers) and the
/// listener (echoes).
#[derive(Debug, Clone)]
pub struct SendBook {
    inner: Arc<Inner>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SendBook {
    /// Opens (or creates) the book in `dir`, reading what earlier runs recorded.
    pub fn open(dir: &Path) -> Result<SendBook, BookError> {
        let path = dir.join(BOOK_FILE);
        let error = |source| BookError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(error)?;
        let mut book = Book::default();
        if let Ok(file) = std::fs::File::open(&path) {
            for line in std::io::BufReader::new(file).lines() {
                let line = line.map_err(error)?;
                // A torn last line (a crash mid-write) was never acted on: nothing is sent
                // before its attempt line is synced.
                match serde_json::from_str::<Line>(&line) {
                    Ok(line) => book.apply(line),
                    Err(e) if !line.trim().is_empty() => {
                        warn!(path = %path.display(), error = %e, "skipping an unreadable send-book line");
                    }
                    Err(_) => {}
                }
            }
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(error)?;
        Ok(SendBook {
            inner: Arc::new(Inner {
                path,
                book: Mutex::new(book),
                file: Mutex::new(file),
            }),
        })
    }

    async fn append(&self, line: Line) -> Result<(), BookError> {
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
        written.map_err(|source| BookError {
            path: self.inner.path.clone(),
            source,
        })?;
        lock(&self.inner.book).apply(line);
        Ok(())
    }

    /// Records a request of `key` with `client_id` about to go out at `at_ms`; durable when
    /// this returns `Ok`.
    pub async fn attempted(&self, key: &str, client_id: u64, at_ms: u64) -> Result<(), BookError> {
        self.append(Line::Attempt {
            key: key.to_owned(),
            client_id,
            at_ms,
        })
        .await
    }

    /// Records Zalo's answer to a send.
    pub async fn answered(&self, key: &str, msg_id: &str) -> Result<(), BookError> {
        self.append(Line::Answered {
            key: key.to_owned(),
            msg_id: msg_id.to_owned(),
        })
        .await
    }

    /// Whether `client_id` is one of our attempts (an echo worth recording).
    pub fn is_ours(&self, client_id: u64) -> bool {
        lock(&self.inner.book).clients.contains_key(&client_id)
    }

    /// Records the echo of our message `client_id` (Zalo's `msg_id`); durable when this
    /// returns `Ok`. Echoes of ids we never used are not recorded.
    pub async fn echo(&self, client_id: u64, msg_id: &str) -> Result<(), BookError> {
        if !self.is_ours(client_id) {
            return Ok(());
        }
        self.append(Line::Echo {
            client_id,
            msg_id: msg_id.to_owned(),
        })
        .await
    }

    /// What the book knows of `key`.
    pub fn evidence(&self, key: &str) -> Evidence {
        match lock(&self.inner.book).attempts.get(key) {
            None => Evidence::NeverSent,
            Some((_, Some(msg_id))) => Evidence::Landed(msg_id.clone()),
            Some((at_ms, None)) => Evidence::Pending { at_ms: *at_ms },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[tokio::test]
    async fn echoes_settle_their_own_attempt_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let book = SendBook::open(dir.path()).unwrap();
        assert_eq!(book.evidence("k"), Evidence::NeverSent);
        book.attempted("k#0", 100, 1_000).await.unwrap();
        book.answered("k#0", "m0").await.unwrap();
        book.attempted("k#1", 101, 2_000).await.unwrap();
        book.attempted("k#1", 102, 3_000).await.unwrap();
        book.attempted("k#2", 103, 4_000).await.unwrap();
        // An echo of someone else's client id, then the retry's echo of k#1.
        book.echo(999, "mx").await.unwrap();
        book.echo(102, "m1").await.unwrap();
        assert_eq!(book.evidence("k#0"), Evidence::Landed("m0".into()));
        assert_eq!(book.evidence("k#1"), Evidence::Landed("m1".into()));
        assert_eq!(book.evidence("k#2"), Evidence::Pending { at_ms: 4_000 });
        drop(book);
        let again = SendBook::open(dir.path()).unwrap();
        assert_eq!(again.evidence("k#1"), Evidence::Landed("m1".into()));
        assert_eq!(again.evidence("k#2"), Evidence::Pending { at_ms: 4_000 });
        assert!(!again.is_ours(999));
    }
}
