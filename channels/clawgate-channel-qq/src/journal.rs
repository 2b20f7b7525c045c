//! The active-message journal: every active message (one without `msg_id`) is written here,
//! synced, before it is sent, and its message id after QQ answered.
//!
//! Active messages are what QQ does not deduplicate: a lost answer cannot be settled by sending
//! again. The journal tells a unit that never went out actively (no entry: its passive
//! resend is safe) from one that may have (an entry without an id: parked), and counts the
//! active messages of each user or group in the current calendar month (UTC) against the
//! configured quota. Attempts whose answer was lost count too: they may have landed.
//!
//! It also keeps, not counted: the ids QQ answered passive replies with (best effort), so a
//! later check of such a unit names its message rather than the id-less dedupe receipt; and,
//! synced before the send, the inbound message a passive reply answers when that was chosen at
//! send time from the chat's latest message (which a restart forgets), so every attempt of the
//! unit repeats the same `(msg_id, msg_seq)` pair.
//!
//! The file is JSON lines (`active-sends.jsonl` in the channel's state directory), appended
//! and synced per record; a torn last line (a crash mid-write) is skipped on load.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// The journal's file name in the channel's state directory.
pub const JOURNAL_FILE: &str = "active-sends.jsonl";

/// A journal operation failed.
#[derive(Debug, thiserror::Error)]
#[error("the QQ active-message journal {path} cannot be {what}: {source}")]
pub struct JournalError {
    path: PathBuf,
    what: &'static str,
    #[source]
    source: std::io::Error,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    key: String,
    target: String,
    /// `YYYY-MM` of the attempt (UTC).
    month: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    /// A passive reply's answer or chosen target (not an active attempt; never counted).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    passive: bool,
    /// The inbound message a passive reply answers, when it was chosen at send time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reply_to: Option<String>,
}

/// What the journal knows of one unit key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActiveAttempt {
    /// Sent actively and answered with this message id.
    Answered(String),
    /// Sent actively; no answer was recorded (it may have landed).
    Unanswered,
}

#[derive(Default)]
struct State {
    attempts: HashMap<String, Record>,
    /// Unit key → the id QQ answered a passive reply with.
    passive: HashMap<String, String>,
    /// Unit key → the inbound message chosen for it at send time.
    chosen: HashMap<String, String>,
    /// (target, month) → attempts.
    counts: HashMap<(String, String), u32>,
}

/// The journal (cheap to clone; one file per channel).
#[derive(Clone)]
pub struct ActiveJournal {
    path: PathBuf,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for ActiveJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveJournal")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// `YYYY-MM` (UTC) of `ms` since the epoch.
pub(crate) fn month_of(ms: u64) -> String {
    // Civil-from-days (Howard Hinnant's algorithm), valid for every date after 1970.
    let days = i64::try_from(ms / 86_400_000).unwrap_or(0);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}")
}

