//! The active-message journal, in the gateway's store: every active message (one without
//! `msg_id`) is recorded, durably, before it is sent, and its message id after QQ answered.
//!
//! Active messages are what QQ does not deduplicate: a lost answer cannot be settled by sending
//! again. The journal tells a unit that never went out actively (no entry: its passive
//! resend is safe) from one that may have (an entry without an id: parked), and counts the
//! active messages of each user or group in the current calendar month (UTC) against the
//! configured quota. Attempts whose answer was lost count too: they may have landed.
//!
//! It also keeps, not counted: the ids QQ answered passive replies with (best effort), so a
//! later check of such a unit names its message rather than the id-less dedupe receipt; and,
//! durable before the send, the inbound message a passive reply answers when that was chosen
//! at send time from the chat's latest message (which a restart forgets), so every attempt of
//! the unit repeats the same `(msg_id, msg_seq)` pair.
//!
//! Two books of the account's [`ChannelState`], read from the store when they decide something,
//! since another gateway on the same store may have written them:
//!
//! - `active-sends`, by unit key: `attempt:<key>` (target, month, quota slot), `answered:<key>`
//!   (the active message's id), `passive:<key>` (a passive reply's id), `chosen:<key>` (the
//!   inbound message chosen at send time).
//! - `active-quota`: one record per counted attempt, `<month>/<target>/<n>` naming the unit, n
//!   below the quota. A slot is claimed by appending it, and an append of a key already there
//!   changes nothing, so two gateways sending to one chat at once cannot both take the last one.
//!
//! An earlier release kept all of it in `active-sends.jsonl` in the state directory; it is
//! imported once ([`ActiveJournal::import_legacy`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::state::{Book, ChannelState, LegacyFiles, StateError};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

/// The file an earlier release kept the journal in (in the gateway's state directory), read
/// once by [`ActiveJournal::import_legacy`].
pub const JOURNAL_FILE: &str = "active-sends.jsonl";

/// The book of attempts, answers and chosen reply targets, by unit key.
const SENDS_BOOK: &str = "active-sends";
/// The book of counted active attempts, one slot each.
const QUOTA_BOOK: &str = "active-quota";

/// Records older than this are pruned at start: a quota counts one calendar month, and an
/// unknown send is settled (or parked for an operator) long before three months pass.
const KEEP_FOR: Duration = Duration::from_secs(93 * 24 * 3_600);
/// At most this many records per book are kept (the newest): a bound for a busy bot, far above
/// what one month of replies and quota slots writes.
const KEEP_NEWEST: u64 = 200_000;

/// A journal operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The store could not be read or written.
    #[error("the QQ active-message journal could not be {what}: {source}")]
    State {
        /// What was being done.
        what: &'static str,
        /// The store's error.
        #[source]
        source: StateError,
    },
    /// The journal file of an earlier release could not be imported.
    #[error(
        "the QQ active-message journal of an earlier release ({JOURNAL_FILE} in the state \
         directory) could not be {what}: {source}; make it readable (or move it aside to give \
         up its records) and start again"
    )]
    Legacy {
        /// What was being done.
        what: &'static str,
        /// The file system's error.
        #[source]
        source: std::io::Error,
    },
}

fn state_error(what: &'static str) -> impl FnOnce(StateError) -> JournalError {
    move |source| JournalError::State { what, source }
}

/// What the journal knows of one unit key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActiveAttempt {
    /// Sent actively and answered with this message id.
    Answered(String),
    /// Sent actively; no answer was recorded (it may have landed).
    Unanswered,
}

/// `attempt:<key>`: the unit was (or is about to be) sent actively.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Attempt {
    target: String,
    /// `YYYY-MM` of the attempt (UTC).
    month: String,
    /// Its slot in the `active-quota` book.
    slot: u32,
}

/// `answered:<key>` / `passive:<key>`: the id QQ answered with.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Answer {
    id: String,
}

/// `chosen:<key>`: the inbound message a passive reply answers, chosen at send time.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Chosen {
    #[serde(rename = "msgId")]
    msg_id: String,
}

/// A counted attempt in the `active-quota` book.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Slot {
    key: String,
}

/// A line of the earlier release's `active-sends.jsonl`.
#[derive(Debug, Deserialize)]
struct LegacyRecord {
    key: String,
    target: String,
    month: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    passive: bool,
    #[serde(default)]
    reply_to: Option<String>,
}

