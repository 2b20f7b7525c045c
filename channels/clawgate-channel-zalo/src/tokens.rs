//! The OA's access token and its rotating refresh token (platform-apis-wave2 §9.1).
//!
//! `POST /v4/oa/access_token` with `grant_type=refresh_token` answers a new access token
//! *and a new refresh token*; the one sent is spent, and using it again fails. So the answer
//! is written to the account's state in the gateway's store (the value [`TOKENS_VALUE`])
//! before the new access token is used or anything else happens, and the store, not the
//! environment, is where every later start (and every gateway sharing the store) reads the
//! refresh token from.
//!
//! Every write is a compare-and-set on the version read, so two gateways sharing one store
//! never both spend the same refresh token:
//!
//! - Before a refresh request, a marker (`refreshing_since_ms`, and who set it) is written
//!   expecting the version read. Of two gateways deciding to refresh at once, one writes it;
//!   the other reads again, finds the marker of a refresh in flight and waits for its answer
//!   (using the access token in hand meanwhile when it still works), then uses the stored one.
//! - The answer is written expecting the marker's version (again if only the marker of the
//!   same chain was touched meanwhile), which clears the marker.
//! - Every call reads the stored value first, so a token another gateway rotated is used at
//!   once; a refused refresh reads it again before reporting anything.
//!
//! A crash (or a lost answer) between Zalo rotating the token and that write would strand the
//! account: the stored refresh token is spent, the new one is gone. The store narrows and
//! names that case rather than pretending it away:
//!
//! - It refreshes **ahead** of expiry (`refresh_ahead`), and a refresh leaves the previous
//!   access token in place until its answer is stored, so an interrupted refresh leaves a
//!   working access token for the rest of its life (about 25 hours on Zalo) instead of none.
//! - A marker left by a refresh that can no longer be in flight (older than the request
//!   timeout and a grace, or this instance's own) is an interrupted one. A refresh refused
//!   while it is set is reported as [`TokenError::Stranded`]: what happened, how long the
//!   access token still works, and what to do.
//! - Recovery is one step: re-authorize the OA, put the new refresh token in the variable the
//!   settings name, restart. The value remembers a fingerprint (SHA-256) of the configured
//!   refresh token it grew from; a different one in the environment replaces the stored chain
//!   (unless it is one an earlier re-authorization already replaced: a gateway still
//!   configured with a spent token does not take the chain back to it).
//!
//! An earlier release kept the tokens in [`TOKEN_FILE`] in the state directory; it is imported
//! once ([`TokenStore::open`]).

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::state::{
    ChannelState, LegacyFiles, StateError, Swapped, ValueExpectation, Versioned,
};
use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::client::{CallError, OaApi};

/// The file an earlier release kept the tokens in (in the gateway's state directory), imported
/// once.
pub const TOKEN_FILE: &str = "zalo-tokens.json";

/// The value the tokens are kept under in the account's state.
pub const TOKENS_VALUE: &str = "tokens";

/// An access token is not used in its last seconds: the call still has to travel.
const EXPIRY_MARGIN_MS: u64 = 30_000;

/// How much longer than one token request a marker set by someone else is taken for a refresh
/// in flight: the write of its answer after the request ends, and a little disagreement
/// between the clocks of two gateways.
const MARKER_GRACE: Duration = Duration::from_secs(2);

/// How often a call waiting for another gateway's refresh reads the stored tokens again.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// How many times one call reads the tokens again after another writer changed them under it
/// before it gives up (each time is someone else's progress; this bounds a pathological race).
const MAX_ROUNDS: usize = 32;

/// How many replaced seeds the value remembers.
const SUPERSEDED_KEPT: usize = 16;

/// Why no access token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The tokens could not be read or written in the gateway's store.
    #[error(
        "the Zalo tokens could not be read or written in the gateway's store: {0} (nothing was \
         sent; it is tried again)"
    )]
    State(#[source] StateError),
    /// The token file of an earlier release could not be imported.
    #[error(
        "the Zalo token file of an earlier release ({TOKEN_FILE} in the state directory) could \
         not be imported: {0}; make it readable, or move it aside to start from the refresh \
         token in refresh_token_env, and start again"
    )]
    Legacy(#[source] std::io::Error),
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
            TokenError::State(_) | TokenError::Legacy(_) | TokenError::Unavailable(_) => {
                DeliveryFailureKind::Transient
            }
        };
        SendError::before_io(kind, self.to_string())
    }
}

