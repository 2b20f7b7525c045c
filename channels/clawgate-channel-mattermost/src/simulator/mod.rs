//! A Mattermost server on loopback: REST v4 and the WebSocket as the server behaves
//! (platform-apis-wave2 §11), with an exact record of what landed.
//!
//! [`MattermostSimulator::start`] binds one port on `127.0.0.1`. REST under `/api/v4/…`
//! (`Authorization: Bearer <token>`, the `{id, message, detailed_error, request_id, status_code,
//! is_oauth}` error body, 26-character ids, the 16,383-rune limit, `root_id` threads, channel
//! membership, the `pending_post_id` cache of 30 s with its in-flight 500, optional rate limiting
//! with `X-Ratelimit-*` and a plain-text 429) and `/api/v4/websocket` (token by header or
//! `authentication_challenge`, `hello` with `connection_id`, `posted` / `post_edited` /
//! `post_deleted` with the post as a JSON string, `seq`, resume by `connection_id` +
//! `sequence_number` from a 128-event dead queue, a fresh connection outside it).
//!
//! Tests play people and other bots ([`MattermostSimulator::person_writes`]), break things
//! ([`MattermostSimulator::inject`], [`MattermostSimulator::drop_sockets`],
//! [`MattermostSimulator::restart`]), move time ([`MattermostSimulator::advance_clock`]) and
//! judge from the record ([`MattermostSimulator::posts`], [`MattermostSimulator::visible`]).
//!
//! Invariants: a refused call has no effect; a call that took effect is in the record whether
//! or not its answer reached the client; every event of a connection has the next `seq`.

mod http;
mod state;
mod ws;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use state::Inner;
pub use state::{CallRecord, SimPost, SimUser};

/// A REST route family, for faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /api/v4/posts`.
    CreatePost,
    /// `PUT /api/v4/posts/{id}/patch` and `PUT /api/v4/posts/{id}`.
    EditPost,
    /// `DELETE /api/v4/posts/{id}`.
    DeletePost,
    /// `GET /api/v4/channels/{id}/posts`.
    ListPosts,
    /// Everything else.
    Other,
}

/// What a faulty call meets.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Applied, then the connection is cut before the answer.
    LoseAnswer,
    /// Refused with this status and error id (nothing happens).
    Error {
        /// HTTP status.
        status: u16,
        /// Mattermost's error id (`api.post.create_post.…`).
        id: String,
        /// Its text.
        message: String,
    },
    /// A 429 `limit exceeded`, resetting after this many seconds.
    RateLimited {
        /// `X-Ratelimit-Reset`.
        reset_s: u64,
    },
    /// A create is held in flight (its `pending_post_id` seen, no post yet) until
    /// [`MattermostSimulator::release`].
    Hold,
}

/// One planned fault: after `after` matching calls go through, the next one meets `kind`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Which calls it applies to (`None`: any REST call).
    pub route: Option<Route>,
    /// Matching calls let through first.
    pub after: u32,
    /// What happens.
    pub kind: FaultKind,
}

impl Fault {
    /// The next call on `route` meets `kind`.
    pub fn on(route: Route, kind: FaultKind) -> Fault {
        Fault {
            route: Some(route),
            after: 0,
            kind,
        }
    }

    /// Any next call meets `kind`.
    pub fn any(kind: FaultKind) -> Fault {
        Fault {
            route: None,
            after: 0,
            kind,
        }
    }

    /// Lets `after` matching calls through first.
    pub fn after(mut self, after: u32) -> Fault {
        self.after = after;
        self
    }
}

/// How a simulator is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulatorConfig {
    /// Where it listens; `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// `RateLimitSettings`: calls per second per token (off by default, as on a server).
    pub rate_limit_per_second: Option<u32>,
    /// `seenPendingPostIdsCache`'s time to live.
    pub pending_post_ttl: Duration,
    /// Events a connection keeps for a resume.
    pub dead_queue: usize,
    /// How long an inactive connection can be resumed.
    pub resume_window: Duration,
    /// `PostMessageMaxRunesV2`.
    pub max_runes: usize,
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            rate_limit_per_second: None,
            pending_post_ttl: Duration::from_secs(30),
            dead_queue: 128,
            resume_window: Duration::from_secs(300),
            max_runes: 16_383,
        }
    }
}

/// Connections of the WebSocket, as the server counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketStats {
    /// Connections open now.
    pub open: usize,
    /// Connections that got a fresh `connection_id`.
    pub fresh: usize,
    /// Connections that resumed an earlier `connection_id`.
    pub resumed: usize,
}

/// The running simulator; dropped, it stops.
#[derive(Debug, Clone)]
pub struct MattermostSimulator {
    inner: Arc<Inner>,
    _guard: Arc<Guard>,
}

/// Stops the server when the last handle goes.
#[derive(Debug)]
struct Guard(Arc<Inner>);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.shutdown.send(true);
    }
}

