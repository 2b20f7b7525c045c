//! One BlueBubbles REST call, and what its failure means.
//!
//! The server password goes in the query string (`?password=`): every URL this module builds
//! carries it, so no URL ever reaches an error, a log line or `Debug` (reqwest's errors are
//! stripped of theirs, and any text that still names the password is withheld).
//!
//! Answers are the server's envelope: `{status, message, data}` on success,
//! `{status, message, error: {type, message}}` (and for a failed iMessage send, the failed
//! message in `data`) otherwise (platform-apis-wave2 §3.1).

use std::time::Duration;

use clawgate_channel_sdk::Secret;
use serde_json::{Value, json};

/// How one call failed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallError {
    /// The server answered with an error envelope.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The envelope's `message` ("Message Send Error", "Bad Request"…).
        message: String,
        /// `error.type` ("iMessage Error", "Validation Error", "Gateway Timeout"…).
        kind: Option<String>,
        /// `error.message`.
        detail: Option<String>,
        /// `data` (a failed send carries the failed message here).
        data: Value,
    },
    /// Nothing reached the server (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back: the server may have acted.
    Lost(String),
}

impl CallError {
    /// One line for errors and logs (never the password).
    pub(crate) fn describe(&self) -> String {
        match self {
            CallError::Refused {
                status,
                message,
                kind,
                detail,
                ..
            } => {
                let mut text = format!("HTTP {status} {message:?}");
                if let Some(kind) = kind {
                    text.push_str(&format!(" ({kind}"));
                    if let Some(detail) = detail {
                        text.push_str(&format!(": {detail}"));
                    }
                    text.push(')');
                }
                text
            }
            CallError::Unreachable(reason) => format!("the server is unreachable: {reason}"),
            CallError::Lost(reason) => format!(
                "the request went out and no usable answer came back ({reason}); the server may \
                 have acted"
            ),
        }
    }

    /// Whether this is the answer to a request whose `tempGuid` is still being sent.
    pub(crate) fn already_queued(&self) -> bool {
        matches!(self, CallError::Refused { status: 400, detail: Some(d), .. } | CallError::Refused { status: 400, message: d, .. } if d.contains("already queued"))
    }
}

/// The BlueBubbles server and the HTTP client.
#[derive(Clone)]
pub(crate) struct BlueBubbles {
    base: String,
    password: Secret,
    http: reqwest::Client,
    timeout: Duration,
}

