//! What the simulated Teams holds: conversations, the activities in them (the bot's own
//! messages, streams and what people wrote), the queue of activities for the bot, issued
//! tokens, faults, and the record of every call.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use super::{
    CallRecord, ConversationKind, DeliveryRecord, Fault, FaultKind, Op, SimActivity, SimStream,
    SimUser, SimulatorConfig, StreamState,
};

/// How often the inbound queue is looked at when nothing woke it.
pub(crate) const QUEUE_TICK: Duration = Duration::from_millis(25);
/// The per-bot, per-conversation send limits (window, most requests in it), from Teams'
/// rate-limit page.
pub const SEND_LIMITS: [(Duration, usize); 4] = [
    (Duration::from_secs(1), 7),
    (Duration::from_secs(2), 8),
    (Duration::from_secs(30), 60),
    (Duration::from_secs(3_600), 1_800),
];
/// The largest message Teams takes (about 28 KB of content).
pub const MAX_MESSAGE_BYTES: usize = 28_000;

/// A Bot Connector refusal: HTTP status and the `{"error": {"code", "message"}}` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) code: String,
    pub(crate) message: String,
    pub(crate) retry_after_s: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: u16, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: code.to_owned(),
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub(crate) fn body(&self) -> Value {
        // The 401 of a refused token is the service's own page, not the error envelope.
        if self.status == 401 {
            return json!({ "message": self.message });
        }
        json!({ "error": { "code": self.code, "message": self.message } })
    }

    pub(crate) fn throttled(retry_after_s: u64) -> ApiError {
        ApiError {
            retry_after_s: Some(retry_after_s),
            ..ApiError::new(429, "Throttled", "API calls quota exceeded.")
        }
    }
}

/// An answer: HTTP status and JSON body (`Null`: empty).
pub(crate) type Answer = Result<(u16, Value), ApiError>;

pub(crate) struct Conversation {
    pub(crate) id: String,
    pub(crate) kind: ConversationKind,
    pub(crate) name: String,
    pub(crate) bot_member: bool,
    /// Recent sends of the bot here (for the rate limits).
    pub(crate) sends: VecDeque<Instant>,
}

pub(crate) struct QueuedEvent {
    pub(crate) id: String,
    pub(crate) body: Value,
    pub(crate) acked: bool,
    pub(crate) given_up: bool,
    pub(crate) in_flight: bool,
    /// A redelivery asked for while an attempt was in flight: made once that attempt's answer
    /// is in (else the answer would mark it acknowledged and the redelivery would be lost).
    pub(crate) redeliver: bool,
    pub(crate) attempts: u32,
    pub(crate) next_at: Instant,
}

pub(crate) struct IssuedToken {
    pub(crate) token: String,
    pub(crate) expires: Instant,
    pub(crate) revoked: bool,
}

pub(crate) struct World {
    pub(crate) bot: SimUser,
    pub(crate) tenant: String,
    pub(crate) next_id: u64,
    pub(crate) conversations: Vec<Conversation>,
    pub(crate) activities: Vec<SimActivity>,
    pub(crate) people: HashMap<String, SimUser>,
    pub(crate) events: Vec<QueuedEvent>,
    pub(crate) deliveries: Vec<DeliveryRecord>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) tokens: Vec<IssuedToken>,
    pub(crate) token_requests: u32,
    pub(crate) endpoint_url: Option<String>,
    pub(crate) cut_next_delivery: bool,
    pub(crate) app_password: String,
}

pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) addr: SocketAddr,
    world: Mutex<World>,
    pub(crate) events_changed: Notify,
    pub(crate) shutdown_tx: watch::Sender<bool>,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("addr", &self.addr)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Inner {
    pub(crate) fn new(config: SimulatorConfig, addr: SocketAddr) -> Inner {
        let world = World {
            bot: SimUser {
                id: format!("28:{}", config.app_id),
                name: "clawgate".into(),
                aad_object_id: String::new(),
                bot: true,
            },
            tenant: "72f988bf-86f1-41af-91ab-2d7cd011db47".into(),
            // Teams activity ids are epoch milliseconds; the counter starts at a fixed one.
            next_id: 1_764_633_600_000,
            conversations: Vec::new(),
            activities: Vec::new(),
            people: HashMap::new(),
            events: Vec::new(),
            deliveries: Vec::new(),
            calls: Vec::new(),
            faults: Vec::new(),
            tokens: Vec::new(),
            token_requests: 0,
            endpoint_url: None,
            cut_next_delivery: false,
            app_password: config.app_password.clone(),
        };
        Inner {
            config,
            addr,
            world: Mutex::new(world),
            events_changed: Notify::new(),
            shutdown_tx: watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `http://127.0.0.1:<port>/`: the `serviceUrl` of every activity.
    pub(crate) fn service_url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

/// RFC 3339 in UTC with milliseconds, as the Bot Framework writes `timestamp`.
pub(crate) fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The stream fields of an activity: its `streaminfo` entity, else its `channelData` when that
/// names a `streamType` (the form Bot Builder's serializer lets through: it drops entity fields
/// it has no model for, and Teams reads both).
pub(crate) fn streaminfo(activity: &Value) -> Option<&Value> {
    activity["entities"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["type"].as_str() == Some("streaminfo")))
        .filter(|e| e.get("streamType").is_some() || e.get("streamSequence").is_some())
        .or_else(|| {
            let data = &activity["channelData"];
            data.get("streamType").map(|_| data)
        })
}

/// `19:abc@thread.tacv2;messageid=123` → (`19:abc@thread.tacv2`, `Some("123")`).
pub(crate) fn split_thread(conversation: &str) -> (&str, Option<&str>) {
    match conversation.split_once(";messageid=") {
        Some((base, root)) => (base, Some(root)),
        None => (conversation, None),
    }
}

impl World {
    pub(crate) fn next_id(&mut self) -> String {
        self.next_id += 1;
        self.next_id.to_string()
    }

    fn hex_id(&mut self) -> String {
        self.next_id += 1;
        format!("{:016x}", self.next_id.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    pub(crate) fn person(&mut self, name: &str) -> SimUser {
        if let Some(user) = self.people.get(name) {
            return user.clone();
        }
        let hex = self.hex_id();
        let user = SimUser {
            id: format!("29:1{hex}"),
            name: name.to_owned(),
            aad_object_id: format!("{}-0000-4000-8000-{}", &hex[..8], &hex[4..16]),
            bot: false,
        };
        self.people.insert(name.to_owned(), user.clone());
        user
    }

    pub(crate) fn other_bot(&mut self, name: &str) -> SimUser {
        let key = format!("bot:{name}");
        if let Some(user) = self.people.get(&key) {
            return user.clone();
        }
        let hex = self.hex_id();
        let user = SimUser {
            id: format!("28:{hex}"),
            name: name.to_owned(),
            aad_object_id: String::new(),
            bot: true,
        };
        self.people.insert(key, user.clone());
        user
    }

    pub(crate) fn create_conversation(&mut self, kind: ConversationKind, name: &str) -> String {
        let hex = self.hex_id();
        let id = match kind {
            ConversationKind::Personal => format!("a:1{hex}"),
            ConversationKind::GroupChat => format!("19:{hex}@thread.v2"),
            ConversationKind::Channel => format!("19:{hex}@thread.tacv2"),
        };
        self.conversations.push(Conversation {
            id: id.clone(),
            kind,
            name: name.to_owned(),
            bot_member: true,
            sends: VecDeque::new(),
        });
        id
    }

    pub(crate) fn conversation(&self, id: &str) -> Option<&Conversation> {
        self.conversations.iter().find(|c| c.id == id)
    }

    /// The `conversation` object of an activity in `conversation` (thread `root`).
    fn conversation_json(&self, conversation: &Conversation, root: Option<&str>) -> Value {
        let id = match root {
            Some(root) => format!("{};messageid={root}", conversation.id),
            None => conversation.id.clone(),
        };
        let mut value = json!({
            "id": id,
            "conversationType": match conversation.kind {
                ConversationKind::Personal => "personal",
                ConversationKind::GroupChat => "groupChat",
                ConversationKind::Channel => "channel",
            },
            "tenantId": self.tenant,
        });
        if conversation.kind != ConversationKind::Personal {
            value["isGroup"] = json!(true);
            value["name"] = json!(conversation.name);
        }
        value
    }

    fn channel_data(&self, conversation: &Conversation) -> Value {
        let mut data = json!({ "tenant": { "id": self.tenant } });
        if conversation.kind == ConversationKind::Channel {
            data["teamsChannelId"] = json!(conversation.id);
            data["teamsTeamId"] = json!(conversation.id);
            data["channel"] = json!({ "id": conversation.id });
            data["team"] = json!({ "id": conversation.id });
        }
        data
    }

    fn account(user: &SimUser) -> Value {
        let mut value = json!({ "id": user.id, "name": user.name });
        if user.bot {
            value["role"] = json!("bot");
        } else {
            value["aadObjectId"] = json!(user.aad_object_id);
        }
        value
    }

    /// `author` writes `text` in `conversation`; in a channel, a new post (its own thread) or a
    /// reply in thread `root`. In a channel or group chat the bot is @mentioned (Teams delivers
    /// only those). Queues the activity for the bot.
    pub(crate) fn write(
        &mut self,
        conversation: &str,
        author: &SimUser,
        text: &str,
        root: Option<&str>,
        service_url: &str,
    ) -> Option<SimActivity> {
        let conv = self.conversation(conversation)?;
        let kind = conv.kind;
        let id = self.next_id();
        let thread = match kind {
            ConversationKind::Channel => Some(root.map_or_else(|| id.clone(), str::to_owned)),
            _ => None,
        };
        let conv = self.conversation(conversation)?;
        let mention = kind != ConversationKind::Personal;
        let shown = if mention {
            format!("<at>{}</at> {text}", self.bot.name)
        } else {
            text.to_owned()
        };
        let mut entities = vec![json!({
            "type": "clientInfo", "locale": "en-US", "country": "US", "platform": "Web",
            "timezone": "Europe/London",
        })];
        if mention {
            entities.push(json!({
                "type": "mention",
                "mentioned": { "id": self.bot.id, "name": self.bot.name },
                "text": format!("<at>{}</at>", self.bot.name),
            }));
        }
        let now = SystemTime::now();
        let mut body = json!({
            "type": "message",
            "id": id,
            "timestamp": rfc3339(now),
            "localTimestamp": rfc3339(now),
            "serviceUrl": service_url,
            "channelId": "msteams",
            "from": Self::account(author),
            "conversation": self.conversation_json(conv, thread.as_deref()),
            "recipient": { "id": self.bot.id, "name": self.bot.name },
            "textFormat": "plain",
            "text": shown,
            "attachments": [],
            "entities": entities,
            "channelData": self.channel_data(conv),
            "locale": "en-US",
        });
        if let (Some(root), ConversationKind::Channel) = (root, kind) {
            body["replyToId"] = json!(root);
        }
        let activity = SimActivity {
            id: id.clone(),
            conversation: conversation.to_owned(),
            thread,
            from: author.clone(),
            from_bot_under_test: false,
            text: shown,
            reply_to_id: root.map(str::to_owned),
            stream: None,
            deleted: false,
            updates: 0,
        };
        self.activities.push(activity.clone());
        self.queue(&format!("{conversation}|{id}"), body);
        Some(activity)
    }

    /// The bot is added to `conversation` by `by`: a `conversationUpdate` with `membersAdded`.
    pub(crate) fn add_bot(&mut self, conversation: &str, by: &SimUser, service_url: &str) -> bool {
        if self.conversation(conversation).is_none() {
            return false;
        }
        let id = self.next_id();
        let Some(conv) = self.conversation(conversation) else {
            return false;
        };
        let body = json!({
            "type": "conversationUpdate",
            "id": format!("f:{id}"),
            "timestamp": rfc3339(SystemTime::now()),
            "serviceUrl": service_url,
            "channelId": "msteams",
            "from": Self::account(by),
            "conversation": self.conversation_json(conv, None),
            "recipient": { "id": self.bot.id, "name": self.bot.name },
            "membersAdded": [{ "id": self.bot.id }],
            "channelData": self.channel_data(conv),
        });
        self.queue(&format!("{conversation}|f:{id}"), body);
        if let Some(conv) = self.conversations.iter_mut().find(|c| c.id == conversation) {
            conv.bot_member = true;
        }
        true
    }

    pub(crate) fn remove_bot(&mut self, conversation: &str) -> bool {
        match self.conversations.iter_mut().find(|c| c.id == conversation) {
            Some(conv) => {
                conv.bot_member = false;
                true
            }
            None => false,
        }
    }

    fn queue(&mut self, id: &str, body: Value) {
        self.events.push(QueuedEvent {
            id: id.to_owned(),
            body,
            acked: false,
            given_up: false,
            in_flight: false,
            redeliver: false,
            attempts: 0,
            next_at: Instant::now(),
        });
    }

    /// The first fault matching `op`, counting the call against those still waiting.
    pub(crate) fn take_fault(&mut self, op: Op) -> Option<FaultKind> {
        for fault in &mut self.faults {
            if fault.op.is_some_and(|o| o != op) || fault.times == 0 {
                continue;
            }
            if fault.after > 0 {
                fault.after -= 1;
                continue;
            }
            fault.times -= 1;
            return Some(fault.kind.clone());
        }
        None
    }

    /// A token for `client_id` / `client_secret`, or the OAuth error.
    pub(crate) fn issue_token(
        &mut self,
        app_id: &str,
        client_id: &str,
        client_secret: &str,
        scope: &str,
        lifetime: Duration,
    ) -> Result<(String, u64), (u16, Value)> {
        self.token_requests += 1;
        if client_id != app_id {
            return Err((
                400,
                json!({
                    "error": "unauthorized_client",
                    "error_description": format!(
                        "AADSTS700016: Application with identifier '{client_id}' was not found \
                         in the directory 'Bot Framework'."
                    ),
                    "error_codes": [700016],
                }),
            ));
        }
        if client_secret != self.app_password {
            return Err((
                401,
                json!({
                    "error": "invalid_client",
                    "error_description": format!(
                        "AADSTS7000215: Invalid client secret provided. Ensure the secret being \
                         sent in the request is the client secret value, not the client secret \
                         ID, for a secret added to app '{app_id}'."
                    ),
                    "error_codes": [7000215],
                }),
            ));
        }
        if scope != "https://api.botframework.com/.default" {
            return Err((
                400,
                json!({
                    "error": "invalid_scope",
                    "error_description": format!(
                        "AADSTS70011: The provided request must include a 'scope' input \
                         parameter. The provided value for the input parameter 'scope' is not \
                         valid: {scope}"
                    ),
                    "error_codes": [70011],
                }),
            ));
        }
        let token = format!("eyJ0eXAiOiJKV1QifQ.sim.{}", self.hex_id());
        self.tokens.push(IssuedToken {
            token: token.clone(),
            expires: Instant::now() + lifetime,
            revoked: false,
        });
        Ok((token, lifetime.as_secs()))
    }

    pub(crate) fn token_valid(&self, token: &str) -> bool {
        self.tokens
            .iter()
            .any(|t| t.token == token && !t.revoked && Instant::now() < t.expires)
    }

    /// Counts a send in `conversation` against its limits; the wait when one is full.
    fn rate_check(&mut self, conversation: &str) -> Result<(), ApiError> {
        let Some(conv) = self.conversations.iter_mut().find(|c| c.id == conversation) else {
            return Ok(());
        };
        let now = Instant::now();
        while conv
            .sends
            .front()
            .is_some_and(|at| now.duration_since(*at) >= SEND_LIMITS[3].0)
        {
            conv.sends.pop_front();
        }
        for (window, most) in SEND_LIMITS {
            let inside: Vec<&Instant> = conv
                .sends
                .iter()
                .filter(|at| now.duration_since(**at) < window)
                .collect();
            if inside.len() >= most {
                let oldest = inside[0];
                let wait = window.saturating_sub(now.duration_since(*oldest));
                return Err(ApiError::throttled(wait.as_secs().max(1)));
            }
        }
        conv.sends.push_back(now);
        Ok(())
    }

    /// The conversation a call addresses and the thread in it; refusals for one the bot is not
    /// in.
    fn addressed<'a>(&self, conversation: &'a str) -> Result<(&'a str, Option<&'a str>), ApiError> {
        let (base, root) = split_thread(conversation);
        let Some(conv) = self.conversation(base) else {
            return Err(ApiError::new(
                404,
                "ConversationNotFound",
                "Conversation not found.",
            ));
        };
        if !conv.bot_member {
            return Err(ApiError::new(
                403,
                "BotNotInConversationRoster",
                "The bot is not part of the conversation roster.",
            ));
        }
        if let Some(root) = root {
            let known = self
                .activities
                .iter()
                .any(|a| a.conversation == base && a.id == root && a.thread.is_some());
            if conv.kind != ConversationKind::Channel || !known {
                return Err(ApiError::new(
                    404,
                    "ConversationNotFound",
                    "Conversation not found.",
                ));
            }
        }
        Ok((base, root))
    }

    fn text_of(activity: &Value) -> Result<String, ApiError> {
        let text = activity["text"].as_str().unwrap_or_default().to_owned();
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(ApiError::new(
                413,
                "MessageSizeTooBig",
                "Message size too large.",
            ));
        }
        Ok(text)
    }

    /// `POST /v3/conversations/{conversation}/activities[/{reply_to}]`.
    pub(crate) fn post_activity(
        &mut self,
        config: &SimulatorConfig,
        conversation: &str,
        reply_to: Option<&str>,
        activity: &Value,
    ) -> Answer {
        let (base, root) = self.addressed(conversation)?;
        let kind = activity["type"].as_str().unwrap_or_default();
        if !matches!(kind, "message" | "typing") {
            return Err(ApiError::new(
                400,
                "BadArgument",
                format!("Unknown activity type {kind:?}."),
            ));
        }
        if let Some(info) = streaminfo(activity) {
            return self.stream_activity(config, base, kind, info, activity);
        }
        if config.rate_limits {
            self.rate_check(base)?;
        }
        if kind == "typing" {
            return Ok((200, json!({})));
        }
        let text = Self::text_of(activity)?;
        if text.trim().is_empty() && activity["attachments"].as_array().is_none_or(Vec::is_empty) {
            return Err(ApiError::new(
                400,
                "BadArgument",
                "Activity must have text or attachments.",
            ));
        }
        let reply_to = reply_to
            .map(str::to_owned)
            .or_else(|| activity["replyToId"].as_str().map(str::to_owned));
        if let Some(reply_to) = &reply_to
            && !self
                .activities
                .iter()
                .any(|a| a.conversation == base && &a.id == reply_to)
        {
            return Err(ApiError::new(
                400,
                "BadArgument",
                format!("Invalid replyToId {reply_to:?}: no such activity in the conversation."),
            ));
        }
        let id = self.next_id();
        let bot = self.bot.clone();
        self.activities.push(SimActivity {
            id: id.clone(),
            conversation: base.to_owned(),
            thread: root.map(str::to_owned),
            from: bot,
            from_bot_under_test: true,
            text,
            reply_to_id: reply_to,
            stream: None,
            deleted: false,
            updates: 0,
        });
        Ok((201, json!({ "id": id })))
    }

    fn not_allowed(message: &str) -> ApiError {
        ApiError::new(403, "ContentStreamNotAllowed", message)
    }

    /// A streaming activity (streaming-ux.md): start, continue, or final.
    fn stream_activity(
        &mut self,
        config: &SimulatorConfig,
        base: &str,
        kind: &str,
        info: &Value,
        activity: &Value,
    ) -> Answer {
        let personal = self
            .conversation(base)
            .is_some_and(|c| c.kind == ConversationKind::Personal);
        if !personal {
            return Err(Self::not_allowed(
                "Content stream is not allowed for this conversation: streaming is available \
                 in one-on-one chats only.",
            ));
        }
        let stream_type = info["streamType"].as_str().unwrap_or("streaming");
        let sequence = info["streamSequence"].as_u64();
        let stream_id = info["streamId"].as_str().map(str::to_owned);
        let text =
            Self::text_of(activity).map_err(|_| Self::not_allowed("Message size too large."))?;
        match (kind, stream_id) {
            ("typing", None) => {
                if text.is_empty() {
                    return Err(ApiError::new(
                        400,
                        "BadArgument",
                        "Start streaming activities should include text.",
                    ));
                }
                if sequence != Some(1) {
                    return Err(ApiError::new(
                        400,
                        "BadArgument",
                        "A stream starts with streamSequence 1.",
                    ));
                }
                if !matches!(stream_type, "informative" | "streaming") {
                    return Err(ApiError::new(
                        400,
                        "BadArgument",
                        format!("Invalid streamType {stream_type:?} to start a stream."),
                    ));
                }
                if config.rate_limits {
                    self.rate_check(base)?;
                }
                let id = self.next_id();
                let bot = self.bot.clone();
                let (informative, streamed) = if stream_type == "informative" {
                    (vec![text.clone()], Vec::new())
                } else {
                    (Vec::new(), vec![text.clone()])
                };
                self.activities.push(SimActivity {
                    id: id.clone(),
                    conversation: base.to_owned(),
                    thread: None,
                    from: bot,
                    from_bot_under_test: true,
                    text: streamed.last().cloned().unwrap_or_default(),
                    reply_to_id: activity["replyToId"].as_str().map(str::to_owned),
                    stream: Some(SimStream {
                        id: id.clone(),
                        state: StreamState::Streaming,
                        sequence: 1,
                        informative,
                        streamed,
                        started: Instant::now(),
                        last_request: Instant::now(),
                        dropped: 0,
                    }),
                    deleted: false,
                    updates: 0,
                });
                Ok((201, json!({ "id": id })))
            }
            ("typing", Some(stream_id)) => {
                let interval = config.stream_min_interval;
                let max = config.stream_max_duration;
                let found = self.open_stream(base, &stream_id, max)?;
                let Some(sequence) = sequence else {
                    return Err(ApiError::new(
                        400,
                        "BadArgument",
                        "A streaming activity needs its streamSequence.",
                    ));
                };
                let Some(stream) = found.stream.as_mut() else {
                    return Err(ApiError::new(404, "NotFound", "Stream not found."));
                };
                if sequence <= stream.sequence {
                    stream.dropped += 1;
                    return Ok((
                        202,
                        json!({ "error": {
                            "code": "ContentStreamSequenceOrderPreConditionFailed",
                            "message": "PreCondition failed: the streamSequence is not greater \
                                        than the last one received; the activity was dropped.",
                        } }),
                    ));
                }
                if stream.last_request.elapsed() < interval {
                    return Err(ApiError::throttled(1));
                }
                stream.sequence = sequence;
                stream.last_request = Instant::now();
                if stream_type == "informative" {
                    stream.informative.push(text);
                } else {
                    stream.streamed.push(text);
                }
                let shown = stream.streamed.last().cloned().unwrap_or_default();
                found.text = shown;
                Ok((202, json!({})))
            }
            ("message", Some(stream_id)) => {
                if stream_type != "final" {
                    return Err(ApiError::new(
                        400,
                        "BadArgument",
                        "A message activity in a stream must be its final (streamType final).",
                    ));
                }
                if sequence.is_some() {
                    return Err(ApiError::new(
                        400,
                        "BadArgument",
                        "The final streaming message must not carry a streamSequence.",
                    ));
                }
                if text.trim().is_empty() {
                    return Err(ApiError::new(
                        400,
                        "BadArgument",
                        "The final streaming message should include text.",
                    ));
                }
                let max = config.stream_max_duration;
                let found = self.open_stream(base, &stream_id, max)?;
                if let Some(stream) = found.stream.as_mut() {
                    stream.state = StreamState::Final;
                }
                found.text = text;
                Ok((200, json!({ "id": stream_id })))
            }
            _ => Err(ApiError::new(
                400,
                "BadArgument",
                "A new stream starts with a typing activity.",
            )),
        }
    }

    fn activity_mut(&mut self, base: &str, id: &str) -> Option<&mut SimActivity> {
        self.activities
            .iter_mut()
            .find(|a| a.conversation == base && a.id == id)
    }

    /// The stream `id` in `base` if it still takes content; else Teams' 403 for why not.
    fn open_stream(
        &mut self,
        base: &str,
        id: &str,
        max: Duration,
    ) -> Result<&mut SimActivity, ApiError> {
        let Some(found) = self
            .activity_mut(base, id)
            .filter(|a| a.from_bot_under_test && !a.deleted && a.stream.is_some())
        else {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("Stream {id:?} not found in this conversation."),
            ));
        };
        let Some(stream) = found.stream.as_mut() else {
            return Err(ApiError::new(404, "NotFound", "Stream not found."));
        };
        if stream.state == StreamState::Streaming && stream.started.elapsed() > max {
            stream.state = StreamState::TimedOut;
        }
        match stream.state {
            StreamState::Streaming => Ok(found),
            StreamState::Final => Err(Self::not_allowed(
                "Content stream is not allowed on an already completed streamed message.",
            )),
            StreamState::TimedOut => Err(Self::not_allowed(
                "Content stream finished due to exceeded streaming time.",
            )),
            StreamState::CancelledByUser => {
                Err(Self::not_allowed("Content stream was cancelled by user."))
            }
        }
    }

    /// `PUT /v3/conversations/{conversation}/activities/{id}`.
    pub(crate) fn update_activity(
        &mut self,
        conversation: &str,
        id: &str,
        activity: &Value,
    ) -> Answer {
        let (base, _) = self.addressed(conversation)?;
        let text = Self::text_of(activity)?;
        if text.trim().is_empty() {
            return Err(ApiError::new(
                400,
                "BadArgument",
                "Activity must have text or attachments.",
            ));
        }
        let Some(found) = self
            .activity_mut(base, id)
            .filter(|a| !a.deleted && a.from_bot_under_test)
        else {
            return Err(ApiError::new(
                404,
                "ActivityNotFound",
                "The activity was not found in this conversation.",
            ));
        };
        if found
            .stream
            .as_ref()
            .is_some_and(|s| s.state == StreamState::Streaming)
        {
            return Err(ApiError::new(
                403,
                "ContentStreamNotAllowed",
                "A message cannot be updated while it is streaming.",
            ));
        }
        found.text = text;
        found.updates += 1;
        Ok((200, json!({ "id": id })))
    }

    /// `DELETE /v3/conversations/{conversation}/activities/{id}`.
    pub(crate) fn delete_activity(&mut self, conversation: &str, id: &str) -> Answer {
        let (base, _) = self.addressed(conversation)?;
        let Some(found) = self
            .activity_mut(base, id)
            .filter(|a| !a.deleted && a.from_bot_under_test)
        else {
            return Err(ApiError::new(
                404,
                "ActivityNotFound",
                "The activity was not found in this conversation.",
            ));
        };
        found.deleted = true;
        if let Some(stream) = found.stream.as_mut()
            && stream.state == StreamState::Streaming
        {
            stream.state = StreamState::Final;
        }
        Ok((200, Value::Null))
    }

    /// The person presses Stop on stream `id`.
    pub(crate) fn cancel_stream(&mut self, id: &str) -> bool {
        let Some(stream) = self
            .activities
            .iter_mut()
            .filter_map(|a| a.stream.as_mut())
            .find(|s| s.id == id && s.state == StreamState::Streaming)
        else {
            return false;
        };
        stream.state = StreamState::CancelledByUser;
        true
    }
}
