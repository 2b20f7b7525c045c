//! Conversation references: for each conversation Teams wrote to the bot from, the service URL
//! its activities came with (the only place the bot may send to for it) and its type. Kept in
//! the gateway's store, one value per conversation (`reference/<conversation id>`), written
//! before the activity that taught it is acknowledged, so replies after a restart, proactive
//! sends and another gateway sharing the store all go where Teams said.

use std::collections::BTreeMap;

use clawgate_channel_sdk::{ChannelState, ImportError, LegacyFiles, StateError};
use serde::{Deserialize, Serialize};

/// The file an earlier release kept the references of every Teams account in (in the state
/// directory); imported into the store once, then renamed `teams-conversations.json.imported`.
pub const REFERENCES_FILE: &str = "teams-conversations.json";

/// The prefix of a reference's value name; the rest is the conversation id.
const VALUE_PREFIX: &str = "reference/";

/// What the bot knows about one conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationReference {
    /// Where its activities are sent (`serviceUrl` of the last activity from it).
    pub service_url: String,
    /// `personal`, `groupChat` or `channel`.
    pub conversation_type: String,
}

/// The references of one bot, shared by the source (which learns them) and the sender. Every
/// read goes to the store: another gateway may have learned a reference since.
#[derive(Debug, Clone)]
pub(crate) struct References {
    state: ChannelState,
}

fn value_name(conversation: &str) -> String {
    format!("{VALUE_PREFIX}{conversation}")
}

impl References {
    /// The references kept in `state`, after importing the file an earlier release wrote.
    pub(crate) async fn open(
        state: ChannelState,
        legacy: &LegacyFiles,
    ) -> Result<References, ImportError> {
        let references = References { state };
        references.import(legacy).await?;
        Ok(references)
    }

    /// Imports [`REFERENCES_FILE`] once (see [`ChannelState::import_values`]: a reference
    /// already in the store wins, as it was learned later).
    async fn import(&self, legacy: &LegacyFiles) -> Result<(), ImportError> {
        let imported = self
            .state
            .import_values(legacy, REFERENCES_FILE, |bytes| {
                let known: BTreeMap<String, ConversationReference> = serde_json::from_slice(bytes)
                    .map_err(|e| format!("not a references file ({e})"))?;
                Ok(known
                    .into_iter()
                    .map(|(conversation, reference)| (value_name(&conversation), reference)))
            })
            .await?;
        if imported.retired {
            tracing::info!(
                written = imported.written,
                kept = imported.kept,
                "imported the Teams conversation references of {REFERENCES_FILE}"
            );
        }
        Ok(())
    }

    /// The reference of `conversation` (a channel's id without `;messageid=`).
    pub(crate) async fn get(
        &self,
        conversation: &str,
    ) -> Result<Option<ConversationReference>, StateError> {
        Ok(self
            .state
            .value(&value_name(conversation))
            .await?
            .map(|v| v.value))
    }

    /// Records `reference` for `conversation` (the newest activity's is the one Teams wants
    /// used); the store is written only when it changed.
    pub(crate) async fn learn(
        &self,
        conversation: &str,
        reference: ConversationReference,
    ) -> Result<(), StateError> {
        if self.get(conversation).await?.as_ref() == Some(&reference) {
            return Ok(());
        }
        self.state
            .put(&value_name(conversation), &reference)
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn reference(url: &str) -> ConversationReference {
        ConversationReference {
            service_url: url.into(),
            conversation_type: "personal".into(),
        }
    }

    fn state(dir: &std::path::Path, account: &str) -> ChannelState {
        clawgate_conformance::channel_state(dir, "teams", account)
    }

    #[tokio::test]
    async fn references_survive_a_reopen_and_are_seen_by_another_gateway() {
        let dir = tempfile::tempdir().expect("tempdir");
        let refs = References::open(state(dir.path(), "default"), &LegacyFiles::none())
            .await
            .expect("opens");
        let first = reference("https://smba.trafficmanager.net/emea/");
        refs.learn("a:1", first.clone()).await.expect("writes");
        // Another process on the same store.
        let again = References::open(state(dir.path(), "default"), &LegacyFiles::none())
            .await
            .expect("reopens");
        assert_eq!(again.get("a:1").await.unwrap(), Some(first));
        assert_eq!(again.get("a:2").await.unwrap(), None);
        // A newer service URL learned there is what this one sends to next.
        let moved = reference("https://smba.trafficmanager.net/amer/");
        again.learn("a:1", moved.clone()).await.expect("writes");
        assert_eq!(refs.get("a:1").await.unwrap(), Some(moved));
    }

    #[tokio::test]
    async fn the_old_file_is_imported_once_and_a_stored_reference_wins() {
        let old = tempfile::tempdir().expect("tempdir");
        let dir = tempfile::tempdir().expect("tempdir");
        // The file as the earlier release wrote it (pretty JSON, one entry per conversation).
        let file = serde_json::to_vec_pretty(&BTreeMap::from([
            ("a:1".to_owned(), reference("https://old.example/a/")),
            (
                "19:x@thread.tacv2".to_owned(),
                reference("https://old.example/b/"),
            ),
        ]))
        .unwrap();
        std::fs::write(old.path().join(REFERENCES_FILE), &file).unwrap();
        // Learned (by a gateway already on the store) before the import: it wins.
        let newer = reference("https://new.example/a/");
        References::open(state(dir.path(), "default"), &LegacyFiles::none())
            .await
            .unwrap()
            .learn("a:1", newer.clone())
            .await
            .unwrap();
        let legacy = LegacyFiles::in_dir(old.path());
        let refs = References::open(state(dir.path(), "default"), &legacy)
            .await
            .expect("imports");
        assert_eq!(refs.get("a:1").await.unwrap(), Some(newer));
        assert_eq!(
            refs.get("19:x@thread.tacv2").await.unwrap(),
            Some(reference("https://old.example/b/"))
        );
        assert!(!old.path().join(REFERENCES_FILE).exists());
        assert!(
            old.path()
                .join(format!("{REFERENCES_FILE}.imported"))
                .is_file()
        );
        // A crash before the rename: the file is there again and imports nothing twice (each
        // value is still at its first version).
        std::fs::write(old.path().join(REFERENCES_FILE), &file).unwrap();
        References::open(state(dir.path(), "default"), &legacy)
            .await
            .expect("imports again");
        let stored = state(dir.path(), "default")
            .value::<ConversationReference>("reference/19:x@thread.tacv2")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.version, 1);
        assert_eq!(
            refs.get("a:1").await.unwrap(),
            Some(reference("https://new.example/a/"))
        );
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_references_file_stops_the_start_naming_it() {
        let old = tempfile::tempdir().expect("tempdir");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(old.path().join(REFERENCES_FILE), b"{not json").unwrap();
        let error = References::open(
            state(dir.path(), "default"),
            &LegacyFiles::in_dir(old.path()),
        )
        .await
        .expect_err("refused");
        assert!(error.to_string().contains(REFERENCES_FILE), "{error}");
        assert!(old.path().join(REFERENCES_FILE).is_file(), "left in place");
    }
}
