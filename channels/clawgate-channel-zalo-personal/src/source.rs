//! The listener: the account's one Zalo Web WebSocket (zca-js `listen.ts`), as a pushed feed.
//!
//! - Connect to the first `zpw_ws` URL (`?zpw_ver=…&zpw_type=…&t=<ms>`) with the session's
//!   cookie, user agent and `Origin: https://chat.zalo.me`.
//! - The first frame (1, 1, 1) carries the cipher `key` of the connection's encrypted frames;
//!   from then on the client pings (1, 2, 1) `{"eventId": <ms>}` every `ping_interval`.
//! - (1, 501, 0) direct and (1, 521, 0) group message frames carry `{"data", "encrypt"}`,
//!   decoded as [`crate::wire::decode_event`] says, holding `msgs` / `groupMsgs`. People's
//!   messages go to the engine (its durable record dedupes on `msgId`); the account's own
//!   (`uidFrom` "0") are never answered, and those with one of our `clientId`s as `cliMsgId`
//!   (used by any gateway on the store) are written to the [`SendBook`] (they settle sends
//!   whose answer was lost).
//! - A (1, 3000, 0) frame or close code 3000/3003 means another session took the account's
//!   one listener: the account is marked taken over ([`Account::take_over`], logged at error
//!   with what to do) and the feed **stays down** without reconnecting. Any other close or a
//!   broken connection ends the run with a transient error and the engine connects again.
//!
//! Zalo has no catch-up: what people write while no listener is connected is not pushed
//! later. The README says what that means.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{EventSink, NoTransportAck, PushedEvent, PushedFeed, SourceError};
use clawgate_types::DeliveryFailureKind;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tracing::{debug, info, warn};

use crate::account::Account;
use crate::book::SendBook;
use crate::client::{LoginError, ORIGIN};
use crate::wire::{self, API_TYPE, API_VERSION, close, cmd};

/// The listener of one account.
#[derive(Debug, Clone)]
pub struct ZaloListener {
    name: String,
    account: Account,
    book: SendBook,
    timeout: Duration,
}

fn transient(message: impl Into<String>) -> SourceError {
    SourceError::new(DeliveryFailureKind::Transient, message)
}

