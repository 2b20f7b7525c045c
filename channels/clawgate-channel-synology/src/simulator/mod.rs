//! Synology Chat on loopback: the DSM Web API `SYNO.Chat.External` and the webhook sender.
//!
//! [`SynologySimulator::start`] binds `127.0.0.1` and serves `GET`/`POST /webapi/entry.cgi?
//! api=SYNO.Chat.External&method=…&version=2&token=%22…%22` as platform-apis-wave2 §7 describes
//! it (all of it \[obs\]: no vendor source was reachable):
//!
//! - the token travels inside URL-encoded double quotes; a bare token does not match;
//! - the body (or the query) carries `payload=<URL-encoded JSON>`: `text`, `file_url`, and for
//!   `chatbot` the `user_ids` (Chat-internal ids, integers);
//! - `incoming` posts into the channel the incoming-webhook token belongs to; `chatbot` posts
//!   to each of `user_ids` as the bot; `user_list` and `channel_list` answer `data.users` /
//!   `data.channels` (bot token);
//! - every answer is HTTP 200 with `{"success":true|false,"error":{"code","errors"?}}`; the
//!   codes are those Synology Chat clients handle (the `synochat` package): 102 unknown API
//!   (also what DSM answers while the Chat package is stopped: inject it for that),
//!   103 unknown method, 104 unsupported version, 117 invalid payload, 404 invalid token, 411
//!   posting too fast;
//! - the rate limit's observable shape is a decision of this simulator (\[obs\]: clients wait
//!   ≥ 500 ms between posts and know 411): a post sooner than
//!   [`SimulatorConfig::min_send_interval`] after the previous accepted post of the same token
//!   answers 411 and creates nothing;
//! - the two user-id spaces: a person's `user_id` in the bot's events is per-integration
//!   ([`SimUser::bot_user_id`]); `chatbot` wants the Chat-internal one ([`SimUser::user_id`],
//!   from `user_list`). A chatbot post to an id that names nobody is refused (117, \[unverified\]);
//!   one to the *other* space's number that happens to name someone lands with that person,
//!   as it would on a NAS.
//!
//! Webhooks: a person's DM to the bot is POSTed to the bot's URL, a channel post starting with
//! a trigger word to the channel's outgoing-webhook URL, form-encoded (`token`, `user_id`,
//! `username`, `post_id`, `timestamp`, `text`; plus `channel_id`, `channel_type`,
//! `channel_name`, `thread_id`, `trigger_word` for outgoing webhooks). Each is tried **once**:
//! no retry semantics are known for Synology, so none are invented;
//! [`SynologySimulator::replay`] posts a delivery again when a test wants a duplicate.
//!
//! Tests play the people ([`SynologySimulator::person_dms_bot`],
//! [`SynologySimulator::person_posts`]), break things ([`SynologySimulator::inject`]) and judge
//! from the platform's own record ([`SynologySimulator::posts`], [`SynologySimulator::calls`],
//! [`SynologySimulator::deliveries`]).
//!
//! Invariants: a refused call creates nothing; an accepted post is in the record whether or
//! not its answer reached the client.

mod http;
mod webhook;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How a simulator is set up.
#[derive(Clone)]
pub struct SimulatorConfig {
    /// Where to listen; `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// The bot integration's token (`chatbot`, `user_list`, `channel_list`, and the `token`
    /// field of the bot's events).
    pub bot_token: String,
    /// The bot's display name.
    pub bot_name: String,
    /// Posts of one token closer than this answer 411 (see the module docs).
    pub min_send_interval: Duration,
    /// The longest `text` accepted (an assumption: no limit is documented; 117 beyond it).
    pub max_text_chars: usize,
    /// How long a webhook receiver may take before the attempt counts as failed.
    pub answer_deadline: Duration,
    /// Whether a post made through an incoming webhook that starts with a trigger word fires
    /// that channel's outgoing webhook, authored by the integration (\[unverified\]: off unless a
    /// test wants to check that the channel never answers its own posts).
    pub echo_integration_posts: bool,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret, even on a test platform.
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("bot_name", &self.bot_name)
            .field("min_send_interval", &self.min_send_interval)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            bot_token: "Xg6tQbBnJ0r7v2Lm9kHp4sWcYd8eFa1uZqRz5NjTx3oVwKiMgUhElOyCbDfSaPnq".into(),
            bot_name: "clawgate".into(),
            min_send_interval: Duration::from_millis(500),
            max_text_chars: 2_000,
            answer_deadline: Duration::from_secs(10),
            echo_integration_posts: false,
        }
    }
}

