//! The simulator's state: users, channels and their messages, nonces, buckets, faults, the call
//! record and the Gateway sessions' event logs. Every operation takes the one lock briefly.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::gateway::Command;
use super::{Fault, FaultKind, GatewayStats, Limit, Route, SimUser, SimulatorConfig, WriteOptions};
use crate::wire::{DISCORD_EPOCH_MS, intents};

/// The longest `content`.
pub(crate) const MAX_CONTENT: usize = 2000;
/// The longest `nonce`.
pub(crate) const MAX_NONCE: usize = 25;
/// The invalid-request window.
const INVALID_WINDOW: Duration = Duration::from_secs(600);

/// One message as the simulator holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimMessage {
    /// Snowflake.
    pub id: String,
    /// Channel (or thread).
    pub channel_id: String,
    /// Author's id.
    pub author_id: String,
    /// Author's name.
    pub author_name: String,
    /// Whether a bot wrote it.
    pub author_bot: bool,
    /// The text (after edits).
    pub content: String,
    /// The nonce it was sent with.
    pub nonce: Option<Value>,
    /// The message it answers.
    pub reply_to: Option<String>,
    /// Whether it pinged @everyone/@here (only when `allowed_mentions` let it).
    pub mention_everyone: bool,
    /// Users it pinged.
    pub mentions: Vec<String>,
    /// The `allowed_mentions` it was sent with.
    pub allowed_mentions: Option<Value>,
    /// Edits applied.
    pub edits: u32,
    /// Deleted (kept in the record, not visible).
    pub deleted: bool,
    /// Wall-clock creation, Unix ms.
    pub created_ms: u64,
    /// Wall-clock last edit, Unix ms.
    pub edited_ms: Option<u64>,
}

/// RFC 3339 of a Unix time in ms (UTC), as Discord writes timestamps.
pub(crate) fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}000+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

impl SimMessage {
    /// The `d` of its `MESSAGE_CREATE` in a guild channel (or a DM when `guild_id` is `None`).
    pub fn to_event(&self, guild_id: Option<&str>) -> Value {
        let mut d = self.to_json(guild_id);
        if let Some(guild) = guild_id {
            d["guild_id"] = json!(guild);
            d["member"] = json!({ "roles": [] });
        }
        d
    }

    /// The Message object REST answers with.
    pub fn to_json(&self, guild_id: Option<&str>) -> Value {
        let mut author = json!({
            "id": self.author_id, "username": self.author_name, "discriminator": "0",
            "global_name": self.author_name, "avatar": null,
        });
        if self.author_bot {
            author["bot"] = json!(true);
        }
        let mut value = json!({
            "id": self.id,
            "type": if self.reply_to.is_some() { 19 } else { 0 },
            "channel_id": self.channel_id,
            "author": author,
            "content": self.content,
            "timestamp": rfc3339(self.created_ms),
            "edited_timestamp": self.edited_ms.map(rfc3339),
            "tts": false,
            "mention_everyone": self.mention_everyone,
            "mentions": self.mentions.iter().map(|id| json!({"id": id})).collect::<Vec<_>>(),
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": false,
            "flags": 0,
            "components": [],
        });
        if let Some(nonce) = &self.nonce {
            value["nonce"] = nonce.clone();
        }
        if let Some(reply) = &self.reply_to {
            let mut reference =
                json!({ "type": 0, "channel_id": self.channel_id, "message_id": reply });
            if let Some(guild) = guild_id {
                reference["guild_id"] = json!(guild);
            }
            value["message_reference"] = reference;
        }
        value
    }
}

/// One REST call as the simulator saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// HTTP method.
    pub method: String,
    /// Path after `/api/v10`.
    pub path: String,
    /// Its family.
    pub route: Route,
    /// The bot that called (when the token was valid).
    pub bot: Option<String>,
    /// The status answered (0: cut before answering).
    pub status: u16,
    /// Whether the answer reached the client (false: lost or cut).
    pub answered: bool,
    /// The JSON body sent, if any.
    pub body: Value,
    /// The `X-RateLimit-Scope` of a 429.
    pub scope: Option<String>,
}