/// The id in a message field (a string, or a number in some frames).
pub(crate) fn id_of(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

enum End {
    Stopped,
    TakenOver,
}

impl ZaloListener {
    pub(crate) fn new(name: &str, account: Account, book: SendBook, timeout: Duration) -> Self {
        ZaloListener {
            name: name.to_owned(),
            account,
            book,
            timeout,
        }
    }

    async fn stay_down(&self, sink: &Arc<dyn EventSink>) -> Result<(), SourceError> {
        // Not an error for the engine to retry: the feed ends when the gateway stops.
        sink.stopped().await;
        Ok(())
    }

    async fn connect(&self, sink: &Arc<dyn EventSink>) -> Result<End, SourceError> {
        let session = match self.account.session().await {
            Ok(session) => session,
            Err(error @ LoginError::Refused(_)) => {
                return Err(SourceError::new(
                    DeliveryFailureKind::Auth,
                    error.to_string(),
                ));
            }
            Err(error) => return Err(transient(error.to_string())),
        };
        let base = session
            .ws_urls
            .first()
            .cloned()
            .ok_or_else(|| transient("the login gave no listener URL"))?;
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!(
            "{base}{sep}zpw_ver={API_VERSION}&zpw_type={API_TYPE}&t={}",
            self.account.client().now_ms()
        );
        let credentials = self.account.client().credentials();
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| transient(format!("Zalo listener URL: {e}")))?;
        let headers = request.headers_mut();
        for (name, value) in [
            ("cookie", credentials.cookie.expose()),
            ("user-agent", credentials.user_agent.as_str()),
            ("origin", ORIGIN),
            ("cache-control", "no-cache"),
        ] {
            headers.insert(
                name,
                value.parse().map_err(|_| {
                    SourceError::new(
                        DeliveryFailureKind::Auth,
                        format!("the {name} is not a valid header value"),
                    )
                })?,
            );
        }
        let connecting =
            tokio::time::timeout(self.timeout, tokio_tungstenite::connect_async(request))
                .await
                .map_err(|_| transient("Zalo listener: the handshake timed out"))?;
        let socket = match connecting {
            Ok((socket, _)) => socket,
            Err(tokio_tungstenite::tungstenite::Error::Http(response))
                if matches!(response.status().as_u16(), 401 | 403) =>
            {
                // The session is no longer valid: log in again on the next run.
                self.account.forget().await;
                return Err(SourceError::new(
                    DeliveryFailureKind::Auth,
                    format!(
                        "Zalo refused the listener (HTTP {}); logging in again",
                        response.status()
                    ),
                ));
            }
            Err(e) => return Err(transient(format!("Zalo listener: {e}"))),
        };
        let (mut tx, mut rx) = socket.split();
        let mut cipher_key: Option<String> = None;
        let mut ping = tokio::time::interval(session.ping_interval);
        ping.reset();
        let uid = session.uid.clone();
        loop {
            let frame = tokio::select! {
                () = sink.stopped() => {
                    let _ = tx.send(Frame::Close(Some(
                        tokio_tungstenite::tungstenite::protocol::CloseFrame {
                            code: 1000.into(),
                            reason: "".into(),
                        },
                    ))).await;
                    return Ok(End::Stopped);
                }
                _ = ping.tick(), if cipher_key.is_some() => {
                    let body = json!({ "eventId": self.account.client().now_ms() });
                    let bytes = wire::encode_frame(1, cmd::PING, 1, &body);
                    if let Err(e) = tx.send(Frame::Binary(bytes.into())).await {
                        return Err(transient(format!("Zalo listener ping: {e}")));
                    }
                    continue;
                }
                frame = rx.next() => frame,
            };
            let bytes = match frame {
                Some(Ok(Frame::Binary(bytes))) => bytes,
                Some(Ok(Frame::Close(close_frame))) => {
                    let code = close_frame.as_ref().map(|c| u16::from(c.code));
                    if let Some(code @ (close::DUPLICATE_CONNECTION | close::KICK_CONNECTION)) =
                        code
                    {
                        self.account.take_over(code);
                        return Ok(End::TakenOver);
                    }
                    return Err(transient(format!(
                        "Zalo closed the listener (code {code:?}); connecting again"
                    )));
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    return Err(transient(format!(
                        "the Zalo listener broke ({e}); connecting again"
                    )));
                }
                None => return Err(transient("the Zalo listener ended; connecting again")),
            };
            let (version, command, sub, body) = match wire::decode_frame(&bytes) {
                Ok(decoded) => decoded,
                Err(error) => {
                    warn!(channel = %self.name, %error, "skipping an undecodable listener frame");
                    continue;
                }
            };
            match (version, command, sub) {
                (1, cmd::CIPHER_KEY, 1) => {
                    if let Some(key) = body
                        .as_ref()
                        .and_then(|b| b.get("key"))
                        .and_then(Value::as_str)
                    {
                        cipher_key = Some(key.to_owned());
                        ping.reset();
                        info!(channel = %self.name, "Zalo listener connected");
                    }
                }
                (1, cmd::DUPLICATE, 0) => {
                    // Zalo announces the other connection before closing this one.
                    self.account.take_over(close::DUPLICATE_CONNECTION);
                    let _ = tx
                        .send(Frame::Close(Some(
                            tokio_tungstenite::tungstenite::protocol::CloseFrame {
                                code: close::DUPLICATE_CONNECTION.into(),
                                reason: "".into(),
                            },
                        )))
                        .await;
                    return Ok(End::TakenOver);
                }
                (1, cmd::USER_MESSAGES | cmd::GROUP_MESSAGES, 0) => {
                    let Some(body) = body else { continue };
                    let group = command == cmd::GROUP_MESSAGES;
                    match wire::decode_event(&body, cipher_key.as_deref()) {
                        Ok(payload) => self.messages(sink, &payload, group, &uid).await,
                        Err(error) => {
                            warn!(channel = %self.name, %error, "skipping an undecodable message frame");
                        }
                    }
                }
                other => debug!(channel = %self.name, frame = ?other, "listener frame not used"),
            }
        }
    }

    async fn messages(&self, sink: &Arc<dyn EventSink>, payload: &Value, group: bool, uid: &str) {
        let list = payload
            .pointer(if group {
                "/data/groupMsgs"
            } else {
                "/data/msgs"
            })
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for msg in list {
            let from = id_of(msg.get("uidFrom")).unwrap_or_default();
            if from == "0" || from == uid {
                // Our own message: never a turn; the echo of one of our sends settles it.
                if let (Some(client_id), Some(msg_id)) = (
                    id_of(msg.get("cliMsgId")).and_then(|c| c.parse::<u64>().ok()),
                    id_of(msg.get("msgId")),
                ) && let Err(error) = self.book.echo(client_id, &msg_id).await
                {
                    warn!(channel = %self.name, %error, "an echo of our own message was not recorded");
                }
                continue;
            }
            let raw = json!({ "thread": if group { "group" } else { "user" }, "message": msg });
            sink.deliver(PushedEvent::new(raw, Arc::new(NoTransportAck)))
                .await;
        }
    }
}

#[async_trait]
impl PushedFeed for ZaloListener {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        if let Some(takeover) = self.account.taken_over() {
            warn!(channel = %self.name, "{}", takeover.describe());
            return self.stay_down(&sink).await;
        }
        match self.connect(&sink).await? {
            End::Stopped => Ok(()),
            End::TakenOver => self.stay_down(&sink).await,
        }
    }
}
