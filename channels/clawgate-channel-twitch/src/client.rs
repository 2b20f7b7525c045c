//! Helix "Send Chat Message" over HTTP, and what its answer means: sent (with the message id),
//! dropped by a chat rule (200 with `is_sent: false`: a refusal, never a success), refused
//! with a Helix error (nothing happened), unreachable (nothing happened), or lost after the
//! request went out (Twitch may have posted it).

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use clawgate_types::clock::Clock;
use serde::Deserialize;
use serde_json::json;

/// What a send came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Posted, with Twitch's message id.
    Sent(String),
    /// `is_sent: false`: a chat rule dropped it.
    Dropped { code: String, message: String },
}

/// How a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// A Helix error answer: the call had no effect.
    Refused {
        status: u16,
        message: String,
        retry_after_ms: Option<u64>,
    },
    /// Nothing reached Twitch.
    Unreachable(String),
    /// The request went out and no usable answer came back: Twitch may have posted it.
    Lost(String),
}

impl CallError {
    pub(crate) fn into_send_error(self) -> SendError {
        match self {
            CallError::Refused {
                status,
                message,
                retry_after_ms,
            } => {
                let kind = match status {
                    400 | 422 => DeliveryFailureKind::InvalidPayload,
                    401 => DeliveryFailureKind::Auth,
                    403 => DeliveryFailureKind::Permission,
                    404 => DeliveryFailureKind::NotFound,
                    409 => DeliveryFailureKind::Conflict,
                    429 => DeliveryFailureKind::RateLimit,
                    _ => DeliveryFailureKind::Transient,
                };
                let hint = match kind {
                    DeliveryFailureKind::Auth => {
                        ": check the token (user:write:chat) and that client_id is its application's"
                    }
                    DeliveryFailureKind::Permission => {
                        ": check user_id is the token's user and the bot may chat there"
                    }
                    _ => "",
                };
                SendError::before_io(
                    kind,
                    format!("Helix refused the chat message (HTTP {status}): {message}{hint}"),
                )
                .with_retry_after_ms(retry_after_ms)
                .with_platform_code(status.to_string())
            }
            CallError::Unreachable(reason) => SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("Helix is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                DeliveryFailureKind::Unknown,
                format!(
                    "the chat message went out to Helix and no answer came back ({reason}); \
                     Twitch may have posted it"
                ),
            ),
        }
    }
}

