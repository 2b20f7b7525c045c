//! The simulator's state: users, channels, posts, the pending_post_id cache, faults, and the
//! WebSocket connections with their dead queues.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use super::{Fault, SimulatorConfig, SocketStats};

/// A user account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimUser {
    /// 26-character id.
    pub id: String,
    /// `username`.
    pub username: String,
    /// Its access token.
    pub token: String,
    /// A bot account.
    pub is_bot: bool,
}

/// A post as the database holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimPost {
    /// 26-character id.
    pub id: String,
    /// Milliseconds.
    pub create_at: i64,
    /// Milliseconds.
    pub update_at: i64,
    /// Milliseconds; 0 when never edited.
    pub edit_at: i64,
    /// Milliseconds; 0 when not deleted.
    pub delete_at: i64,
    /// The author.
    pub user_id: String,
    /// The channel.
    pub channel_id: String,
    /// The thread root; empty for a root post.
    pub root_id: String,
    /// The text.
    pub message: String,
    /// `""` for a normal post, `system_…` for system messages.
    #[serde(rename = "type")]
    pub kind: String,
    /// Arbitrary properties (bots' posts carry `from_bot: "true"`).
    pub props: Value,
    /// The client's dedupe id, echoed back.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pending_post_id: String,
}

/// One REST call as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    /// `POST`, `PUT`…
    pub method: String,
    /// The path.
    pub path: String,
    /// The answer's status (0 when the connection was cut before any answer).
    pub status: u16,
    /// Whether the answer reached the client.
    pub answered: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct SimChannel {
    pub(crate) id: String,
    pub(crate) name: String,
    /// `O` open, `P` private, `D` direct, `G` group.
    pub(crate) kind: String,
    pub(crate) members: BTreeSet<String>,
}

/// An entry of `seenPendingPostIdsCache`.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) seen_at: Duration,
    /// `None` while the create is in flight.
    pub(crate) post_id: Option<String>,
}

/// A WebSocket connection's server side: kept after a disconnect for resumes.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) user_id: String,
    /// The next `seq`.
    pub(crate) sequence: i64,
    /// The last events sent, for a resume (`seq`, the event).
    pub(crate) dead_queue: VecDeque<(i64, Value)>,
    /// Events not yet written to the socket.
    pub(crate) outbox: VecDeque<Value>,
    pub(crate) active: bool,
    pub(crate) inactive_since: Duration,
    /// The socket task serving it now: a task that lost it to a resume leaves it alone.
    pub(crate) owner: u64,
}

/// An API error as the server writes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) id: String,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: u16, id: &str, message: &str) -> ApiError {
        ApiError {
            status,
            id: id.to_owned(),
            message: message.to_owned(),
        }
    }

    pub(crate) fn body(&self, request_id: &str) -> Value {
        json!({
            "id": self.id,
            "message": self.message,
            "detailed_error": "",
            "request_id": request_id,
            "status_code": self.status,
            "is_oauth": false,
        })
    }
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) users: HashMap<String, SimUser>,
    pub(crate) channels: HashMap<String, SimChannel>,
    pub(crate) posts: Vec<SimPost>,
    pub(crate) pending: HashMap<String, Pending>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) connections: HashMap<String, Connection>,
    pub(crate) stats: SocketStats,
    /// Bumped to close every open socket.
    pub(crate) socket_epoch: u64,
    pub(crate) clock_offset: Duration,
    pub(crate) held_release: bool,
    /// Per token: the rate-limit window's start and the calls in it.
    pub(crate) rate: HashMap<String, (Duration, u32)>,
    pub(crate) next_id: u64,
    /// When the last post was created (ids and times increase).
    last_ms: i64,
}

/// What the server and the control API share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) team_id: String,
    state: Mutex<State>,
    pub(crate) addr: OnceLock<SocketAddr>,
    pub(crate) shutdown: watch::Sender<bool>,
    /// Woken when events are queued or sockets must close.
    pub(crate) sockets: watch::Sender<u64>,
    pub(crate) release: Notify,
}

fn wall() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// A Mattermost-shaped id: 26 lowercase base-32 characters.
fn make_id(n: u64, salt: u64) -> String {
    const ALPHABET: &[u8] = b"ybndrfg8ejkmcpqxot1uwisza345h769";
    let mut x = n
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(salt.rotate_left(17));
    let mut y = n ^ salt.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    let mut out = String::with_capacity(26);
    for i in 0..26 {
        let source = if i < 13 { &mut x } else { &mut y };
        out.push(ALPHABET[(*source & 31) as usize] as char);
        *source = source.rotate_right(5) ^ (n + i);
    }
    out
}

