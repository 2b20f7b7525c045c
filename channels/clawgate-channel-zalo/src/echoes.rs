//! The evidence about the messages we sent: the one way Zalo lets a send whose answer was
//! lost be settled (platform-apis-wave2 §9.1: no idempotency key, no message lookup). The OA
//! posts an `oa_send_text` webhook for every text the OA sends, carrying the recipient, the
//! text and Zalo's `msg_id`, but nothing of ours (no metadata field exists). So a send is
//! matched to its echo by **recipient, exact text and time**.
//!
//! The evidence is the book [`SENDS_BOOK`] of the account's state in the gateway's store, so
//! every gateway sharing the store settles a send from what any of them recorded. Its records,
//! each under a key that makes its append repeatable:
//!
//! - `attempt:<unit key>` (recipient, text, time): durable *before* the request goes out. A
//!   key without it was never sent by this account: it reconciles as not sent. The first
//!   attempt's record stays (an echo of any attempt of the key is its echo).
//! - `answered:<unit key>` (`msg_id`): Zalo's answer.
//! - `echo:<msg_id>` (recipient, text, time): durable before the webhook is answered 200, so
//!   one Zalo saw answered is never lost to a crash; one we did not answer is posted again.
//! - `claimed:<msg_id>` (unit key): the send an echo belongs to, written for an answer and for
//!   an unknown send an echo settles. Keyed by the echo, it is appended once: of two gateways
//!   claiming one echo for two sends, exactly one gets it.
//!
//! An unknown send is `Sent` with the oldest echo recorded after its attempt (its request left
//! after the attempt was durable, so its echo comes later) to the same recipient with the same
//! text, stamped no earlier than [`CLOCK_SKEW_MS`] before the attempt, that no other send
//! claimed. Two unknown sends of the same text to the same person each get one echo; the limit
//! is a lost answer racing the echo of an identical text whose own answer is still in flight
//! (the same person, the same words, the same seconds), which the gateway's one reply per
//! message makes unlikely; the README says so.
//!
//! An earlier release kept the book in [`BOOK_FILE`] in the state directory; it is imported
//! once ([`EchoBook::import_legacy`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::state::{Book, ChannelState, LegacyFiles, Record, StateError};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// The file an earlier release kept the book in (in the gateway's state directory), imported
/// once.
pub const BOOK_FILE: &str = "zalo-sends.jsonl";

/// The book's name in the account's state.
pub const SENDS_BOOK: &str = "sends";

/// How much earlier than our attempt Zalo's clock may stamp its echo.
pub const CLOCK_SKEW_MS: u64 = 60_000;

/// Records older than this are pruned: an unknown send is reconciled within the engine's
/// reconciliation window (minutes) and then parked, and Zalo gives up posting an echo after
/// about an hour; three months is far beyond both.
const KEEP_FOR: Duration = Duration::from_secs(93 * 24 * 3_600);
/// At most this many records are kept (the newest): four per message, so a bound for a busy
/// OA far above what the days an unknown send can take write.
const KEEP_NEWEST: u64 = 400_000;
/// How often a running channel prunes (besides at start).
const PRUNE_EVERY_MS: i64 = 24 * 3_600 * 1_000;
/// How many records of an imported file are written at once (the store batches them).
const IMPORT_BATCH: usize = 256;

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
pub enum BookError {
    /// The store could not be read or written.
    #[error("the Zalo send book could not be {what}: {source}")]
    State {
        /// What was being done.
        what: &'static str,
        /// The store's error.
        #[source]
        source: StateError,
    },
    /// The book file of an earlier release could not be imported.
    #[error(
        "the Zalo send book of an earlier release ({BOOK_FILE} in the state directory) could \
         not be {what}: {source}; make it readable (or move it aside to give up its records) \
         and start again"
    )]
    Legacy {
        /// What was being done.
        what: &'static str,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

fn state_error(what: &'static str) -> impl FnOnce(StateError) -> BookError {
    move |source| BookError::State { what, source }
}

fn legacy_error(what: &'static str) -> impl FnOnce(std::io::Error) -> BookError {
    move |source| BookError::Legacy { what, source }
}

/// One record of the book (its key says which send or echo it is about).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum Entry {
    Attempt {
        user_id: String,
        text: String,
        at_ms: u64,
    },
    Answered {
        msg_id: String,
    },
    Echo {
        user_id: String,
        text: String,
        at_ms: u64,
    },
    Claimed {
        key: String,
    },
}

const ATTEMPT: &str = "attempt:";
const ANSWERED: &str = "answered:";
const ECHO: &str = "echo:";
const CLAIMED: &str = "claimed:";

