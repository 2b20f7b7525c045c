//! A loopback Urbit ship as a Tlon bot sees it: Eyre's login, channels (pokes, subscriptions,
//! acks, server-sent events) and scries, with Tlon's `chat` (DMs) and `channels` (group
//! channels) agents behind them (platform-apis-wave2 §15):
//!
//! - `POST /~/login` `password=<+code>` → 204 with `set-cookie: urbauth-~ship=…`; a wrong
//!   code → 400. Every other route wants the cookie (403 without).
//! - `PUT` (or `POST`) `/~/channel/<uid>`: a JSON array of actions; the first creates the
//!   channel; answered 204 once taken. A poke's result is an event:
//!   `{"id", "response": "poke", "ok": "ok"}` or `{"id", "response": "poke", "err": "<trace>"}`;
//!   a subscription's too, then `{"id", "response": "diff", "json", "mark"}` per fact, and
//!   `{"id", "response": "quit"}` when it ends.
//! - `GET /~/channel/<uid>`: `id: N` / `data: <json>` events. Every unacked event is replayed
//!   on each new GET (events up to a `Last-Event-ID` header count as acked); an ack clears
//!   every event up to its id. A backlog over the clog threshold whose oldest event is older
//!   than the clog timeout clogs the channel: its subscriptions are kicked (`quit`). A deleted
//!   or reaped channel answers 404.
//! - DMs: the client picks the writ id (`~author/<@ud>`); an `add` whose id the DM already has
//!   is taken without a second message (\[likely, unverified\] on real ships). Group posts get
//!   host-assigned ids (an `@ud` of the host's `@da`).
//! - Scries (\[unverified\] paths): `/chat/dm/<ship>/writs/writ/id/<author>/<ud>`,
//!   `/channels/v4/<nest>/posts/newest/<n>/outline`, `/channels/v4/<nest>/posts/post/<id>`.
//!
//! The simulator records what landed (the judge of the crash tests) and injects faults:
//! refused pokes, lost poke results (the poke is applied, its result never emitted), PUTs
//! answered with an error status (nothing applied), dropped event streams, reaped channels.

mod http;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::aura::{da_from_unix_ms, format_ud, parse_ud, ship};
use crate::story;

/// How the simulated ship is set up.
#[derive(Debug, Clone)]
pub struct ShipConfig {
    /// The ship's name (`~zod`).
    pub our: String,
    /// Its `+code`.
    pub code: String,
    /// The group channels that exist (nests `chat/~host/name`).
    pub nests: Vec<String>,
    /// How many unacked events a channel may hold before it can clog (Eyre: 50 \[obs\]).
    pub clog_threshold: usize,
    /// How old the oldest unacked event must be for a clog (Eyre: 30 s \[obs\]).
    pub clog_timeout: Duration,
}

impl Default for ShipConfig {
    fn default() -> ShipConfig {
        ShipConfig {
            our: "~zod".into(),
            code: "lidlut-tabwed-pillex-ridrup".into(),
            nests: vec!["chat/~zod/general".into()],
            clog_threshold: 50,
            clog_timeout: Duration::from_secs(30),
        }
    }
}

/// A fault the next poke (of the chat or channels agent) meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The agent refuses the poke (`err` with this trace); nothing happens.
    Nack(String),
    /// The poke is applied but its result event is never emitted (the answer is lost).
    LoseResult,
    /// The PUT carrying the poke is answered with this status; nothing is applied.
    PutStatus(u16),
    /// The poke is applied, then every event stream is dropped before its result is read
    /// (the result stays queued and is replayed).
    DropStreams,
}

/// One DM message.
#[derive(Debug, Clone, PartialEq)]
pub struct Writ {
    /// The writ id (`~author/<@ud>`).
    pub id: String,
    /// Its author.
    pub author: String,
    /// Its `sent` (ms).
    pub sent: u64,
    /// Its text (the story read back).
    pub text: String,
    /// Its story.
    pub content: Value,
}

/// One group channel post or thread reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Post {
    /// The host-assigned id (`@ud`).
    pub id: String,
    /// Its author.
    pub author: String,
    /// Its `sent` (ms).
    pub sent: u64,
    /// Its text.
    pub text: String,
    /// Its story.
    pub content: Value,
    /// Thread replies (empty for a reply).
    pub replies: Vec<Post>,
}

/// Something of ours that landed, for the crash judge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    /// `dm:~ship`, `chat/~host/name` or `chat/~host/name#<parent>`.
    pub place: String,
    /// The message id.
    pub id: String,
    /// Its text.
    pub text: String,
}

