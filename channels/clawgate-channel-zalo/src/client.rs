//! The OA API and the OAuth token endpoint over HTTP, and what their failures mean: Zalo
//! refused the call (an `error` code in the body: nothing was sent), it never reached Zalo, or
//! it went out and no usable answer came back (a message may have been sent).
//!
//! Zalo answers failures with **HTTP 200** and `{"error": <negative>, "message": …}`; only
//! `error: 0` is a success (platform-apis-wave2 §9.1). The same code means different things on
//! different Zalo products (`-216` is an invalid or expired access token on OA endpoints, not
//! on ZNS ones), so a failure is classified by endpoint, code and message together.

use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use serde_json::Value;

/// Which Zalo endpoint answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `POST /v3.0/oa/message/cs`.
    Message,
    /// `GET /v2.0/oa/getoa`.
    OaInfo,
    /// `POST /v4/oa/access_token` (the OAuth host).
    Token,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Endpoint::Message => "POST /v3.0/oa/message/cs",
            Endpoint::OaInfo => "GET /v2.0/oa/getoa",
            Endpoint::Token => "POST /v4/oa/access_token",
        }
    }
}

/// The OA's access token is invalid or expired (OA endpoints).
pub(crate) const INVALID_TOKEN: i64 = -216;
/// The person has not interacted with the OA in the last 7 days: consultation messages are
/// closed until they write again.
pub(crate) const OUTSIDE_WINDOW: i64 = -230;
/// The person does not follow the OA (or unfollowed it).
pub(crate) const NOT_FOLLOWER: i64 = -213;
/// Invalid parameters.
pub(crate) const INVALID_PARAMS: i64 = -201;
/// The app exceeded its request limit.
pub(crate) const RATE_LIMITED: i64 = -32;

/// A refusal: the `error` code and `message` (or the OAuth host's `error_description`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZaloError {
    pub(crate) endpoint: Endpoint,
    pub(crate) status: u16,
    pub(crate) code: i64,
    pub(crate) message: String,
}

impl ZaloError {
    /// The failure class (by endpoint, code and message).
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        if self.endpoint == Endpoint::Token {
            // Every refusal of the token endpoint is about the credentials: the app id, the
            // secret key, or a refresh token that expired or was already used.
            return Auth;
        }
        let about_token = self.message.to_ascii_lowercase().contains("access token");
        match self.code {
            INVALID_TOKEN => Auth,
            _ if about_token => Auth,
            OUTSIDE_WINDOW | NOT_FOLLOWER => Permission,
            RATE_LIMITED => RateLimit,
            INVALID_PARAMS => InvalidPayload,
            _ if self.status >= 500 => Transient,
            _ => InvalidPayload,
        }
    }

    /// The access token was refused: a refresh may cure it.
    pub(crate) fn is_token_refusal(&self) -> bool {
        self.endpoint != Endpoint::Token && self.kind() == DeliveryFailureKind::Auth
    }

    fn hint(&self) -> &'static str {
        match (self.endpoint, self.code) {
            (Endpoint::Token, _) => {
                " (re-authorize the OA in Zalo for Developers and put the new refresh token in \
                 refresh_token_env, then restart)"
            }
            (_, OUTSIDE_WINDOW) => {
                " (more than 7 days since the person last interacted with the OA: consultation \
                 messages are closed until they write again; not retried)"
            }
            (_, NOT_FOLLOWER) => " (the person does not follow the OA)",
            (_, INVALID_TOKEN) => " (the access token is invalid or expired)",
            _ => "",
        }
    }
}

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// Zalo answered with an error code: the call had no effect.
    Refused(ZaloError),
    /// Nothing reached Zalo (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back: it may have been carried out.
    Lost(String),
}

impl CallError {
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        match self {
            CallError::Refused(error) => error.kind(),
            CallError::Unreachable(_) => DeliveryFailureKind::Transient,
            CallError::Lost(_) => DeliveryFailureKind::Unknown,
        }
    }

    /// As a send failure: a refusal or an unreachable server had no side effect; a lost answer
    /// may have.
    pub(crate) fn into_send_error(self, what: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused(error) => SendError::before_io(
                kind,
                format!(
                    "Zalo {what}: {} answered error {}: {}{}",
                    error.endpoint.name(),
                    error.code,
                    error.message,
                    error.hint()
                ),
            )
            .with_platform_code(error.code.to_string()),
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Zalo {what}: the OA API is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Zalo {what}: the request went out and no usable answer came back \
                     ({reason}); the message may have been sent"
                ),
            ),
        }
    }
}