impl std::fmt::Debug for BlueBubbles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlueBubbles")
            .field("base", &self.base)
            .field("password", &"<redacted>")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl BlueBubbles {
    /// Calls to `base` (`http://mac.local:1234`, the simulator), authenticated with
    /// `password`; a call may take `timeout` before its outcome counts as unknown (a text send
    /// is answered only once its chat.db row exists: up to 2 minutes).
    pub(crate) fn new(base: &str, password: Secret, timeout: Duration) -> BlueBubbles {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        BlueBubbles {
            base: base.trim_end_matches('/').to_owned(),
            password,
            http,
            timeout,
        }
    }

    fn url(&self, path: &str) -> String {
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("password", self.password.expose())
            .finish();
        format!("{}{path}?{query}", self.base)
    }

    /// Removes anything naming the password from `text`.
    fn redact(&self, text: String) -> String {
        let secret = self.password.expose();
        let encoded: String = form_urlencoded::byte_serialize(secret.as_bytes()).collect();
        if text.contains("password=")
            || (!secret.is_empty() && (text.contains(secret) || text.contains(&encoded)))
        {
            return "the request failed (details withheld: they name the server password)".into();
        }
        text
    }

    fn describe(&self, error: reqwest::Error) -> String {
        let error = error.without_url();
        let mut text = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        self.redact(text)
    }

    /// `method path` with `body`; the answer's `data`.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        let mut request = self.http.request(method, self.url(path));
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.timeout(self.timeout).send().await {
            Ok(response) => response,
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(self.describe(error)));
            }
            Err(error) => return Err(CallError::Lost(self.describe(error))),
        };
        let status = response.status().as_u16();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(self.describe(e)))?;
        let envelope: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let text = |v: &Value| v.as_str().map(str::to_owned);
        match envelope.get("status").and_then(Value::as_u64) {
            Some(_) if (200..300).contains(&status) => {
                Ok(envelope.get("data").cloned().unwrap_or(Value::Null))
            }
            Some(_) => Err(CallError::Refused {
                status,
                message: envelope.get("message").and_then(text).unwrap_or_default(),
                kind: envelope.pointer("/error/type").and_then(text),
                detail: envelope.pointer("/error/message").and_then(text),
                data: envelope.get("data").cloned().unwrap_or(Value::Null),
            }),
            // A proxy's page, a cut body: the server may have acted before it.
            None => Err(CallError::Lost(format!(
                "HTTP {status} without a BlueBubbles envelope"
            ))),
        }
    }

    /// `GET /api/v1/server/info`.
    pub(crate) async fn server_info(&self) -> Result<Value, CallError> {
        self.call(reqwest::Method::GET, "/api/v1/server/info", None)
            .await
    }

    /// `POST /api/v1/message/text`: answered with the sent message once its row exists.
    pub(crate) async fn send_text(
        &self,
        chat_guid: &str,
        temp_guid: &str,
        text: &str,
        method: &str,
    ) -> Result<Value, CallError> {
        let body = json!({
            "chatGuid": chat_guid,
            "tempGuid": temp_guid,
            "message": text,
            "method": method,
        });
        self.call(reqwest::Method::POST, "/api/v1/message/text", Some(&body))
            .await
    }

    /// `POST /api/v1/message/query`: the chat's messages created at or after `after_ms`,
    /// oldest first.
    pub(crate) async fn messages_since(
        &self,
        chat_guid: &str,
        after_ms: u64,
        limit: u32,
    ) -> Result<Vec<Value>, CallError> {
        let body = json!({
            "chatGuid": chat_guid,
            "after": after_ms,
            "limit": limit,
            "sort": "ASC",
            "with": ["chat"],
        });
        let data = self
            .call(reqwest::Method::POST, "/api/v1/message/query", Some(&body))
            .await?;
        Ok(data.as_array().cloned().unwrap_or_default())
    }

    /// `POST /api/v1/message/:guid/edit` (Private API).
    pub(crate) async fn edit(&self, guid: &str, text: &str) -> Result<Value, CallError> {
        let body = json!({
            "editedMessage": text,
            "backwardsCompatibilityMessage": format!("Edited to \u{201c}{text}\u{201d}"),
            "partIndex": 0,
        });
        let path = format!("/api/v1/message/{}/edit", encode(guid));
        self.call(reqwest::Method::POST, &path, Some(&body)).await
    }

    /// `POST /api/v1/message/:guid/unsend` (Private API).
    pub(crate) async fn unsend(&self, guid: &str) -> Result<Value, CallError> {
        let body = json!({ "partIndex": 0 });
        let path = format!("/api/v1/message/{}/unsend", encode(guid));
        self.call(reqwest::Method::POST, &path, Some(&body)).await
    }
}

/// A guid as one path segment.
fn encode(segment: &str) -> String {
    form_urlencoded::byte_serialize(segment.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_password_never_reaches_an_error_or_debug() {
        let api = BlueBubbles::new(
            "http://127.0.0.1:1",
            Secret::new("very secret/pass"),
            Duration::from_secs(2),
        );
        let error = api.server_info().await.unwrap_err();
        assert!(matches!(error, CallError::Unreachable(_)), "{error:?}");
        let text = format!("{error:?} {} {api:?}", error.describe());
        assert!(!text.contains("very"), "{text}");
        assert!(!text.contains("password="), "{text}");
        // Whatever text names it is withheld, encoded or not.
        assert!(
            !api.redact("GET http://x/?password=very%20secret%2Fpass".into())
                .contains("very")
        );
        assert!(!api.redact("oops very secret/pass".into()).contains("very"));
    }
}