/// A person with a Chat account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimUser {
    /// The Chat-internal id (`user_list`, `chatbot`'s `user_ids`).
    pub user_id: u64,
    /// The id the bot's events carry for this person (per integration; differs from
    /// [`Self::user_id`]).
    pub bot_user_id: u64,
    /// The DSM user name.
    pub username: String,
    /// The name shown in Chat.
    pub nickname: String,
}

/// A Chat channel with its integrations.
#[derive(Clone, PartialEq, Eq)]
pub struct SimChannel {
    /// Its id (`channel_id`).
    pub channel_id: u64,
    /// Its name.
    pub name: String,
    /// The incoming webhook's token (posts into this channel).
    pub incoming_token: String,
    /// The name posts through the incoming webhook are shown under.
    pub incoming_name: String,
    /// The outgoing webhook's token, once one is set up.
    pub outgoing_token: Option<String>,
    /// The outgoing webhook's trigger words.
    pub trigger_words: Vec<String>,
    /// Where the outgoing webhook posts.
    pub outgoing_url: Option<String>,
}

impl std::fmt::Debug for SimChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimChannel")
            .field("channel_id", &self.channel_id)
            .field("name", &self.name)
            .field("trigger_words", &self.trigger_words)
            .field("outgoing_url", &self.outgoing_url)
            .finish_non_exhaustive()
    }
}

/// Where a post is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conversation {
    /// The DM between the bot and the person with this Chat-internal id.
    Direct(u64),
    /// A channel.
    Channel(u64),
}

/// Who wrote a post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Author {
    /// A person (Chat-internal id).
    Person(u64),
    /// The bot (`chatbot`).
    Bot,
    /// An incoming webhook, under its name.
    Integration(String),
}

/// One post, as Synology Chat holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimPost {
    /// Its id.
    pub post_id: u64,
    /// Where it is.
    pub conversation: Conversation,
    /// Who wrote it.
    pub author: Author,
    /// Its text.
    pub text: String,
    /// The file it links (`file_url`).
    pub file_url: Option<String>,
}

/// One API call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// `GET` or `POST`.
    pub http_method: String,
    /// The `method` parameter.
    pub method: String,
    /// The token as it arrived (quotes included).
    pub raw_token: String,
    /// The decoded `payload`, `Null` when absent or not JSON.
    pub payload: Value,
    /// The HTTP status answered.
    pub status: u16,
    /// `success` of the answer (`None` for a non-JSON answer).
    pub success: Option<bool>,
    /// `error.code` of a refusal.
    pub code: Option<i64>,
    /// The answer was written (`false`: an injected lost answer).
    pub answered: bool,
}

/// One webhook POST and how it went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// The delivery's number (for [`SynologySimulator::replay`]).
    pub id: usize,
    /// Where it went.
    pub url: String,
    /// The form fields posted, in order.
    pub fields: Vec<(String, String)>,
    /// The HTTP status answered; 0: no connection, no answer in time, or not finished yet.
    pub status: u16,
    /// Finished (answered or failed).
    pub done: bool,
}

