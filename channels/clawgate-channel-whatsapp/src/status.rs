//! The evidence about the messages we sent: the one way WhatsApp lets a send whose answer was
//! lost be settled (platform-apis-wave2 §1.2). Every outbound message carries its unit key in
//! `biz_opaque_callback_data`, and Meta echoes it in every `statuses[]` entry of that message
//! (`sent`, `delivered`, `read`, `failed`) together with its `wamid`.
//!
//! The book is a file of its own in the channel's state directory, one JSON line per change of
//! a key's evidence (the last line of a key wins), holding three facts:
//!
//! - **attempted**: written and synced *before* the request goes out. A key without it was never
//!   sent by this account, so it reconciles as not sent (the engine may send it).
//! - **answered / accepted**: Graph answered with the `wamid`, or a `sent`, `delivered` or
//!   `read` status arrived. Statuses are synced before the webhook is answered 200, so one Meta
//!   saw answered is never lost to a crash, and one we did not answer is delivered again (Meta
//!   retries for up to 7 days).
//! - **failed codes**: from `failed` statuses; a message can be `delivered` on one device and
//!   `failed` on another, so a failure never proves a message absent.
//!
//! The file is compacted to one line per key when it is opened.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::warn;

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
#[error("the WhatsApp status book {path}: {source} (check the state directory is writable)")]
pub struct BookError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    by_key: Mutex<HashMap<String, StatusEvidence>>,
    file: Mutex<Option<std::fs::File>>,
}

/// The durable record of send evidence, shared by the adapter (attempts, answers) and the
/// webhook source (statuses).
#[derive(Debug, Clone)]
pub struct StatusBook {
    inner: Arc<Inner>,
}

/// The name of the book in the channel's state directory.
pub const BOOK_FILE: &str = "whatsapp-statuses.jsonl";