/// A refusal: status and body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub status: u16,
    pub body: Value,
}

impl ApiError {
    pub(crate) fn new(status: u16, code: i64, message: &str) -> ApiError {
        ApiError {
            status,
            body: json!({ "message": message, "code": code }),
        }
    }

    /// 50035 with one form error at `field`.
    pub(crate) fn form(field: &str, code: &str, message: &str) -> ApiError {
        ApiError {
            status: 400,
            body: json!({
                "message": "Invalid Form Body", "code": 50035,
                "errors": { field: { "_errors": [ { "code": code, "message": message } ] } }
            }),
        }
    }

    pub(crate) fn unknown_channel() -> ApiError {
        ApiError::new(404, 10003, "Unknown Channel")
    }

    pub(crate) fn unknown_message() -> ApiError {
        ApiError::new(404, 10008, "Unknown Message")
    }
}

pub(crate) struct Channel {
    pub id: String,
    pub name: String,
    pub parent: Option<String>,
    pub dm: bool,
    pub messages: Vec<SimMessage>,
    /// user id → permissions taken away.
    pub denied: HashMap<String, HashSet<String>>,
}

pub(crate) struct Session {
    pub id: String,
    pub bot: String,
    pub intents: u64,
    pub seq: u64,
    /// `(s, t, d)` of every dispatch, in order.
    pub events: Vec<(u64, String, Value)>,
    /// Resumable.
    pub alive: bool,
}

#[derive(Clone, Copy)]
pub(crate) struct Bucket {
    pub remaining: u32,
    pub reset_at: Instant,
}

pub(crate) struct Conn {
    pub bot: Option<String>,
    pub session: Option<String>,
    pub tx: mpsc::UnboundedSender<Command>,
}

pub(crate) struct State {
    pub clock_offset: Duration,
    last_snowflake: u64,
    pub guild_id: String,
    pub users: BTreeMap<String, SimUser>,
    pub channels: BTreeMap<String, Channel>,
    /// (author, nonce) → (message id, when).
    pub nonces: HashMap<(String, String), (String, Instant)>,
    pub buckets: HashMap<(Route, String), Bucket>,
    pub global: HashMap<String, Bucket>,
    pub invalid: (u32, Instant),
    pub banned_until: Option<Instant>,
    pub faults: Vec<Fault>,
    pub log: Vec<CallRecord>,
    pub sessions: HashMap<String, Session>,
    pub conns: HashMap<u64, Conn>,
    pub next_conn: u64,
    pub stats: HashMap<String, GatewayStats>,
    next_token: u64,
}

