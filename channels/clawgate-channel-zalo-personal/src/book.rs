//! The evidence about our sends: the one way a send whose answer was lost can be settled.
//! Zalo Web has no idempotency and no message lookup, but every send carries a `clientId` we
//! choose, and the listener pushes the account's own messages back (the frames zca-js emits
//! with `selfListen`) with that id as `cliMsgId` next to Zalo's `msgId`.
//!
//! The evidence is kept in the gateway's store (the account's [`ChannelState`], book
//! `zalo-personal-sends`), so the gateway that holds the listener records the echoes of sends
//! another gateway made, and any gateway settles them:
//!
//! - `client:<clientId>` (unit key, time), then `attempt:<unit key>` (time of the first
//!   attempt): written, durably, *before* the request goes out. A key without an attempt was
//!   never sent: it reconciles as not sent. A retry of the same key (after a refusal) adds its
//!   own `clientId`.
//! - `answered:<unit key>`: Zalo's answer (`msgId`).
//! - `echo:<unit key>`: our own message seen on the listener for a `clientId` of one of its
//!   attempts (`msgId`); durable when seen.
//!
//! An attempt with neither an answer nor an echo stays unknown while its echo can still
//! come ([`SendBook::evidence`] says when it went out); after it, nothing can ever tell (no
//! catch-up after a disconnect, no lookup), and the send is undecidable: parked, never resent.
//!
//! An earlier release kept the evidence in [`BOOK_FILE`] in the state directory; it is
//! imported once ([`SendBook::import_legacy`]).

use std::time::Duration;

use clawgate_channel_sdk::state::{Book, ChannelState, LegacyFiles, StateError};
use serde::{Deserialize, Serialize};
use tracing::warn;

/// The file an earlier release kept the evidence in (in the gateway's state directory), read
/// once by [`SendBook::import_legacy`].
pub const BOOK_FILE: &str = "zalo-personal-sends.jsonl";

/// The book the evidence is kept in.
const BOOK: &str = "zalo-personal-sends";

/// Records older than this are pruned at start: an unknown send is settled or parked within
/// the engine's reconciliation window (minutes), and its echo comes within `echo_window_ms`.
const KEEP_FOR: Duration = Duration::from_secs(30 * 24 * 3_600);
/// At most this many records are kept (the newest): far above what a month of sends writes
/// (four records a unit at most).
const KEEP_NEWEST: u64 = 200_000;

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
pub enum BookError {
    /// The store could not be read or written.
    #[error("the Zalo Personal send book could not be {what}: {source}")]
    State {
        /// What was being done.
        what: &'static str,
        /// The store's error.
        #[source]
        source: StateError,
    },
    /// The send book file of an earlier release could not be imported.
    #[error(
        "the Zalo Personal send book of an earlier release ({BOOK_FILE} in the state \
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

fn state_error(what: &'static str) -> impl FnOnce(StateError) -> BookError {
    move |source| BookError::State { what, source }
}

/// `client:<clientId>`: the unit an attempt's `clientId` belongs to.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Client {
    key: String,
    at_ms: u64,
}

/// `attempt:<key>`: when the unit's first attempt went out.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Attempt {
    at_ms: u64,
}

/// `answered:<key>` / `echo:<key>`: Zalo's id of the unit's message.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Landed {
    msg_id: String,
}

/// A line of the earlier release's `zalo-personal-sends.jsonl`.
#[derive(Debug, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum LegacyLine {
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

/// The durable record of send evidence, shared by the adapter (attempts, answers) and the
/// listener (echoes), and by every gateway on the store.
#[derive(Debug, Clone)]
pub struct SendBook {
    book: Book,
}

impl SendBook {
    /// The book of the account whose state is `state`; prunes what is too old to matter.
    pub async fn open(state: &ChannelState) -> Result<SendBook, BookError> {
        let book = state.book(BOOK);
        book.prune(KEEP_FOR, KEEP_NEWEST)
            .await
            .map_err(state_error("pruned"))?;
        Ok(SendBook { book })
    }

    /// Imports the `zalo-personal-sends.jsonl` an earlier release wrote, then sets it aside;
    /// returns how many lines were imported. Repeatable: every record is keyed, so a crash
    /// before the file is set aside imports it again and adds nothing.
    pub async fn import_legacy(&self, legacy: &LegacyFiles) -> Result<usize, BookError> {
        let legacy_error = |what| move |source| BookError::Legacy { what, source };
        let Some(bytes) = legacy.read(BOOK_FILE).map_err(legacy_error("read"))? else {
            return Ok(0);
        };
        let mut imported = 0;
        for line in String::from_utf8_lossy(&bytes).lines() {
            // A torn last line (a crash mid-write) was never acted on: nothing was sent before
            // its attempt line was synced.
            let Ok(line) = serde_json::from_str::<LegacyLine>(line) else {
                if !line.trim().is_empty() {
                    warn!(
                        file = BOOK_FILE,
                        "skipping an unreadable line of the old send book"
                    );
                }
                continue;
            };
            match line {
                LegacyLine::Attempt {
                    key,
                    client_id,
                    at_ms,
                } => self.attempted(&key, client_id, at_ms).await?,
                LegacyLine::Answered { key, msg_id } => self.answered(&key, &msg_id).await?,
                LegacyLine::Echo { client_id, msg_id } => self.echo(client_id, &msg_id).await?,
            }
            imported += 1;
        }
        legacy
            .retire(BOOK_FILE)
            .map_err(legacy_error("set aside"))?;
        Ok(imported)
    }