/// A line of the earlier release's `zalo-sends.jsonl`.
#[derive(Debug, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum LegacyLine {
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

/// The send evidence of one account, shared by the adapter (attempts, answers, settling) and
/// the webhook source (echoes). Everything is read from the store when it decides something.
#[derive(Debug, Clone)]
pub struct EchoBook {
    book: Book,
    state: ChannelState,
    /// When this instance last pruned (gateway clock).
    pruned_at: Arc<std::sync::Mutex<i64>>,
}

fn sent(msg_id: String) -> Option<SendEvidence> {
    Some(SendEvidence {
        attempted: true,
        msg_id: Some(msg_id),
    })
}

impl EchoBook {
    /// The book of the account whose state is `state`; prunes what is too old to matter.
    pub async fn open(state: &ChannelState) -> Result<EchoBook, BookError> {
        let book = EchoBook {
            book: state.book(SENDS_BOOK),
            state: state.clone(),
            pruned_at: Arc::new(std::sync::Mutex::new(i64::MIN)),
        };
        if book.prune_due() {
            book.prune().await?;
        }
        Ok(book)
    }

    /// Whether a prune is due (and, if so, that this caller does it).
    fn prune_due(&self) -> bool {
        let now = self.state.now_ms();
        let mut pruned_at = self
            .pruned_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.saturating_sub(*pruned_at) < PRUNE_EVERY_MS {
            return false;
        }
        *pruned_at = now;
        true
    }

    async fn prune(&self) -> Result<(), BookError> {
        self.book
            .prune(KEEP_FOR, KEEP_NEWEST)
            .await
            .map_err(state_error("pruned"))?;
        Ok(())
    }

    async fn append(&self, key: String, entry: &Entry) -> Result<bool, BookError> {
        self.book
            .append(&key, entry)
            .await
            .map_err(state_error("written"))
    }

    async fn find(&self, key: &str) -> Result<Option<Record<Entry>>, BookError> {
        self.book.find(key).await.map_err(state_error("read"))
    }

    /// Imports the `zalo-sends.jsonl` an earlier release wrote, then sets it aside; returns how
    /// many of its lines were read. Repeatable: a crash before the file is set aside imports it
    /// again and adds nothing (every record is keyed). Records older than the book keeps are
    /// left out. Attempts are written before echoes, and both before answers and claims, so
    /// the book's order still puts every echo after the attempts it may settle.
    pub async fn import_legacy(&self, legacy: &LegacyFiles) -> Result<usize, BookError> {
        let Some(bytes) = legacy.read(BOOK_FILE).map_err(legacy_error("read"))? else {
            return Ok(0);
        };
        let text = String::from_utf8_lossy(&bytes);
        let oldest = u64::try_from(self.state.now_ms())
            .unwrap_or(0)
            .saturating_sub(u64::try_from(KEEP_FOR.as_millis()).unwrap_or(u64::MAX));
        let (mut attempts, mut echoes, mut settled) = (Vec::new(), Vec::new(), Vec::new());
        let (mut attempted, mut claimed) = (HashSet::new(), HashSet::new());
        let mut read = 0;
        // A torn last line (a crash mid-write) does not parse and is skipped, as the earlier
        // release skipped it: nothing was sent or answered before its line was synced.
        for line in text
            .lines()
            .filter_map(|line| serde_json::from_str::<LegacyLine>(line).ok())
        {
            read += 1;
            match line {
                LegacyLine::Attempt {
                    key,
                    user_id,
                    text,
                    at_ms,
                } if at_ms >= oldest && attempted.insert(key.clone()) => {
                    attempts.push((
                        format!("{ATTEMPT}{key}"),
                        Entry::Attempt {
                            user_id,
                            text,
                            at_ms,
                        },
                    ));
                }
                LegacyLine::Echo {
                    msg_id,
                    user_id,
                    text,
                    at_ms,
                } if at_ms >= oldest => echoes.push((
                    format!("{ECHO}{msg_id}"),
                    Entry::Echo {
                        user_id,
                        text,
                        at_ms,
                    },
                )),
                LegacyLine::Answered { key, msg_id } => {
                    settled.push((
                        format!("{ANSWERED}{key}"),
                        Entry::Answered {
                            msg_id: msg_id.clone(),
                        },
                    ));
                    if claimed.insert(msg_id.clone()) {
                        settled.push((format!("{CLAIMED}{msg_id}"), Entry::Claimed { key }));
                    }
                }
                // The first claim of a msg_id in the file is the one that stands.
                LegacyLine::Claimed { key, msg_id } if claimed.insert(msg_id.clone()) => {
                    settled.push((format!("{CLAIMED}{msg_id}"), Entry::Claimed { key }));
                }
                LegacyLine::Attempt { .. }
                | LegacyLine::Echo { .. }
                | LegacyLine::Claimed { .. } => {}
            }
        }
        // Answers and claims of sends too old to keep settle nothing.
        settled.retain(|(record, entry)| match entry {
            Entry::Answered { .. } => record
                .strip_prefix(ANSWERED)
                .is_some_and(|key| attempted.contains(key)),
            Entry::Claimed { key } => attempted.contains(key),
            _ => false,
        });
        for phase in [attempts, echoes, settled] {
            self.append_all(phase).await?;
        }
        legacy
            .retire(BOOK_FILE)
            .map_err(legacy_error("set aside"))?;
        info!(
            lines = read,
            "the {BOOK_FILE} of an earlier release was taken into the gateway's store"
        );
        Ok(read)
    }

