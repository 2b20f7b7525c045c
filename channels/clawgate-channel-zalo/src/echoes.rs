//! The evidence about the messages we sent: the one way Zalo lets a send whose answer was
//! lost be settled (platform-apis-wave2 §9.1: no idempotency key, no message lookup). The OA
//! posts an `oa_send_text` webhook for every text the OA sends, carrying the recipient, the
//! text and Zalo's `msg_id`, but nothing of ours (no metadata field exists). So a send is
//! matched to its echo by **recipient, exact text and time**:
//!
//! - **attempt** (key, recipient, text, time): written and synced *before* the request goes
//!   out. A key without it was never sent by this account: it reconciles as not sent.
//! - **answered** (key, `message_id`): Zalo's answer. Synced, because its `msg_id` must never
//!   be handed to another send.
//! - **echo** (`msg_id`, recipient, text, time): synced before the webhook is answered 200, so
//!   one Zalo saw answered is never lost to a crash; one we did not answer is posted again.
//! - **claimed** (key, `msg_id`): an echo given to an unknown send, synced before the answer.
//!
//! An unknown send is `Sent` with the oldest echo to the same recipient with the same text,
//! stamped no earlier than [`CLOCK_SKEW_MS`] before the attempt, that no other send answered
//! or claimed. Two unknown sends of the same text to the same person each get one echo; the
//! limit is a lost answer racing the echo of an identical text whose own answer is still in
//! flight (the same person, the same words, the same seconds), which the gateway's one reply
//! per message makes unlikely; the README says so.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::warn;

/// The name of the book in the channel's state directory.
pub const BOOK_FILE: &str = "zalo-sends.jsonl";

/// How much earlier than our attempt Zalo's clock may stamp its echo.
pub const CLOCK_SKEW_MS: u64 = 60_000;

/// What the book knows about one unit key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendEvidence {
    /// A request of it was about to go out.
    pub attempted: bool,
    /// Zalo's `msg_id`: answered, or matched to an echo.
    pub msg_id: Option<String>,
}

/// Why the book could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("the Zalo send book {path}: {source} (check the state directory is writable)")]
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
        user_id: String,
        text: String,
        at_ms: u64,
    },
    Answered {
        key: String,
        msg_id: String,
    },
    Echo {
        msg_id: String,
        user_id: String,
        text: String,
        at_ms: u64,
    },
    Claimed {
        key: String,
        msg_id: String,
    },
}

#[derive(Debug, Clone)]
struct Attempt {
    user_id: String,
    text: String,
    at_ms: u64,
    msg_id: Option<String>,
}

#[derive(Debug, Clone)]
struct Echo {
    msg_id: String,
    user_id: String,
    text: String,
    at_ms: u64,
}

#[derive(Debug, Default)]
struct Book {
    attempts: HashMap<String, Attempt>,
    echoes: Vec<Echo>,
    /// `msg_id`s given to a send (answered or claimed).
    taken: HashSet<String>,
}

impl Book {
    fn apply(&mut self, line: Line) {
        match line {
            Line::Attempt {
                key,
                user_id,
                text,
                at_ms,
            } => {
                // A retry of the same key keeps the first attempt's time: an echo of any of
                // its attempts is its echo.
                self.attempts.entry(key).or_insert(Attempt {
                    user_id,
                    text,
                    at_ms,
                    msg_id: None,
                });
            }
            Line::Answered { key, msg_id } | Line::Claimed { key, msg_id } => {
                self.taken.insert(msg_id.clone());
                if let Some(attempt) = self.attempts.get_mut(&key) {
                    attempt.msg_id = Some(msg_id);
                }
            }
            Line::Echo {
                msg_id,
                user_id,
                text,
                at_ms,
            } => {
                if !self.echoes.iter().any(|e| e.msg_id == msg_id) {
                    self.echoes.push(Echo {
                        msg_id,
                        user_id,
                        text,
                        at_ms,
                    });
                }
            }
        }
    }

    fn matching_echo(&self, attempt: &Attempt) -> Option<String> {
        self.echoes
            .iter()
            .filter(|e| {
                e.user_id == attempt.user_id
                    && e.text == attempt.text
                    && e.at_ms.saturating_add(CLOCK_SKEW_MS) >= attempt.at_ms
                    && !self.taken.contains(&e.msg_id)
            })
            .min_by_key(|e| e.at_ms)
            .map(|e| e.msg_id.clone())
    }
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    book: Mutex<Book>,
    file: Mutex<std::fs::File>,
}