struct Stream {
    tx: mpsc::UnboundedSender<String>,
}

#[derive(Default)]
struct Chan {
    next_event: u64,
    queue: BTreeMap<u64, (Value, Instant)>,
    subs: BTreeMap<u64, (String, String)>,
    stream: Option<Stream>,
}

#[derive(Default)]
struct State {
    sessions: HashSet<String>,
    channels: HashMap<String, Chan>,
    dms: BTreeMap<String, Vec<Writ>>,
    nests: BTreeMap<String, Vec<Post>>,
    last_da: u128,
    faults: Vec<(u32, Fault)>,
    applied_pokes: u64,
    acks: u64,
    kicks: u64,
    streams_opened: u64,
    /// Every diff handed out: `(channel uid, subscription, fact)`.
    diffs: Vec<(String, u64, Value)>,
    /// Every fact the agents gave: `(app, fact)`.
    facts: Vec<(String, Value)>,
}

pub(crate) struct Inner {
    config: ShipConfig,
    state: Mutex<State>,
}

/// A running simulated ship.
#[derive(Clone)]
pub struct Ship {
    inner: Arc<Inner>,
    url: String,
}

impl std::fmt::Debug for Ship {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ship")
            .field("url", &self.url)
            .field("our", &self.inner.config.our)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

fn sse(id: u64, data: &Value) -> String {
    format!("id: {id}\ndata: {data}\n\n")
}

impl Chan {
    fn emit(&mut self, data: Value) {
        self.next_event += 1;
        let id = self.next_event;
        if let Some(stream) = &self.stream
            && stream.tx.send(sse(id, &data)).is_err()
        {
            self.stream = None;
        }
        self.queue.insert(id, (data, Instant::now()));
    }

    fn clogged(&self, config: &ShipConfig) -> bool {
        self.queue.len() > config.clog_threshold
            && self
                .queue
                .values()
                .next()
                .is_some_and(|(_, at)| at.elapsed() >= config.clog_timeout)
    }
}

impl State {
    fn next_da(&mut self) -> u128 {
        let da = da_from_unix_ms(now_ms()).max(self.last_da + 1);
        self.last_da = da;
        da
    }

    /// Hands a fact to every subscription of `app`, kicking the subscriptions of channels it
    /// clogs.
    fn broadcast(&mut self, config: &ShipConfig, app: &str, mark: &str, fact: &Value) {
        self.facts.push((app.to_owned(), fact.clone()));
        let mut kicks = 0;
        for (uid, chan) in &mut self.channels {
            let subs: Vec<u64> = chan
                .subs
                .iter()
                .filter(|(_, (a, _))| a == app)
                .map(|(id, _)| *id)
                .collect();
            for sub in subs {
                chan.emit(json!({ "id": sub, "response": "diff", "json": fact, "mark": mark }));
                self.diffs.push((uid.clone(), sub, fact.clone()));
            }
            if !chan.subs.is_empty() && chan.clogged(config) {
                let subs: Vec<u64> = chan.subs.keys().copied().collect();
                chan.subs.clear();
                for sub in subs {
                    chan.emit(json!({ "id": sub, "response": "quit" }));
                    kicks += 1;
                }
            }
        }
        self.kicks += kicks;
    }