    /// Records a request of `key` with `client_id` about to go out at `at_ms`; durable when
    /// this returns `Ok`.
    pub async fn attempted(&self, key: &str, client_id: u64, at_ms: u64) -> Result<(), BookError> {
        // The clientId first: an attempt record is never without the id its echo names (a
        // crash in between leaves an id no request used, which nothing ever echoes).
        self.book
            .append(
                &format!("client:{client_id}"),
                &Client {
                    key: key.to_owned(),
                    at_ms,
                },
            )
            .await
            .map_err(state_error("written"))?;
        self.book
            .append(&format!("attempt:{key}"), &Attempt { at_ms })
            .await
            .map_err(state_error("written"))?;
        Ok(())
    }

    /// Records Zalo's answer to a send.
    pub async fn answered(&self, key: &str, msg_id: &str) -> Result<(), BookError> {
        self.book
            .append(
                &format!("answered:{key}"),
                &Landed {
                    msg_id: msg_id.to_owned(),
                },
            )
            .await
            .map_err(state_error("written"))?;
        Ok(())
    }

    /// The unit whose attempt used `client_id` (on any gateway), if one did.
    pub async fn unit_of(&self, client_id: u64) -> Result<Option<String>, BookError> {
        Ok(self
            .book
            .find::<Client>(&format!("client:{client_id}"))
            .await
            .map_err(state_error("read"))?
            .map(|r| r.value.key))
    }

    /// Records the echo of our message `client_id` (Zalo's `msg_id`); durable when this
    /// returns `Ok`. Echoes of ids no attempt used (the person's own messages from their other
    /// devices) are not recorded; the first echo of a unit stays.
    pub async fn echo(&self, client_id: u64, msg_id: &str) -> Result<(), BookError> {
        let Some(key) = self.unit_of(client_id).await? else {
            return Ok(());
        };
        self.book
            .append(
                &format!("echo:{key}"),
                &Landed {
                    msg_id: msg_id.to_owned(),
                },
            )
            .await
            .map_err(state_error("written"))?;
        Ok(())
    }

    /// What the store holds of `key`, whichever gateway wrote it.
    pub async fn evidence(&self, key: &str) -> Result<Evidence, BookError> {
        let find_landed = |what: String| async move {
            self.book
                .find::<Landed>(&what)
                .await
                .map_err(state_error("read"))
        };
        if let Some(answered) = find_landed(format!("answered:{key}")).await? {
            return Ok(Evidence::Landed(answered.value.msg_id));
        }
        if let Some(echo) = find_landed(format!("echo:{key}")).await? {
            return Ok(Evidence::Landed(echo.value.msg_id));
        }
        Ok(
            match self
                .book
                .find::<Attempt>(&format!("attempt:{key}"))
                .await
                .map_err(state_error("read"))?
            {
                Some(attempt) => Evidence::Pending {
                    at_ms: attempt.value.at_ms,
                },
                None => Evidence::NeverSent,
            },
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[tokio::test]
    async fn echoes_settle_their_own_attempt_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let state = || clawgate_conformance::channel_state(dir.path(), "zalo-personal", "default");
        let book = SendBook::open(&state()).await.unwrap();
        assert_eq!(book.evidence("k").await.unwrap(), Evidence::NeverSent);
        book.attempted("k#0", 100, 1_000).await.unwrap();
        book.answered("k#0", "m0").await.unwrap();
        book.attempted("k#1", 101, 2_000).await.unwrap();
        book.attempted("k#1", 102, 3_000).await.unwrap();
        book.attempted("k#2", 103, 4_000).await.unwrap();
        // An echo of someone else's client id, then the retry's echo of k#1.
        book.echo(999, "mx").await.unwrap();
        book.echo(102, "m1").await.unwrap();
        assert_eq!(
            book.evidence("k#0").await.unwrap(),
            Evidence::Landed("m0".into())
        );
        assert_eq!(
            book.evidence("k#1").await.unwrap(),
            Evidence::Landed("m1".into())
        );
        assert_eq!(
            book.evidence("k#2").await.unwrap(),
            Evidence::Pending { at_ms: 4_000 }
        );
        drop(book);
        let again = SendBook::open(&state()).await.unwrap();
        assert_eq!(
            again.evidence("k#1").await.unwrap(),
            Evidence::Landed("m1".into())
        );
        assert_eq!(
            again.evidence("k#2").await.unwrap(),
            Evidence::Pending { at_ms: 4_000 },
            "the first attempt's time"
        );
        assert_eq!(again.unit_of(999).await.unwrap(), None);
        assert_eq!(again.unit_of(101).await.unwrap().as_deref(), Some("k#1"));
    }
}