/// The durable record of send evidence, shared by the adapter (attempts, answers) and the
/// webhook source (echoes).
#[derive(Debug, Clone)]
pub struct EchoBook {
    inner: Arc<Inner>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl EchoBook {
    /// Opens (or creates) the book in `dir`, reading what earlier runs recorded.
    pub fn open(dir: &Path) -> Result<EchoBook, BookError> {
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
                // A torn last line (a crash mid-write) was never acted on: nothing is sent or
                // answered before its line is synced.
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
        Ok(EchoBook {
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

    /// Records a request of `key` (to `user_id`, saying `text`) about to go out at `at_ms`;
    /// durable when this returns `Ok`.
    pub async fn attempted(
        &self,
        key: &str,
        user_id: &str,
        text: &str,
        at_ms: u64,
    ) -> Result<(), BookError> {
        if lock(&self.inner.book).attempts.contains_key(key) {
            return Ok(());
        }
        self.append(Line::Attempt {
            key: key.to_owned(),
            user_id: user_id.to_owned(),
            text: text.to_owned(),
            at_ms,
        })
        .await
    }

    /// Records Zalo's answer to a send.
    pub async fn answered(&self, key: &str, msg_id: &str) -> Result<(), BookError> {
        if lock(&self.inner.book).taken.contains(msg_id) {
            warn!(
                key,
                msg_id, "an answered msg_id was already given to another send"
            );
        }
        self.append(Line::Answered {
            key: key.to_owned(),
            msg_id: msg_id.to_owned(),
        })
        .await
    }

    /// Records an `oa_send_text` echo; durable when this returns `Ok`.
    pub async fn echo(
        &self,
        msg_id: &str,
        user_id: &str,
        text: &str,
        at_ms: u64,
    ) -> Result<(), BookError> {
        if lock(&self.inner.book)
            .echoes
            .iter()
            .any(|e| e.msg_id == msg_id)
        {
            return Ok(());
        }
        self.append(Line::Echo {
            msg_id: msg_id.to_owned(),
            user_id: user_id.to_owned(),
            text: text.to_owned(),
            at_ms,
        })
        .await
    }

    /// What the book knows of `key`, matching (and durably claiming) an echo for an attempt
    /// that has no `msg_id` yet.
    pub async fn settle(&self, key: &str) -> Result<Option<SendEvidence>, BookError> {
        let claim = {
            let book = lock(&self.inner.book);
            let Some(attempt) = book.attempts.get(key) else {
                return Ok(None);
            };
            if let Some(msg_id) = &attempt.msg_id {
                return Ok(Some(SendEvidence {
                    attempted: true,
                    msg_id: Some(msg_id.clone()),
                }));
            }
            book.matching_echo(attempt)
        };
        let Some(msg_id) = claim else {
            return Ok(Some(SendEvidence {
                attempted: true,
                msg_id: None,
            }));
        };
        self.append(Line::Claimed {
            key: key.to_owned(),
            msg_id: msg_id.clone(),
        })
        .await?;
        Ok(Some(SendEvidence {
            attempted: true,
            msg_id: Some(msg_id),
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[tokio::test]
    async fn echoes_settle_unknown_sends_once_each_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let book = EchoBook::open(dir.path()).unwrap();
        assert_eq!(book.settle("never").await.unwrap(), None);
        // k#0 answered normally; k#1 and k#2 (the same text to the same person) lost answers.
        book.attempted("k#0", "u1", "hi", 1_000_000).await.unwrap();
        book.answered("k#0", "m0").await.unwrap();
        book.attempted("k#1", "u1", "hi", 1_000_100).await.unwrap();
        book.attempted("k#2", "u1", "hi", 1_000_200).await.unwrap();
        book.attempted("k#3", "u2", "other", 1_000_300)
            .await
            .unwrap();
        // Echoes: k#0's, a text to someone else, one far too old, then k#1's and k#2's.
        book.echo("m0", "u1", "hi", 1_000_050).await.unwrap();
        book.echo("mx", "u2", "hi", 1_000_150).await.unwrap();
        book.echo("mold", "u1", "hi", 1_000_100 - CLOCK_SKEW_MS - 1)
            .await
            .unwrap();
        book.echo("m1", "u1", "hi", 1_000_150).await.unwrap();
        book.echo("m1", "u1", "hi", 1_000_150).await.unwrap();
        let first = book.settle("k#1").await.unwrap().unwrap();
        assert_eq!(first.msg_id.as_deref(), Some("m1"));
        // The only other matching echo is taken: k#2 stays unknown until its own arrives.
        assert_eq!(book.settle("k#2").await.unwrap().unwrap().msg_id, None);
        assert_eq!(book.settle("k#3").await.unwrap().unwrap().msg_id, None);
        book.echo("m2", "u1", "hi", 1_000_250).await.unwrap();
        drop(book);
        let again = EchoBook::open(dir.path()).unwrap();
        assert_eq!(
            again
                .settle("k#1")
                .await
                .unwrap()
                .unwrap()
                .msg_id
                .as_deref(),
            Some("m1")
        );
        assert_eq!(
            again
                .settle("k#0")
                .await
                .unwrap()
                .unwrap()
                .msg_id
                .as_deref(),
            Some("m0")
        );
        assert_eq!(
            again
                .settle("k#2")
                .await
                .unwrap()
                .unwrap()
                .msg_id
                .as_deref(),
            Some("m2")
        );
    }
}