    /// Appends `records`, many at a time; all are durable when this returns.
    async fn append_all(&self, records: Vec<(String, Entry)>) -> Result<(), BookError> {
        let mut records = records.into_iter().peekable();
        while records.peek().is_some() {
            let mut writes = tokio::task::JoinSet::new();
            for (key, entry) in records.by_ref().take(IMPORT_BATCH) {
                let book = self.book.clone();
                writes.spawn(async move { book.append(&key, &entry).await });
            }
            while let Some(written) = writes.join_next().await {
                written
                    .map_err(|e| BookError::Legacy {
                        what: "imported",
                        source: std::io::Error::other(e),
                    })?
                    .map_err(state_error("written"))?;
            }
        }
        Ok(())
    }

    /// Records a request of `key` (to `user_id`, saying `text`) about to go out at `at_ms`;
    /// durable when this returns `Ok`. A key attempted before keeps its first record.
    pub async fn attempted(
        &self,
        key: &str,
        user_id: &str,
        text: &str,
        at_ms: u64,
    ) -> Result<(), BookError> {
        self.append(
            format!("{ATTEMPT}{key}"),
            &Entry::Attempt {
                user_id: user_id.to_owned(),
                text: text.to_owned(),
                at_ms,
            },
        )
        .await?;
        if self.prune_due() {
            // Off the send's path: a day's pruning is not this send's business.
            let book = self.clone();
            tokio::spawn(async move {
                if let Err(error) = book.prune().await {
                    warn!(%error, "the Zalo send book was not pruned; it is tried again tomorrow");
                }
            });
        }
        Ok(())
    }

    /// Records Zalo's answer to a send, and claims its `msg_id` for it.
    pub async fn answered(&self, key: &str, msg_id: &str) -> Result<(), BookError> {
        self.append(
            format!("{ANSWERED}{key}"),
            &Entry::Answered {
                msg_id: msg_id.to_owned(),
            },
        )
        .await?;
        let claim = format!("{CLAIMED}{msg_id}");
        if !self
            .append(
                claim.clone(),
                &Entry::Claimed {
                    key: key.to_owned(),
                },
            )
            .await?
            && let Some(Record {
                value: Entry::Claimed { key: claimer },
                ..
            }) = self.find(&claim).await?
            && claimer != key
        {
            warn!(
                key,
                msg_id, claimer, "an answered msg_id was already given to another send"
            );
        }
        Ok(())
    }

    /// Records an `oa_send_text` echo; durable when this returns `Ok`.
    pub async fn echo(
        &self,
        msg_id: &str,
        user_id: &str,
        text: &str,
        at_ms: u64,
    ) -> Result<(), BookError> {
        self.append(
            format!("{ECHO}{msg_id}"),
            &Entry::Echo {
                user_id: user_id.to_owned(),
                text: text.to_owned(),
                at_ms,
            },
        )
        .await?;
        Ok(())
    }

