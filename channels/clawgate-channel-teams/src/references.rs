//! Conversation references: for each conversation Teams wrote to the bot from, the service URL
//! its activities came with (the only place the bot may send to for it) and its type. Kept in
//! a file of the channel's state directory, so replies after a restart and proactive sends go
//! where Teams said; written (synced, then renamed into place) before the activity that taught
//! it is acknowledged.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// The file's name in the state directory.
pub const REFERENCES_FILE: &str = "teams-conversations.json";

/// What the bot knows about one conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationReference {
    /// Where its activities are sent (`serviceUrl` of the last activity from it).
    pub service_url: String,
    /// `personal`, `groupChat` or `channel`.
    pub conversation_type: String,
}

/// The references, shared by the source (which learns them) and the sender.
#[derive(Debug, Clone)]
pub(crate) struct References {
    path: PathBuf,
    known: Arc<Mutex<BTreeMap<String, ConversationReference>>>,
}

impl References {
    /// The references kept under `dir` (none yet when the file does not exist).
    pub(crate) fn open(dir: &Path) -> Result<References, String> {
        let path = dir.join(REFERENCES_FILE);
        let known = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("{} is not a references file: {e}", path.display()))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(error) => return Err(format!("{} cannot be read: {error}", path.display())),
        };
        Ok(References {
            path,
            known: Arc::new(Mutex::new(known)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ConversationReference>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The reference of `conversation` (a channel's id without `;messageid=`).
    pub(crate) fn get(&self, conversation: &str) -> Option<ConversationReference> {
        self.lock().get(conversation).cloned()
    }

    /// Records `reference` for `conversation`; the file is rewritten only when it changed.
    pub(crate) fn learn(
        &self,
        conversation: &str,
        reference: ConversationReference,
    ) -> std::io::Result<()> {
        let mut known = self.lock();
        if known.get(conversation) == Some(&reference) {
            return Ok(());
        }
        let mut next = known.clone();
        next.insert(conversation.to_owned(), reference);
        let bytes = serde_json::to_vec_pretty(&next).map_err(std::io::Error::other)?;
        let tmp = self.path.with_extension("json.tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        *known = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let refs = References::open(dir.path()).expect("opens");
        let reference = ConversationReference {
            service_url: "https://smba.trafficmanager.net/emea/".into(),
            conversation_type: "personal".into(),
        };
        refs.learn("a:1", reference.clone()).expect("writes");
        let again = References::open(dir.path()).expect("reopens");
        assert_eq!(again.get("a:1"), Some(reference));
        assert_eq!(again.get("a:2"), None);
    }
}