impl MattermostSimulator {
    /// Starts a server with one team.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<MattermostSimulator> {
        let inner = Arc::new(Inner::new(config));
        http::start(&inner).await?;
        Ok(MattermostSimulator {
            _guard: Arc::new(Guard(inner.clone())),
            inner,
        })
    }

    /// `http://127.0.0.1:<port>`: the server URL a client is given.
    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr())
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.inner.addr().port()
    }

    /// The team's id.
    pub fn team_id(&self) -> String {
        self.inner.team_id.clone()
    }

    /// A bot account with a bot access token.
    pub fn add_bot(&self, username: &str) -> SimUser {
        self.inner.with(|s| s.add_user(username, true))
    }

    /// A person (with a personal access token, so a client library can act as them).
    pub fn add_person(&self, username: &str) -> SimUser {
        self.inner.with(|s| s.add_user(username, false))
    }

    /// An open channel of the team with these members; returns its id.
    pub fn add_channel(&self, name: &str, members: &[&SimUser]) -> String {
        self.inner.with(|s| s.add_channel(name, "O", members))
    }

    /// The direct channel of two users (type `D`, named `<id>__<id>`).
    pub fn add_dm(&self, a: &SimUser, b: &SimUser) -> String {
        let name = {
            let mut ids = [a.id.clone(), b.id.clone()];
            ids.sort();
            format!("{}__{}", ids[0], ids[1])
        };
        self.inner.with(|s| s.add_channel(&name, "D", &[a, b]))
    }

    /// `user` joins `channel`.
    pub fn join(&self, channel: &str, user: &SimUser) {
        self.inner.with(|s| {
            if let Some(c) = s.channels.get_mut(channel) {
                c.members.insert(user.id.clone());
            }
        });
    }

    /// `user` leaves `channel` (its posts there are refused with 403 afterwards).
    pub fn leave(&self, channel: &str, user: &SimUser) {
        self.inner.with(|s| {
            if let Some(c) = s.channels.get_mut(channel) {
                c.members.remove(&user.id);
            }
        });
    }

    /// `user` writes `text` into `channel` (in the thread of `root_id` when given); the post
    /// and its `posted` event appear.
    pub fn person_writes(
        &self,
        channel: &str,
        user: &SimUser,
        text: &str,
        root_id: Option<&str>,
    ) -> SimPost {
        self.inner.with(|s| {
            s.create_post(
                &self.inner,
                &user.id,
                channel,
                text,
                root_id.unwrap_or_default(),
                serde_json::json!({}),
                "",
            )
        })
    }

    /// `user` edits a post (a `post_edited` event).
    pub fn edit_post(&self, post_id: &str, text: &str) -> Option<SimPost> {
        self.inner
            .with(|s| s.patch_post(&self.inner, post_id, Some(text), None).ok())
    }

    /// Someone deletes a post (a `post_deleted` event).
    pub fn delete_post(&self, post_id: &str) -> bool {
        self.inner
            .with(|s| s.delete_post(&self.inner, post_id).is_ok())
    }

    /// Plans a fault.
    pub fn inject(&self, fault: Fault) {
        self.inner.with(|s| s.faults.push(fault));
    }

    /// Lets every held create go on.
    pub fn release(&self) {
        // The flag first: a woken create reads it before waiting again.
        self.inner.with(|s| s.held_release = true);
        self.inner.release.notify_waiters();
    }

    /// Closes every WebSocket connection abruptly; each stays resumable.
    pub fn drop_sockets(&self) {
        // The server closed them: it knows at once (a resume right after finds them inactive).
        self.inner.with(|s| {
            s.socket_epoch += 1;
            let now = s.now();
            for c in s.connections.values_mut().filter(|c| c.active) {
                c.disconnect(now);
            }
        });
        self.inner.sockets_changed();
    }

    /// A server restart: the pending_post_id cache and every WebSocket connection (with its dead
    /// queue) are forgotten; posts stay (they are in the database).
    pub fn restart(&self) {
        self.inner.with(|s| {
            s.pending.clear();
            s.connections.clear();
            s.socket_epoch += 1;
        });
        self.inner.sockets_changed();
    }

    /// Moves the server's clock forward (post times, the pending cache, the resume window).
    pub fn advance_clock(&self, by: Duration) {
        self.inner.with(|s| s.clock_offset += by);
    }

    /// Every post of `channel` ever created, deleted ones included, oldest first.
    pub fn posts(&self, channel: &str) -> Vec<SimPost> {
        self.inner.with(|s| {
            s.posts
                .iter()
                .filter(|p| p.channel_id == channel)
                .cloned()
                .collect()
        })
    }

    /// The posts of `channel` a person sees: not deleted, oldest first.
    pub fn visible(&self, channel: &str) -> Vec<SimPost> {
        self.posts(channel)
            .into_iter()
            .filter(|p| p.delete_at == 0)
            .collect()
    }

    /// One post by id.
    pub fn post(&self, id: &str) -> Option<SimPost> {
        self.inner
            .with(|s| s.posts.iter().find(|p| p.id == id).cloned())
    }

    /// Creates whose `pending_post_id` is seen and whose post is not made yet.
    pub fn in_flight(&self) -> usize {
        self.inner
            .with(|s| s.pending.values().filter(|p| p.post_id.is_none()).count())
    }

    /// The REST calls made, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.with(|s| s.calls.clone())
    }

    /// The WebSocket's connections.
    pub fn socket_stats(&self) -> SocketStats {
        self.inner.with(|s| s.stats)
    }

    /// The `posted` event of `post` as the WebSocket sends it (without `seq`).
    pub fn posted_event(&self, post: &SimPost) -> serde_json::Value {
        self.inner.with(|s| s.event("posted", post))
    }
}
