//! The reply journal: the unit keys of every reply call this channel ever started, written and
//! synced to the channel's state directory before the call goes out, and a `!<key>` line when
//! LINE refused the call (nothing was sent). After a restart it tells a reply that never left
//! (no entry, or refused: safe to send, or to settle as a push) from one whose outcome is
//! unknown (an entry: LINE cannot say whether it landed). Pushes need none: their retry key
//! settles them.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Unit keys of started replies, durable in `<state_dir>/<channel>.reply-journal`.
#[derive(Debug)]
pub(crate) struct ReplyJournal {
    path: PathBuf,
    started: Mutex<HashSet<String>>,
}

impl ReplyJournal {
    /// Opens (or creates) the journal of channel `name` in `dir`.
    pub(crate) fn open(dir: &Path, name: &str) -> std::io::Result<ReplyJournal> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{name}.reply-journal"));
        let mut started = HashSet::new();
        match File::open(&path) {
            Ok(file) => {
                for line in BufReader::new(file).lines().map_while(Result::ok) {
                    match line.strip_prefix('!') {
                        Some(refused) => started.remove(refused),
                        None if !line.is_empty() => started.insert(line),
                        None => false,
                    };
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(ReplyJournal {
            path,
            started: Mutex::new(started),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a reply of `key` was ever started.
    pub(crate) fn started(&self, key: &str) -> bool {
        self.lock().contains(key)
    }

    fn append(&self, line: &str) -> std::io::Result<()> {
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        file.write_all(format!("{line}\n").as_bytes())?;
        file.sync_data()
    }

    /// Records that a reply of `key` starts now; returns once it is on disk.
    pub(crate) fn start(&self, key: &str) -> std::io::Result<()> {
        let mut started = self.lock();
        if started.contains(key) {
            return Ok(());
        }
        self.append(key)?;
        started.insert(key.to_owned());
        Ok(())
    }

    /// Records that LINE refused the reply of `key`: nothing of it was sent.
    pub(crate) fn refused(&self, key: &str) -> std::io::Result<()> {
        let mut started = self.lock();
        self.append(&format!("!{key}"))?;
        started.remove(key);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn started_replies_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let journal = ReplyJournal::open(dir.path(), "line").unwrap();
        assert!(!journal.started("k#0"));
        journal.start("k#0").unwrap();
        journal.start("k#0").unwrap();
        assert!(journal.started("k#0"));
        let again = ReplyJournal::open(dir.path(), "line").unwrap();
        assert!(again.started("k#0"));
        assert!(!again.started("k#1"));
        let text = std::fs::read_to_string(dir.path().join("line.reply-journal")).unwrap();
        assert_eq!(text, "k#0\n");
        again.refused("k#0").unwrap();
        assert!(!again.started("k#0"));
        assert!(
            !ReplyJournal::open(dir.path(), "line")
                .unwrap()
                .started("k#0")
        );
    }
}
