//! One JSON-RPC call to the signal-cli daemon over its TCP socket (`daemon --tcp`), and what
//! its failure means: the daemon refused it (a JSON-RPC error: nothing was sent), it never
//! reached the daemon (no connection), or it went out and no answer came back (the message
//! may have been sent).
//!
//! Each call opens its own connection: a send's answer can then never be confused with the
//! `receive` notifications of the source's subscription, and a lost answer is one closed
//! connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clawgate_channel_sdk::SendError;
use clawgate_types::DeliveryFailureKind;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A JSON-RPC error answer (`{"error": {code, message, data}}`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RpcError {
    pub(crate) code: i64,
    pub(crate) message: String,
    /// `data.response.results` of a send no recipient took.
    pub(crate) results: Vec<Value>,
}

/// How one call failed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallError {
    /// The daemon answered with an error: the call had no effect.
    Refused(RpcError),
    /// Nothing reached the daemon (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back: it may have been carried out.
    Lost(String),
}

/// A per-recipient `type` of a send result, as a failure class.
pub(crate) fn result_kind(kind: &str) -> DeliveryFailureKind {
    use DeliveryFailureKind::*;
    match kind {
        // The recipient is not on Signal (any more).
        "UNREGISTERED_FAILURE" => NotFound,
        // Their safety number changed: nothing goes to them until an operator trusts it.
        "IDENTITY_FAILURE" => Permission,
        "RATE_LIMIT_FAILURE" => RateLimit,
        // The upload to the Signal server did not complete (or a stale pre-key).
        "NETWORK_FAILURE" | "INVALID_PRE_KEY_FAILURE" => Transient,
        _ => Transient,
    }
}

impl RpcError {
    /// The failure class: the per-recipient results first (they say why), else the code
    /// (signal-cli's `SignalJsonRpcCommandHandler`: -1 user error, -3 IO error, -4 untrusted
    /// key, -5 rate limit, -6 captcha rejected; JSON-RPC's own -32xxx).
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        let types: Vec<&str> = self
            .results
            .iter()
            .filter_map(|r| r.get("type").and_then(Value::as_str))
            .filter(|t| *t != "SUCCESS")
            .collect();
        for (wanted, kind) in [
            ("RATE_LIMIT_FAILURE", RateLimit),
            ("IDENTITY_FAILURE", Permission),
            ("NETWORK_FAILURE", Transient),
            ("UNREGISTERED_FAILURE", NotFound),
        ] {
            if types.contains(&wanted) {
                return kind;
            }
        }
        match self.code {
            -5 | -6 => RateLimit,
            -4 => Permission,
            -3 => Transient,
            // A multi-account daemon that does not hold this account: it was never registered
            // or linked there, or was removed.
            -32602 if self.message.contains("account does not exist") => Auth,
            -1 if self.message.starts_with("Group not found") => NotFound,
            -1 if self.message.contains("not a member") => Permission,
            -1 | -32602 | -32601 | -32600 | -32700 => InvalidPayload,
            // -2 unexpected error, -32603 internal error.
            _ => Transient,
        }
    }

    /// The longest `retryAfterSeconds` of the results, in ms.
    pub(crate) fn retry_after_ms(&self) -> Option<u64> {
        self.results
            .iter()
            .filter_map(|r| r.get("retryAfterSeconds").and_then(Value::as_u64))
            .max()
            .map(|s| s.saturating_mul(1_000))
    }

    fn hint(&self) -> &'static str {
        match self.kind() {
            DeliveryFailureKind::Permission => {
                " (a recipient's safety number changed: verify it, then `signal-cli -a <account> \
                 trust <number>`; not retried)"
            }
            DeliveryFailureKind::Auth => {
                " (the daemon holds no such account: register or link it there, or fix \
                 `account` in the settings)"
            }
            DeliveryFailureKind::NotFound => " (the recipient is not on Signal, or no such group)",
            DeliveryFailureKind::RateLimit if self.code == -5 => {
                " (the Signal server rate-limits this account; it may ask for a captcha: \
                 `signal-cli submitRateLimitChallenge`)"
            }
            _ => "",
        }
    }
}

impl CallError {
    /// As a send failure: a refusal or an unreachable daemon had no side effect; a lost
    /// answer may have.
    pub(crate) fn into_send_error(self, what: &str) -> SendError {
        match self {
            CallError::Refused(error) => {
                let kind = error.kind();
                SendError::before_io(
                    kind,
                    format!(
                        "Signal {what}: {} (code {}){}",
                        error.message.replace('\n', "; "),
                        error.code,
                        error.hint()
                    ),
                )
                .with_retry_after_ms(error.retry_after_ms())
                .with_platform_code(error.code.to_string())
            }
            CallError::Unreachable(reason) => SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("Signal {what}: the signal-cli daemon is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                DeliveryFailureKind::Unknown,
                format!(
                    "Signal {what}: the request reached signal-cli and no answer came back \
                     ({reason}); the message may have been sent"
                ),
            ),
        }
    }
}