    /// What the book knows of `key`, matching (and durably claiming) an echo for an attempt
    /// that has no `msg_id` yet. Read from the store: the attempt, the answer and the echo may
    /// each have been written by another gateway.
    pub async fn settle(&self, key: &str) -> Result<Option<SendEvidence>, BookError> {
        let Some(Record {
            seq,
            value:
                Entry::Attempt {
                    user_id,
                    text,
                    at_ms,
                },
            ..
        }) = self.find(&format!("{ATTEMPT}{key}")).await?
        else {
            return Ok(None);
        };
        if let Some(Record {
            value: Entry::Answered { msg_id },
            ..
        }) = self.find(&format!("{ANSWERED}{key}")).await?
        {
            return Ok(sent(msg_id));
        }
        let later = self
            .book
            .since::<Entry>(seq)
            .await
            .map_err(state_error("read"))?;
        let mut claimed = HashSet::new();
        let mut echoes = Vec::new();
        for record in later {
            match record.value {
                Entry::Claimed { key: claimer } => {
                    let msg_id = record.key.trim_start_matches(CLAIMED).to_owned();
                    if claimer == key {
                        // Settled before, here or by another gateway.
                        return Ok(sent(msg_id));
                    }
                    claimed.insert(msg_id);
                }
                Entry::Echo {
                    user_id: to,
                    text: said,
                    at_ms: echoed,
                } if to == user_id
                    && said == text
                    && echoed.saturating_add(CLOCK_SKEW_MS) >= at_ms =>
                {
                    echoes.push((
                        echoed,
                        record.seq,
                        record.key.trim_start_matches(ECHO).to_owned(),
                    ));
                }
                _ => {}
            }
        }
        echoes.sort();
        for (_, _, msg_id) in echoes {
            if claimed.contains(&msg_id) {
                continue;
            }
            // The claim is keyed by the echo: if another send (on any gateway) claimed it
            // first, this append changes nothing and the next echo is tried.
            let claim = format!("{CLAIMED}{msg_id}");
            if self
                .append(
                    claim.clone(),
                    &Entry::Claimed {
                        key: key.to_owned(),
                    },
                )
                .await?
            {
                return Ok(sent(msg_id));
            }
            if let Some(Record {
                value: Entry::Claimed { key: claimer },
                ..
            }) = self.find(&claim).await?
                && claimer == key
            {
                return Ok(sent(msg_id));
            }
        }
        Ok(Some(SendEvidence {
            attempted: true,
            msg_id: None,
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn msg_id(evidence: Option<SendEvidence>) -> Option<String> {
        evidence.unwrap().msg_id
    }

    #[tokio::test]
    async fn echoes_settle_unknown_sends_once_each_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let state = clawgate_conformance::channel_state(dir.path(), "zalo", "default");
        let book = EchoBook::open(&state).await.unwrap();
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
        assert_eq!(
            msg_id(book.settle("k#1").await.unwrap()).as_deref(),
            Some("m1")
        );
        // The only other matching echo is taken: k#2 stays unknown until its own arrives.
        assert_eq!(msg_id(book.settle("k#2").await.unwrap()), None);
        assert_eq!(msg_id(book.settle("k#3").await.unwrap()), None);
        book.echo("m2", "u1", "hi", 1_000_250).await.unwrap();
        drop(book);
        let again = EchoBook::open(&state).await.unwrap();
        for (key, expected) in [("k#1", "m1"), ("k#0", "m0"), ("k#2", "m2"), ("k#1", "m1")] {
            assert_eq!(
                msg_id(again.settle(key).await.unwrap()).as_deref(),
                Some(expected),
                "{key}"
            );
        }
    }

    /// Two gateways settle two unknown sends of the same text to the same person at once, with
    /// one echo between them: exactly one gets it.
    #[tokio::test]
    async fn an_echo_is_claimed_by_one_send_across_gateways() {
        let dir = tempfile::tempdir().unwrap();
        for round in 0..5 {
            let account = format!("oa-{round}");
            let a = EchoBook::open(&clawgate_conformance::channel_state(
                dir.path(),
                "zalo",
                &account,
            ))
            .await
            .unwrap();
            let b = EchoBook::open(&clawgate_conformance::channel_state(
                dir.path(),
                "zalo",
                &account,
            ))
            .await
            .unwrap();
            a.attempted("k#1", "u1", "hi", 1_000_000).await.unwrap();
            a.attempted("k#2", "u1", "hi", 1_000_000).await.unwrap();
            b.echo("m1", "u1", "hi", 1_000_010).await.unwrap();
            let (one, two) = tokio::join!(a.settle("k#1"), b.settle("k#2"));
            let mut got = vec![msg_id(one.unwrap()), msg_id(two.unwrap())];
            got.sort();
            assert_eq!(got, vec![None, Some("m1".to_owned())], "round {round}");
            // Asked again, on either gateway, each keeps what it got.
            let (one, two) = (
                a.settle("k#1").await.unwrap(),
                a.settle("k#2").await.unwrap(),
            );
            let mut again = vec![msg_id(one), msg_id(two)];
            again.sort();
            assert_eq!(again, got);
        }
    }
}
