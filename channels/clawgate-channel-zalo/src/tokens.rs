//! The OA's access token and its rotating refresh token (platform-apis-wave2 §9.1).
//!
//! `POST /v4/oa/access_token` with `grant_type=refresh_token` answers a new access token
//! *and a new refresh token*; the one sent is spent, and using it again fails. So the answer
//! is written to [`TOKEN_FILE`] (a temporary file, synced, renamed over the old one, the
//! directory synced) before the new access token is used or anything else happens, and the
//! file, not the environment, is where the next start reads the refresh token from.
//!
//! A crash (or a lost answer) between Zalo rotating the token and that write would strand the
//! account: the stored refresh token is spent, the new one is gone. The store narrows and
//! names that case rather than pretending it away:
//!
//! - It refreshes **ahead** of expiry (`refresh_ahead`), and a refresh leaves the previous
//!   access token in place until its answer is stored, so an interrupted refresh leaves a
//!   working access token for the rest of its life (about 25 hours on Zalo) instead of none.
//! - A marker (`refreshing_since_ms`) is synced before each refresh request and cleared by
//!   the write that stores its answer. A refresh refused while the marker of an earlier one is
//!   still set is reported as [`TokenError::Stranded`]: what happened, how long the access
//!   token still works, and what to do.
//! - Recovery is one step: re-authorize the OA, put the new refresh token in the variable the
//!   settings name, restart. The file remembers a fingerprint (SHA-256) of the configured
//!   refresh token it grew from; a different one in the environment replaces the stored chain.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::client::{CallError, OaApi};

/// The name of the token file in the channel's state directory.
pub const TOKEN_FILE: &str = "zalo-tokens.json";

/// An access token is not used in its last seconds: the call still has to travel.
const EXPIRY_MARGIN_MS: u64 = 30_000;

/// Why no access token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file could not be read or written.
    #[error("the Zalo token file {path}: {source} (check the state directory is writable)")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// Zalo refused the refresh token.
    #[error(
        "Zalo refused the OA's token refresh ({message}): check app_id and the Secret key in \
         app_secret_env; if those are right, the refresh token is spent or expired: \
         re-authorize the OA (Zalo for Developers → your app → Official Account → authorize), \
         put the new refresh token in {env_var} and restart"
    )]
    Refused {
        /// The variable the settings name for the refresh token.
        env_var: String,
        /// Zalo's words.
        message: String,
    },
    /// An earlier refresh got no stored answer and Zalo has spent its refresh token.
    #[error(
        "a Zalo token refresh started at {since_ms} ms (Unix time) ended without its answer \
         being saved (a crash or a lost answer), and Zalo has since rotated the refresh token \
         ({message}); the current access token works for about {access_left_s} s more: \
         re-authorize the OA, put the new refresh token in {env_var} and restart"
    )]
    Stranded {
        /// The variable the settings name for the refresh token.
        env_var: String,
        /// When the interrupted refresh started.
        since_ms: u64,
        /// How long the access token in hand still works.
        access_left_s: u64,
        /// Zalo's words.
        message: String,
    },
    /// The token endpoint could not be reached or gave no usable answer.
    #[error("the Zalo token endpoint failed: {0}")]
    Unavailable(String),
}

impl TokenError {
    /// As a send failure: no access token means the message never went out.
    pub(crate) fn into_send_error(self) -> SendError {
        let kind = match self {
            TokenError::Refused { .. } | TokenError::Stranded { .. } => DeliveryFailureKind::Auth,
            TokenError::Io { .. } | TokenError::Unavailable(_) => DeliveryFailureKind::Transient,
        };
        SendError::before_io(kind, self.to_string())
    }
}

/// What the token file holds.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Stored {
    #[serde(default)]
    access_token: String,
    #[serde(default)]
    access_expires_at_ms: u64,
    refresh_token: String,
    /// SHA-256 (hex) of the configured refresh token this chain grew from.
    seeded_from: String,
    /// Set before a refresh request goes out; cleared by the write that stores its answer.
    #[serde(default)]
    refreshing_since_ms: Option<u64>,
}

