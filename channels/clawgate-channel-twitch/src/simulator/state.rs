//! The simulated chat: users, rooms, connections, Twitch's sending rules and the record of
//! what landed. Both transports (IRC and Helix) post through [`State::post`], so a rule holds
//! the same way whichever one a client uses.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

use super::{Attempt, AttemptOutcome, Fault, FaultKind, SimMessage, SimUser, SimulatorConfig, Via};

/// The window both chat rate limits count in (20 or 100 messages per 30 s).
pub(crate) const RATE_WINDOW: Duration = Duration::from_secs(30);
/// The duplicate rule's window: identical to your previous message within 30 s.
pub(crate) const DUPLICATE_WINDOW: Duration = Duration::from_secs(30);
/// Twitch's message length limit, in characters.
pub(crate) const MAX_CHARS: usize = 500;

/// A line (or the end) for one client connection.
#[derive(Debug)]
pub(crate) enum Out {
    Line(String),
    Close,
}

/// One IRC client connection.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) login: Option<String>,
    pub(crate) pass: Option<String>,
    pub(crate) tags: bool,
    pub(crate) commands: bool,
    pub(crate) joined: BTreeSet<String>,
    pub(crate) tx: mpsc::UnboundedSender<Out>,
    pub(crate) pongs: u64,
}

impl Conn {
    pub(crate) fn send(&self, line: impl Into<String>) {
        let _ = self.tx.send(Out::Line(line.into()));
    }
}

/// One channel (a broadcaster's chat room).
#[derive(Debug, Default)]
pub(crate) struct Room {
    pub(crate) id: String,
    pub(crate) slow_secs: u64,
    pub(crate) moderators: BTreeSet<String>,
    pub(crate) vips: BTreeSet<String>,
    pub(crate) banned: BTreeSet<String>,
    pub(crate) timed_out: BTreeMap<String, Instant>,
    /// Words AutoMod holds a message for.
    pub(crate) held_terms: Vec<String>,
    pub(crate) messages: Vec<SimMessage>,
}

/// What Twitch's chat rules made of a post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Posted {
    Sent(Box<SimMessage>),
    Dropped { code: String, message: String },
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) config: SimulatorConfig,
    pub(crate) users: BTreeMap<String, SimUser>,
    pub(crate) rooms: BTreeMap<String, Room>,
    pub(crate) conns: BTreeMap<u64, Conn>,
    pub(crate) next_conn: u64,
    next_user_id: u64,
    /// Per sender: when each of its messages (sent or dropped by a chat rule) was posted.
    sends: BTreeMap<String, VecDeque<Instant>>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) attempts: Vec<Attempt>,
    offset: Duration,
    /// Helix points: remaining, and when the bucket is full again.
    pub(crate) points: (u32, Instant),
}

impl State {
    pub(crate) fn new(config: SimulatorConfig) -> State {
        let mut state = State {
            users: BTreeMap::new(),
            rooms: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_conn: 0,
            next_user_id: 1000,
            sends: BTreeMap::new(),
            faults: Vec::new(),
            attempts: Vec::new(),
            offset: Duration::ZERO,
            points: (config.helix_points_per_minute, Instant::now()),
            config: config.clone(),
        };
        let bot = SimUser {
            id: config.bot_user_id.clone(),
            login: config.bot_login.clone(),
            display_name: config.bot_login.clone(),
            token: config.bot_token.clone(),
        };
        state.users.insert(bot.login.clone(), bot);
        for channel in &config.channels {
            state.add_channel(channel);
        }
        state
    }

    /// The simulated clock: real time plus what a test advanced it by.
    pub(crate) fn now(&self) -> Instant {
        Instant::now() + self.offset
    }

    pub(crate) fn advance(&mut self, by: Duration) {
        self.offset += by;
    }

