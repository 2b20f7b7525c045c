//! User mode's attempt journal: before a chat message goes out, its `referenceId`, conversation
//! and the time are appended (and synced) to `<state dir>/talk-attempts.jsonl`. It is what makes
//! a lost answer decidable: a unit with no entry never left (the entry is written before any
//! request), and a unit with one was sent no earlier than that time, so history older than it
//! (less a clock slack) proves absence.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// One attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// When the first attempt began (ms since the epoch, this machine's clock).
    pub(crate) at_ms: i64,
}

#[derive(Serialize, Deserialize)]
struct Line {
    #[serde(rename = "ref")]
    reference: String,
    token: String,
    at: i64,
}

/// Entries older than this are dropped when the journal is opened.
const KEEP_MS: i64 = 14 * 24 * 3_600_000;

/// The journal file and its entries.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    entries: Mutex<HashMap<String, Attempt>>,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Journal {
    /// Opens (and compacts) the journal in `dir`.
    pub(crate) fn open(dir: &std::path::Path) -> std::io::Result<Journal> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("talk-attempts.jsonl");
        let mut entries = HashMap::new();
        let mut kept = Vec::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            let horizon = now_ms() - KEEP_MS;
            // A torn last line (a crash mid-append) is skipped: its request never started.
            for line in text
                .lines()
                .filter_map(|l| serde_json::from_str::<Line>(l).ok())
            {
                if line.at >= horizon {
                    entries
                        .entry(line.reference.clone())
                        .or_insert(Attempt { at_ms: line.at });
                    kept.push(line);
                }
            }
        }
        let tmp = dir.join("talk-attempts.jsonl.tmp");
        {
            let mut file = std::fs::File::create(&tmp)?;
            for line in &kept {
                serde_json::to_writer(&mut file, line)?;
                file.write_all(b"\n")?;
            }
            file.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        Ok(Journal {
            path,
            entries: Mutex::new(entries),
        })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Attempt>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The first attempt of `reference`, if one was journaled.
    pub(crate) fn get(&self, reference: &str) -> Option<Attempt> {
        self.entries().get(reference).copied()
    }

    /// Journals an attempt of `reference` in `token` (durably) unless one is already there.
    pub(crate) async fn record(&self, reference: &str, token: &str) -> std::io::Result<()> {
        if self.get(reference).is_some() {
            return Ok(());
        }
        let at = now_ms();
        let mut line = serde_json::to_vec(&Line {
            reference: reference.to_owned(),
            token: token.to_owned(),
            at,
        })?;
        line.push(b'\n');
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            file.write_all(&line)?;
            file.sync_data()
        })
        .await
        .map_err(std::io::Error::other)??;
        self.entries()
            .entry(reference.to_owned())
            .or_insert(Attempt { at_ms: at });
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[tokio::test]
    async fn attempts_survive_a_reopen_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        journal.record("r1", "tok").await.unwrap();
        let first = journal.get("r1").unwrap();
        journal.record("r1", "tok").await.unwrap();
        assert_eq!(
            journal.get("r1"),
            Some(first),
            "the first attempt's time is kept"
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("talk-attempts.jsonl"))
            .unwrap()
            .write_all(b"{\"ref\":\"r2\",\"tok")
            .unwrap();
        let reopened = Journal::open(dir.path()).unwrap();
        assert_eq!(reopened.get("r1"), Some(first));
        assert_eq!(reopened.get("r2"), None);
    }
}