/// Tokens are secrets: only their shape prints.
impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stored")
            .field("access_expires_at_ms", &self.access_expires_at_ms)
            .field("refreshing_since_ms", &self.refreshing_since_ms)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn fingerprint(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    api: OaApi,
    env_var: String,
    refresh_ahead_ms: u64,
    state: tokio::sync::Mutex<Stored>,
}

/// The OA's tokens, shared by the sender and the start-up check; one refresh at a time.
#[derive(Debug, Clone)]
pub struct TokenStore {
    inner: Arc<Inner>,
}

/// Writes `stored` to `path` atomically and durably.
fn write(path: &Path, stored: &Stored) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&tmp)?;
    file.write_all(&serde_json::to_vec_pretty(stored).map_err(std::io::Error::other)?)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl TokenStore {
    /// Opens the token file in `dir`, or seeds it from the configured refresh token (the
    /// value of `env_var`). A configured token other than the one the file grew from means
    /// the operator re-authorized: it replaces the stored chain.
    pub(crate) fn open(
        dir: &Path,
        api: OaApi,
        env_var: &str,
        configured: &Secret,
        refresh_ahead: Duration,
    ) -> Result<TokenStore, TokenError> {
        let path = dir.join(TOKEN_FILE);
        let io = |source| TokenError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let seed = fingerprint(configured.expose());
        let stored = match std::fs::read(&path) {
            Ok(bytes) => {
                let stored: Stored = serde_json::from_slice(&bytes)
                    .map_err(|e| io(std::io::Error::other(e.to_string())))?;
                (stored.seeded_from == seed).then_some(stored)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(e)),
        };
        let stored = match stored {
            Some(stored) => stored,
            None => {
                if path.exists() {
                    info!(
                        env_var,
                        "a new refresh token is configured: it replaces the stored one"
                    );
                }
                let fresh = Stored {
                    refresh_token: configured.expose().to_owned(),
                    seeded_from: seed,
                    ..Stored::default()
                };
                write(&path, &fresh).map_err(io)?;
                fresh
            }
        };
        Ok(TokenStore {
            inner: Arc::new(Inner {
                path,
                api,
                env_var: env_var.to_owned(),
                refresh_ahead_ms: u64::try_from(refresh_ahead.as_millis()).unwrap_or(u64::MAX),
                state: tokio::sync::Mutex::new(stored),
            }),
        })
    }

    /// An access token to call with: the stored one while it has more than `refresh_ahead`
    /// left; else a refreshed one (the stored one still, when a refresh ahead of expiry fails).
    pub(crate) async fn access_token(&self) -> Result<String, TokenError> {
        let mut state = self.inner.state.lock().await;
        let now = now_ms();
        let usable = !state.access_token.is_empty()
            && state.access_expires_at_ms > now.saturating_add(EXPIRY_MARGIN_MS);
        if usable && state.access_expires_at_ms > now.saturating_add(self.inner.refresh_ahead_ms) {
            return Ok(state.access_token.clone());
        }
        match self.refresh(&mut state).await {
            Ok(token) => Ok(token),
            Err(error) if usable => {
                warn!(%error, "refreshing the Zalo access token ahead of expiry failed; the current one is used meanwhile");
                Ok(state.access_token.clone())
            }
            Err(error) => Err(error),
        }
    }

    /// Zalo refused `refused` as invalid or expired: a fresh one, unless another call
    /// already replaced it.
    pub(crate) async fn after_refusal(&self, refused: &str) -> Result<String, TokenError> {
        let mut state = self.inner.state.lock().await;
        if state.access_token != refused && !state.access_token.is_empty() {
            return Ok(state.access_token.clone());
        }
        state.access_expires_at_ms = 0;
        self.refresh(&mut state).await
    }

    /// The stored refresh token spent for a new pair, which is stored before it is returned.
    async fn refresh(&self, state: &mut Stored) -> Result<String, TokenError> {
        let io = |source| TokenError::Io {
            path: self.inner.path.clone(),
            source,
        };
        let interrupted = state.refreshing_since_ms;
        let mut marked = state.clone();
        marked.refreshing_since_ms = Some(interrupted.unwrap_or_else(now_ms));
        write(&self.inner.path, &marked).map_err(io)?;
        *state = marked;
        match self.inner.api.refresh(&state.refresh_token).await {
            Ok(answer) => {
                let fresh = Stored {
                    access_token: answer.access_token,
                    access_expires_at_ms: now_ms()
                        .saturating_add(answer.expires_in_s.saturating_mul(1_000)),
                    refresh_token: answer.refresh_token,
                    seeded_from: state.seeded_from.clone(),
                    refreshing_since_ms: None,
                };
                // Before anything uses it: the old refresh token is spent from here on.
                write(&self.inner.path, &fresh).map_err(io)?;
                *state = fresh;
                info!(
                    expires_in_s = answer.expires_in_s,
                    "the Zalo access token was refreshed"
                );
                Ok(state.access_token.clone())
            }
            Err(CallError::Refused(error)) => {
                if interrupted.is_none() {
                    // A refusal rotated nothing: no earlier refresh is unaccounted for.
                    let mut cleared = state.clone();
                    cleared.refreshing_since_ms = None;
                    write(&self.inner.path, &cleared).map_err(io)?;
                    *state = cleared;
                }
                let access_left_s = state.access_expires_at_ms.saturating_sub(now_ms()) / 1_000;
                Err(match interrupted {
                    Some(since_ms) => TokenError::Stranded {
                        env_var: self.inner.env_var.clone(),
                        since_ms,
                        access_left_s,
                        message: error.message,
                    },
                    None => TokenError::Refused {
                        env_var: self.inner.env_var.clone(),
                        message: format!("error {}: {}", error.code, error.message),
                    },
                })
            }
            Err(CallError::Unreachable(reason)) => {
                // Nothing reached Zalo: the refresh token is not spent.
                let mut cleared = state.clone();
                cleared.refreshing_since_ms = interrupted;
                write(&self.inner.path, &cleared).map_err(io)?;
                *state = cleared;
                Err(TokenError::Unavailable(reason))
            }
            // The marker stays: Zalo may have rotated the token.
            Err(CallError::Lost(reason)) => Err(TokenError::Unavailable(reason)),
        }
    }

    /// The refresh token the next refresh spends (tests read it to play the operator).
    #[cfg(test)]
    pub(crate) async fn stored_refresh_token(&self) -> String {
        self.inner.state.lock().await.refresh_token.clone()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn tokens_never_print() {
        let stored = Stored {
            access_token: "acc-secret".into(),
            refresh_token: "ref-secret".into(),
            ..Stored::default()
        };
        assert!(!format!("{stored:?}").contains("secret"));
    }

    #[tokio::test]
    async fn the_configured_token_seeds_the_file_and_a_new_one_replaces_the_chain() {
        let dir = tempfile::tempdir().unwrap();
        let api = OaApi::new(
            "http://127.0.0.1:9",
            "http://127.0.0.1:9",
            "1",
            Secret::new("k"),
            Duration::from_secs(1),
        );
        let first = Secret::new("refresh-one");
        let store =
            TokenStore::open(dir.path(), api.clone(), "ZR", &first, Duration::ZERO).unwrap();
        assert_eq!(store.stored_refresh_token().await, "refresh-one");
        // A rotation happened in an earlier run: the file's token wins over the environment.
        {
            let mut state = store.inner.state.lock().await;
            state.refresh_token = "refresh-two".into();
            write(&store.inner.path, &state).unwrap();
        }
        let again =
            TokenStore::open(dir.path(), api.clone(), "ZR", &first, Duration::ZERO).unwrap();
        assert_eq!(again.stored_refresh_token().await, "refresh-two");
        let reauthorized = Secret::new("refresh-fresh");
        let adopted =
            TokenStore::open(dir.path(), api, "ZR", &reauthorized, Duration::ZERO).unwrap();
        assert_eq!(adopted.stored_refresh_token().await, "refresh-fresh");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(TOKEN_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