/// A token endpoint answer.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TokenAnswer {
    pub(crate) access_token: String,
    pub(crate) refresh_token: String,
    pub(crate) expires_in_s: u64,
}

impl std::fmt::Debug for TokenAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAnswer")
            .field("expires_in_s", &self.expires_in_s)
            .finish_non_exhaustive()
    }
}

/// The OA API and OAuth endpoints of one app.
#[derive(Clone)]
pub(crate) struct OaApi {
    api_base: String,
    oauth_base: String,
    app_id: String,
    app_secret: Secret,
    http: reqwest::Client,
    timeout: Duration,
}

/// The app secret rides in the token endpoint's header: never printed.
impl std::fmt::Debug for OaApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OaApi")
            .field("api_base", &self.api_base)
            .field("oauth_base", &self.oauth_base)
            .field("app_id", &self.app_id)
            .field("app_secret", &self.app_secret)
            .finish_non_exhaustive()
    }
}

impl OaApi {
    pub(crate) fn new(
        api_base: &str,
        oauth_base: &str,
        app_id: &str,
        app_secret: Secret,
        timeout: Duration,
    ) -> OaApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        OaApi {
            api_base: api_base.trim_end_matches('/').to_owned(),
            oauth_base: oauth_base.trim_end_matches('/').to_owned(),
            app_id: app_id.to_owned(),
            app_secret,
            http,
            timeout,
        }
    }

    /// How long one call may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn api_base(&self) -> &str {
        &self.api_base
    }

    /// `POST /v3.0/oa/message/cs`: a consultation text to `user_id`; Zalo's `message_id`.
    pub(crate) async fn send_text(
        &self,
        access_token: &str,
        user_id: &str,
        text: &str,
    ) -> Result<String, CallError> {
        let body = serde_json::json!({
            "recipient": { "user_id": user_id },
            "message": { "text": text },
        });
        let request = self
            .http
            .post(format!("{}/v3.0/oa/message/cs", self.api_base))
            .header("access_token", access_token)
            .json(&body);
        let answer = self.call(Endpoint::Message, request).await?;
        answer
            .pointer("/data/message_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| CallError::Lost("error 0 without data.message_id".into()))
    }

    /// `GET /v2.0/oa/getoa`: the OA itself (the start-up token check).
    pub(crate) async fn oa_info(&self, access_token: &str) -> Result<Value, CallError> {
        let request = self
            .http
            .get(format!("{}/v2.0/oa/getoa", self.api_base))
            .header("access_token", access_token);
        let answer = self.call(Endpoint::OaInfo, request).await?;
        Ok(answer.get("data").cloned().unwrap_or(Value::Null))
    }

    /// `POST /v4/oa/access_token` with `grant_type=refresh_token`: a new access token and a
    /// new refresh token (the one given is spent).
    pub(crate) async fn refresh(&self, refresh_token: &str) -> Result<TokenAnswer, CallError> {
        let request = self
            .http
            .post(format!("{}/v4/oa/access_token", self.oauth_base))
            .header("secret_key", self.app_secret.expose())
            .form(&[
                ("app_id", self.app_id.as_str()),
                ("grant_type", "refresh_token"),
                ("refresh_token", refresh_token),
            ]);
        let answer = self.call(Endpoint::Token, request).await?;
        let text = |key: &str| answer.get(key).and_then(Value::as_str).map(str::to_owned);
        // `expires_in` comes as a string of seconds ("90000"); a number is read all the same.
        let expires_in_s = match answer.get("expires_in") {
            Some(Value::String(s)) => s.trim().parse().ok(),
            Some(Value::Number(n)) => n.as_u64(),
            _ => None,
        };
        match (text("access_token"), text("refresh_token"), expires_in_s) {
            (Some(access_token), Some(refresh_token), Some(expires_in_s)) => Ok(TokenAnswer {
                access_token,
                refresh_token,
                expires_in_s,
            }),
            // The refresh token may have been spent: nothing usable came back.
            _ => Err(CallError::Lost(
                "the token endpoint answered without access_token, refresh_token and \
                 expires_in"
                    .into(),
            )),
        }
    }

    async fn call(
        &self,
        endpoint: Endpoint,
        request: reqwest::RequestBuilder,
    ) -> Result<Value, CallError> {
        let sent = request.timeout(self.timeout).send().await;
        let response = match sent {
            Ok(response) => response,
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(error.to_string()));
            }
            Err(error) => return Err(CallError::Lost(error.to_string())),
        };
        let status = response.status().as_u16();
        let body = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let code = answer.get("error").and_then(Value::as_i64);
        match code {
            Some(0) if status == 200 => Ok(answer),
            // The token endpoint's success carries no `error` field.
            None if endpoint == Endpoint::Token && status == 200 && answer.is_object() => {
                Ok(answer)
            }
            Some(code) if code != 0 => {
                let text = |key: &str| answer.get(key).and_then(Value::as_str);
                let message = text("message")
                    .or_else(|| text("error_description"))
                    .or_else(|| text("error_reason"))
                    .or_else(|| text("error_name"))
                    .unwrap_or("no message")
                    .to_owned();
                Err(CallError::Refused(ZaloError {
                    endpoint,
                    status,
                    code,
                    message,
                }))
            }
            // Not Zalo talking (a proxy's page, a cut body): the call may have been carried out.
            _ => Err(CallError::Lost(format!(
                "HTTP {status} without a Zalo answer"
            ))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use clawgate_channel_sdk::SideEffect;

    fn refused(endpoint: Endpoint, code: i64, message: &str) -> CallError {
        CallError::Refused(ZaloError {
            endpoint,
            status: 200,
            code,
            message: message.into(),
        })
    }

    #[test]
    fn refusals_are_classified_by_endpoint_code_and_message() {
        use DeliveryFailureKind::*;
        let cases = [
            (
                "expired token",
                Endpoint::Message,
                -216,
                "Access token is invalid",
                Auth,
            ),
            (
                "token by message",
                Endpoint::Message,
                -124,
                "Access token is expired",
                Auth,
            ),
            (
                "window",
                Endpoint::Message,
                -230,
                "User has not interacted with the OA in the past 7 days",
                Permission,
            ),
            (
                "not a follower",
                Endpoint::Message,
                -213,
                "User has not followed OA",
                Permission,
            ),
            (
                "rate",
                Endpoint::Message,
                -32,
                "App has exceeded the request limit",
                RateLimit,
            ),
            (
                "params",
                Endpoint::Message,
                -201,
                "Parameters are invalid",
                InvalidPayload,
            ),
            (
                "unknown code",
                Endpoint::Message,
                -999,
                "Something else",
                InvalidPayload,
            ),
            (
                "refresh token spent",
                Endpoint::Token,
                -14014,
                "Invalid refresh token",
                Auth,
            ),
            (
                "oa info token",
                Endpoint::OaInfo,
                -216,
                "Access token is invalid",
                Auth,
            ),
        ];
        for (case, endpoint, code, message, kind) in cases {
            let error = refused(endpoint, code, message).into_send_error("send");
            assert_eq!(error.kind, kind, "{case}");
            assert_eq!(error.side_effect, SideEffect::None, "{case}");
            assert_eq!(
                error.platform_code.as_deref(),
                Some(code.to_string().as_str()),
                "{case}"
            );
        }
        let window = refused(Endpoint::Message, -230, "x").into_send_error("send");
        assert!(window.message.contains("7 days"), "{}", window.message);
        let CallError::Refused(token) = refused(Endpoint::Message, -216, "x") else {
            unreachable!()
        };
        assert!(token.is_token_refusal());
        let CallError::Refused(spent) = refused(Endpoint::Token, -14014, "x") else {
            unreachable!()
        };
        assert!(!spent.is_token_refusal());
        let lost = CallError::Lost("timeout".into()).into_send_error("send");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, SideEffect::Possible)
        );
    }

    #[test]
    fn the_secret_never_prints() {
        let api = OaApi::new(
            "http://127.0.0.1:1",
            "http://127.0.0.1:1",
            "1",
            Secret::new("very-secret-key"),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very-secret"));
        let answer = TokenAnswer {
            access_token: "acc-secret".into(),
            refresh_token: "ref-secret".into(),
            expires_in_s: 1,
        };
        assert!(!format!("{answer:?}").contains("secret"));
    }
}