impl Inner {
    pub(crate) fn new(config: SimulatorConfig) -> Inner {
        let salt = u64::try_from(wall().as_nanos() % u128::from(u64::MAX)).unwrap_or(7);
        Inner {
            config,
            team_id: make_id(0, salt),
            state: Mutex::new(State {
                users: HashMap::new(),
                channels: HashMap::new(),
                posts: Vec::new(),
                pending: HashMap::new(),
                faults: Vec::new(),
                calls: Vec::new(),
                connections: HashMap::new(),
                stats: SocketStats::default(),
                socket_epoch: 0,
                clock_offset: Duration::ZERO,
                held_release: false,
                rate: HashMap::new(),
                next_id: salt % 1_000_000,
                last_ms: 0,
            }),
            addr: OnceLock::new(),
            shutdown: watch::channel(false).0,
            sockets: watch::channel(0).0,
            release: Notify::new(),
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
            .get()
            .copied()
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    pub(crate) fn sockets_changed(&self) {
        self.sockets.send_modify(|n| *n += 1);
    }
}

impl State {
    /// The server's clock (wall time plus what tests advanced).
    pub(crate) fn now(&self) -> Duration {
        wall() + self.clock_offset
    }

    pub(crate) fn now_ms(&self) -> i64 {
        i64::try_from(self.now().as_millis()).unwrap_or(i64::MAX)
    }

    pub(crate) fn new_id(&mut self) -> String {
        self.next_id += 1;
        make_id(self.next_id, 0x5eed)
    }

    pub(crate) fn add_user(&mut self, username: &str, is_bot: bool) -> SimUser {
        let id = self.new_id();
        let token = self.new_id();
        let user = SimUser {
            id: id.clone(),
            username: username.to_owned(),
            token,
            is_bot,
        };
        self.users.insert(id, user.clone());
        user
    }

    pub(crate) fn add_channel(&mut self, name: &str, kind: &str, members: &[&SimUser]) -> String {
        let id = self.new_id();
        self.channels.insert(
            id.clone(),
            SimChannel {
                id: id.clone(),
                name: name.to_owned(),
                kind: kind.to_owned(),
                members: members.iter().map(|u| u.id.clone()).collect(),
            },
        );
        id
    }

    pub(crate) fn user_by_token(&self, token: &str) -> Option<SimUser> {
        self.users.values().find(|u| u.token == token).cloned()
    }

    fn post_time(&mut self) -> i64 {
        // Strictly increasing, so `since` and ordering never tie.
        let now = self.now_ms().max(self.last_ms + 1);
        self.last_ms = now;
        now
    }

    /// Creates a post (no checks: the REST handler and the control API check first) and
    /// broadcasts `posted`.
    pub(crate) fn create_post(
        &mut self,
        inner: &Inner,
        user_id: &str,
        channel_id: &str,
        message: &str,
        root_id: &str,
        mut props: Value,
        pending_post_id: &str,
    ) -> SimPost {
        if self.users.get(user_id).is_some_and(|u| u.is_bot) {
            // The server marks every bot account's post.
            props["from_bot"] = json!("true");
        }
        let at = self.post_time();
        let post = SimPost {
            id: self.new_id(),
            create_at: at,
            update_at: at,
            edit_at: 0,
            delete_at: 0,
            user_id: user_id.to_owned(),
            channel_id: channel_id.to_owned(),
            root_id: root_id.to_owned(),
            message: message.to_owned(),
            kind: String::new(),
            props,
            pending_post_id: pending_post_id.to_owned(),
        };
        self.posts.push(post.clone());
        self.broadcast(inner, "posted", &post);
        post
    }

    pub(crate) fn find_post(&mut self, id: &str) -> Result<&mut SimPost, ApiError> {
        self.posts
            .iter_mut()
            .find(|p| p.id == id && p.delete_at == 0)
            .ok_or_else(|| ApiError::new(404, "app.post.get.app_error", "Unable to get the post."))
    }

    /// A patch: only the given fields change.
    pub(crate) fn patch_post(
        &mut self,
        inner: &Inner,
        id: &str,
        message: Option<&str>,
        props: Option<Value>,
    ) -> Result<SimPost, ApiError> {
        let at = self.post_time();
        let post = self.find_post(id)?;
        if let Some(message) = message {
            post.message = message.to_owned();
        }
        if let Some(mut props) = props {
            // The server keeps its own marker on a bot's post.
            if post.props.get("from_bot").is_some() {
                props["from_bot"] = json!("true");
            }
            post.props = props;
        }
        post.edit_at = at;
        post.update_at = at;
        let post = post.clone();
        self.broadcast(inner, "post_edited", &post);
        Ok(post)
    }

    pub(crate) fn delete_post(&mut self, inner: &Inner, id: &str) -> Result<SimPost, ApiError> {
        let at = self.post_time();
        let post = self.find_post(id)?;
        post.delete_at = at;
        post.update_at = at;
        let post = post.clone();
        self.broadcast(inner, "post_deleted", &post);
        Ok(post)
    }

    /// The event of `post`, without `seq` (each connection numbers its own).
    pub(crate) fn event(&self, event: &str, post: &SimPost) -> Value {
        let channel = self.channels.get(&post.channel_id);
        let sender = self
            .users
            .get(&post.user_id)
            .map(|u| format!("@{}", u.username))
            .unwrap_or_default();
        let mut data = json!({
            "post": serde_json::to_string(post).unwrap_or_default(),
            "channel_display_name": channel.map(|c| c.name.clone()).unwrap_or_default(),
            "channel_name": channel.map(|c| c.name.clone()).unwrap_or_default(),
            "channel_type": channel.map(|c| c.kind.clone()).unwrap_or_default(),
            "sender_name": sender,
            "team_id": "",
        });
        if event == "posted" {
            // Members named `@username` in the text, as the server's `mentions` (a JSON string).
            let mentioned: Vec<&str> = channel
                .into_iter()
                .flat_map(|c| c.members.iter())
                .filter_map(|id| self.users.get(id))
                .filter(|u| u.id != post.user_id && mentions(&post.message, &u.username))
                .map(|u| u.id.as_str())
                .collect();
            if !mentioned.is_empty() {
                data["mentions"] = json!(serde_json::to_string(&mentioned).unwrap_or_default());
            }
        }
        json!({
            "event": event,
            "data": data,
            "broadcast": {
                "omit_users": null,
                "user_id": "",
                "channel_id": post.channel_id,
                "team_id": "",
            },
        })
    }

    /// Queues `post`'s event on every connection of the channel's members.
    fn broadcast(&mut self, inner: &Inner, event: &str, post: &SimPost) {
        let Some(members) = self
            .channels
            .get(&post.channel_id)
            .map(|c| c.members.clone())
        else {
            return;
        };
        let value = self.event(event, post);
        let limit = inner.config.dead_queue;
        for connection in self.connections.values_mut() {
            if members.contains(&connection.user_id) {
                connection.push(value.clone(), limit);
            }
        }
        inner.sockets_changed();
    }

    /// Takes the next planned fault matching `route`, counting down the others' `after`.
    pub(crate) fn take_fault(&mut self, route: super::Route) -> Option<super::FaultKind> {
        let index = self
            .faults
            .iter()
            .position(|f| f.route.is_none_or(|r| r == route))?;
        let fault = &mut self.faults[index];
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        Some(self.faults.remove(index).kind)
    }

    /// Drops cache entries older than the TTL.
    pub(crate) fn expire_pending(&mut self, ttl: Duration) {
        let now = self.now();
        self.pending
            .retain(|_, p| now.saturating_sub(p.seen_at) < ttl);
    }
}

/// Whether `text` mentions `@username` (followed by a non-name character or the end).
pub(crate) fn mentions(text: &str, username: &str) -> bool {
    let needle = format!("@{username}");
    text.match_indices(&needle).any(|(at, _)| {
        text[at + needle.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.'))
    })
}

impl Connection {
    pub(crate) fn new(user_id: &str) -> Connection {
        Connection {
            user_id: user_id.to_owned(),
            sequence: 0,
            dead_queue: VecDeque::new(),
            outbox: VecDeque::new(),
            active: true,
            inactive_since: Duration::ZERO,
            owner: 0,
        }
    }

    /// The socket is gone: events wait in the dead queue for a resume.
    pub(crate) fn disconnect(&mut self, now: Duration) {
        self.active = false;
        self.inactive_since = now;
        self.outbox.clear();
    }

    /// Numbers an event, keeps it in the dead queue, and queues it for the socket.
    pub(crate) fn push(&mut self, mut event: Value, limit: usize) {
        event["seq"] = json!(self.sequence);
        self.dead_queue.push_back((self.sequence, event.clone()));
        while self.dead_queue.len() > limit {
            self.dead_queue.pop_front();
        }
        self.sequence += 1;
        if self.active {
            self.outbox.push_back(event);
        }
    }
}