/// The slots of the quota book this process has read (a cache: a slot's append decides).
#[derive(Debug, Default)]
struct QuotaCache {
    /// The last quota record read.
    seen: i64,
    /// (target, month) → slot → unit key.
    slots: HashMap<(String, String), BTreeMap<u32, String>>,
}

/// The journal (cheap to clone; one per account).
#[derive(Clone)]
pub struct ActiveJournal {
    sends: Book,
    quota: Book,
    cache: Arc<Mutex<QuotaCache>>,
}

impl std::fmt::Debug for ActiveJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveJournal")
            .field("sends", &self.sends)
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

fn month_at(now_ms: i64) -> String {
    month_of(u64::try_from(now_ms).unwrap_or(0))
}

fn slot_key(month: &str, target: &str, n: u32) -> String {
    format!("{month}/{target}/{n}")
}

/// (month, target, n) of a slot key.
fn parse_slot_key(key: &str) -> Option<(String, String, u32)> {
    let (rest, n) = key.rsplit_once('/')?;
    let (month, target) = rest.split_once('/')?;
    Some((month.to_owned(), target.to_owned(), n.parse().ok()?))
}

impl ActiveJournal {
    /// The journal of the account whose state is `state`; prunes what is too old to matter.
    pub async fn open(state: &ChannelState) -> Result<ActiveJournal, JournalError> {
        let journal = ActiveJournal {
            sends: state.book(SENDS_BOOK),
            quota: state.book(QUOTA_BOOK),
            cache: Arc::new(Mutex::new(QuotaCache::default())),
        };
        for book in [&journal.sends, &journal.quota] {
            book.prune(KEEP_FOR, KEEP_NEWEST)
                .await
                .map_err(state_error("pruned"))?;
        }
        Ok(journal)
    }