#[derive(Debug, Deserialize)]
struct HelixError {
    status: Option<u16>,
    message: Option<String>,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SendAnswer {
    data: Vec<SendData>,
}

#[derive(Debug, Deserialize)]
struct SendData {
    #[serde(default)]
    message_id: String,
    is_sent: bool,
    #[serde(default)]
    drop_reason: Option<DropReason>,
}

#[derive(Debug, Deserialize)]
struct DropReason {
    code: String,
    #[serde(default)]
    message: String,
}

/// The Helix endpoint with the bot's credentials.
#[derive(Clone)]
pub(crate) struct Helix {
    base: String,
    client_id: String,
    token: Secret,
    http: reqwest::Client,
    timeout: Duration,
    /// The gateway's clock: a 429's `Ratelimit-Reset` (Unix seconds) is read against it.
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Helix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Helix")
            .field("base", &self.base)
            .field("client_id", &self.client_id)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Helix {
    pub(crate) fn new(
        base: &str,
        client_id: &str,
        token: Secret,
        timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Helix {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        Helix {
            base: base.trim_end_matches('/').to_owned(),
            client_id: client_id.to_owned(),
            token,
            http,
            timeout,
            clock,
        }
    }

    /// `POST {base}/chat/messages`.
    pub(crate) async fn send_chat_message(
        &self,
        broadcaster_id: &str,
        sender_id: &str,
        text: &str,
        reply_parent: Option<&str>,
    ) -> Result<Sent, CallError> {
        let mut body = json!({
            "broadcaster_id": broadcaster_id,
            "sender_id": sender_id,
            "message": text,
        });
        if let Some(parent) = reply_parent {
            body["reply_parent_message_id"] = json!(parent);
        }
        let sent = self
            .http
            .post(format!("{}/chat/messages", self.base))
            .bearer_auth(self.token.expose())
            .header("Client-Id", &self.client_id)
            .json(&body)
            .timeout(self.timeout)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(error.to_string()));
            }
            Err(error) => return Err(CallError::Lost(error.to_string())),
        };
        let status = response.status().as_u16();
        let reset = response
            .headers()
            .get("ratelimit-reset")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        if status == 200 {
            let answer: SendAnswer = serde_json::from_slice(&bytes).map_err(|e| {
                CallError::Lost(format!("HTTP 200 without a Send Chat Message answer: {e}"))
            })?;
            let Some(data) = answer.data.into_iter().next() else {
                return Err(CallError::Lost("HTTP 200 with an empty `data`".into()));
            };
            return Ok(match (data.is_sent, data.drop_reason) {
                (true, _) => Sent::Sent(data.message_id),
                (false, Some(reason)) => Sent::Dropped {
                    code: reason.code,
                    message: reason.message,
                },
                (false, None) => Sent::Dropped {
                    code: "unknown".into(),
                    message: "is_sent is false and no drop_reason was given".into(),
                },
            });
        }
        let Ok(error) = serde_json::from_slice::<HelixError>(&bytes) else {
            // Not Helix talking (a proxy's page): the call may have landed.
            return Err(CallError::Lost(format!(
                "HTTP {status} without a Helix answer"
            )));
        };
        let retry_after_ms = (status == 429).then(|| {
            let now = u64::try_from(self.clock.now_ms().div_euclid(1_000)).unwrap_or(0);
            reset.map_or(1_000, |r| r.saturating_sub(now).max(1) * 1_000)
        });
        Err(CallError::Refused {
            status: error.status.unwrap_or(status),
            message: error
                .message
                .filter(|m| !m.is_empty())
                .or(error.error)
                .unwrap_or_else(|| format!("HTTP {status}")),
            retry_after_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use clawgate_channel_sdk::SideEffect;

    use super::*;

    #[test]
    fn helix_errors_are_classified_by_status_and_a_lost_answer_is_unknown() {
        use DeliveryFailureKind::*;
        for (status, kind) in [
            (400, InvalidPayload),
            (401, Auth),
            (403, Permission),
            (404, NotFound),
            (422, InvalidPayload),
            (429, RateLimit),
            (500, Transient),
            (503, Transient),
        ] {
            let error = CallError::Refused {
                status,
                message: "x".into(),
                retry_after_ms: None,
            }
            .into_send_error();
            assert_eq!(error.kind, kind, "{status}");
            assert_eq!(error.side_effect, SideEffect::None);
        }
        let lost = CallError::Lost("reset".into()).into_send_error();
        assert_eq!(lost.kind, Unknown);
        assert_eq!(lost.side_effect, SideEffect::Possible);
    }

    #[test]
    fn the_token_never_prints() {
        let helix = Helix::new(
            "http://127.0.0.1:1/helix",
            "cid",
            Secret::new("very-secret"),
            Duration::from_secs(1),
            Arc::new(clawgate_types::clock::SystemClock),
        );
        assert!(!format!("{helix:?}").contains("very-secret"));
    }

    /// `Ratelimit-Reset` is a Unix time: how long until it is read on the gateway's clock.
    #[cfg(feature = "simulator")]
    #[tokio::test]
    async fn a_helix_rate_limits_reset_is_read_on_the_gateways_clock() {
        use clawgate_types::clock::{ManualClock, SystemClock};

        use crate::simulator::{SimulatorConfig, TwitchSimulator};

        // No points: the first call is refused, its reset a minute from the host's now.
        let sim = TwitchSimulator::start(SimulatorConfig {
            helix_points_per_minute: 0,
            ..SimulatorConfig::default()
        })
        .await
        .expect("the simulator starts");
        let config = sim.config();
        // The gateway's clock ten minutes behind the host's.
        let clock = Arc::new(ManualClock::new(SystemClock.now_ms() - 600_000));
        let helix = Helix::new(
            &sim.helix_base(),
            &config.client_id,
            Secret::new(&config.bot_token),
            Duration::from_secs(3),
            clock,
        );
        let refused = helix
            .send_chat_message("1", &config.bot_user_id, "hi", None)
            .await
            .expect_err("no points left");
        let CallError::Refused {
            status: 429,
            retry_after_ms: Some(wait),
            ..
        } = refused
        else {
            panic!("a rate limit: {refused:?}");
        };
        assert!((600_000..=662_000).contains(&wait), "{wait} ms");
        sim.stop().await;
    }
}
