//! Groups upgraded to supergroups: Telegram answers a send to the old id with
//! `migrate_to_chat_id` once; the move is remembered here, in memory and in the account's book
//! [`BOOK`] in the gateway's store, so every later message (and every reply recorded before the
//! move) goes to the new id without asking again.

use std::collections::BTreeMap;
use std::sync::Mutex;

use clawgate_channel_sdk::{Book, ChannelState, LegacyFiles, StateError};
use tracing::{info, warn};

/// The book of moves: keyed by the old chat id, the record is the new chat id. A group moves
/// once, so a key is written once and a repeated append (another gateway, an import run again)
/// changes nothing. Never pruned: one record per migrated group the account was in, and a
/// forgotten move would cost a refused send per chat.
pub(crate) const BOOK: &str = "chat-migrations";

/// The file an earlier release kept the moves in, in the gateway's state directory (one name
/// for every Telegram account): a JSON object of old chat id → new chat id.
pub(crate) const LEGACY_FILE: &str = "telegram-chat-migrations.json";

/// Old chat id → new chat id.
#[derive(Debug)]
pub(crate) struct Migrations {
    /// A cache of the book as of the start and the moves this process learned; a move another
    /// gateway learned since is learned here from Telegram's answer, as it was there.
    moved: Mutex<BTreeMap<String, String>>,
    book: Book,
}

/// Imports the moves an earlier release kept in [`LEGACY_FILE`], once: each is appended under
/// its old chat id (repeatable after a crash before the file is set aside), then the file is
/// set aside. A file that cannot be read or parsed stops the start: forgetting a move would
/// send into a chat that no longer exists.
pub(crate) async fn import_legacy(book: &Book, legacy: &LegacyFiles) -> Result<(), String> {
    let Some(bytes) = legacy
        .read(LEGACY_FILE)
        .map_err(|e| format!("cannot read {LEGACY_FILE} in the state directory: {e}"))?
    else {
        return Ok(());
    };
    let moved: BTreeMap<String, String> = serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "{LEGACY_FILE} in the state directory is not a chat migration map ({e}); fix or \
             remove it"
        )
    })?;
    for (from, to) in &moved {
        book.append(from, to)
            .await
            .map_err(|e| format!("{LEGACY_FILE} cannot be imported: {e}"))?;
    }
    legacy.retire(LEGACY_FILE).map_err(|e| {
        format!("{LEGACY_FILE} was imported but cannot be set aside (fix its permissions): {e}")
    })?;
    if !moved.is_empty() {
        info!(
            moves = moved.len(),
            "the chat migrations of an earlier release were imported"
        );
    }
    Ok(())
}

impl Migrations {
    /// The moves recorded in the account's state. A state that cannot be read is an error:
    /// forgetting a move would send into a chat that no longer exists.
    pub(crate) async fn load(state: &ChannelState) -> Result<Migrations, StateError> {
        let book = state.book(BOOK);
        let moved = book
            .since::<String>(0)
            .await?
            .into_iter()
            .map(|record| (record.key, record.value))
            .collect();
        Ok(Migrations {
            moved: Mutex::new(moved),
            book,
        })
    }

    fn moved(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.moved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where `chat` lives now (following every recorded move).
    pub(crate) fn current(&self, chat: &str) -> String {
        let moved = self.moved();
        let mut current = chat;
        // A chain is at most a few moves long; the bound guards against a cycle.
        for _ in 0..8 {
            match moved.get(current) {
                Some(next) => current = next,
                None => break,
            }
        }
        current.to_owned()
    }

    /// Records that `from` moved to `to`, durably.
    pub(crate) async fn remember(&self, from: &str, to: &str) {
        self.moved().insert(from.to_owned(), to.to_owned());
        if let Err(error) = self.book.append(from, &to).await {
            // The move still holds for this process; after a restart Telegram answers once more.
            warn!(%error, "the chat move could not be written down");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(dir: &std::path::Path) -> ChannelState {
        clawgate_conformance::channel_state(dir, "telegram", "default")
    }

    #[tokio::test]
    async fn moves_are_followed_and_survive_a_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let map = Migrations::load(&state(dir.path()))
            .await
            .expect("nothing stored yet");
        assert_eq!(map.current("-5"), "-5");
        map.remember("-5", "-1005").await;
        map.remember("-1005", "-1006").await;
        assert_eq!(map.current("-5"), "-1006", "a chain is followed");
        let reloaded = Migrations::load(&state(dir.path())).await.expect("reload");
        assert_eq!(reloaded.current("-5"), "-1006");
    }

    #[tokio::test]
    async fn a_legacy_file_that_is_not_a_map_stops_the_start_and_stays() {
        let store = tempfile::tempdir().expect("tempdir");
        let old = tempfile::tempdir().expect("tempdir");
        std::fs::write(old.path().join(LEGACY_FILE), b"not json").expect("write");
        let legacy = LegacyFiles::in_dir(old.path());
        let error = import_legacy(&state(store.path()).book(BOOK), &legacy)
            .await
            .expect_err("garbage");
        assert!(error.contains("fix or remove it"), "{error}");
        assert!(old.path().join(LEGACY_FILE).exists(), "not set aside");
    }
}
