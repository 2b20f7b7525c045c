//! The bot's access tokens for the Bot Connector: the client-credentials grant at the Bot
//! Framework's token endpoint (`client_id` = the app id, its client secret, scope
//! `https://api.botframework.com/.default`), cached until shortly before they expire.

use std::time::{Duration, Instant};

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use serde_json::Value;

/// The scope of every Bot Connector token.
pub const BOT_FRAMEWORK_SCOPE: &str = "https://api.botframework.com/.default";
/// A token is renewed this long before it expires (or at half its life, if that is sooner).
const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// How getting an access token failed. The call it was for never went out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenFailure {
    /// The token endpoint answered an OAuth error (`{"error", "error_description"}`).
    Refused {
        code: u16,
        error: String,
        description: String,
    },
    /// The endpoint could not be reached, timed out, or answered something that is not a token.
    Transport(String),
}

impl TokenFailure {
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        match self {
            TokenFailure::Refused { code, .. } if *code >= 500 => DeliveryFailureKind::Transient,
            TokenFailure::Refused { code: 429, .. } => DeliveryFailureKind::RateLimit,
            TokenFailure::Refused { .. } => DeliveryFailureKind::Auth,
            TokenFailure::Transport(_) => DeliveryFailureKind::Transient,
        }
    }

    /// As a send failure: nothing reached the connector.
    pub(crate) fn into_send_error(self, password_env: &str) -> SendError {
        let kind = self.kind();
        let message = match &self {
            TokenFailure::Refused {
                code,
                error,
                description,
            } => {
                let advice = match error.as_str() {
                    "invalid_client" => format!(
                        ": the client secret in {password_env} was refused: create a new one \
                         (Azure portal → the bot's app registration → Certificates & secrets) \
                         and put its value, not its id, there"
                    ),
                    "unauthorized_client" => {
                        ": app_id names no app registration: check it against the bot's \
                         Microsoft App ID"
                            .to_owned()
                    }
                    _ => String::new(),
                };
                format!(
                    "Teams access token: the token endpoint answered {code} {error}: \
                     {description}{advice}"
                )
            }
            TokenFailure::Transport(reason) => {
                format!("Teams access token: the token endpoint failed: {reason}")
            }
        };
        let error = SendError::before_io(kind, message);
        match self {
            TokenFailure::Refused { error: code, .. } => error.with_platform_code(code),
            TokenFailure::Transport(_) => error,
        }
    }
}

struct Cached {
    token: Secret,
    refresh_at: Instant,
}

/// Access tokens of one app, fetched as needed.
pub(crate) struct TokenSource {
    url: String,
    app_id: String,
    password: Secret,
    /// The variable the secret came from (for messages).
    pub(crate) password_env: String,
    http: reqwest::Client,
    timeout: Duration,
    /// Held across a fetch: concurrent callers share one request.
    cached: tokio::sync::Mutex<Option<Cached>>,
}

/// The secret and the tokens are never printed.
impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("url", &self.url)
            .field("app_id", &self.app_id)
            .field("password_env", &self.password_env)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    pub(crate) fn new(
        url: &str,
        app_id: &str,
        password: Secret,
        password_env: &str,
        http: reqwest::Client,
        timeout: Duration,
    ) -> TokenSource {
        TokenSource {
            url: url.to_owned(),
            app_id: app_id.to_owned(),
            password,
            password_env: password_env.to_owned(),
            http,
            timeout,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// A token good for a call now: the cached one, or a fresh one when it is due.
    pub(crate) async fn token(&self) -> Result<Secret, TokenFailure> {
        let mut cached = self.cached.lock().await;
        if let Some(current) = cached.as_ref()
            && Instant::now() < current.refresh_at
        {
            return Ok(current.token.clone());
        }
        let fetched = self.fetch().await?;
        let token = fetched.token.clone();
        *cached = Some(fetched);
        Ok(token)
    }

    /// Forgets `stale` (the connector refused it) unless a newer token already replaced it.
    pub(crate) async fn invalidate(&self, stale: &Secret) {
        let mut cached = self.cached.lock().await;
        if cached.as_ref().is_some_and(|c| c.token == *stale) {
            *cached = None;
        }
    }

    async fn fetch(&self) -> Result<Cached, TokenFailure> {
        let asked_at = Instant::now();
        let response = self
            .http
            .post(&self.url)
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", self.app_id.as_str()),
                ("client_secret", self.password.expose()),
                ("scope", BOT_FRAMEWORK_SCOPE),
            ])
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| TokenFailure::Transport(e.without_url().to_string()))?;
        let code = response.status().as_u16();
        let body = response
            .bytes()
            .await
            .map_err(|e| TokenFailure::Transport(e.without_url().to_string()))?;
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if !(200..300).contains(&code) {
            return Err(match parsed["error"].as_str() {
                Some(error) => TokenFailure::Refused {
                    code,
                    error: error.to_owned(),
                    description: parsed["error_description"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                },
                None if code >= 500 => {
                    TokenFailure::Transport(format!("HTTP {code} without an OAuth answer"))
                }
                None => TokenFailure::Refused {
                    code,
                    error: format!("http_{code}"),
                    description: "an answer without an OAuth error".into(),
                },
            });
        }
        let Some(token) = parsed["access_token"].as_str().filter(|t| !t.is_empty()) else {
            return Err(TokenFailure::Transport(format!(
                "HTTP {code} without an access_token"
            )));
        };
        let lifetime = Duration::from_secs(parsed["expires_in"].as_u64().unwrap_or(3_599));
        Ok(Cached {
            token: Secret::new(token),
            // Counted from when the request left: the token was issued no earlier.
            refresh_at: asked_at + lifetime - REFRESH_MARGIN.min(lifetime / 2),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_failures_are_classified_and_name_the_variable() {
        use DeliveryFailureKind::*;
        let refused = |code: u16, error: &str| TokenFailure::Refused {
            code,
            error: error.into(),
            description: "d".into(),
        };
        assert_eq!(refused(401, "invalid_client").kind(), Auth);
        assert_eq!(refused(400, "unauthorized_client").kind(), Auth);
        assert_eq!(refused(503, "temporarily_unavailable").kind(), Transient);
        assert_eq!(refused(429, "throttled").kind(), RateLimit);
        assert_eq!(TokenFailure::Transport("timeout".into()).kind(), Transient);
        let error = refused(401, "invalid_client").into_send_error("TEAMS_APP_PASSWORD");
        assert_eq!(error.side_effect, clawgate_channel_sdk::SideEffect::None);
        assert!(
            error.message.contains("TEAMS_APP_PASSWORD"),
            "{}",
            error.message
        );
    }

    #[test]
    fn the_secret_never_prints() {
        let source = TokenSource::new(
            "http://127.0.0.1:1/token",
            "app",
            Secret::new("very-secret-value"),
            "TEAMS_APP_PASSWORD",
            reqwest::Client::new(),
            Duration::from_secs(1),
        );
        assert!(!format!("{source:?}").contains("very-secret-value"));
    }
}
