//! User mode's attempt journal: before a chat message goes out, its `referenceId`, conversation
//! and the time are recorded, durably, in the gateway's store (the account's [`ChannelState`],
//! book `talk-attempts`, keyed by `referenceId`). It is what makes a lost answer decidable: a
//! unit with no entry never left (the entry is written before any request), and a unit with one
//! was sent no earlier than that time, so history older than it (less a clock slack) proves
//! absence. The journal is read from the store when a send is checked: a gateway that takes the
//! account over settles what another one attempted.
//!
//! An earlier release kept it, with the poller's start ([`START_VALUE`]), in the directory
//! `<name>.talk` of the state directory; [`import_legacy`] brings both in once.

use std::time::Duration;

use clawgate_channel_sdk::state::{
    Book, ChannelState, LegacyFiles, StateError, Swapped, ValueExpectation,
};
use serde::{Deserialize, Serialize};

/// One attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// When the first attempt began (ms since the epoch, the gateway's clock).
    pub(crate) at_ms: i64,
}

/// The record of an attempt.
#[derive(Serialize, Deserialize)]
struct Entry {
    token: String,
    #[serde(rename = "atMs")]
    at_ms: i64,
}

/// The book the journal is kept in.
const BOOK: &str = "talk-attempts";
/// The value the poller's start (the newest message id when the account was first built) is
/// kept in: `{"after": <id>}`.
pub(crate) const START_VALUE: &str = "talk-start";

/// Entries older than this are pruned when the journal is opened (as the earlier release
/// dropped them): a lost answer is settled within minutes, never weeks.
const KEEP_MS: i64 = 14 * 24 * 3_600_000;
/// At most this many entries are kept (the newest): far above two weeks of replies.
const KEEP_NEWEST: u64 = 200_000;

/// The earlier release's journal file in the `<name>.talk` directory.
pub(crate) const LEGACY_JOURNAL: &str = "talk-attempts.jsonl";
/// The earlier release's start file in the `<name>.talk` directory.
pub(crate) const LEGACY_START: &str = "talk-start.json";

/// The journal or the files of an earlier release could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalError {
    /// The store could not be read or written.
    #[error("the Nextcloud Talk attempt journal could not be {what}: {source}")]
    State {
        what: &'static str,
        #[source]
        source: StateError,
    },
    /// The directory of an earlier release could not be imported.
    #[error(
        "the Nextcloud Talk state of an earlier release ({dir} in the state directory) could \
         not be {what}: {source}; make it readable (or move it aside to give up its attempts \
         and start) and start again"
    )]
    Legacy {
        dir: String,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The journal of one account.
#[derive(Debug)]
pub(crate) struct Journal {
    book: Book,
}

/// A line of the earlier release's `talk-attempts.jsonl`.
#[derive(Deserialize)]
struct LegacyLine {
    #[serde(rename = "ref")]
    reference: String,
    token: String,
    at: i64,
}

impl Journal {
    /// The journal of the account whose state is `state`; prunes what is older than two
    /// weeks.
    pub(crate) async fn open(state: &ChannelState) -> Result<Journal, JournalError> {
        let book = state.book(BOOK);
        book.prune(
            Duration::from_millis(u64::try_from(KEEP_MS).unwrap_or(u64::MAX)),
            KEEP_NEWEST,
        )
        .await
        .map_err(|source| JournalError::State {
            what: "pruned",
            source,
        })?;
        Ok(Journal { book })
    }

    /// The first attempt of `reference`, if one was journaled (by any gateway).
    pub(crate) async fn get(&self, reference: &str) -> Result<Option<Attempt>, StateError> {
        Ok(self.book.find::<Entry>(reference).await?.map(|r| Attempt {
            at_ms: r.value.at_ms,
        }))
    }

    /// Journals an attempt of `reference` in `token` at `at_ms`, durably; an earlier attempt's
    /// entry stays (its time is the one that counts).
    pub(crate) async fn record(
        &self,
        reference: &str,
        token: &str,
        at_ms: i64,
    ) -> Result<(), StateError> {
        self.book
            .append(
                reference,
                &Entry {
                    token: token.to_owned(),
                    at_ms,
                },
            )
            .await?;
        Ok(())
    }
}

/// The poller's kept start, `{"after": <id>}`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Start {
    pub(crate) after: i64,
}

/// Imports the `<name>.talk` directory an earlier release kept (`dir`): its journal entries
/// younger than two weeks at `now_ms` (as that release kept them; a torn last line is skipped)
/// and its start, unless the store holds one; then sets the directory aside. Repeatable: the
/// entries are keyed by `referenceId` and the start is written only where none is, so a crash
/// before the directory is set aside imports it again and changes nothing.
pub(crate) async fn import_legacy(
    dir: &str,
    legacy: &LegacyFiles,
    state: &ChannelState,
    journal: &Journal,
    now_ms: i64,
) -> Result<(), JournalError> {
    let legacy_error = |what| {
        move |source| JournalError::Legacy {
            dir: dir.to_owned(),
            what,
            source,
        }
    };
    let Some(files) = legacy.read_dir(dir).map_err(legacy_error("read"))? else {
        return Ok(());
    };
    for (name, bytes) in &files {
        match name.as_str() {
            LEGACY_JOURNAL => {
                for line in String::from_utf8_lossy(bytes)
                    .lines()
                    .filter_map(|l| serde_json::from_str::<LegacyLine>(l).ok())
                    .filter(|l| l.at >= now_ms - KEEP_MS)
                {
                    journal
                        .record(&line.reference, &line.token, line.at)
                        .await
                        .map_err(|source| JournalError::State {
                            what: "written",
                            source,
                        })?;
                }
            }
            LEGACY_START => {
                if let Ok(start) = serde_json::from_slice::<Start>(bytes) {
                    // A start already in the store (another gateway's, or this import's
                    // before a crash) stays.
                    let _: Swapped<Start> = state
                        .swap(START_VALUE, ValueExpectation::Absent, &start)
                        .await
                        .map_err(|source| JournalError::State {
                            what: "written",
                            source,
                        })?;
                }
            }
            // The earlier release's temporary files: never the state.
            _ => {}
        }
    }
    legacy.retire(dir).map_err(legacy_error("set aside"))?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[tokio::test]
    async fn attempts_survive_a_reopen_and_keep_their_first_time() {
        let dir = tempfile::tempdir().unwrap();
        let state = || clawgate_conformance::channel_state(dir.path(), "nextcloud", "default");
        let journal = Journal::open(&state()).await.unwrap();
        journal.record("r1", "tok", 1_000).await.unwrap();
        journal.record("r1", "tok", 2_000).await.unwrap();
        assert_eq!(
            journal.get("r1").await.unwrap(),
            Some(Attempt { at_ms: 1_000 }),
            "the first attempt's time is kept"
        );
        let reopened = Journal::open(&state()).await.unwrap();
        assert_eq!(
            reopened.get("r1").await.unwrap(),
            Some(Attempt { at_ms: 1_000 })
        );
        assert_eq!(reopened.get("r2").await.unwrap(), None);
    }
}
