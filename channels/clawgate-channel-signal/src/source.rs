//! The inbound source: `subscribeReceive` on the daemon's TCP socket.
//!
//! With the daemon in `--receive-mode=manual`, signal-cli leaves messages on the Signal server
//! while no client is subscribed and pulls them once one is, so nothing sent while the gateway
//! was stopped is lost. Each `receive` notification is handed to the engine, which records it
//! durably before `deliver` returns; only then is the next line read. JSON-RPC notifications
//! have no acknowledgement: signal-cli has confirmed a message to the Signal server by the
//! time it writes it, so a message in flight on the socket when the gateway dies is gone
//! (the README says so). A dropped connection is dialled again and subscribed anew.
//!
//! A daemon in the default `on-start` mode refuses `subscribeReceive`; the source then warns
//! and takes what that daemon pushes to every connection, which loses whatever arrives while
//! the gateway is not connected.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{EventSink, NoTransportAck, PushedEvent, PushedFeed, SourceError};
use clawgate_types::DeliveryFailureKind;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tracing::{info, warn};

/// Subscribes one account's messages on a signal-cli daemon.
#[derive(Debug, Clone)]
pub struct ReceiveSource {
    name: String,
    addr: String,
    account: String,
}

/// Why one connection ended.
enum End {
    Stopped,
    /// The connection ended; `subscribed` when it had been set up (the backoff starts over).
    Dropped {
        reason: String,
        subscribed: bool,
    },
}

fn dropped(reason: impl Into<String>, subscribed: bool) -> End {
    End::Dropped {
        reason: reason.into(),
        subscribed,
    }
}

impl ReceiveSource {
    pub(crate) fn new(name: &str, addr: &str, account: &str) -> ReceiveSource {
        ReceiveSource {
            name: name.to_owned(),
            addr: addr.to_owned(),
            account: account.to_owned(),
        }
    }

    async fn connect_once(&self, sink: &Arc<dyn EventSink>) -> End {
        let stream = match TcpStream::connect(&self.addr).await {
            Ok(stream) => stream,
            Err(e) => return dropped(format!("connect to {}: {e}", self.addr), false),
        };
        let (read, mut write) = stream.into_split();
        let request = json!({ "jsonrpc": "2.0", "method": "subscribeReceive",
            "params": { "account": self.account }, "id": "subscribe" });
        let mut line = request.to_string();
        line.push('\n');
        if let Err(e) = write.write_all(line.as_bytes()).await {
            return dropped(format!("subscribeReceive: {e}"), false);
        }
        let mut lines = BufReader::new(read).lines();
        let mut subscription: Option<u64> = None;
        loop {
            let next = tokio::select! {
                () = sink.stopped() => return End::Stopped,
                next = lines.next_line() => next,
            };
            let text = match next {
                Ok(Some(text)) => text,
                Ok(None) => {
                    return dropped("the daemon closed the connection", subscription.is_some());
                }
                Err(e) => return dropped(e.to_string(), subscription.is_some()),
            };
            let Ok(message) = serde_json::from_str::<Value>(&text) else {
                warn!(channel = %self.name, line = %format!("{text:.200}"), "an unreadable line from signal-cli");
                continue;
            };
            if message.get("id").and_then(Value::as_str) == Some("subscribe") {
                if let Some(id) = message.get("result").and_then(Value::as_u64) {
                    info!(channel = %self.name, subscription = id, "subscribed to Signal messages");
                    subscription = Some(id);
                } else {
                    let reason = message
                        .pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or("no result");
                    warn!(channel = %self.name, reason, "signal-cli refused subscribeReceive: start the daemon with --receive-mode=manual, or messages that arrive while the gateway is away are lost");
                }
                continue;
            }
            if message.get("method").and_then(Value::as_str) != Some("receive") {
                continue;
            }
            let params = message.get("params").cloned().unwrap_or(Value::Null);
            // Manual mode wraps the item in its subscription; on-start mode sends it bare.
            let item = match params.get("subscription").and_then(Value::as_u64) {
                Some(id) if Some(id) != subscription => continue,
                Some(_) => params.get("result").cloned().unwrap_or(Value::Null),
                None => params,
            };
            sink.deliver(PushedEvent::new(item, Arc::new(NoTransportAck)))
                .await;
        }
    }
}

#[async_trait]
impl PushedFeed for ReceiveSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let mut backoff = Duration::from_millis(200);
        loop {
            match self.connect_once(&sink).await {
                End::Stopped => return Ok(()),
                End::Dropped { reason, subscribed } => {
                    warn!(channel = %self.name, reason, "the signal-cli connection ended; dialling again");
                    if subscribed {
                        backoff = Duration::from_millis(200);
                    }
                }
            }
            tokio::select! {
                () = sink.stopped() => return Ok(()),
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(30));
            if backoff >= Duration::from_secs(30) {
                // The engine logs it and runs the feed again after its own backoff.
                return Err(SourceError::new(
                    DeliveryFailureKind::Transient,
                    format!(
                        "the signal-cli daemon at {} keeps dropping the connection",
                        self.addr
                    ),
                ));
            }
        }
    }
}
