//! What the status webhooks said about the messages we sent: the one way WhatsApp lets a send
//! whose answer was lost be settled (platform-apis-wave2 §1.2). Every outbound message carries
//! its unit key in `biz_opaque_callback_data`, and Meta echoes it in every `statuses[]` entry
//! of that message (`sent`, `delivered`, `read`, `failed`) together with its `wamid`.
//!
//! The book is a file of its own in the channel's state directory, one JSON line per key
//! (written again only when a key's evidence changes), synced before the webhook is answered:
//! a status Meta saw answered 200 is never lost to a crash, and one we did not answer is
//! delivered again (Meta retries for up to 7 days).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tracing::warn;

/// What one key's status webhooks proved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusEvidence {
    /// The unit key (`biz_opaque_callback_data`).
    pub key: String,
    /// The message's `wamid`.
    pub wamid: String,
    /// `sent`, `delivered` or `read` arrived: WhatsApp has the message.
    pub accepted: bool,
    /// The error codes of `failed` statuses (a message can be `delivered` and `failed` on
    /// different devices, so a failure alone never proves it absent).
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

/// The durable record of status evidence, shared by the webhook source (which writes it) and
/// the adapter (which reconciles from it).
#[derive(Debug, Clone)]
pub struct StatusBook {
    inner: Arc<Inner>,
}

/// The name of the book in the channel's state directory.
pub const BOOK_FILE: &str = "whatsapp-statuses.jsonl";

impl StatusBook {
    /// Opens (or creates) the book in `dir`, reading what earlier runs recorded.
    pub fn open(dir: &Path) -> Result<StatusBook, BookError> {
        let path = dir.join(BOOK_FILE);
        let error = |source| BookError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(error)?;
        let mut by_key = HashMap::new();
        if let Ok(file) = std::fs::File::open(&path) {
            for line in std::io::BufReader::new(file).lines() {
                let line = line.map_err(error)?;
                // A torn last line (a crash mid-write) was never answered 200: Meta resends it.
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

    /// Records one status of a message we sent; durable when this returns `Ok`. `failure` is
    /// the error code of a `failed` status.
    pub async fn record(
        &self,
        key: &str,
        wamid: &str,
        status: &str,
        failure: Option<i64>,
    ) -> Result<(), BookError> {
        let line = {
            let mut by_key = lock(&self.inner.by_key);
            let entry = by_key
                .entry(key.to_owned())
                .or_insert_with(|| StatusEvidence {
                    key: key.to_owned(),
                    wamid: wamid.to_owned(),
                    accepted: false,
                    failed_codes: Vec::new(),
                });
            let before = entry.clone();
            match status {
                "sent" | "delivered" | "read" => entry.accepted = true,
                "failed" => {
                    let code = failure.unwrap_or(-1);
                    if !entry.failed_codes.contains(&code) {
                        entry.failed_codes.push(code);
                    }
                }
                _ => {}
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
            file.sync_data()
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
mod tests {
    use super::*;

    #[tokio::test]
    async fn evidence_survives_a_reopen_and_failures_never_erase_acceptance() {
        let dir = tempfile::tempdir().unwrap();
        let book = StatusBook::open(dir.path()).unwrap();
        book.record("k#0", "wamid.A", "failed", Some(131_026))
            .await
            .unwrap();
        assert!(!book.get("k#0").unwrap().accepted);
        book.record("k#0", "wamid.A", "delivered", None).await.unwrap();
        book.record("k#0", "wamid.A", "read", None).await.unwrap();
        book.record("k#1", "wamid.B", "sent", None).await.unwrap();
        drop(book);
        let again = StatusBook::open(dir.path()).unwrap();
        let first = again.get("k#0").unwrap();
        assert!(first.accepted);
        assert_eq!(first.failed_codes, vec![131_026]);
        assert_eq!(again.get("k#1").unwrap().wamid, "wamid.B");
        assert_eq!(again.get("k#2"), None);
        // One line per change of evidence, not one per status.
        let lines = std::fs::read_to_string(dir.path().join(BOOK_FILE)).unwrap();
        assert_eq!(lines.lines().count(), 3, "{lines}");
    }
}