/// One status of a message we sent, as a webhook reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change<'a> {
    Attempted,
    Accepted(&'a str),
    Failed(&'a str, i64),
}

impl StatusBook {
    /// Opens (or creates) the book in `dir`, reading what earlier runs recorded, and compacts
    /// it to one line per key.
    pub fn open(dir: &Path) -> Result<StatusBook, BookError> {
        let path = dir.join(BOOK_FILE);
        let error = |source| BookError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(error)?;
        let mut by_key = HashMap::new();
        let mut lines = 0usize;
        if let Ok(file) = std::fs::File::open(&path) {
            for line in std::io::BufReader::new(file).lines() {
                let line = line.map_err(error)?;
                lines += 1;
                // A torn last line (a crash mid-write) was never acted on: a status is
                // answered 200 only after its line is synced, an attempt goes out only after.
                match serde_json::from_str::<StatusEvidence>(&line) {
                    Ok(evidence) => {
                        by_key.insert(evidence.key.clone(), evidence);
                    }
                    Err(e) if !line.trim().is_empty() => {
                        warn!(path = %path.display(), error = %e, "skipping an unreadable status line");
                    }
                    Err(_) => {}
                }
            }
        }
        if lines > by_key.len() {
            let compacted = path.with_extension("jsonl.tmp");
            let mut out = std::fs::File::create(&compacted).map_err(error)?;
            for evidence in by_key.values() {
                let mut line = serde_json::to_vec(evidence).unwrap_or_default();
                line.push(b'\n');
                out.write_all(&line).map_err(error)?;
            }
            out.sync_all().map_err(error)?;
            std::fs::rename(&compacted, &path).map_err(error)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(error)?;
        Ok(StatusBook {
            inner: Arc::new(Inner {
                path,
                by_key: Mutex::new(by_key),
                file: Mutex::new(Some(file)),
            }),
        })
    }

    /// What the book knows of `key`.
    pub fn get(&self, key: &str) -> Option<StatusEvidence> {
        lock(&self.inner.by_key).get(key).cloned()
    }

    /// Records a request of `key` about to go out; durable when this returns `Ok`.
    pub async fn attempted(&self, key: &str) -> Result<(), BookError> {
        self.change(key, Change::Attempted, true).await
    }

    /// Records Graph's answer to a send (`wamid`). Not synced: the status webhooks of the
    /// message settle it after a crash all the same.
    pub async fn answered(&self, key: &str, wamid: &str) -> Result<(), BookError> {
        self.change(key, Change::Accepted(wamid), false).await
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
        let change = match status {
            "sent" | "delivered" | "read" => Change::Accepted(wamid),
            "failed" => Change::Failed(wamid, failure.unwrap_or(-1)),
            _ => return Ok(()),
        };
        self.change(key, change, true).await
    }

    async fn change(&self, key: &str, change: Change<'_>, sync: bool) -> Result<(), BookError> {
        let line = {
            let mut by_key = lock(&self.inner.by_key);
            let entry = by_key
                .entry(key.to_owned())
                .or_insert_with(|| StatusEvidence {
                    key: key.to_owned(),
                    ..StatusEvidence::default()
                });
            let before = entry.clone();
            match change {
                Change::Attempted => entry.attempted = true,
                Change::Accepted(wamid) => {
                    entry.accepted = true;
                    entry.wamid = Some(wamid.to_owned());
                }
                Change::Failed(wamid, code) => {
                    entry.wamid.get_or_insert_with(|| wamid.to_owned());
                    if !entry.failed_codes.contains(&code) {
                        entry.failed_codes.push(code);
                    }
                }
            }
            if *entry == before {
                return Ok(());
            }
            let mut line = serde_json::to_vec(&*entry).unwrap_or_default();
            line.push(b'\n');
            line
        };
        let inner = self.inner.clone();
        let written = tokio::task::spawn_blocking(move || {
            let mut file = lock(&inner.file);
            let file = file
                .as_mut()
                .ok_or_else(|| std::io::Error::other("the book is closed"))?;
            file.write_all(&line)?;
            if sync { file.sync_data() } else { Ok(()) }
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        written.map_err(|source| BookError {
            path: self.inner.path.clone(),
            source,
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[tokio::test]
    async fn evidence_survives_a_reopen_and_failures_never_erase_acceptance() {
        let dir = tempfile::tempdir().unwrap();
        let book = StatusBook::open(dir.path()).unwrap();
        book.attempted("k#0").await.unwrap();
        book.status("k#0", "wamid.A", "failed", Some(131_026))
            .await
            .unwrap();
        assert!(!book.get("k#0").unwrap().accepted);
        book.status("k#0", "wamid.A", "delivered", None)
            .await
            .unwrap();
        book.status("k#0", "wamid.A", "read", None).await.unwrap();
        book.attempted("k#1").await.unwrap();
        book.answered("k#1", "wamid.B").await.unwrap();
        book.attempted("k#2").await.unwrap();
        // attempted, failed, delivered (read changes nothing), k#1 twice, k#2 once.
        let lines = std::fs::read_to_string(dir.path().join(BOOK_FILE)).unwrap();
        assert_eq!(lines.lines().count(), 6, "{lines}");
        drop(book);
        let again = StatusBook::open(dir.path()).unwrap();
        let first = again.get("k#0").unwrap();
        assert!(first.accepted && first.attempted);
        assert_eq!(first.failed_codes, vec![131_026]);
        assert_eq!(again.get("k#1").unwrap().wamid.as_deref(), Some("wamid.B"));
        let only_attempted = again.get("k#2").unwrap();
        assert!(only_attempted.attempted && !only_attempted.accepted);
        assert_eq!(again.get("k#3"), None);
        // Reopening compacted the file to one line per key.
        let lines = std::fs::read_to_string(dir.path().join(BOOK_FILE)).unwrap();
        assert_eq!(lines.lines().count(), 3, "{lines}");
    }
}