    /// Imports the `active-sends.jsonl` an earlier release wrote, then sets it aside; returns
    /// how many of its records were read. Repeatable: a crash before the file is set aside
    /// imports it again and adds nothing (every record is keyed by its unit; an attempt keeps
    /// the quota slot it was given the first time).
    pub async fn import_legacy(&self, legacy: &LegacyFiles) -> Result<usize, JournalError> {
        let legacy_error = |what| move |source| JournalError::Legacy { what, source };
        let Some(bytes) = legacy.read(JOURNAL_FILE).map_err(legacy_error("read"))? else {
            return Ok(0);
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut read = 0;
        // A torn last line (a crash mid-write) does not parse and is skipped, as the earlier
        // release skipped it.
        for record in text
            .lines()
            .filter_map(|line| serde_json::from_str::<LegacyRecord>(line).ok())
        {
            read += 1;
            if record.passive {
                if let Some(msg_id) = &record.reply_to {
                    self.chose(&record.key, msg_id).await?;
                }
                if let Some(id) = &record.id {
                    self.answered_passive(&record.key, id).await?;
                }
                continue;
            }
            // Every attempt of the file counts, whatever the quota is now: it was made.
            self.reserve_in(&record.key, &record.target, &record.month, u32::MAX)
                .await?;
            if let Some(id) = &record.id {
                self.answered(&record.key, id).await?;
            }
        }
        legacy
            .retire(JOURNAL_FILE)
            .map_err(legacy_error("set aside"))?;
        Ok(read)
    }

    /// What the journal holds for `key` (read from the store: another gateway may have sent
    /// it).
    pub async fn attempt(&self, key: &str) -> Result<Option<ActiveAttempt>, JournalError> {
        let what = "read";
        if self
            .sends
            .find::<Attempt>(&format!("attempt:{key}"))
            .await
            .map_err(state_error(what))?
            .is_none()
        {
            return Ok(None);
        }
        let answer = self
            .sends
            .find::<Answer>(&format!("answered:{key}"))
            .await
            .map_err(state_error(what))?;
        Ok(Some(match answer {
            Some(record) => ActiveAttempt::Answered(record.value.id),
            None => ActiveAttempt::Unanswered,
        }))
    }

    /// Active messages to `target` in the month of `now_ms`, by every gateway on the store.
    pub async fn used(&self, target: &str, now_ms: i64) -> Result<u32, JournalError> {
        let mut cache = self.cache.lock().await;
        self.catch_up(&mut cache).await?;
        let count = cache
            .slots
            .get(&(target.to_owned(), month_at(now_ms)))
            .map_or(0, BTreeMap::len);
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    /// Records an active attempt of `key` to `target`, unless it would be attempt number
    /// `quota + 1` of this month (counting every gateway's): `Ok(false)` then, nothing written.
    /// Durable on `Ok(true)`.
    pub async fn reserve(
        &self,
        key: &str,
        target: &str,
        now_ms: i64,
        quota: u32,
    ) -> Result<bool, JournalError> {
        let month = month_at(now_ms);
        // Only this month's slots count from now on: the cache forgets earlier ones.
        self.cache
            .lock()
            .await
            .slots
            .retain(|(_, slot_month), _| *slot_month >= month);
        self.reserve_in(key, target, &month, quota).await
    }

    async fn reserve_in(
        &self,
        key: &str,
        target: &str,
        month: &str,
        quota: u32,
    ) -> Result<bool, JournalError> {
        let attempt_key = format!("attempt:{key}");
        if self
            .sends
            .find::<Attempt>(&attempt_key)
            .await
            .map_err(state_error("read"))?
            .is_some()
        {
            return Ok(true);
        }
        let Some(slot) = self.claim(key, target, month, quota).await? else {
            return Ok(false);
        };
        let attempt = Attempt {
            target: target.to_owned(),
            month: month.to_owned(),
            slot,
        };
        self.sends
            .append(&attempt_key, &attempt)
            .await
            .map_err(state_error("written"))?;
        Ok(true)
    }

    /// Reads the quota slots appended since the last read, by any gateway.
    async fn catch_up(&self, cache: &mut QuotaCache) -> Result<(), JournalError> {
        for record in self
            .quota
            .since::<Slot>(cache.seen)
            .await
            .map_err(state_error("read"))?
        {
            cache.seen = record.seq;
            if let Some((month, target, n)) = parse_slot_key(&record.key) {
                cache
                    .slots
                    .entry((target, month))
                    .or_default()
                    .insert(n, record.value.key);
            }
        }
        Ok(())
    }

    /// Claims a quota slot of (`target`, `month`) for `key`, below `quota`: the one it holds
    /// already (a crash between the claim and the attempt record), else the first free one.
    /// `None` when the month's slots are used up.
    async fn claim(
        &self,
        key: &str,
        target: &str,
        month: &str,
        quota: u32,
    ) -> Result<Option<u32>, JournalError> {
        let mut cache = self.cache.lock().await;
        self.catch_up(&mut cache).await?;
        let chat = (target.to_owned(), month.to_owned());
        let mut n = 0;
        loop {
            let slots = cache.slots.entry(chat.clone()).or_default();
            if let Some((&held, _)) = slots.iter().find(|(_, holder)| *holder == key) {
                return Ok(Some(held));
            }
            if u32::try_from(slots.len()).unwrap_or(u32::MAX) >= quota {
                return Ok(None);
            }
            while slots.contains_key(&n) {
                n += 1;
            }
            let slot = slot_key(month, target, n);
            let value = Slot {
                key: key.to_owned(),
            };
            if self
                .quota
                .append(&slot, &value)
                .await
                .map_err(state_error("written"))?
            {
                slots.insert(n, value.key);
                return Ok(Some(n));
            }
            // Taken since the last read: by another gateway, or by this very unit before a
            // crash. The stored holder decides.
            let holder = self
                .quota
                .find::<Slot>(&slot)
                .await
                .map_err(state_error("read"))?
                .map(|r| r.value.key);
            let slots = cache.slots.entry(chat.clone()).or_default();
            match holder {
                Some(holder) if holder == key => {
                    slots.insert(n, holder);
                    return Ok(Some(n));
                }
                Some(holder) => {
                    slots.insert(n, holder);
                }
                // Pruned in between: not ours to count; try the next one.
                None => n += 1,
            }
        }
    }

    /// Records the message id QQ answered for `key`'s active send.
    pub async fn answered(&self, key: &str, id: &str) -> Result<(), JournalError> {
        self.sends
            .append(&format!("answered:{key}"), &Answer { id: id.to_owned() })
            .await
            .map_err(state_error("written"))?;
        Ok(())
    }

    /// Records the id QQ answered a passive reply of `key` with: a later check of that unit
    /// names the message rather than the id-less `<msg_id>:<msg_seq>` receipt. Best effort
    /// (the dedupe settles the unit without it).
    pub async fn answered_passive(&self, key: &str, id: &str) -> Result<(), JournalError> {
        self.sends
            .append(&format!("passive:{key}"), &Answer { id: id.to_owned() })
            .await
            .map_err(state_error("written"))?;
        Ok(())
    }

    /// Records, durably, that `key` answers `msg_id`: a target chosen at send time (the latest
    /// message of the chat, which a restart forgets) must be the same on every attempt. Returns
    /// the choice that holds: an earlier one (of any gateway) stays.
    pub async fn chose(&self, key: &str, msg_id: &str) -> Result<String, JournalError> {
        let chosen_key = format!("chosen:{key}");
        let value = Chosen {
            msg_id: msg_id.to_owned(),
        };
        if self
            .sends
            .append(&chosen_key, &value)
            .await
            .map_err(state_error("written"))?
        {
            return Ok(value.msg_id);
        }
        Ok(self.chosen(key).await?.unwrap_or(value.msg_id))
    }

    /// The inbound message chosen for `key` at send time, if any.
    pub async fn chosen(&self, key: &str) -> Result<Option<String>, JournalError> {
        Ok(self
            .sends
            .find::<Chosen>(&format!("chosen:{key}"))
            .await
            .map_err(state_error("read"))?
            .map(|r| r.value.msg_id))
    }

    /// The id QQ answered `key`'s passive reply with, when it was recorded.
    pub async fn passive_id(&self, key: &str) -> Result<Option<String>, JournalError> {
        Ok(self
            .sends
            .find::<Answer>(&format!("passive:{key}"))
            .await
            .map_err(state_error("read"))?
            .map(|r| r.value.id))
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

    #[test]
    fn slot_keys_read_back_whatever_the_target_holds() {
        assert_eq!(
            parse_slot_key(&slot_key("2026-12", "a/b", 3)),
            Some(("2026-12".into(), "a/b".into(), 3))
        );
        assert_eq!(parse_slot_key("2026-12/x"), None);
    }

    #[tokio::test]
    async fn the_quota_counts_attempts_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let state = clawgate_conformance::channel_state(dir.path(), "qq", "default");
        let journal = ActiveJournal::open(&state).await.unwrap();
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
        journal.answered_passive("p1", "P1").await.unwrap();
        assert_eq!(journal.chose("p2", "IN1").await.unwrap(), "IN1");
        assert_eq!(
            journal.chose("p2", "IN2").await.unwrap(),
            "IN1",
            "the first choice holds"
        );
        let again = ActiveJournal::open(&clawgate_conformance::channel_state(
            dir.path(),
            "qq",
            "default",
        ))
        .await
        .unwrap();
        assert_eq!(
            again.attempt("k1").await.unwrap(),
            Some(ActiveAttempt::Answered("M1".into()))
        );
        assert_eq!(
            again.attempt("k2").await.unwrap(),
            Some(ActiveAttempt::Unanswered)
        );
        assert_eq!(again.attempt("k3-none").await.unwrap(), None);
        assert_eq!(
            again.used("U", now).await.unwrap(),
            2,
            "passive answers are not counted"
        );
        assert_eq!(again.passive_id("p1").await.unwrap().as_deref(), Some("P1"));
        assert_eq!(again.attempt("p1").await.unwrap(), None);
        assert_eq!(
            again.chosen("p2").await.unwrap().as_deref(),
            Some("IN1"),
            "the first choice stays"
        );
        assert_eq!(
            again.used("U", now + 40 * 86_400_000).await.unwrap(),
            0,
            "next month"
        );
    }

    #[tokio::test]
    async fn a_slot_taken_before_a_crash_is_the_units_again_and_one_taken_by_another_gateway_counts()
     {
        let dir = tempfile::tempdir().unwrap();
        let now = 1_796_230_800_000;
        let month = month_of(1_796_230_800_000);
        let first = ActiveJournal::open(&clawgate_conformance::channel_state(
            dir.path(),
            "qq",
            "default",
        ))
        .await
        .unwrap();
        // Another gateway on the store, whose cache is read before the first one's slots.
        let second = ActiveJournal::open(&clawgate_conformance::channel_state(
            dir.path(),
            "qq",
            "default",
        ))
        .await
        .unwrap();
        assert_eq!(second.used("U", now).await.unwrap(), 0);
        // A crash after the slot, before the attempt record: the retry takes the same slot.
        assert_eq!(first.claim("k1", "U", &month, 2).await.unwrap(), Some(0));
        assert!(first.reserve("k1", "U", now, 2).await.unwrap());
        assert_eq!(first.used("U", now).await.unwrap(), 1);
        // The second gateway tries slot 0 (its cache is stale), finds it taken, takes 1.
        second.cache.lock().await.seen = i64::MAX;
        assert!(second.reserve("k2", "U", now, 2).await.unwrap());
        assert!(!second.reserve("k3", "U", now, 2).await.unwrap(), "full");
        assert!(!first.reserve("k3", "U", now, 2).await.unwrap(), "full");
        assert_eq!(first.used("U", now).await.unwrap(), 2);
    }
}
