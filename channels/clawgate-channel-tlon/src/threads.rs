//! The threads this account takes part in: once one of our replies landed in a group
//! channel's thread, later posts in that thread are answered without a mention (groups answer
//! only mentions otherwise). The record is durable — a file in the channel's state directory,
//! replaced atomically (written beside it, synced, renamed) — so a restart keeps answering in
//! those threads.
//!
//! A reply is recorded when its poke's `ok` arrives, when recovery finds it landed, and again
//! after its receipt is committed ([`ChannelMessageAdapter::after_commit`]); recording is
//! idempotent.
//!
//! [`ChannelMessageAdapter::after_commit`]: clawgate_channel_sdk::ChannelMessageAdapter::after_commit

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use tracing::warn;

/// The participated threads of one account: `<nest> <parent post id>` pairs.
#[derive(Debug, Default)]
pub struct ParticipatedThreads {
    path: Option<PathBuf>,
    threads: Mutex<BTreeSet<String>>,
}

fn key(nest: &str, parent: &str) -> String {
    format!("{nest} {parent}")
}

impl ParticipatedThreads {
    /// A record kept only in memory (tests, a channel without a state directory).
    pub fn in_memory() -> ParticipatedThreads {
        ParticipatedThreads::default()
    }

    /// The record in `path`, as far as it was written (a missing file is an empty record; an
    /// unreadable one is reported and starts empty).
    pub fn load(path: PathBuf) -> ParticipatedThreads {
        let threads = match std::fs::read_to_string(&path) {
            Ok(text) => text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_owned)
                .collect(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(error) => {
                warn!(path = %path.display(), %error, "could not read the participated threads; starting without them");
                BTreeSet::new()
            }
        };
        ParticipatedThreads {
            path: Some(path),
            threads: Mutex::new(threads),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether we replied in thread `parent` of channel `nest`.
    pub fn contains(&self, nest: &str, parent: &str) -> bool {
        self.lock().contains(&key(nest, parent))
    }

    /// Every recorded thread, as `(nest, parent)`.
    pub fn all(&self) -> Vec<(String, String)> {
        self.lock()
            .iter()
            .filter_map(|k| {
                let (nest, parent) = k.split_once(' ')?;
                Some((nest.to_owned(), parent.to_owned()))
            })
            .collect()
    }

    /// Records thread `parent` of `nest` (durably when a path is set); `Ok(true)` when it is
    /// new. Under the lock, so two records never lose each other's line.
    pub fn record(&self, nest: &str, parent: &str) -> std::io::Result<bool> {
        let mut threads = self.lock();
        if !threads.insert(key(nest, parent)) {
            return Ok(false);
        }
        if let Some(path) = &self.path {
            let tmp = path.with_extension("tmp");
            let write = || -> std::io::Result<()> {
                let mut file = std::fs::File::create(&tmp)?;
                for line in threads.iter() {
                    writeln!(file, "{line}")?;
                }
                file.sync_all()?;
                std::fs::rename(&tmp, path)?;
                if let Some(dir) = path.parent() {
                    std::fs::File::open(dir)?.sync_all()?;
                }
                Ok(())
            };
            if let Err(error) = write() {
                threads.remove(&key(nest, parent));
                return Err(error);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_reload_and_repeat_harmlessly() {
        let dir = std::env::temp_dir().join(format!("tlon-threads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("participated-threads");
        let _ = std::fs::remove_file(&path);
        let threads = ParticipatedThreads::load(path.clone());
        assert!(threads.record("chat/~zod/general", "170.1").expect("write"));
        assert!(!threads.record("chat/~zod/general", "170.1").expect("again"));
        let again = ParticipatedThreads::load(path.clone());
        assert!(again.contains("chat/~zod/general", "170.1"));
        assert!(!again.contains("chat/~zod/general", "170.2"));
        assert_eq!(again.all().len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