pub(crate) struct Inner {
    pub config: SimulatorConfig,
    state: Mutex<State>,
    /// Bumped whenever a session's event log grows.
    pub changed: watch::Sender<u64>,
    pub shutdown: watch::Sender<bool>,
    pub rest_addr: OnceLock<SocketAddr>,
    pub gateway_addr: OnceLock<SocketAddr>,
    pub tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl State {
    pub(crate) fn now(&self) -> Instant {
        Instant::now() + self.clock_offset
    }

    pub(crate) fn wall_ms(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_add(self.clock_offset);
        u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
    }

    /// A new snowflake: ms since Discord's epoch, worker 1, an increment; always increasing.
    pub(crate) fn snowflake(&mut self) -> String {
        let at = (self.wall_ms().saturating_sub(DISCORD_EPOCH_MS)) << 22 | (1 << 17);
        self.last_snowflake = at.max(self.last_snowflake + 1);
        self.last_snowflake.to_string()
    }

    pub(crate) fn token_user(&self, token: &str) -> Option<&SimUser> {
        self.users
            .values()
            .find(|u| u.token.as_deref() == Some(token))
    }

    pub(crate) fn denied(&self, channel: &Channel, user: &str, permission: &str) -> bool {
        channel
            .denied
            .get(user)
            .is_some_and(|d| d.contains(permission))
    }

    /// Appends a dispatch to every live session of `bot` (or of every bot when `None`) that
    /// `filter` admits; returns whether any session got it.
    pub(crate) fn dispatch(
        &mut self,
        t: &str,
        mut make: impl FnMut(&SimUser, u64) -> Option<Value>,
    ) -> bool {
        let mut any = false;
        let users = self.users.clone();
        for session in self.sessions.values_mut().filter(|s| s.alive) {
            let Some(bot) = users.get(&session.bot) else {
                continue;
            };
            if let Some(d) = make(bot, session.intents) {
                session.seq += 1;
                session.events.push((session.seq, t.to_owned(), d));
                any = true;
            }
        }
        any
    }

    /// The `MESSAGE_CREATE` of `message` as `bot` with `intents` sees it (or `None` when its
    /// intents do not cover the channel).
    pub(crate) fn message_event(
        guild_id: &str,
        dm: bool,
        message: &SimMessage,
        bot: &SimUser,
        intents_of: u64,
    ) -> Option<Value> {
        let needed = if dm {
            intents::DIRECT_MESSAGES
        } else {
            intents::GUILD_MESSAGES
        };
        if intents_of & needed == 0 {
            return None;
        }
        let mut d = message.to_json((!dm).then_some(guild_id));
        // Without MESSAGE_CONTENT a bot sees text only of its own messages, DMs and mentions.
        let sees_content = intents_of & intents::MESSAGE_CONTENT != 0
            || message.author_id == bot.id
            || dm
            || message.mentions.contains(&bot.id);
        if !sees_content {
            d["content"] = json!("");
        }
        if !dm {
            d["guild_id"] = json!(guild_id);
            d["member"] = json!({ "roles": [], "joined_at": rfc3339(message.created_ms) });
            d["channel_type"] = json!(0);
        } else {
            d["channel_type"] = json!(1);
        }
        Some(d)
    }
}

/// Which users `content` pings and whether it pings everyone, under `allowed_mentions` (absent:
/// everything in the text is parsed).
pub(crate) fn mentions(content: &str, allowed: Option<&Value>) -> (bool, Vec<String>) {
    let parse: Option<Vec<&str>> = allowed.map(|a| {
        a.get("parse")
            .and_then(Value::as_array)
            .map(|p| p.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    });
    let listed: Vec<&str> = allowed
        .and_then(|a| a.get("users"))
        .and_then(Value::as_array)
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let allows = |what: &str| parse.as_ref().is_none_or(|p| p.contains(&what));
    let everyone =
        (content.contains("@everyone") || content.contains("@here")) && allows("everyone");
    let mut users = Vec::new();
    let mut rest = content;
    while let Some(start) = rest.find("<@") {
        let after = &rest[start + 2..];
        let after = after.strip_prefix('!').unwrap_or(after);
        let Some(end) = after.find('>') else { break };
        let id = &after[..end];
        if !id.is_empty()
            && id.bytes().all(|b| b.is_ascii_digit())
            && (allows("users") || listed.contains(&id))
        {
            users.push(id.to_owned());
        }
        rest = &after[end..];
    }
    (everyone, users)
}

impl Inner {
    pub(crate) fn new(config: SimulatorConfig) -> Arc<Inner> {
        let mut state = State {
            clock_offset: Duration::ZERO,
            last_snowflake: 0,
            guild_id: String::new(),
            users: BTreeMap::new(),
            channels: BTreeMap::new(),
            nonces: HashMap::new(),
            buckets: HashMap::new(),
            global: HashMap::new(),
            invalid: (0, Instant::now()),
            banned_until: None,
            faults: Vec::new(),
            log: Vec::new(),
            sessions: HashMap::new(),
            conns: HashMap::new(),
            next_conn: 0,
            stats: HashMap::new(),
            next_token: 0,
        };
        state.guild_id = state.snowflake();
        Arc::new(Inner {
            config,
            state: Mutex::new(state),
            changed: watch::channel(0).0,
            shutdown: watch::channel(false).0,
            rest_addr: OnceLock::new(),
            gateway_addr: OnceLock::new(),
            tasks: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    pub(crate) fn events_changed(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    pub(crate) fn rest_addr(&self) -> SocketAddr {
        *self.rest_addr.get().expect("set at start")
    }

    pub(crate) fn gateway_addr(&self) -> SocketAddr {
        *self.gateway_addr.get().expect("set at start")
    }

    pub(crate) async fn stop(&self) {
        self.shutdown.send_replace(true);
        let tasks: Vec<_> = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
    }

    pub(crate) fn guild_id(&self) -> String {
        self.with_state(|s| s.guild_id.clone())
    }

    pub(crate) fn add_user(&self, username: &str, bot: bool) -> SimUser {
        self.with_state(|s| {
            let id = s.snowflake();
            s.next_token += 1;
            let token = bot.then(|| {
                // The shape of a real token: base64-ish user id, a timestamp, an HMAC part.
                format!("{}.sim{}.{:032x}", id, s.next_token, s.last_snowflake)
            });
            let user = SimUser {
                id: id.clone(),
                username: username.to_owned(),
                bot,
                token,
            };
            s.users.insert(id, user.clone());
            user
        })
    }

    pub(crate) fn add_channel(&self, name: &str, parent: Option<String>, dm: bool) -> String {
        self.with_state(|s| {
            let id = s.snowflake();
            s.channels.insert(
                id.clone(),
                Channel {
                    id: id.clone(),
                    name: name.to_owned(),
                    parent,
                    dm,
                    messages: Vec::new(),
                    denied: HashMap::new(),
                },
            );
            id
        })
    }

    pub(crate) fn deny(&self, channel: &str, user: &str, permission: &str) {
        self.with_state(|s| {
            if let Some(c) = s.channels.get_mut(channel) {
                c.denied
                    .entry(user.to_owned())
                    .or_default()
                    .insert(permission.to_owned());
            }
        });
    }

    /// A message lands in `channel` (a person, another bot, or a REST create) and is dispatched.
    pub(crate) fn land(
        s: &mut State,
        channel: &str,
        author: &SimUser,
        content: &str,
        nonce: Option<Value>,
        reply_to: Option<String>,
        allowed_mentions: Option<Value>,
    ) -> Result<SimMessage, ApiError> {
        let id = s.snowflake();
        let created_ms = s.wall_ms();
        let (mention_everyone, mentioned) = mentions(content, allowed_mentions.as_ref());
        let message = SimMessage {
            id,
            channel_id: channel.to_owned(),
            author_id: author.id.clone(),
            author_name: author.username.clone(),
            author_bot: author.bot,
            content: content.to_owned(),
            nonce,
            reply_to,
            mention_everyone,
            mentions: mentioned,
            allowed_mentions,
            edits: 0,
            deleted: false,
            created_ms,
            edited_ms: None,
        };
        let chan = s
            .channels
            .get_mut(channel)
            .ok_or_else(ApiError::unknown_channel)?;
        chan.messages.push(message.clone());
        let dm = chan.dm;
        let guild = s.guild_id.clone();
        s.dispatch("MESSAGE_CREATE", |bot, intents_of| {
            State::message_event(&guild, dm, &message, bot, intents_of)
        });
        Ok(message)
    }

    pub(crate) fn write(
        &self,
        channel: &str,
        author: &SimUser,
        text: &str,
        options: WriteOptions,
    ) -> SimMessage {
        let landed = self.with_state(|s| {
            Inner::land(
                s,
                channel,
                author,
                text,
                options.nonce.map(Value::String),
                options.reply_to,
                None,
            )
        });
        self.events_changed();
        landed.expect("a channel made by add_channel")
    }

    pub(crate) fn messages(&self, channel: &str) -> Vec<SimMessage> {
        self.with_state(|s| {
            s.channels
                .get(channel)
                .map(|c| c.messages.iter().filter(|m| !m.deleted).cloned().collect())
                .unwrap_or_default()
        })
    }

    pub(crate) fn calls(&self) -> Vec<CallRecord> {
        self.with_state(|s| s.log.clone())
    }

    pub(crate) fn invalid_requests(&self) -> u32 {
        self.with_state(|s| s.invalid.0)
    }

    pub(crate) fn inject(&self, fault: Fault) {
        self.with_state(|s| s.faults.push(fault));
    }

    pub(crate) fn pending_faults(&self) -> usize {
        self.with_state(|s| s.faults.len())
    }

    pub(crate) fn advance_clock(&self, by: Duration) {
        self.with_state(|s| s.clock_offset += by);
    }

    pub(crate) fn gateway_command(&self, bot: &str, command: Command) -> usize {
        self.with_state(|s| {
            let mut sent = 0;
            for conn in s.conns.values() {
                if conn.bot.as_deref() == Some(bot) && conn.tx.send(command.clone()).is_ok() {
                    sent += 1;
                }
            }
            if matches!(command, Command::Drop | Command::Close(_)) {
                // From now on nothing more goes out on them, whenever their tasks notice.
                s.conns.retain(|_, c| c.bot.as_deref() != Some(bot));
            }
            if let Command::Invalidate(false) = command {
                for session in s.sessions.values_mut().filter(|x| x.bot == bot) {
                    session.alive = false;
                }
            }
            sent
        })
    }

    pub(crate) fn connected(&self, bot: &str) -> usize {
        self.with_state(|s| {
            s.conns
                .values()
                .filter(|c| c.bot.as_deref() == Some(bot) && c.session.is_some())
                .count()
        })
    }

    pub(crate) fn gateway_stats(&self, bot: &str) -> GatewayStats {
        self.with_state(|s| s.stats.get(bot).cloned().unwrap_or_default())
    }

    pub(crate) fn dispatched(&self, bot: &str) -> Vec<(String, u64, String, Value)> {
        self.with_state(|s| {
            let mut all: Vec<_> = s
                .sessions
                .values()
                .filter(|x| x.bot == bot)
                .flat_map(|x| {
                    x.events
                        .iter()
                        .map(|(seq, t, d)| (x.id.clone(), *seq, t.clone(), d.clone()))
                })
                .collect();
            all.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
            all
        })
    }
}

/// Takes one call from `bucket` (a fixed window of `limit`): `Err(retry_after)` when empty.
pub(crate) fn take(bucket: &mut Bucket, limit: Limit, now: Instant) -> Result<(), Duration> {
    if now >= bucket.reset_at {
        bucket.remaining = limit.limit;
        bucket.reset_at = now + limit.per;
    }
    if bucket.remaining == 0 {
        return Err(bucket.reset_at - now);
    }
    bucket.remaining -= 1;
    Ok(())
}

/// Counts a 401/403/429 toward the ban; returns whether the client is now banned.
pub(crate) fn count_invalid(s: &mut State, limit: u32) {
    let now = s.now();
    if now.duration_since(s.invalid.1) >= INVALID_WINDOW {
        s.invalid = (0, now);
    }
    s.invalid.0 += 1;
    if s.invalid.0 > limit {
        s.banned_until = Some(s.invalid.1 + INVALID_WINDOW);
    }
}

/// The first planned fault matching `route`, counting down `after`.
pub(crate) fn match_fault(s: &mut State, route: Route) -> Option<FaultKind> {
    let index = s
        .faults
        .iter()
        // A fault for any route leaves the set-up calls (`/users/@me`, `/gateway/bot`) alone.
        .position(|f| f.route.map_or(route != Route::Other, |r| r == route))?;
    let fault = &mut s.faults[index];
    if fault.after > 0 {
        fault.after -= 1;
        return None;
    }
    Some(s.faults.remove(index).kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000+00:00");
        assert_eq!(
            rfc3339(1_420_070_400_123),
            "2015-01-01T00:00:00.123000+00:00"
        );
        assert_eq!(
            rfc3339(1_709_251_199_000),
            "2024-02-29T23:59:59.000000+00:00"
        );
    }

    #[test]
    fn mentions_follow_allowed_mentions() {
        let text = "hi <@123> and @everyone";
        assert_eq!(mentions(text, None), (true, vec!["123".to_owned()]));
        let locked = json!({ "parse": [] });
        assert_eq!(mentions(text, Some(&locked)), (false, vec![]));
        let users = json!({ "parse": [], "users": ["123"] });
        assert_eq!(
            mentions(text, Some(&users)),
            (false, vec!["123".to_owned()])
        );
    }
}