    pub(crate) fn unix_ms(&self) -> u64 {
        let now = SystemTime::now() + self.offset;
        now.duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub(crate) fn add_user(&mut self, login: &str) -> SimUser {
        let login = login.to_ascii_lowercase();
        if let Some(user) = self.users.get(&login) {
            return user.clone();
        }
        self.next_user_id += 1;
        let user = SimUser {
            id: self.next_user_id.to_string(),
            display_name: login.clone(),
            token: format!("{login}tokensimulated{}", self.next_user_id),
            login: login.clone(),
        };
        self.users.insert(login, user.clone());
        user
    }

    /// A channel is its broadcaster's login; the broadcaster becomes a user if new.
    pub(crate) fn add_channel(&mut self, login: &str) -> String {
        let login = login.trim_start_matches('#').to_ascii_lowercase();
        let user = self.add_user(&login);
        self.rooms.entry(login).or_insert_with(|| Room {
            id: user.id.clone(),
            ..Room::default()
        });
        user.id
    }

    pub(crate) fn user_by_token(&self, token: &str) -> Option<&SimUser> {
        self.users.values().find(|u| u.token == token)
    }

    pub(crate) fn room_by_id(&self, id: &str) -> Option<String> {
        self.rooms
            .iter()
            .find(|(_, room)| room.id == id)
            .map(|(login, _)| login.clone())
    }

    /// Whether `login` is the broadcaster, a moderator or a VIP of `channel` (100 / 30 s).
    pub(crate) fn elevated(&self, channel: &str, login: &str) -> bool {
        self.rooms.get(channel).is_some_and(|room| {
            channel == login || room.moderators.contains(login) || room.vips.contains(login)
        })
    }

    /// The next fault for `via`, if one is due.
    pub(crate) fn take_fault(&mut self, via: Via) -> Option<FaultKind> {
        let index = self.faults.iter().position(|f| f.kind.via() == via)?;
        let fault = &mut self.faults[index];
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        let kind = fault.kind.clone();
        fault.times = fault.times.saturating_sub(1);
        if fault.times == 0 {
            self.faults.remove(index);
        }
        Some(kind)
    }

    /// Twitch's chat rules for `sender` posting `text` into `channel`, then the post itself.
    pub(crate) fn post(
        &mut self,
        sender: &str,
        channel: &str,
        text: &str,
        reply_parent: Option<&str>,
        client_nonce: Option<&str>,
        via: Via,
    ) -> Posted {
        let posted = self.check_and_post(sender, channel, text, reply_parent, client_nonce, via);
        self.attempts.push(Attempt {
            via,
            sender: sender.to_owned(),
            channel: channel.to_owned(),
            text: text.to_owned(),
            outcome: match &posted {
                Posted::Sent(m) => AttemptOutcome::Sent(m.id.clone()),
                Posted::Dropped { code, .. } => AttemptOutcome::Dropped(code.clone()),
            },
        });
        posted
    }

    fn check_and_post(
        &mut self,
        sender: &str,
        channel: &str,
        text: &str,
        reply_parent: Option<&str>,
        client_nonce: Option<&str>,
        via: Via,
    ) -> Posted {
        let now = self.now();
        let elevated = self.elevated(channel, sender);
        let drop = |code: &str, message: String| Posted::Dropped {
            code: code.to_owned(),
            message,
        };
        let Some(room) = self.rooms.get_mut(channel) else {
            return drop(
                "msg_channel_suspended",
                "This channel does not exist or has been suspended.".into(),
            );
        };
        if room.banned.contains(sender) {
            return drop(
                "msg_banned",
                format!("You are permanently banned from talking in {channel}."),
            );
        }
        if let Some(until) = room.timed_out.get(sender).copied() {
            if until > now {
                let secs = (until - now).as_secs().max(1);
                return drop(
                    "msg_timedout",
                    format!("You are timed out for {secs} more seconds."),
                );
            }
            room.timed_out.remove(sender);
        }
        let mine = room
            .messages
            .iter()
            .rev()
            .find(|m| m.sender_login == sender);
        if !elevated
            && room.slow_secs > 0
            && let Some(last) = mine
        {
            let next = last.posted_at + Duration::from_secs(room.slow_secs);
            if next > now {
                let secs = (next - now).as_secs().max(1);
                return drop(
                    "msg_slowmode",
                    format!(
                        "This room is in slow mode and you are sending messages too quickly. \
                         You will be able to talk again in {secs} seconds."
                    ),
                );
            }
        }
        if let Some(last) = mine
            && last.text == text
            && last.posted_at + DUPLICATE_WINDOW > now
        {
            return drop(
                "msg_duplicate",
                "Your message was not sent because it is identical to the previous one you \
                 sent, less than 30 seconds ago."
                    .into(),
            );
        }
        let lowered = text.to_lowercase();
        if room
            .held_terms
            .iter()
            .any(|t| lowered.contains(&t.to_lowercase()))
        {
            return drop(
                "msg_rejected",
                "Your message is being checked by mods and has not been sent.".into(),
            );
        }
        let parent = match reply_parent {
            Some(id) => match room.messages.iter().find(|m| m.id == id) {
                Some(parent) => Some(parent.clone()),
                None => {
                    return drop(
                        "msg_rejected",
                        "Your message was not sent because it was rejected.".into(),
                    );
                }
            },
            None => None,
        };
        let limit = if elevated {
            self.config.elevated_rate_limit
        } else {
            self.config.rate_limit
        };
        let window = self.sends.entry(sender.to_owned()).or_default();
        while window.front().is_some_and(|t| *t + RATE_WINDOW <= now) {
            window.pop_front();
        }
        if self.config.rate_limits && window.len() >= limit as usize {
            return drop(
                "msg_ratelimit",
                "Your message was not sent because you are sending messages too quickly.".into(),
            );
        }
        window.push_back(now);
        let user = self.users.get(sender).cloned().unwrap_or_else(|| SimUser {
            id: String::new(),
            login: sender.to_owned(),
            display_name: sender.to_owned(),
            token: String::new(),
        });
        let message = SimMessage {
            id: uuid::Uuid::now_v7().to_string(),
            channel: channel.to_owned(),
            sender_login: user.login.clone(),
            sender_id: user.id.clone(),
            display_name: user.display_name.clone(),
            text: text.to_owned(),
            reply_parent: parent.map(|p| (p.id, p.sender_login, p.text)),
            client_nonce: client_nonce.map(str::to_owned),
            via,
            sent_ts_ms: self.unix_ms(),
            posted_at: now,
        };
        if let Some(room) = self.rooms.get_mut(channel) {
            room.messages.push(message.clone());
        }
        Posted::Sent(Box::new(message))
    }

    /// Relays a posted message to every connection in its channel but `except`.
    pub(crate) fn relay(&self, message: &SimMessage, except: Option<u64>) {
        let room_id = self
            .rooms
            .get(&message.channel)
            .map_or("", |r| r.id.as_str());
        let is_mod = self
            .rooms
            .get(&message.channel)
            .is_some_and(|r| r.moderators.contains(&message.sender_login));
        let mut tags = vec![
            ("badge-info", String::new()),
            (
                "badges",
                badges(&message.channel, &message.sender_login, self),
            ),
            ("color", String::new()),
            ("display-name", message.display_name.clone()),
            ("emotes", String::new()),
            ("first-msg", "0".into()),
            ("flags", String::new()),
            ("id", message.id.clone()),
            ("mod", if is_mod { "1" } else { "0" }.into()),
            ("returning-chatter", "0".into()),
            ("room-id", room_id.to_owned()),
            ("subscriber", "0".into()),
            ("tmi-sent-ts", message.sent_ts_ms.to_string()),
            ("turbo", "0".into()),
            ("user-id", message.sender_id.clone()),
            ("user-type", if is_mod { "mod" } else { "" }.into()),
        ];
        if let Some(nonce) = &message.client_nonce {
            tags.push(("client-nonce", nonce.clone()));
        }
        if let Some((id, login, body)) = &message.reply_parent {
            tags.push(("reply-parent-msg-id", id.clone()));
            tags.push(("reply-parent-user-login", login.clone()));
            tags.push(("reply-parent-display-name", login.clone()));
            tags.push(("reply-parent-msg-body", body.clone()));
        }
        let login = &message.sender_login;
        let plain = format!(
            ":{login}!{login}@{login}.tmi.twitch.tv PRIVMSG #{} :{}",
            message.channel, message.text
        );
        let tagged = format!("{} {plain}", tag_string(&tags));
        for (id, conn) in &self.conns {
            if Some(*id) == except || !conn.joined.contains(&message.channel) {
                continue;
            }
            conn.send(if conn.tags { &tagged } else { &plain });
        }
    }
}

/// The `badges` tag of `login` in `channel`.
pub(crate) fn badges(channel: &str, login: &str, state: &State) -> String {
    let Some(room) = state.rooms.get(channel) else {
        return String::new();
    };
    if channel == login {
        "broadcaster/1".into()
    } else if room.moderators.contains(login) {
        "moderator/1".into()
    } else if room.vips.contains(login) {
        "vip/1".into()
    } else {
        String::new()
    }
}

/// `@k=v;k=v` with IRCv3 tag escaping.
pub(crate) fn tag_string(tags: &[(&str, String)]) -> String {
    let body: Vec<String> = tags
        .iter()
        .map(|(k, v)| format!("{k}={}", escape_tag(v)))
        .collect();
    format!("@{}", body.join(";"))
}

pub(crate) fn escape_tag(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            ';' => out.push_str("\\:"),
            ' ' => out.push_str("\\s"),
            '\\' => out.push_str("\\\\"),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}