/// The daemon's TCP socket and the account calls are made for.
#[derive(Debug)]
pub(crate) struct Daemon {
    addr: String,
    account: String,
    timeout: Duration,
    next_id: AtomicU64,
}

impl Daemon {
    pub(crate) fn new(addr: &str, account: &str, timeout: Duration) -> Daemon {
        Daemon {
            addr: addr.to_owned(),
            account: account.to_owned(),
            timeout,
            next_id: AtomicU64::new(1),
        }
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn account(&self) -> &str {
        &self.account
    }

    /// Calls `method` with `params` (an object; `account` is added).
    pub(crate) async fn call(&self, method: &str, mut params: Value) -> Result<Value, CallError> {
        params["account"] = json!(self.account);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line =
            json!({ "jsonrpc": "2.0", "method": method, "params": params, "id": id }).to_string();
        line.push('\n');
        let connect = tokio::time::timeout(self.timeout, TcpStream::connect(&self.addr)).await;
        let stream = match connect {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Err(CallError::Unreachable(error.to_string())),
            Err(_) => return Err(CallError::Unreachable("connect timed out".into())),
        };
        match tokio::time::timeout(self.timeout, exchange(stream, &line, id)).await {
            Ok(answer) => answer,
            Err(_) => Err(CallError::Lost(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}

/// Writes the request and reads lines until the answer with `id` (notifications are skipped).
async fn exchange(stream: TcpStream, line: &str, id: u64) -> Result<Value, CallError> {
    let (read, mut write) = stream.into_split();
    // Once any byte may have gone out, a failure is a lost answer, not an unreachable daemon.
    write
        .write_all(line.as_bytes())
        .await
        .map_err(|e| CallError::Lost(e.to_string()))?;
    let mut lines = BufReader::new(read).lines();
    loop {
        let next = lines
            .next_line()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        let Some(text) = next else {
            return Err(CallError::Lost(
                "the daemon closed the connection before answering".into(),
            ));
        };
        let Ok(answer) = serde_json::from_str::<Value>(&text) else {
            return Err(CallError::Lost(format!(
                "an unreadable answer line: {text:.200}"
            )));
        };
        if answer.get("id").and_then(Value::as_u64) != Some(id) {
            continue;
        }
        if let Some(error) = answer.get("error").filter(|e| e.is_object()) {
            return Err(CallError::Refused(RpcError {
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("no message")
                    .to_owned(),
                results: error
                    .pointer("/data/response/results")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            }));
        }
        return Ok(answer.get("result").cloned().unwrap_or(Value::Null));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use clawgate_channel_sdk::SideEffect;

    fn refused(code: i64, message: &str, types: &[&str]) -> CallError {
        CallError::Refused(RpcError {
            code,
            message: message.into(),
            results: types
                .iter()
                .map(|t| json!({ "type": t, "retryAfterSeconds": 7 }))
                .collect(),
        })
    }

    #[test]
    fn refusals_are_classified_by_results_then_code() {
        use DeliveryFailureKind::*;
        let cases = [
            ("rate limit", -5, "", &["RATE_LIMIT_FAILURE"][..], RateLimit),
            ("untrusted", -4, "", &["IDENTITY_FAILURE"][..], Permission),
            ("network", -3, "", &["NETWORK_FAILURE"][..], Transient),
            (
                "unregistered",
                -1,
                "",
                &["UNREGISTERED_FAILURE"][..],
                NotFound,
            ),
            (
                "mixed: rate limit wins",
                -1,
                "",
                &["UNREGISTERED_FAILURE", "RATE_LIMIT_FAILURE"][..],
                RateLimit,
            ),
            (
                "no account",
                -32602,
                "Specified account does not exist",
                &[][..],
                Auth,
            ),
            (
                "missing account",
                -32602,
                "Method requires valid account parameter",
                &[][..],
                InvalidPayload,
            ),
            ("no group", -1, "Group not found: abc", &[][..], NotFound),
            (
                "user error",
                -1,
                "No message given",
                &[][..],
                InvalidPayload,
            ),
            ("unexpected", -2, "boom", &[][..], Transient),
            ("internal", -32603, "boom", &[][..], Transient),
        ];
        for (name, code, message, types, kind) in cases {
            let error = refused(code, message, types).into_send_error("send");
            assert_eq!(error.kind, kind, "{name}");
            assert_eq!(error.side_effect, SideEffect::None, "{name}");
            assert_eq!(
                error.platform_code.as_deref(),
                Some(code.to_string().as_str()),
                "{name}"
            );
        }
        let limited =
            refused(-5, "Rate limit failure", &["RATE_LIMIT_FAILURE"]).into_send_error("send");
        assert_eq!(limited.retry_after_ms, Some(7_000));
        let lost = CallError::Lost("eof".into()).into_send_error("send");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, SideEffect::Possible)
        );
        let away = CallError::Unreachable("refused".into()).into_send_error("send");
        assert_eq!((away.kind, away.side_effect), (Transient, SideEffect::None));
    }
}
