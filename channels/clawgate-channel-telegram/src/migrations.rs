//! Groups upgraded to supergroups: Telegram answers a send to the old id with
//! `migrate_to_chat_id` once; the move is remembered here, in memory and in a file of the
//! channel's state directory, so every later message (and every reply recorded before the move)
//! goes to the new id without asking again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use tracing::warn;

/// Old chat id → new chat id.
#[derive(Debug, Default)]
pub(crate) struct Migrations {
    moved: Mutex<BTreeMap<String, String>>,
    file: Option<PathBuf>,
}

impl Migrations {
    /// The moves recorded in `file` (none when it does not exist yet). A file that cannot be
    /// read is an error: forgetting a move would send into a chat that no longer exists.
    pub(crate) fn load(file: PathBuf) -> Result<Migrations, String> {
        let moved = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{} is not a chat migration map ({e}); fix or remove it",
                    file.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
        };
        Ok(Migrations {
            moved: Mutex::new(moved),
            file: Some(file),
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
        // A chain is at most a few moves long; the bound guards against a hand-edited cycle.
        for _ in 0..8 {
            match moved.get(current) {
                Some(next) => current = next,
                None => break,
            }
        }
        current.to_owned()
    }

    /// Records that `from` moved to `to`, durably when this map has a file.
    pub(crate) fn remember(&self, from: &str, to: &str) {
        let mut moved = self.moved();
        moved.insert(from.to_owned(), to.to_owned());
        let Some(file) = &self.file else { return };
        let written = serde_json::to_vec_pretty(&*moved)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                let tmp = file.with_extension("json.tmp");
                std::fs::write(&tmp, bytes)?;
                std::fs::rename(&tmp, file)
            });
        if let Err(error) = written {
            // The move still holds for this process; after a restart Telegram answers once more.
            warn!(file = %file.display(), %error, "the chat move could not be written down");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_are_followed_and_survive_a_reload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("migrations.json");
        let map = Migrations::load(file.clone()).expect("no file yet");
        assert_eq!(map.current("-5"), "-5");
        map.remember("-5", "-1005");
        assert_eq!(map.current("-5"), "-1005");
        let reloaded = Migrations::load(file.clone()).expect("reload");
        assert_eq!(reloaded.current("-5"), "-1005");
        std::fs::write(&file, b"not json").expect("write");
        let error = Migrations::load(file).expect_err("garbage");
        assert!(error.contains("fix or remove it"), "{error}");
    }
}