impl DeliveryRecord {
    /// A field's value.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What an injected fault does to a post (`incoming` / `chatbot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// `success:false` with this code, HTTP 200; nothing is posted.
    Refuse(i64),
    /// The post is made, then the connection closes without an answer.
    LoseAnswer,
    /// A web server's error page with this status (DSM's nginx, a proxy); nothing is posted.
    ServerError(u16),
}

/// A fault on posts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub(crate) kind: FaultKind,
    pub(crate) after: u32,
    pub(crate) times: u32,
    pub(crate) method: Option<String>,
}

impl Fault {
    /// The next post meets `kind`.
    pub fn new(kind: FaultKind) -> Fault {
        Fault {
            kind,
            after: 0,
            times: 1,
            method: None,
        }
    }

    /// After `posts` more posts go through.
    pub fn after(mut self, posts: u32) -> Fault {
        self.after = posts;
        self
    }

    /// For `times` posts in a row.
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times.max(1);
        self
    }

    /// Only posts of `method` (`incoming`, `chatbot`) meet it.
    pub fn method(mut self, method: &str) -> Fault {
        self.method = Some(method.to_owned());
        self
    }
}

pub(crate) struct Delivery {
    pub(crate) record: DeliveryRecord,
}

/// The simulated Chat server's state.
pub(crate) struct World {
    pub(crate) users: Vec<SimUser>,
    pub(crate) channels: Vec<SimChannel>,
    pub(crate) posts: Vec<SimPost>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) bot_url: Option<String>,
    pub(crate) bot_token_revoked: bool,
    pub(crate) last_post: HashMap<String, Instant>,
    pub(crate) cut_deliveries: u32,
    counter: u64,
}

impl World {
    pub(crate) fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    fn user(&self, username: &str) -> Option<SimUser> {
        self.users.iter().find(|u| u.username == username).cloned()
    }
}

pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) addr: SocketAddr,
    world: Mutex<World>,
    pub(crate) http: reqwest::Client,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Inner {
    pub(crate) fn new(config: SimulatorConfig, addr: SocketAddr) -> Inner {
        Inner {
            config,
            addr,
            world: Mutex::new(World {
                users: Vec::new(),
                channels: Vec::new(),
                posts: Vec::new(),
                calls: Vec::new(),
                deliveries: Vec::new(),
                faults: Vec::new(),
                bot_url: None,
                bot_token_revoked: false,
                last_post: HashMap::new(),
                cut_deliveries: 0,
                // Post ids of a NAS in use are large numbers.
                counter: 146_028_888_000,
            }),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .build()
                .unwrap_or_default(),
            shutdown: tokio::sync::watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A token as DSM generates them: 64 letters and digits.
fn token(seed: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..64)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ALPHABET[(state % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// A running simulator; stops when dropped (or by [`SynologySimulator::stop`]).
pub struct SynologySimulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SynologySimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SynologySimulator")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl SynologySimulator {
    /// Starts a simulator set up by `config`.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<SynologySimulator> {
        Ok(SynologySimulator {
            inner: http::start(config).await?,
        })
    }

    /// Stops serving.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// The NAS's base URL (`http://127.0.0.1:<port>`), the channel's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The bot's token.
    pub fn bot_token(&self) -> String {
        self.inner.config.bot_token.clone()
    }

    /// Where the bot's events go; `None`: nowhere (a person's DM is posted, no webhook).
    pub fn set_bot_url(&self, url: Option<&str>) {
        self.inner.world().bot_url = url.map(str::to_owned);
    }

    /// A new Chat account `username` shown as `nickname`.
    pub fn add_user(&self, username: &str, nickname: &str) -> SimUser {
        let mut world = self.inner.world();
        if let Some(user) = world.user(username) {
            return user;
        }
        let n = world.users.len() as u64;
        // Two visibly different id spaces: internal ids from 1001, per-bot ids from 3.
        let user = SimUser {
            user_id: 1_001 + n * 7,
            bot_user_id: 3 + n,
            username: username.to_owned(),
            nickname: nickname.to_owned(),
        };
        world.users.push(user.clone());
        user
    }

    /// A person by user name.
    pub fn user(&self, username: &str) -> Option<SimUser> {
        self.inner.world().user(username)
    }

    /// A new channel `name` with an incoming webhook (posting as `incoming_name`).
    pub fn add_channel(&self, name: &str, incoming_name: &str) -> SimChannel {
        let mut world = self.inner.world();
        let channel_id = 30 + world.channels.len() as u64;
        let seed = world.next();
        let channel = SimChannel {
            channel_id,
            name: name.to_owned(),
            incoming_token: token(seed),
            incoming_name: incoming_name.to_owned(),
            outgoing_token: None,
            trigger_words: Vec::new(),
            outgoing_url: None,
        };
        world.channels.push(channel.clone());
        channel
    }

    /// Sets up the outgoing webhook of channel `channel_id`: posts starting with one of
    /// `trigger_words` go to `url`. Returns its token.
    pub fn set_outgoing_webhook(
        &self,
        channel_id: u64,
        trigger_words: &[&str],
        url: &str,
    ) -> Option<String> {
        let mut world = self.inner.world();
        let seed = world.next();
        let channel = world
            .channels
            .iter_mut()
            .find(|c| c.channel_id == channel_id)?;
        let token = channel
            .outgoing_token
            .get_or_insert_with(|| token(seed ^ 0x5eed))
            .clone();
        channel.trigger_words = trigger_words.iter().map(|w| (*w).to_owned()).collect();
        channel.outgoing_url = Some(url.to_owned());
        Some(token)
    }

    /// A channel by id.
    pub fn channel(&self, channel_id: u64) -> Option<SimChannel> {
        self.inner
            .world()
            .channels
            .iter()
            .find(|c| c.channel_id == channel_id)
            .cloned()
    }

    /// Person `username` writes `text` to the bot: the post, and the bot's event (one
    /// attempt) when the bot has a URL. Returns the post id.
    ///
    /// # Panics
    /// When `username` has no account ([`Self::add_user`] first).
    pub fn person_dms_bot(&self, username: &str, text: &str) -> u64 {
        let mut world = self.inner.world();
        let user = world
            .user(username)
            .unwrap_or_else(|| panic!("{username} has no Chat account: add_user first"));
        let post_id = world.next();
        world.posts.push(SimPost {
            post_id,
            conversation: Conversation::Direct(user.user_id),
            author: Author::Person(user.user_id),
            text: text.to_owned(),
            file_url: None,
        });
        if let Some(url) = world.bot_url.clone() {
            let fields = vec![
                ("token".into(), self.inner.config.bot_token.clone()),
                ("user_id".into(), user.bot_user_id.to_string()),
                ("username".into(), user.username.clone()),
                ("post_id".into(), post_id.to_string()),
                ("timestamp".into(), now_ms().to_string()),
                ("text".into(), text.to_owned()),
            ];
            webhook::enqueue(&self.inner, &mut world, url, fields);
        }
        post_id
    }

    /// Person `username` posts `text` into channel `channel_id`: the post, and the outgoing
    /// webhook's event when the text starts with a trigger word. Returns the post id.
    ///
    /// # Panics
    /// When the person or the channel does not exist.
    pub fn person_posts(&self, username: &str, channel_id: u64, text: &str) -> u64 {
        let mut world = self.inner.world();
        let user = world
            .user(username)
            .unwrap_or_else(|| panic!("{username} has no Chat account: add_user first"));
        let post_id = world.next();
        world.posts.push(SimPost {
            post_id,
            conversation: Conversation::Channel(channel_id),
            author: Author::Person(user.user_id),
            text: text.to_owned(),
            file_url: None,
        });
        let (id, name) = (user.user_id.to_string(), user.username.clone());
        outgoing(
            &self.inner,
            &mut world,
            channel_id,
            post_id,
            &id,
            &name,
            text,
        );
        post_id
    }

    /// Every post, oldest first: the platform's own record.
    pub fn posts(&self) -> Vec<SimPost> {
        self.inner.world().posts.clone()
    }

    /// The texts the bot posted to `username`, oldest first.
    pub fn bot_texts_to(&self, username: &str) -> Vec<String> {
        let world = self.inner.world();
        let Some(user) = world.user(username) else {
            return Vec::new();
        };
        world
            .posts
            .iter()
            .filter(|p| p.conversation == Conversation::Direct(user.user_id))
            .filter(|p| p.author == Author::Bot)
            .map(|p| p.text.clone())
            .collect()
    }

    /// The texts integrations posted into channel `channel_id`, oldest first.
    pub fn integration_texts_in(&self, channel_id: u64) -> Vec<String> {
        self.inner
            .world()
            .posts
            .iter()
            .filter(|p| p.conversation == Conversation::Channel(channel_id))
            .filter(|p| matches!(p.author, Author::Integration(_)))
            .map(|p| p.text.clone())
            .collect()
    }

    /// Every API call, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Every webhook delivery, oldest first.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner
            .world()
            .deliveries
            .iter()
            .map(|d| d.record.clone())
            .collect()
    }

    /// Posts delivery `id` again (same fields), as a new delivery; its id.
    pub fn replay(&self, id: usize) -> Option<usize> {
        let mut world = self.inner.world();
        let record = world.deliveries.get(id)?.record.clone();
        Some(webhook::enqueue(
            &self.inner,
            &mut world,
            record.url,
            record.fields,
        ))
    }

    /// Posts arbitrary form `fields` to `url`, as Synology would (a hand-made event).
    pub fn deliver_raw(&self, url: &str, fields: Vec<(String, String)>) -> usize {
        let mut world = self.inner.world();
        webhook::enqueue(&self.inner, &mut world, url.to_owned(), fields)
    }

    /// The next delivery's answer is not read: it counts as failed (status 0).
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_deliveries += 1;
    }

    /// Waits until every delivery has finished; `false` after `deadline`.
    pub async fn deliveries_settled(&self, deadline: Duration) -> bool {
        let until = Instant::now() + deadline;
        loop {
            if self.inner.world().deliveries.iter().all(|d| d.record.done) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The bot's token stops working (404 on every bot call).
    pub fn revoke_bot_token(&self) {
        self.inner.world().bot_token_revoked = true;
    }

    /// Queues a fault for posts.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }
}

/// Fires channel `channel_id`'s outgoing webhook for a post starting with a trigger word.
fn outgoing(
    inner: &Arc<Inner>,
    world: &mut World,
    channel_id: u64,
    post_id: u64,
    user_id: &str,
    username: &str,
    text: &str,
) {
    let Some(channel) = world
        .channels
        .iter()
        .find(|c| c.channel_id == channel_id)
        .cloned()
    else {
        return;
    };
    let (Some(url), Some(token)) = (channel.outgoing_url, channel.outgoing_token) else {
        return;
    };
    let Some(trigger) = channel
        .trigger_words
        .iter()
        .find(|w| text.starts_with(w.as_str()))
    else {
        return;
    };
    let fields = vec![
        ("token".into(), token),
        ("channel_id".into(), channel_id.to_string()),
        ("channel_type".into(), "1".into()),
        ("channel_name".into(), channel.name.clone()),
        ("user_id".into(), user_id.to_owned()),
        ("username".into(), username.to_owned()),
        ("post_id".into(), post_id.to_string()),
        ("thread_id".into(), "0".into()),
        ("timestamp".into(), now_ms().to_string()),
        ("text".into(), text.to_owned()),
        ("trigger_word".into(), trigger.clone()),
    ];
    webhook::enqueue(inner, world, url, fields);
}

impl Drop for SynologySimulator {
    fn drop(&mut self) {
        self.inner.shutdown.send_replace(true);
    }
}