    fn take_fault(&mut self) -> Option<Fault> {
        let (after, _) = self.faults.first_mut()?;
        if *after > 0 {
            *after -= 1;
            return None;
        }
        Some(self.faults.remove(0).1)
    }
}

fn writ_json(writ: &Writ, time: &str) -> Value {
    json!({
        "essay": { "content": writ.content, "author": writ.author, "sent": writ.sent, "kind": null },
        "seal": { "id": writ.id, "time": time },
    })
}

fn post_json(post: &Post) -> Value {
    let replies: serde_json::Map<String, Value> = post
        .replies
        .iter()
        .map(|r| {
            (
                r.id.clone(),
                json!({
                    "memo": { "content": r.content, "author": r.author, "sent": r.sent },
                    "seal": { "id": r.id, "parent-id": post.id },
                }),
            )
        })
        .collect();
    json!({
        "essay": { "content": post.content, "author": post.author, "sent": post.sent, "kind": "/chat" },
        "seal": { "id": post.id, "replies": replies },
    })
}

impl Inner {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies one poke; `Err` is the agent's refusal.
    fn apply_poke(
        &self,
        state: &mut State,
        app: &str,
        mark: &str,
        body: &Value,
    ) -> Result<(), String> {
        let our = &self.config.our;
        match (app, mark) {
            ("hood", "helm-hi") => Ok(()),
            ("chat", "chat-dm-action") => {
                let to = body
                    .get("ship")
                    .and_then(Value::as_str)
                    .filter(|s| s.starts_with('~'))
                    .ok_or("%chat: bad chat-dm-action: no ship")?;
                let id = body
                    .pointer("/diff/id")
                    .and_then(Value::as_str)
                    .ok_or("%chat: bad chat-dm-action: no writ id")?;
                let memo = body
                    .pointer("/diff/delta/add/memo")
                    .ok_or("%chat: bad chat-dm-action: only `add` is simulated")?;
                let (author, ud) = id.split_once('/').ok_or("%chat: bad writ id")?;
                let da = parse_ud(ud).ok_or("%chat: bad writ id: not an @ud")?;
                if author != our || memo.get("author").and_then(Value::as_str) != Some(our) {
                    return Err("%chat: a writ must be written by our ship".into());
                }
                let content = memo.get("content").cloned().unwrap_or(Value::Null);
                let text = story::to_text(&content).ok_or("%chat: content is not a story")?;
                let sent = memo
                    .get("sent")
                    .and_then(Value::as_u64)
                    .ok_or("%chat: memo without sent")?;
                let writs = state.dms.entry(to.to_owned()).or_default();
                if writs.iter().any(|w| w.id == id) {
                    // The same writ id again: already there, nothing new.
                    return Ok(());
                }
                let writ = Writ {
                    id: id.to_owned(),
                    author: our.clone(),
                    sent,
                    text,
                    content,
                };
                writs.push(writ.clone());
                let fact = json!({ "whom": to, "id": id, "response": { "add": {
                    "essay": writ_json(&writ, "")["essay"], "time": format_ud(da),
                }}});
                state.broadcast(&self.config, "chat", "writ-response", &fact);
                Ok(())
            }
            ("channels", "channel-action-1") => {
                let nest = body
                    .pointer("/channel/nest")
                    .and_then(Value::as_str)
                    .ok_or("%channels: bad channel-action-1: no nest")?
                    .to_owned();
                if !state.nests.contains_key(&nest) {
                    return Err(format!("%channels: no channel {nest}"));
                }
                let post = body
                    .pointer("/channel/action/post")
                    .ok_or("%channels: only post actions are simulated")?;
                let (add, parent) = if let Some(add) = post.get("add") {
                    (add, None)
                } else if let Some(reply) = post.get("reply") {
                    let parent = reply
                        .get("id")
                        .and_then(Value::as_str)
                        .ok_or("%channels: reply without a parent id")?;
                    let add = reply
                        .pointer("/action/add")
                        .ok_or("%channels: only reply adds are simulated")?;
                    (add, Some(parent.to_owned()))
                } else {
                    return Err("%channels: unknown post action".into());
                };
                if add.get("author").and_then(Value::as_str) != Some(our) {
                    return Err("%channels: a post must be written by our ship".into());
                }
                let content = add.get("content").cloned().unwrap_or(Value::Null);
                let text = story::to_text(&content).ok_or("%channels: content is not a story")?;
                let sent = add
                    .get("sent")
                    .and_then(Value::as_u64)
                    .ok_or("%channels: post without sent")?;
                self.add_post(state, &nest, parent.as_deref(), our, sent, text, content)
                    .map(|_| ())
            }
            _ => Err(format!("no agent {app} taking mark {mark} on this ship")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn add_post(
        &self,
        state: &mut State,
        nest: &str,
        parent: Option<&str>,
        author: &str,
        sent: u64,
        text: String,
        content: Value,
    ) -> Result<String, String> {
        let id = format_ud(state.next_da());
        let post = Post {
            id: id.clone(),
            author: author.to_owned(),
            sent,
            text,
            content,
            replies: Vec::new(),
        };
        let posts = state
            .nests
            .get_mut(nest)
            .ok_or_else(|| format!("%channels: no channel {nest}"))?;
        let fact = match parent {
            None => {
                let view = post_json(&post);
                posts.push(post);
                json!({ "nest": nest, "response": { "post": { "id": id, "r-post": { "set": {
                    "essay": view["essay"], "seal": { "id": id },
                }}}}})
            }
            Some(parent) => {
                let top = posts
                    .iter_mut()
                    .find(|p| p.id == parent)
                    .ok_or_else(|| format!("%channels: no post {parent} in {nest}"))?;
                let memo =
                    json!({ "content": post.content, "author": post.author, "sent": post.sent });
                top.replies.push(post);
                json!({ "nest": nest, "response": { "post": { "id": parent, "r-post": { "reply": {
                    "id": id, "r-reply": { "set": { "memo": memo, "seal": { "id": id, "parent-id": parent } } },
                }}}}})
            }
        };
        state.broadcast(&self.config, "channels", "channel-response-2", &fact);
        Ok(id)
    }

    /// A scry of `path` (without `.json`).
    fn scry(&self, path: &str) -> Option<Value> {
        let state = self.state();
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match parts.as_slice() {
            ["chat", "dm", with, "writs", "writ", "id", author, ud] => {
                let id = format!("{author}/{ud}");
                let writ = state.dms.get(*with)?.iter().find(|w| w.id == id)?;
                Some(writ_json(writ, ud))
            }
            [
                "channels",
                "v4",
                kind,
                host,
                name,
                "posts",
                "newest",
                count,
                "outline",
            ] => {
                let nest = format!("{kind}/{host}/{name}");
                let count: usize = count.parse().ok()?;
                let posts = state.nests.get(&nest)?;
                let map: serde_json::Map<String, Value> = posts
                    .iter()
                    .rev()
                    .take(count)
                    .map(|p| (p.id.clone(), post_json(p)))
                    .collect();
                Some(json!({ "posts": map, "newer": null, "older": null }))
            }
            ["channels", "v4", kind, host, name, "posts", "post", id] => {
                let nest = format!("{kind}/{host}/{name}");
                let post = state.nests.get(&nest)?.iter().find(|p| p.id == *id)?;
                Some(post_json(post))
            }
            _ => None,
        }
    }
}

impl Ship {
    /// Starts a ship on a loopback port.
    pub async fn start(config: ShipConfig) -> std::io::Result<Ship> {
        let mut state = State::default();
        for nest in &config.nests {
            state.nests.insert(nest.clone(), Vec::new());
        }
        let inner = Arc::new(Inner {
            config,
            state: Mutex::new(state),
        });
        let url = http::serve(inner.clone()).await?;
        Ok(Ship { inner, url })
    }

    /// The ship's URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its name.
    pub fn our(&self) -> &str {
        &self.inner.config.our
    }

    /// Its `+code`.
    pub fn code(&self) -> &str {
        &self.inner.config.code
    }

    /// After `after` more pokes (of chat or channels), one poke meets `fault`.
    pub fn inject(&self, after: u32, fault: Fault) {
        self.inner.state().faults.push((after, fault));
    }

    /// `from` writes us a DM; returns its writ id.
    pub fn dm_from(&self, from: &str, text: &str) -> String {
        self.dm_from_as(from, text, false)
    }

    /// `from`, a bot (its author is its profile object), writes us a DM.
    pub fn dm_from_bot(&self, from: &str, text: &str) -> String {
        self.dm_from_as(from, text, true)
    }

    /// The last fact as the feed hands it over (`{"app", "mark", "event"}`).
    pub fn last_event(&self) -> Option<Value> {
        let state = self.inner.state();
        let (app, fact) = state.facts.last()?;
        Some(json!({ "app": app, "mark": null, "event": fact }))
    }

    fn dm_from_as(&self, from: &str, text: &str, bot: bool) -> String {
        let from = ship(from);
        let mut state = self.inner.state();
        let da = state.next_da();
        let id = format!("{from}/{}", format_ud(da));
        let content = story::from_text(text);
        let writ = Writ {
            id: id.clone(),
            author: from.clone(),
            sent: now_ms(),
            text: text.to_owned(),
            content,
        };
        state
            .dms
            .entry(from.clone())
            .or_default()
            .push(writ.clone());
        let mut essay = writ_json(&writ, "")["essay"].clone();
        if bot {
            essay["author"] = json!({ "ship": from, "nickname": "a bot", "avatar": null });
        }
        let fact = json!({ "whom": from, "id": id, "response": { "add": {
            "essay": essay, "time": format_ud(da),
        }}});
        state.broadcast(&self.inner.config, "chat", "writ-response", &fact);
        id
    }

    fn person_story(&self, text: &str, mention: bool) -> Value {
        if mention {
            json!([{ "inline": [{ "ship": self.inner.config.our }, format!(" {text}")] }])
        } else {
            story::from_text(text)
        }
    }

    /// `from` posts `text` in `nest` (mentioning us when `mention`); returns the post id.
    pub fn post_from(&self, nest: &str, from: &str, text: &str, mention: bool) -> String {
        let content = self.person_story(text, mention);
        let full = story::to_text(&content).unwrap_or_default();
        let mut state = self.inner.state();
        self.inner
            .add_post(&mut state, nest, None, &ship(from), now_ms(), full, content)
            .expect("the nest exists")
    }

    /// `from` replies `text` in thread `parent` of `nest`; returns the reply id.
    pub fn reply_from(
        &self,
        nest: &str,
        parent: &str,
        from: &str,
        text: &str,
        mention: bool,
    ) -> String {
        let content = self.person_story(text, mention);
        let full = story::to_text(&content).unwrap_or_default();
        let mut state = self.inner.state();
        self.inner
            .add_post(
                &mut state,
                nest,
                Some(parent),
                &ship(from),
                now_ms(),
                full,
                content,
            )
            .expect("the nest and parent exist")
    }

    /// Every diff handed out so far, handed out again as new events (an agent giving the
    /// same facts twice, acked ones included); how many.
    pub fn repeat_diffs(&self) -> usize {
        let mut state = self.inner.state();
        let diffs = state.diffs.clone();
        let mut repeated = 0;
        for (uid, sub, fact) in diffs {
            if let Some(chan) = state.channels.get_mut(&uid)
                && chan.subs.contains_key(&sub)
            {
                chan.emit(json!({ "id": sub, "response": "diff", "json": fact, "mark": "repeat" }));
                repeated += 1;
            }
        }
        repeated
    }

    /// The DM with `with`, oldest first.
    pub fn dm(&self, with: &str) -> Vec<Writ> {
        self.inner
            .state()
            .dms
            .get(&ship(with))
            .cloned()
            .unwrap_or_default()
    }

    /// Our messages in the DM with `with`, as texts.
    pub fn our_dm_texts(&self, with: &str) -> Vec<String> {
        let our = self.our().to_owned();
        self.dm(with)
            .into_iter()
            .filter(|w| w.author == our)
            .map(|w| w.text)
            .collect()
    }

    /// The posts of `nest`, oldest first, with their replies.
    pub fn posts(&self, nest: &str) -> Vec<Post> {
        self.inner
            .state()
            .nests
            .get(nest)
            .cloned()
            .unwrap_or_default()
    }

    /// Every message of ours that landed, DMs and posts and replies.
    pub fn landed(&self) -> Vec<Landed> {
        let state = self.inner.state();
        let our = &self.inner.config.our;
        let mut out = Vec::new();
        for (with, writs) in &state.dms {
            for w in writs.iter().filter(|w| &w.author == our) {
                out.push(Landed {
                    place: format!("dm:{with}"),
                    id: w.id.clone(),
                    text: w.text.clone(),
                });
            }
        }
        for (nest, posts) in &state.nests {
            for p in posts {
                if &p.author == our {
                    out.push(Landed {
                        place: nest.clone(),
                        id: p.id.clone(),
                        text: p.text.clone(),
                    });
                }
                for r in p.replies.iter().filter(|r| &r.author == our) {
                    out.push(Landed {
                        place: format!("{nest}#{}", p.id),
                        id: r.id.clone(),
                        text: r.text.clone(),
                    });
                }
            }
        }
        out
    }

    /// Subscriptions held across all channels, as `(app, path)`.
    pub fn subscriptions(&self) -> Vec<(String, String)> {
        self.inner
            .state()
            .channels
            .values()
            .flat_map(|c| c.subs.values().cloned())
            .collect()
    }

    /// Event streams open now.
    pub fn open_streams(&self) -> usize {
        self.inner
            .state()
            .channels
            .values()
            .filter(|c| c.stream.as_ref().is_some_and(|s| !s.tx.is_closed()))
            .count()
    }

    /// Event streams opened so far (GETs answered 200).
    pub fn streams_opened(&self) -> u64 {
        self.inner.state().streams_opened
    }

    /// Unacked events across all channels.
    pub fn unacked(&self) -> usize {
        self.inner
            .state()
            .channels
            .values()
            .map(|c| c.queue.len())
            .sum()
    }

    /// Acks taken, and subscriptions kicked for clogging.
    pub fn acks_and_kicks(&self) -> (u64, u64) {
        let state = self.inner.state();
        (state.acks, state.kicks)
    }

    /// Pokes applied (chat and channels).
    pub fn applied_pokes(&self) -> u64 {
        self.inner.state().applied_pokes
    }

    /// Drops every open event stream (a network blip, a ship restart): channels, their
    /// subscriptions and unacked events stay.
    pub fn drop_streams(&self) {
        for chan in self.inner.state().channels.values_mut() {
            chan.stream = None;
        }
    }

    /// Reaps every channel (their GET answers 404 from now on).
    pub fn reap_channels(&self) {
        self.inner.state().channels.clear();
    }

    /// Forgets every session cookie (they were revoked; clients must log in again).
    pub fn revoke_sessions(&self) {
        self.inner.state().sessions.clear();
    }
}
