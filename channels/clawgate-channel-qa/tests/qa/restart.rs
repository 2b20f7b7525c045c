//! The platform's state file: a restarted platform answers as if it had never stopped, and a
//! file it cannot read stops it from starting without being touched.

use std::path::{Path, PathBuf};

use clawgate_channel_qa::{
    InboundRequest, MessageAnswer, QaPlatform, QaPlatformConfig, SendRequest, Update, UpdatesAnswer,
};

fn config(state_path: PathBuf) -> QaPlatformConfig {
    QaPlatformConfig {
        state_path: Some(state_path),
        ..QaPlatformConfig::default()
    }
}

/// One HTTP client speaking the platform's API with its token.
struct Api<'a> {
    platform: &'a QaPlatform,
    http: reqwest::Client,
}

impl<'a> Api<'a> {
    fn new(platform: &'a QaPlatform) -> Self {
        Api {
            platform,
            http: reqwest::Client::new(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.platform.base_url())
    }

    /// Sends and answers the status, whether it was a replay, and the message.
    async fn send(&self, text: &str, key: Option<&str>) -> (u16, bool, MessageAnswer) {
        let request = SendRequest {
            text: text.into(),
            attachments: Vec::new(),
            thread_id: None,
            reply_to_id: None,
            metadata: None,
            idempotency_key: key.map(str::to_owned),
        };
        let response = self
            .http
            .post(self.url("/api/conversations/c1/messages"))
            .bearer_auth(self.platform.token())
            .json(&request)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let replay = response.headers().contains_key("idempotent-replay");
        (status, replay, response.json().await.unwrap())
    }

    async fn edit(&self, id: &str, text: &str) {
        let response = self
            .http
            .patch(self.url(&format!("/api/conversations/c1/messages/{id}")))
            .bearer_auth(self.platform.token())
            .json(&serde_json::json!({ "text": text }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }

    async fn delete(&self, id: &str) {
        let response = self
            .http
            .delete(self.url(&format!("/api/conversations/c1/messages/{id}")))
            .bearer_auth(self.platform.token())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }

    async fn updates(&self, offset: Option<i64>) -> Vec<Update> {
        let query = offset.map(|o| format!("?offset={o}")).unwrap_or_default();
        let response = self
            .http
            .get(self.url(&format!("/api/updates{query}")))
            .bearer_auth(self.platform.token())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json::<UpdatesAnswer>().await.unwrap().result
    }
}

fn inbound(platform: &QaPlatform, text: &str) -> String {
    let request = InboundRequest {
        text: text.into(),
        author_id: "alice".into(),
        author_is_bot: false,
        thread_id: None,
        reply_to_id: None,
        metadata: None,
    };
    platform.inject_inbound("c1", request).unwrap().id
}

fn ids(updates: &[Update]) -> Vec<i64> {
    updates.iter().map(|u| u.update_id).collect()
}

#[tokio::test]
async fn a_restarted_platform_keeps_messages_keys_and_unconfirmed_updates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qa-state.json");

    let first = QaPlatform::start(config(path.clone())).await.unwrap();
    let api = Api::new(&first);
    let (status, _, keyed) = api.send("keyed", Some("k1")).await;
    assert_eq!(status, 201);
    let (_, _, edited) = api.send("before edit", None).await;
    api.edit(&edited.message.id, "after edit").await;
    let (_, _, deleted) = api.send("to delete", None).await;
    api.delete(&deleted.message.id).await;
    let (status, replay, replayed) = api.send("keyed again", Some("k1")).await;
    assert_eq!((status, replay), (200, true));
    assert_eq!(replayed.message.id, keyed.message.id);
    inbound(&first, "confirmed before the restart");
    inbound(&first, "still pending at the restart");
    let old_updates = api.updates(None).await;
    assert_eq!(old_updates.len(), 2);
    // Asking from the second update confirms the first one.
    assert_eq!(
        ids(&api.updates(Some(old_updates[1].update_id)).await),
        ids(&old_updates[1..])
    );
    let messages = first.messages("c1");
    let log = first.log();
    let addr = first.addr();
    first.stop().await;

    // Same address too: stopping released the port.
    let second = QaPlatform::start(QaPlatformConfig {
        bind: addr,
        ..config(path)
    })
    .await
    .unwrap();
    let api = Api::new(&second);
    assert_eq!(second.messages("c1"), messages);
    assert_eq!(second.log(), log);
    assert_eq!(second.landed_count("k1"), 1);
    let (status, replay, replayed) = api.send("keyed once more", Some("k1")).await;
    assert_eq!((status, replay), (200, true));
    assert_eq!(replayed.message, keyed.message);
    assert_eq!(second.landed_count("k1"), 1);

    assert_eq!(ids(&api.updates(None).await), ids(&old_updates[1..]));
    let newest = inbound(&second, "after the restart");
    assert!(
        messages.iter().all(|m| m.id != newest),
        "ids are not reused"
    );
    let updates = api.updates(None).await;
    assert_eq!(updates.len(), 2);
    assert_eq!(updates[0].update_id, old_updates[1].update_id);
    assert!(updates[1].update_id > old_updates[1].update_id);
    assert_eq!(updates[1].message.id, newest);
}

/// `start` on an unreadable state file fails with `InvalidData`, names the file, says what to do
/// and leaves the file exactly as it was.
async fn refused(path: &Path, contents: &[u8]) -> String {
    std::fs::write(path, contents).unwrap();
    let error = QaPlatform::start(config(path.to_owned()))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(std::fs::read(path).unwrap(), contents);
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("move it away"), "{message}");
    message
}

#[tokio::test]
async fn a_corrupt_state_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qa-state.json");
    refused(&path, b"{\"format\": 1, \"seq\": 3, \"mess").await;
}

#[tokio::test]
async fn a_state_file_of_an_unknown_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qa-state.json");
    let message = refused(&path, br#"{"format": 2, "somethingNew": []}"#).await;
    assert!(message.contains("format 2"), "{message}");
}
