//! Where events come from: Meta posting webhook notifications to a listener of ours.
//!
//! - `GET` is the verification handshake Meta runs when the callback URL is configured:
//!   `hub.mode=subscribe` and `hub.verify_token` equal to ours (compared in constant time) are
//!   answered with `hub.challenge`, anything else 403.
//! - `POST` is checked before anything parses it: `X-Hub-Signature-256` over the raw body with
//!   the app secret, in constant time; every refusal is the same 401, its reason logged only.
//! - A delivery may batch several messages and statuses. Each message is handed to the engine
//!   as an envelope of its own (event id: its `wamid`); each status carrying our
//!   `biz_opaque_callback_data` is written to the [`StatusBook`] (it settles sends; it is never
//!   a turn). The answer is 200 only once every message and every status is recorded durably;
//!   otherwise 503 and Meta delivers the whole batch again, which the engine and the
//!   book deduplicate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use clawgate_channel_sdk::listener::{self, Limits};
use clawgate_channel_sdk::{
    AckAnswer, AckSignal, EventSink, PushedEvent, PushedFeed, Secret, SourceError,
};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::client::GraphApi;
use crate::signature::{self, SIGNATURE_HEADER};
use crate::status::StatusBook;

/// The largest webhook body: Meta documents payloads of up to 3 MB (platform-apis-wave2 §1.3).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// How the webhook listener is set up.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The address the listener binds (a reverse proxy terminates TLS in front of it).
    pub listen: SocketAddr,
    /// The path of the callback URL.
    pub path: String,
    /// The Meta app's secret: every delivery is signed with it.
    pub app_secret: Secret,
    /// The verify token typed into the app's webhook configuration.
    pub verify_token: Secret,
    /// How long a delivery waits for the engine's durable record before answering 503.
    pub answer_deadline: Duration,
}

/// The webhook listener.
#[derive(Debug)]
pub struct WebhookSource {
    config: WebhookConfig,
    book: StatusBook,
    /// Marks each recorded message read, when the account says so.
    mark_read: Option<GraphApi>,
}

impl WebhookSource {
    pub(crate) fn new(
        config: WebhookConfig,
        book: StatusBook,
        mark_read: Option<GraphApi>,
    ) -> WebhookSource {
        WebhookSource {
            config,
            book,
            mark_read,
        }
    }
}

struct Delivery {
    sink: Arc<dyn EventSink>,
    config: WebhookConfig,
    book: StatusBook,
    mark_read: Option<GraphApi>,
}

/// Byte-wise comparison whose time does not depend on where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn verify(
    State(delivery): State<Arc<Delivery>>,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let mode = query.get("hub.mode").map(String::as_str);
    let token = query.get("hub.verify_token").map(String::as_str);
    let expected = delivery.config.verify_token.expose().as_bytes();
    match (mode, token, query.get("hub.challenge")) {
        (Some("subscribe"), Some(token), Some(challenge)) if same(token.as_bytes(), expected) => {
            info!("WhatsApp webhook verified");
            ([(header::CONTENT_TYPE, "text/plain")], challenge.clone()).into_response()
        }
        _ => {
            warn!("a WhatsApp webhook verification was refused (wrong hub.verify_token or mode)");
            (StatusCode::FORBIDDEN, "verification refused").into_response()
        }
    }
}

/// One delivery's messages, each as an envelope of its own, and its statuses.
fn split(raw: &Value) -> (Vec<Value>, Vec<Value>) {
    let (mut messages, mut statuses) = (Vec::new(), Vec::new());
    let entries = raw.get("entry").and_then(Value::as_array);
    for entry in entries.into_iter().flatten() {
        let changes = entry.get("changes").and_then(Value::as_array);
        for change in changes.into_iter().flatten() {
            if change.get("field").and_then(Value::as_str) != Some("messages") {
                continue;
            }
            let Some(value) = change.get("value") else {
                continue;
            };
            let items = value.get("messages").and_then(Value::as_array);
            for message in items.into_iter().flatten() {
                let mut value = value.clone();
                value["messages"] = json!([message]);
                if let Some(object) = value.as_object_mut() {
                    object.remove("statuses");
                }
                messages.push(json!({
                    "object": raw["object"],
                    "entry": [{ "id": entry["id"], "changes": [{ "field": "messages", "value": value }] }],
                }));
            }
            let items = value.get("statuses").and_then(Value::as_array);
            statuses.extend(items.into_iter().flatten().cloned());
        }
    }
    (messages, statuses)
}