/// What the stored value holds (the shape of the earlier release's token file, plus the fields
/// several gateways need).
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
    /// The instance that set the marker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refreshing_by: Option<String>,
    /// SHA-256 (hex) of the configured refresh tokens earlier chains grew from, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    superseded: Vec<String>,
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

impl Stored {
    fn access_left_s(&self, now: u64) -> u64 {
        self.access_expires_at_ms.saturating_sub(now) / 1_000
    }
}

fn fingerprint(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An id for this instance's markers: random per process and instance (the standard library's
/// hasher keys come from the operating system's randomness).
fn instance_id() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

#[derive(Debug)]
struct Inner {
    state: ChannelState,
    api: OaApi,
    env_var: String,
    configured: Secret,
    refresh_ahead_ms: u64,
    /// A marker older than this, set by someone else, is no longer a refresh in flight.
    in_flight_for: Duration,
    /// Marks the refreshes this instance starts.
    id: String,
    /// One refresh at a time in this process; other gateways are kept out by the marker.
    turn: tokio::sync::Mutex<()>,
}

/// The OA's tokens, shared by the sender and the start-up check.
#[derive(Debug, Clone)]
pub struct TokenStore {
    inner: Arc<Inner>,
}

/// What one refresh attempt came to.
enum Refreshed {
    /// A new access token, stored.
    Token(String),
    /// Someone else changed the stored tokens first: read them again.
    Changed,
}

/// The marker of another instance's refresh a call is waiting on, and since when.
struct Waiting {
    marker: (u64, Option<String>),
    since: tokio::time::Instant,
}

impl TokenStore {
    /// The tokens of the account whose state is `state`: the token file of an earlier release
    /// in `legacy` imported once, else the stored value, else seeded from the configured
    /// refresh token (the value of `env_var`). A configured token other than the one the
    /// stored chain grew from means the operator re-authorized: it replaces the chain.
    pub(crate) async fn open(
        state: ChannelState,
        legacy: &LegacyFiles,
        api: OaApi,
        env_var: &str,
        configured: &Secret,
        refresh_ahead: Duration,
    ) -> Result<TokenStore, TokenError> {
        let store = TokenStore {
            inner: Arc::new(Inner {
                state,
                in_flight_for: api.timeout().saturating_add(MARKER_GRACE),
                api,
                env_var: env_var.to_owned(),
                configured: configured.clone(),
                refresh_ahead_ms: u64::try_from(refresh_ahead.as_millis()).unwrap_or(u64::MAX),
                id: instance_id(),
                turn: tokio::sync::Mutex::new(()),
            }),
        };
        store.import_legacy(legacy).await?;
        let current = store.current().await?;
        if current.value.seeded_from != fingerprint(configured.expose()) {
            warn!(
                env_var,
                "the refresh token configured here was replaced by a later re-authorization; the \
                 stored chain is used (put the current one in the variable)"
            );
        }
        Ok(store)
    }

    /// Imports the token file an earlier release wrote, then sets it aside. Only the account
    /// configured with the refresh token the file's chain grew from takes it (two accounts of
    /// the kind wrote the same file); a token already stored is newer and wins. Repeatable: a
    /// crash before the file is set aside imports nothing new on the next start.
    async fn import_legacy(&self, legacy: &LegacyFiles) -> Result<(), TokenError> {
        let Some(bytes) = legacy.read(TOKEN_FILE).map_err(TokenError::Legacy)? else {
            return Ok(());
        };
        let stored: Stored = serde_json::from_slice(&bytes).map_err(|e| {
            TokenError::Legacy(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })?;
        if stored.seeded_from != fingerprint(self.inner.configured.expose()) {
            info!(
                env_var = %self.inner.env_var,
                "the {TOKEN_FILE} of an earlier release grew from another refresh token than the \
                 one configured here: it is left for the account configured with that one \
                 (delete it if there is none)"
            );
            return Ok(());
        }
        let imported = matches!(
            self.swap(ValueExpectation::Absent, &stored).await?,
            Swapped::Written(_)
        );
        legacy.retire(TOKEN_FILE).map_err(TokenError::Legacy)?;
        info!(
            imported,
            "the {TOKEN_FILE} of an earlier release was taken into the gateway's store"
        );
        Ok(())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.inner.state.now_ms()).unwrap_or(0)
    }

    async fn swap(
        &self,
        expected: ValueExpectation,
        value: &Stored,
    ) -> Result<Swapped<Stored>, TokenError> {
        self.inner
            .state
            .swap(TOKENS_VALUE, expected, value)
            .await
            .map_err(TokenError::State)
    }

    async fn read(&self) -> Result<Option<Versioned<Stored>>, TokenError> {
        self.inner
            .state
            .value(TOKENS_VALUE)
            .await
            .map_err(TokenError::State)
    }

    /// The stored tokens, seeded from the configured refresh token when there are none, or
    /// when the configured one is new (a re-authorization).
    async fn current(&self) -> Result<Versioned<Stored>, TokenError> {
        let seed = fingerprint(self.inner.configured.expose());
        for _ in 0..MAX_ROUNDS {
            let (expected, mut superseded) = match self.read().await? {
                Some(stored)
                    if stored.value.seeded_from == seed
                        || stored.value.superseded.contains(&seed) =>
                {
                    return Ok(stored);
                }
                Some(stored) => {
                    info!(
                        env_var = %self.inner.env_var,
                        "a new refresh token is configured: it replaces the stored one"
                    );
                    let mut superseded = stored.value.superseded;
                    superseded.push(stored.value.seeded_from);
                    (ValueExpectation::Version(stored.version), superseded)
                }
                None => (ValueExpectation::Absent, Vec::new()),
            };
            let excess = superseded.len().saturating_sub(SUPERSEDED_KEPT);
            superseded.drain(..excess);
            let fresh = Stored {
                refresh_token: self.inner.configured.expose().to_owned(),
                seeded_from: seed.clone(),
                superseded,
                ..Stored::default()
            };
            if let Swapped::Written(version) = self.swap(expected, &fresh).await? {
                return Ok(Versioned {
                    value: fresh,
                    version,
                });
            }
        }
        Err(changing())
    }

    /// An access token to call with: the stored one while it has more than `refresh_ahead`
    /// left; else a refreshed one (the stored one still, when a refresh ahead of expiry fails
    /// or another gateway's is in flight).
    pub(crate) async fn access_token(&self) -> Result<String, TokenError> {
        self.obtain(None).await
    }

    /// Zalo refused `refused` as invalid or expired: another one (one another call or another
    /// gateway stored since, or a fresh one).
    pub(crate) async fn after_refusal(&self, refused: &str) -> Result<String, TokenError> {
        self.obtain(Some(refused)).await
    }

    async fn obtain(&self, refused: Option<&str>) -> Result<String, TokenError> {
        let _turn = self.inner.turn.lock().await;
        let mut waiting: Option<Waiting> = None;
        let mut changes = 0;
        loop {
            let current = self.current().await?;
            let tokens = &current.value;
            let now = self.now_ms();
            let usable = !tokens.access_token.is_empty()
                && Some(tokens.access_token.as_str()) != refused
                && tokens.access_expires_at_ms > now.saturating_add(EXPIRY_MARGIN_MS);
            if usable
                && tokens.access_expires_at_ms > now.saturating_add(self.inner.refresh_ahead_ms)
            {
                return Ok(tokens.access_token.clone());
            }
            if self.in_flight_elsewhere(tokens, now, &mut waiting) {
                if usable {
                    return Ok(tokens.access_token.clone());
                }
                tokio::time::sleep(WAIT_POLL).await;
                continue;
            }
            let access = tokens.access_token.clone();
            match self.refresh(current).await {
                Ok(Refreshed::Token(token)) => return Ok(token),
                Ok(Refreshed::Changed) => {
                    changes += 1;
                    if changes >= MAX_ROUNDS {
                        return Err(changing());
                    }
                }
                Err(error) if usable => {
                    warn!(%error, "refreshing the Zalo access token ahead of expiry failed; the current one is used meanwhile");
                    return Ok(access);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Whether the marker in `tokens` is a refresh another instance may still have in flight:
    /// set by someone else, younger than a request can take by the gateway's clock, and not
    /// waited on that long already (whatever the clocks say).
    fn in_flight_elsewhere(
        &self,
        tokens: &Stored,
        now: u64,
        waiting: &mut Option<Waiting>,
    ) -> bool {
        let Some(since) = tokens.refreshing_since_ms else {
            return false;
        };
        if tokens.refreshing_by.as_deref() == Some(self.inner.id.as_str()) {
            // Ours, and none of ours is in flight (this call holds the turn): interrupted.
            return false;
        }
        let limit = self.inner.in_flight_for;
        let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        if now.saturating_sub(since) >= limit_ms {
            return false;
        }
        let marker = (since, tokens.refreshing_by.clone());
        let started = match waiting {
            Some(w) if w.marker == marker => w.since,
            _ => {
                let since = tokio::time::Instant::now();
                *waiting = Some(Waiting { marker, since });
                since
            }
        };
        started.elapsed() < limit
    }

    /// Spends the stored refresh token of `current` for a new pair, which is stored before it
    /// is returned.
    async fn refresh(&self, current: Versioned<Stored>) -> Result<Refreshed, TokenError> {
        let interrupted = current.value.refreshing_since_ms;
        let spent = current.value.refresh_token.clone();
        let mut marked = current.value;
        marked.refreshing_since_ms = Some(interrupted.unwrap_or_else(|| self.now_ms()));
        marked.refreshing_by = Some(self.inner.id.clone());
        // Durable before the request: a lost answer leaves the marker behind.
        let marked_version = match self
            .swap(ValueExpectation::Version(current.version), &marked)
            .await?
        {
            Swapped::Written(version) => version,
            Swapped::Conflict(_) => return Ok(Refreshed::Changed),
        };
        match self.inner.api.refresh(&spent).await {
            Ok(answer) => {
                let fresh = Stored {
                    access_token: answer.access_token,
                    access_expires_at_ms: self
                        .now_ms()
                        .saturating_add(answer.expires_in_s.saturating_mul(1_000)),
                    refresh_token: answer.refresh_token,
                    seeded_from: marked.seeded_from,
                    refreshing_since_ms: None,
                    refreshing_by: None,
                    superseded: marked.superseded,
                };
                // Before anything uses it: the old refresh token is spent from here on.
                self.store_answer(marked_version, &spent, &fresh).await?;
                info!(
                    expires_in_s = answer.expires_in_s,
                    "the Zalo access token was refreshed"
                );
                Ok(Refreshed::Token(fresh.access_token))
            }
            Err(CallError::Refused(error)) => {
                // Another gateway may have stored a rotation meanwhile (it took this marker for
                // an interrupted one): its tokens are the live ones.
                if let Some(stored) = self.read().await?
                    && stored.value.refresh_token != spent
                {
                    return Ok(Refreshed::Changed);
                }
                if interrupted.is_none() {
                    // A refusal rotated nothing: no earlier refresh is unaccounted for.
                    let mut cleared = marked.clone();
                    cleared.refreshing_since_ms = None;
                    cleared.refreshing_by = None;
                    // A conflict: someone wrote since, and what they wrote stands.
                    self.swap(ValueExpectation::Version(marked_version), &cleared)
                        .await?;
                }
                let access_left_s = marked.access_left_s(self.now_ms());
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
                // Nothing reached Zalo: the refresh token is not spent; the marker is as it was.
                let mut restored = marked;
                restored.refreshing_since_ms = interrupted;
                if interrupted.is_none() {
                    restored.refreshing_by = None;
                }
                self.swap(ValueExpectation::Version(marked_version), &restored)
                    .await?;
                Err(TokenError::Unavailable(reason))
            }
            // The marker stays: Zalo may have rotated the token.
            Err(CallError::Lost(reason)) => Err(TokenError::Unavailable(reason)),
        }
    }

    /// Stores `fresh`, the answer to a refresh that spent `spent`, over the marker written at
    /// version `expected`. Someone may have touched the marker meanwhile (taken it for an
    /// interrupted refresh); while the stored chain is still the one spent, the answer is
    /// written over it. A chain replaced by a re-authorization stands.
    async fn store_answer(
        &self,
        mut expected: i64,
        spent: &str,
        fresh: &Stored,
    ) -> Result<(), TokenError> {
        for _ in 0..MAX_ROUNDS {
            match self
                .swap(ValueExpectation::Version(expected), fresh)
                .await?
            {
                Swapped::Written(_) => return Ok(()),
                Swapped::Conflict(Some(stored)) if stored.value.refresh_token == spent => {
                    expected = stored.version;
                }
                Swapped::Conflict(_) => {
                    warn!(
                        "the stored Zalo tokens were replaced (a re-authorization) while a refresh \
                         was in flight: they stand, and the refreshed access token serves this \
                         call only"
                    );
                    return Ok(());
                }
            }
        }
        Err(changing())
    }

    /// The refresh token the next refresh spends (tests read it to play the operator).
    #[cfg(test)]
    pub(crate) async fn stored_refresh_token(&self) -> String {
        self.read()
            .await
            .ok()
            .flatten()
            .map(|s| s.value.refresh_token)
            .unwrap_or_default()
    }
}

fn changing() -> TokenError {
    TokenError::Unavailable(
        "the stored Zalo tokens kept changing under this call (other gateways writing them); \
         it is tried again"
            .into(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn api(base: &str) -> OaApi {
        OaApi::new(base, base, "1", Secret::new("k"), Duration::from_secs(3))
    }

    #[test]
    fn tokens_never_print() {
        let stored = Stored {
            access_token: "acc-secret".into(),
            refresh_token: "ref-secret".into(),
            ..Stored::default()
        };
        assert!(!format!("{stored:?}").contains("secret"));
    }

    async fn open(state: &ChannelState, base: &str, token: &str) -> TokenStore {
        open_with(state, api(base), token).await
    }

    async fn open_with(state: &ChannelState, api: OaApi, token: &str) -> TokenStore {
        TokenStore::open(
            state.clone(),
            &LegacyFiles::none(),
            api,
            "ZR",
            &Secret::new(token),
            Duration::ZERO,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn the_configured_token_seeds_the_value_and_a_new_one_replaces_the_chain() {
        let dir = tempfile::tempdir().unwrap();
        let state = clawgate_conformance::channel_state(dir.path(), "zalo", "default");
        let base = "http://127.0.0.1:9";
        let store = open(&state, base, "refresh-one").await;
        assert_eq!(store.stored_refresh_token().await, "refresh-one");
        // A rotation happened in an earlier run: the stored token wins over the environment.
        let mut rotated = store.read().await.unwrap().unwrap();
        rotated.value.refresh_token = "refresh-two".into();
        store
            .swap(ValueExpectation::Version(rotated.version), &rotated.value)
            .await
            .unwrap();
        let again = open(&state, base, "refresh-one").await;
        assert_eq!(again.stored_refresh_token().await, "refresh-two");
        let adopted = open(&state, base, "refresh-fresh").await;
        assert_eq!(adopted.stored_refresh_token().await, "refresh-fresh");
        // A gateway still configured with the replaced token keeps the new chain.
        let stale = open(&state, base, "refresh-one").await;
        assert_eq!(stale.stored_refresh_token().await, "refresh-fresh");
    }

    /// Two gateways on one store find the access token refused at the same moment: one
    /// refreshes, the other waits for its answer and uses it; the refresh token is spent once.
    #[cfg(feature = "simulator")]
    #[tokio::test]
    async fn two_gateways_refreshing_at_once_spend_the_refresh_token_once() {
        use crate::simulator::{SimulatorConfig, ZaloSimulator};
        let sim = ZaloSimulator::start(SimulatorConfig::default())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let configured = sim.authorize();
        // Two gateways: each its own connection to the one SQLite store.
        let gateway = || {
            let state = clawgate_conformance::channel_state(dir.path(), "zalo", "default");
            let api = OaApi::new(
                &sim.api_url(),
                &sim.api_url(),
                &sim.app_id(),
                Secret::new(sim.app_secret()),
                Duration::from_secs(3),
            );
            let configured = configured.clone();
            async move { open_with(&state, api, &configured).await }
        };
        let (a, b) = (gateway().await, gateway().await);
        let first = a.access_token().await.unwrap();
        assert_eq!(b.access_token().await.unwrap(), first, "b uses a's token");
        for _ in 0..3 {
            let old = a.access_token().await.unwrap();
            sim.expire_access_tokens();
            let (from_a, from_b) = tokio::join!(a.after_refusal(&old), b.after_refusal(&old));
            let (from_a, from_b) = (from_a.unwrap(), from_b.unwrap());
            assert_ne!(from_a, old);
            assert_eq!(from_a, from_b, "one refresh, its answer used by both");
        }
        let refreshes: Vec<_> = sim
            .calls()
            .into_iter()
            .filter(|c| c.path == "/v4/oa/access_token")
            .collect();
        assert_eq!(refreshes.len(), 4, "one at the start, one per expiry");
        let errors: Vec<_> = refreshes.iter().map(|c| c.error).collect();
        assert_eq!(errors, vec![0; 4], "no refresh token was sent twice");
        assert_eq!(sim.live_refresh_tokens(), 1);
    }
}