impl ActiveJournal {
    /// Opens (or creates) the journal in `dir`.
    pub fn open(dir: &Path) -> Result<ActiveJournal, JournalError> {
        let path = dir.join(JOURNAL_FILE);
        let mut state = State::default();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                if !text.is_empty() && !text.ends_with('\n') {
                    // A torn last line (a crash mid-write): later records start on a line of
                    // their own.
                    use std::io::Write;
                    let mut file = std::fs::OpenOptions::new()
                        .append(true)
                        .open(&path)
                        .and_then(|mut f| f.write_all(b"\n").and_then(|()| f.sync_data()));
                    if let Err(source) = file.as_mut() {
                        return Err(JournalError {
                            path,
                            what: "repaired",
                            source: std::io::Error::new(source.kind(), source.to_string()),
                        });
                    }
                }
                for line in text.lines() {
                    if let Ok(record) = serde_json::from_str::<Record>(line) {
                        state.apply(record);
                    }
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(JournalError {
                    path,
                    what: "read",
                    source,
                });
            }
        }
        Ok(ActiveJournal {
            path,
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// What the journal holds for `key`.
    pub async fn attempt(&self, key: &str) -> Option<ActiveAttempt> {
        let state = self.state.lock().await;
        state.attempts.get(key).map(|r| match &r.id {
            Some(id) => ActiveAttempt::Answered(id.clone()),
            None => ActiveAttempt::Unanswered,
        })
    }

    /// Active messages to `target` in the month of `now_ms`.
    pub async fn used(&self, target: &str, now_ms: u64) -> u32 {
        let state = self.state.lock().await;
        state
            .counts
            .get(&(target.to_owned(), month_of(now_ms)))
            .copied()
            .unwrap_or(0)
    }

    /// Records an active attempt of `key` to `target`, unless it would be attempt number
    /// `quota + 1` of this month: `Ok(false)` then, nothing written. Durable on `Ok(true)`.
    pub async fn reserve(
        &self,
        key: &str,
        target: &str,
        now_ms: u64,
        quota: u32,
    ) -> Result<bool, JournalError> {
        let mut state = self.state.lock().await;
        let month = month_of(now_ms);
        if state.attempts.contains_key(key) {
            return Ok(true);
        }
        let used = state
            .counts
            .get(&(target.to_owned(), month.clone()))
            .copied()
            .unwrap_or(0);
        if used >= quota {
            return Ok(false);
        }
        let record = Record {
            key: key.to_owned(),
            target: target.to_owned(),
            month,
            id: None,
            passive: false,
            reply_to: None,
        };
        self.append(&record).await?;
        state.apply(record);
        Ok(true)
    }

    /// Records the message id QQ answered for `key`'s active send.
    pub async fn answered(&self, key: &str, id: &str) -> Result<(), JournalError> {
        let mut state = self.state.lock().await;
        let Some(mut record) = state.attempts.get(key).cloned() else {
            return Ok(());
        };
        record.id = Some(id.to_owned());
        self.append(&record).await?;
        state.apply(record);
        Ok(())
    }

    /// Records the id QQ answered a passive reply of `key` with: a later check of that unit
    /// names the message rather than the id-less `<msg_id>:<msg_seq>` receipt. Best effort
    /// (the dedupe settles the unit without it).
    pub async fn answered_passive(
        &self,
        key: &str,
        target: &str,
        id: &str,
    ) -> Result<(), JournalError> {
        let mut state = self.state.lock().await;
        let record = Record {
            key: key.to_owned(),
            target: target.to_owned(),
            month: String::new(),
            id: Some(id.to_owned()),
            passive: true,
            reply_to: None,
        };
        self.append(&record).await?;
        state.apply(record);
        Ok(())
    }

    /// Records, synced, that `key` answers `msg_id`: a target chosen at send time (the latest
    /// message of the chat, which a restart forgets) must be the same on every attempt.
    pub async fn chose(&self, key: &str, msg_id: &str) -> Result<(), JournalError> {
        let mut state = self.state.lock().await;
        if state.chosen.contains_key(key) {
            return Ok(());
        }
        let record = Record {
            key: key.to_owned(),
            target: String::new(),
            month: String::new(),
            id: None,
            passive: true,
            reply_to: Some(msg_id.to_owned()),
        };
        self.append(&record).await?;
        state.apply(record);
        Ok(())
    }

    /// The inbound message chosen for `key` at send time, if any.
    pub async fn chosen(&self, key: &str) -> Option<String> {
        self.state.lock().await.chosen.get(key).cloned()
    }

    /// The id QQ answered `key`'s passive reply with, when it was recorded.
    pub async fn passive_id(&self, key: &str) -> Option<String> {
        self.state.lock().await.passive.get(key).cloned()
    }

    async fn append(&self, record: &Record) -> Result<(), JournalError> {
        let error = |what, source| JournalError {
            path: self.path.clone(),
            what,
            source,
        };
        let mut line = serde_json::to_vec(record).unwrap_or_default();
        line.push(b'\n');
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .await
            .map_err(|e| error("opened", e))?;
        file.write_all(&line)
            .await
            .map_err(|e| error("written", e))?;
        file.sync_data().await.map_err(|e| error("synced", e))
    }
}

impl State {
    fn apply(&mut self, record: Record) {
        if record.passive {
            if let Some(reply_to) = record.reply_to {
                self.chosen.insert(record.key.clone(), reply_to);
            }
            if let Some(id) = record.id {
                self.passive.insert(record.key, id);
            }
            return;
        }
        if !self.attempts.contains_key(&record.key) {
            *self
                .counts
                .entry((record.target.clone(), record.month.clone()))
                .or_default() += 1;
        }
        self.attempts.insert(record.key.clone(), record);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn months_are_civil_utc_months() {
        assert_eq!(month_of(0), "1970-01");
        // 2026-12-02T17:00:00Z and 2024-02-29T23:59:59Z.
        assert_eq!(month_of(1_796_230_800_000), "2026-12");
        assert_eq!(month_of(1_709_251_199_000), "2024-02");
        assert_eq!(month_of(1_709_251_200_000), "2024-03");
    }

    #[tokio::test]
    async fn the_quota_counts_attempts_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let journal = ActiveJournal::open(dir.path()).unwrap();
        let now = 1_796_230_800_000;
        assert!(journal.reserve("k1", "U", now, 2).await.unwrap());
        assert!(
            journal.reserve("k1", "U", now, 2).await.unwrap(),
            "same key again"
        );
        assert!(journal.reserve("k2", "U", now, 2).await.unwrap());
        assert!(
            !journal.reserve("k3", "U", now, 2).await.unwrap(),
            "over quota"
        );
        assert!(
            journal.reserve("k3", "G", now, 2).await.unwrap(),
            "another target"
        );
        journal.answered("k1", "M1").await.unwrap();
        journal.answered_passive("p1", "U", "P1").await.unwrap();
        journal.chose("p2", "IN1").await.unwrap();
        journal.chose("p2", "IN2").await.unwrap();
        // A torn last line is skipped.
        let path = dir.path().join(JOURNAL_FILE);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"key\":\"k9\",\"tar");
        std::fs::write(&path, text).unwrap();
        let again = ActiveJournal::open(dir.path()).unwrap();
        assert_eq!(
            again.attempt("k1").await,
            Some(ActiveAttempt::Answered("M1".into()))
        );
        assert_eq!(again.attempt("k2").await, Some(ActiveAttempt::Unanswered));
        assert_eq!(again.attempt("k3-none").await, None);
        assert_eq!(
            again.used("U", now).await,
            2,
            "passive answers are not counted"
        );
        assert_eq!(again.passive_id("p1").await.as_deref(), Some("P1"));
        assert_eq!(again.attempt("p1").await, None);
        assert_eq!(
            again.chosen("p2").await.as_deref(),
            Some("IN1"),
            "the first choice stays"
        );
        assert_eq!(
            again.used("U", now + 40 * 86_400_000).await,
            0,
            "next month"
        );
    }
}