/// Writes one status of ours to the book; statuses of messages sent by others (another app on
/// the same number, the Business app) carry no key of ours and are only logged.
async fn record_status(book: &StatusBook, status: &Value) -> bool {
    let text = |key: &str| status.get(key).and_then(Value::as_str);
    let (Some(key), Some(wamid), Some(state)) =
        (text("biz_opaque_callback_data"), text("id"), text("status"))
    else {
        debug!(status = %status, "a status without our callback data");
        return true;
    };
    let failure = status.pointer("/errors/0/code").and_then(Value::as_i64);
    if state == "failed" {
        warn!(key, wamid, code = ?failure, "WhatsApp reports a message failed");
    }
    match book.status(key, wamid, state, failure).await {
        Ok(()) => true,
        Err(error) => {
            warn!(%error, "a status could not be recorded; Meta will deliver it again");
            false
        }
    }
}

async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    if let Err(error) = signature::verify(
        delivery.config.app_secret.expose().as_bytes(),
        header,
        &body,
    ) {
        warn!(%error, "a WhatsApp webhook delivery was refused");
        return listener::refused();
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw @ Value::Object(_)) => raw,
        _ => return (StatusCode::BAD_REQUEST, "not a JSON notification").into_response(),
    };
    if raw.get("object").and_then(Value::as_str) != Some("whatsapp_business_account") {
        // Another product's notification: nothing for this channel.
        return StatusCode::OK.into_response();
    }
    let (messages, statuses) = split(&raw);
    let mut complete = true;
    for status in &statuses {
        complete &= record_status(&delivery.book, status).await;
    }
    let mut waiting = Vec::with_capacity(messages.len());
    for message in messages {
        let wamid = message
            .pointer("/entry/0/changes/0/value/messages/0/id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let (ack, signal) = AckSignal::new();
        delivery.sink.deliver(PushedEvent::new(message, ack)).await;
        waiting.push((wamid, signal));
    }
    let mut recorded = Vec::new();
    for (wamid, signal) in waiting {
        match signal.answer(delivery.config.answer_deadline).await {
            AckAnswer::Acked => recorded.extend(wamid),
            _ => complete = false,
        }
    }
    if let Some(api) = delivery.mark_read.clone() {
        // Best effort, after the durable record; a read receipt is not the ack.
        tokio::spawn(async move {
            for wamid in recorded {
                let body = json!({ "messaging_product": "whatsapp", "status": "read", "message_id": wamid });
                if let Err(error) = api.messages(&body).await {
                    debug!(?error, "marking a message read failed");
                }
            }
        });
    }
    if complete {
        StatusCode::OK.into_response()
    } else {
        // Meta delivers it again; the engine and the book deduplicate.
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

#[async_trait]
impl PushedFeed for WebhookSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            config: self.config.clone(),
            book: self.book.clone(),
            mark_read: self.mark_read.clone(),
        });
        let app = axum::Router::new()
            .route(&self.config.path, get(verify).post(deliver))
            .with_state(state);
        listener::serve(
            "the WhatsApp webhook listener",
            self.config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_split_into_one_envelope_per_message_and_its_statuses() {
        let raw = json!({
            "object": "whatsapp_business_account",
            "entry": [{ "id": "W", "changes": [{ "field": "messages", "value": {
                "metadata": { "phone_number_id": "PN" },
                "messages": [{ "id": "wamid.1" }, { "id": "wamid.2" }],
                "statuses": [{ "id": "wamid.9", "status": "sent" }],
            }}]}],
        });
        let (messages, statuses) = split(&raw);
        assert_eq!(messages.len(), 2);
        assert_eq!(
            messages[1].pointer("/entry/0/changes/0/value/messages/0/id"),
            Some(&json!("wamid.2"))
        );
        assert_eq!(
            messages[1].pointer("/entry/0/changes/0/value/metadata/phone_number_id"),
            Some(&json!("PN"))
        );
        assert!(
            messages[0]
                .pointer("/entry/0/changes/0/value/statuses")
                .is_none()
        );
        assert_eq!(statuses.len(), 1);
    }

    #[test]
    fn token_comparison_is_exact() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
    }
}
