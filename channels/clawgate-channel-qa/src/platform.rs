//! The QA platform server: a real loopback chat service with fault injection and a durable log.
//!
//! With [`QaPlatformConfig::state_path`] set, every change a client could observe is written to
//! that file before the answer goes out, so a restarted platform (even after SIGKILL) still
//! knows every message, idempotency key and unconfirmed update, and keeps counting update ids
//! from where it stopped. Faults and the webhook are test controls and start empty.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::{Json, Router};
use tokio::sync::oneshot;
use tracing::warn;

use crate::wire::{
    ApiError, EditRequest, ErrorBody, Fault, FaultMode, InboundRequest, LogEntry, LogEvent,
    MessageAnswer, MessagesAnswer, PlatformMessage, SendRequest,
};
use crate::wire::{Update, UpdatesAnswer};

/// How to run a QA platform.
#[derive(Clone)]
pub struct QaPlatformConfig {
    /// Where to listen; port 0 picks a free one.
    pub bind: SocketAddr,
    /// The bearer token `/api` requires.
    pub token: String,
    /// Longest text one message may carry.
    pub max_text_chars: usize,
    /// Append-only JSON-lines log of everything that landed (also kept in memory).
    pub log_path: Option<PathBuf>,
    /// Where the platform keeps its state across restarts (JSON, replaced atomically after each
    /// change). `None` keeps everything in memory only.
    pub state_path: Option<PathBuf>,
}

impl std::fmt::Debug for QaPlatformConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token opens `/api`: never printed.
        f.debug_struct("QaPlatformConfig")
            .field("bind", &self.bind)
            .field("token", &"<redacted>")
            .field("max_text_chars", &self.max_text_chars)
            .field("log_path", &self.log_path)
            .field("state_path", &self.state_path)
            .finish()
    }
}

impl Default for QaPlatformConfig {
    fn default() -> Self {
        QaPlatformConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: "qa-token".into(),
            max_text_chars: 4_000,
            log_path: None,
            state_path: None,
        }
    }
}

#[derive(Debug, Default)]
struct PlatformState {
    seq: u64,
    messages: BTreeMap<String, PlatformMessage>,
    by_key: BTreeMap<String, String>,
    faults: VecDeque<Fault>,
    log: Vec<LogEntry>,
    log_file: Option<std::fs::File>,
    /// Inbound updates not yet confirmed by an offset.
    updates: VecDeque<Update>,
    next_update_id: i64,
    state_path: Option<PathBuf>,
}

/// The version of the state file's shape; a file of another version is refused, not guessed at.
const STATE_FORMAT: u64 = 1;

/// The state file: what a restarted platform needs to answer as if it had never stopped.
/// Borrowed when written (no copy of the state per change), owned when read.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Snapshot<'a> {
    format: u64,
    seq: u64,
    next_update_id: i64,
    messages: Cow<'a, BTreeMap<String, PlatformMessage>>,
    by_key: Cow<'a, BTreeMap<String, String>>,
    updates: Cow<'a, VecDeque<Update>>,
    log: Cow<'a, [LogEntry]>,
}

/// Reads the state file; `None` when there is none yet. Never writes: a file it cannot read is
/// left as it is for the user to inspect.
fn load_state(path: &FsPath) -> std::io::Result<Option<Snapshot<'static>>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            let message = format!("cannot read QA platform state {}: {e}", path.display());
            return Err(std::io::Error::new(e.kind(), message));
        }
    };
    let refuse = |why: String| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "QA platform state {} {why}; it was left untouched: move it away to start with \
                 an empty platform",
                path.display()
            ),
        )
    };
    // The version first, so a newer file is named as such rather than reported as corrupt.
    #[derive(serde::Deserialize)]
    struct Header {
        format: u64,
    }
    let header: Header =
        serde_json::from_slice(&bytes).map_err(|e| refuse(format!("is not a state file ({e})")))?;
    if header.format != STATE_FORMAT {
        return Err(refuse(format!(
            "has format {}, this build reads format {STATE_FORMAT}",
            header.format
        )));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| refuse(format!("is corrupt ({e})")))
}

impl PlatformState {
    /// Writes the durable state to `state_path`. Called with the state lock held, so two
    /// requests can never write their snapshots out of order.
    fn save(&self) -> std::io::Result<()> {
        let Some(path) = &self.state_path else {
            return Ok(());
        };
        let snapshot = Snapshot {
            format: STATE_FORMAT,
            seq: self.seq,
            next_update_id: self.next_update_id,
            messages: Cow::Borrowed(&self.messages),
            by_key: Cow::Borrowed(&self.by_key),
            updates: Cow::Borrowed(&self.updates),
            log: Cow::Borrowed(&self.log),
        };
        // A temp file in the same directory, renamed over the old one: a reader (or a restart
        // after a kill mid-write) sees the old snapshot or the new one, never half of one. No
        // fsync: the promise is surviving the process being killed, which keeps the page cache;
        // surviving power loss is not worth an fsync per request on a QA platform.
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        write_private(FsPath::new(&tmp), &serde_json::to_vec(&snapshot)?)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| {
                let message = format!("cannot write QA platform state {}: {e}", path.display());
                std::io::Error::new(e.kind(), message)
            })
    }

    /// Stores a new message under the next sequence number (its id is made from it) and logs it.
    fn add_message(
        &mut self,
        event: LogEvent,
        build: impl FnOnce(String, u64) -> PlatformMessage,
    ) -> PlatformMessage {
        let seq = self.seq + 1;
        let message = build(format!("m-{seq}"), seq);
        if let Some(key) = &message.idempotency_key {
            self.by_key.insert(key.clone(), message.id.clone());
        }
        self.messages.insert(message.id.clone(), message.clone());
        self.record(event, &message);
        message
    }

    fn record(&mut self, event: LogEvent, message: &PlatformMessage) {
        self.seq += 1;
        let entry = LogEntry {
            seq: self.seq,
            event,
            message_id: message.id.clone(),
            conversation_id: message.conversation_id.clone(),
            idempotency_key: message.idempotency_key.clone(),
            text: message.text.clone(),
            attachments: message.attachments.clone(),
        };
        if let Some(file) = self.log_file.as_mut() {
            let line = serde_json::to_string(&entry).unwrap_or_default();
            if let Err(e) = writeln!(file, "{line}").and_then(|()| file.flush()) {
                warn!(error = %e, "QA platform could not append to its log");
            }
        }
        self.log.push(entry);
    }

    /// The fault that applies to this call, if any (each fault covers `count` calls).
    fn take_fault(&mut self) -> Option<Fault> {
        let front = self.faults.front_mut()?;
        if front.pass_first > 0 {
            front.pass_first -= 1;
            return None;
        }
        let fault = front.clone();
        front.count = front.count.saturating_sub(1);
        if front.count == 0 {
            self.faults.pop_front();
        }
        Some(fault)
    }
}

struct Shared {
    config: QaPlatformConfig,
    state: Mutex<PlatformState>,
    /// Wakes long polls when an update arrives.
    new_update: tokio::sync::Notify,
    /// Where updates are also pushed (`POST /control/webhook`), and how each delivery went.
    webhook: Mutex<Option<String>>,
    webhook_attempts: Mutex<HashMap<i64, u32>>,
    http: reqwest::Client,
    /// This object, for the delivery tasks it spawns.
    me: std::sync::OnceLock<std::sync::Weak<Shared>>,
    /// Set when the platform stops; long polls end early.
    stopping: AtomicBool,
}

/// Deliveries of one update to the webhook before the platform gives up.
const WEBHOOK_MAX_ATTEMPTS: u32 = 8;

/// Why an injected inbound message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
enum InboundRefused {
    Empty,
    /// Longer than `max_text_chars`.
    TooLong {
        length: usize,
        limit: usize,
    },
    ReplyTargetNotFound(String),
    /// The update exists in memory but could not be saved, so it is not acknowledged.
    NotSaved(String),
}

impl InboundRefused {
    fn response(&self) -> Response {
        match self {
            InboundRefused::Empty => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "text must not be empty",
            ),
            InboundRefused::TooLong { length, limit } => error(
                StatusCode::BAD_REQUEST,
                "message_too_long",
                format!("text is {length} characters; the limit is {limit}"),
            ),
            InboundRefused::ReplyTargetNotFound(id) => error(
                StatusCode::NOT_FOUND,
                "reply_target_not_found",
                format!("no message {id}"),
            ),
            InboundRefused::NotSaved(why) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "state_not_saved",
                format!("the platform could not save its state: {why}"),
            ),
        }
    }
}

impl Shared {
    /// Pushes an update to the webhook like real platforms do: anything but a 2xx answer (or no
    /// answer) is delivered again, with a growing delay, up to a limit.
    async fn deliver_webhook(&self, url: String, update: Update) {
        for attempt in 1..=WEBHOOK_MAX_ATTEMPTS {
            *self
                .webhook_attempts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(update.update_id)
                .or_default() += 1;
            let answer = self.http.post(&url).json(&update).send().await;
            if answer.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
        }
        warn!(
            update = update.update_id,
            "webhook gave up after {WEBHOOK_MAX_ATTEMPTS} deliveries"
        );
    }

    /// Stores a message written by someone on the platform.
    fn inbound(
        &self,
        conversation: String,
        request: InboundRequest,
    ) -> Result<PlatformMessage, InboundRefused> {
        if request.text.is_empty() {
            return Err(InboundRefused::Empty);
        }
        let length = request.text.chars().count();
        if length > self.config.max_text_chars {
            return Err(InboundRefused::TooLong {
                length,
                limit: self.config.max_text_chars,
            });
        }
        let mut state = self.lock();
        if let Some(reply_to) = &request.reply_to_id
            && !state.messages.contains_key(reply_to)
        {
            return Err(InboundRefused::ReplyTargetNotFound(reply_to.clone()));
        }
        let message = state.add_message(LogEvent::Inbound, |id, seq| PlatformMessage {
            id,
            conversation_id: conversation,
            thread_id: request.thread_id,
            reply_to_id: request.reply_to_id,
            text: request.text,
            attachments: Vec::new(),
            metadata: request.metadata,
            idempotency_key: None,
            edits: 0,
            seq,
            author_id: Some(request.author_id),
            author_is_bot: request.author_is_bot,
        });
        state.next_update_id += 1;
        let update = Update {
            update_id: state.next_update_id,
            message: message.clone(),
        };
        state.updates.push_back(update.clone());
        state
            .save()
            .map_err(|e| InboundRefused::NotSaved(e.to_string()))?;
        drop(state);
        self.new_update.notify_waiters();
        let webhook = self
            .webhook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let (Some(url), Some(shared)) =
            (webhook, self.me.get().and_then(std::sync::Weak::upgrade))
        {
            tokio::spawn(async move { shared.deliver_webhook(url, update).await });
        }
        Ok(message)
    }

    fn lock(&self) -> MutexGuard<'_, PlatformState> {
        // A handler that panicked mid-update leaves plain data behind; keep serving.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A running QA platform. Dropping it stops the server.
pub struct QaPlatform {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for QaPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QaPlatform")
            .field("addr", &self.addr)
            .finish()
    }
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        ok: false,
        error: ApiError {
            code: code.into(),
            message: message.into(),
            retry_after_secs: None,
        },
    };
    (status, Json(body)).into_response()
}

/// Saves the state before `answer` acknowledges a change. When the save fails the client hears
/// a 500 instead: the platform never confirms what a restart could forget.
/// Writes `bytes` to `path`, readable by its owner only (0600): the snapshot holds every
/// conversation of the platform.
fn write_private(path: &FsPath, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}

fn saved(state: &PlatformState, answer: Response) -> Response {
    match state.save() {
        Ok(()) => answer,
        Err(e) => not_saved(&e),
    }
}

fn not_saved(e: &std::io::Error) -> Response {
    warn!(error = %e, "QA platform could not save its state");
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "state_not_saved",
        format!("the platform could not save its state: {e}"),
    )
}

fn fault_response(fault: &Fault) -> Response {
    let status = fault
        .status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let body = ErrorBody {
        ok: false,
        error: ApiError {
            code: fault
                .code
                .clone()
                .unwrap_or_else(|| "injected_fault".into()),
            message: "fault injected by the test".into(),
            retry_after_secs: fault.retry_after_secs,
        },
    };
    let mut response = (status, Json(body)).into_response();
    if let Some(secs) = fault.retry_after_secs {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, secs.into());
    }
    response
}

/// A response whose body fails after the work was done: the client sees the connection drop.
fn dropped_connection() -> Response {
    let stream = futures_util::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other(
            "connection dropped by fault injection",
        ))
    });
    Response::new(Body::from_stream(stream))
}

/// The control routes' guard: the platform's bearer token.
async fn require_token(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if authorized(&shared, request.headers()) {
        next.run(request).await
    } else {
        error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        )
    }
}

/// Every route: the request must name this platform by a loopback name (it runs on the
/// user's machine, where a web page could otherwise reach it through DNS rebinding).
async fn loopback_only(
    request: axum::extract::Request,
    next: axum::middleware::Next,
    port: u16,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    if clawgate_channel_sdk::loopback::is_loopback_host(host, port) {
        next.run(request).await
    } else {
        error(
            StatusCode::MISDIRECTED_REQUEST,
            "misdirected",
            clawgate_channel_sdk::loopback::NOT_LOOPBACK,
        )
    }
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|token| {
            clawgate_channel_sdk::same_secret(shared.config.token.as_bytes(), token.as_bytes())
        })
}

/// Applies the before-work part of a fault; returns a response when the call must end here.
async fn before_work(fault: Option<&Fault>) -> Option<Response> {
    let fault = fault?;
    match fault.mode {
        FaultMode::Status => Some(fault_response(fault)),
        FaultMode::DelayBefore => {
            tokio::time::sleep(Duration::from_millis(fault.delay_ms.unwrap_or(0))).await;
            None
        }
        FaultMode::DropAfterAccept | FaultMode::DelayAfterAccept => None,
    }
}

/// Applies the after-work part of a fault to a finished answer.
async fn after_work(fault: Option<&Fault>, answer: Response) -> Response {
    match fault.map(|f| (f.mode, f.delay_ms)) {
        Some((FaultMode::DropAfterAccept, _)) => dropped_connection(),
        Some((FaultMode::DelayAfterAccept, delay)) => {
            tokio::time::sleep(Duration::from_millis(delay.unwrap_or(0))).await;
            answer
        }
        _ => answer,
    }
}

/// The common start of every message call: the bearer token, then the fault that applies to
/// this call (a status fault answers here; the others come back to be applied around the work).
async fn admit(shared: &Shared, headers: &HeaderMap) -> Result<Option<Fault>, Response> {
    if !authorized(shared, headers) {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        ));
    }
    let fault = shared.lock().take_fault();
    match before_work(fault.as_ref()).await {
        Some(response) => Err(response),
        None => Ok(fault),
    }
}

fn invalid_request(rejection: &JsonRejection) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request",
        rejection.body_text(),
    )
}

async fn send_message(
    State(shared): State<Arc<Shared>>,
    Path(conversation): Path<String>,
    headers: HeaderMap,
    body: Result<Json<SendRequest>, JsonRejection>,
) -> Response {
    let fault = match admit(&shared, &headers).await {
        Ok(fault) => fault,
        Err(refused) => return refused,
    };
    let Json(request) = match body {
        Ok(body) => body,
        Err(rejection) => return invalid_request(&rejection),
    };
    let length = request.text.chars().count();
    if length == 0 && request.attachments.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "text must not be empty (unless the message carries attachments)",
        );
    }
    if request.attachments.iter().any(|a| a.url.trim().is_empty()) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "every attachment needs a url (the QA platform fetches files by URL)",
        );
    }
    if length > shared.config.max_text_chars {
        return error(
            StatusCode::BAD_REQUEST,
            "message_too_long",
            format!(
                "text is {length} characters; the limit is {}",
                shared.config.max_text_chars
            ),
        );
    }
    let answer = {
        let mut state = shared.lock();
        if let Some(reply_to) = &request.reply_to_id
            && !state.messages.contains_key(reply_to)
        {
            return error(
                StatusCode::NOT_FOUND,
                "reply_target_not_found",
                format!("no message {reply_to}"),
            );
        }
        let existing = request
            .idempotency_key
            .as_ref()
            .and_then(|k| state.by_key.get(k))
            .cloned();
        if let Some(id) = existing.and_then(|id| state.messages.get(&id).cloned()) {
            state.record(LogEvent::Replayed, &id);
            let mut response = (
                StatusCode::OK,
                Json(MessageAnswer {
                    ok: true,
                    message: id,
                }),
            )
                .into_response();
            response.headers_mut().insert(
                "idempotent-replay",
                "true"
                    .parse()
                    .unwrap_or(header::HeaderValue::from_static("true")),
            );
            saved(&state, response)
        } else {
            let message = state.add_message(LogEvent::Sent, |id, seq| PlatformMessage {
                id,
                conversation_id: conversation,
                thread_id: request.thread_id,
                reply_to_id: request.reply_to_id,
                text: request.text,
                attachments: request.attachments,
                metadata: request.metadata,
                idempotency_key: request.idempotency_key,
                edits: 0,
                seq,
                author_id: Some("clawgate-bot".into()),
                author_is_bot: true,
            });
            let response = (
                StatusCode::CREATED,
                Json(MessageAnswer { ok: true, message }),
            )
                .into_response();
            saved(&state, response)
        }
    };
    after_work(fault.as_ref(), answer).await
}

async fn edit_message(
    State(shared): State<Arc<Shared>>,
    Path((conversation, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Json<EditRequest>, JsonRejection>,
) -> Response {
    let fault = match admit(&shared, &headers).await {
        Ok(fault) => fault,
        Err(refused) => return refused,
    };
    let Json(request) = match body {
        Ok(body) => body,
        Err(rejection) => return invalid_request(&rejection),
    };
    if request.text.chars().count() > shared.config.max_text_chars {
        return error(
            StatusCode::BAD_REQUEST,
            "message_too_long",
            "edited text is over the limit",
        );
    }
    let answer = {
        let mut state = shared.lock();
        let Some(message) = state
            .messages
            .get_mut(&id)
            .filter(|m| m.conversation_id == conversation)
        else {
            return error(
                StatusCode::NOT_FOUND,
                "message_not_found",
                format!("no message {id} in {conversation}"),
            );
        };
        message.text = request.text;
        message.edits += 1;
        let message = message.clone();
        state.record(LogEvent::Edited, &message);
        let response = (StatusCode::OK, Json(MessageAnswer { ok: true, message })).into_response();
        saved(&state, response)
    };
    after_work(fault.as_ref(), answer).await
}

async fn delete_message(
    State(shared): State<Arc<Shared>>,
    Path((conversation, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let fault = match admit(&shared, &headers).await {
        Ok(fault) => fault,
        Err(refused) => return refused,
    };
    let answer = {
        let mut state = shared.lock();
        let found = state
            .messages
            .get(&id)
            .filter(|m| m.conversation_id == conversation)
            .cloned();
        let Some(message) = found else {
            return error(
                StatusCode::NOT_FOUND,
                "message_not_found",
                format!("no message {id} in {conversation}"),
            );
        };
        state.messages.remove(&id);
        state.record(LogEvent::Deleted, &message);
        let response = (StatusCode::OK, Json(serde_json::json!({ "ok": true }))).into_response();
        saved(&state, response)
    };
    after_work(fault.as_ref(), answer).await
}

async fn list_messages(
    State(shared): State<Arc<Shared>>,
    Path(conversation): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&shared, &headers) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        );
    }
    let mut messages: Vec<PlatformMessage> = shared
        .lock()
        .messages
        .values()
        .filter(|m| m.conversation_id == conversation)
        .cloned()
        .collect();
    messages.sort_by_key(|m| m.seq);
    (StatusCode::OK, Json(MessagesAnswer { ok: true, messages })).into_response()
}

async fn lookup_by_key(
    State(shared): State<Arc<Shared>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&shared, &headers) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        );
    }
    let state = shared.lock();
    // A deleted message still proves the key landed: keep answering from the key index.
    let found = state.by_key.get(&key).and_then(|id| {
        state.messages.get(id).cloned().or_else(|| {
            state
                .log
                .iter()
                .find(|e| &e.message_id == id)
                .map(|e| PlatformMessage {
                    id: e.message_id.clone(),
                    conversation_id: e.conversation_id.clone(),
                    thread_id: None,
                    reply_to_id: None,
                    text: e.text.clone(),
                    attachments: e.attachments.clone(),
                    metadata: None,
                    idempotency_key: e.idempotency_key.clone(),
                    edits: 0,
                    seq: e.seq,
                    author_id: None,
                    author_is_bot: true,
                })
        })
    });
    match found {
        Some(message) => {
            (StatusCode::OK, Json(MessageAnswer { ok: true, message })).into_response()
        }
        None => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no message with idempotency key {key}"),
        ),
    }
}

async fn add_faults(State(shared): State<Arc<Shared>>, Json(faults): Json<Vec<Fault>>) -> Response {
    shared
        .lock()
        .faults
        .extend(faults.into_iter().filter(|f| f.count > 0));
    (StatusCode::OK, Json(serde_json::json!({ "ok": true }))).into_response()
}

async fn inject_inbound(
    State(shared): State<Arc<Shared>>,
    Path(conversation): Path<String>,
    body: Result<Json<InboundRequest>, JsonRejection>,
) -> Response {
    let Json(request) = match body {
        Ok(body) => body,
        Err(rejection) => return invalid_request(&rejection),
    };
    match shared.inbound(conversation, request) {
        Ok(message) => (
            StatusCode::CREATED,
            Json(MessageAnswer { ok: true, message }),
        )
            .into_response(),
        Err(refused) => refused.response(),
    }
}

/// Query of `GET /api/updates`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdatesQuery {
    #[serde(default)]
    offset: Option<i64>,
    #[serde(default)]
    limit: Option<usize>,
    /// Long-poll: wait up to this many milliseconds for an update when there is none.
    #[serde(default)]
    timeout_ms: Option<u64>,
}

async fn get_updates(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    axum::extract::Query(query): axum::extract::Query<UpdatesQuery>,
) -> Response {
    if !authorized(&shared, &headers) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        );
    }
    let limit = query.limit.unwrap_or(100).clamp(1, 100);
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(query.timeout_ms.unwrap_or(0).min(30_000));
    loop {
        // Register for a wake-up before looking, so an update arriving in between is not missed.
        let notified = shared.new_update.notified();
        let result: Vec<Update> = {
            let mut state = shared.lock();
            if let Some(offset) = query.offset {
                // Asking from `offset` confirms everything below it: those are forgotten.
                let before = state.updates.len();
                while state.updates.front().is_some_and(|u| u.update_id < offset) {
                    state.updates.pop_front();
                }
                if state.updates.len() != before
                    && let Err(e) = state.save()
                {
                    return not_saved(&e);
                }
            }
            state.updates.iter().take(limit).cloned().collect()
        };
        // A stopping platform answers its long polls now, so shutdown need not wait for them.
        if !result.is_empty()
            || shared.stopping.load(Ordering::Acquire)
            || tokio::time::Instant::now() >= deadline
        {
            return (StatusCode::OK, Json(UpdatesAnswer { ok: true, result })).into_response();
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

/// `POST /control/webhook {"url": …}` (or `null` to stop pushing).
async fn set_webhook(
    State(shared): State<Arc<Shared>>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let url = body.get("url").and_then(|u| u.as_str()).map(str::to_owned);
    *shared
        .webhook
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = url;
    (StatusCode::OK, Json(serde_json::json!({ "ok": true }))).into_response()
}

async fn read_log(State(shared): State<Arc<Shared>>) -> Response {
    let entries = shared.lock().log.clone();
    (
        StatusCode::OK,
        Json(serde_json::json!({ "ok": true, "entries": entries })),
    )
        .into_response()
}

impl QaPlatform {
    /// Binds and starts serving, from the state in `config.state_path` when that file exists.
    ///
    /// A state file that cannot be read or is of an unknown format fails with `InvalidData`
    /// naming the file; it is never overwritten.
    pub async fn start(config: QaPlatformConfig) -> std::io::Result<QaPlatform> {
        let loaded = match &config.state_path {
            Some(path) => load_state(path)?,
            None => None,
        };
        let log_file = match &config.log_path {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
            None => None,
        };
        let fresh = loaded.is_none();
        let state = match loaded {
            Some(s) => PlatformState {
                seq: s.seq,
                messages: s.messages.into_owned(),
                by_key: s.by_key.into_owned(),
                log: s.log.into_owned(),
                updates: s.updates.into_owned(),
                next_update_id: s.next_update_id,
                ..PlatformState::default()
            },
            None => PlatformState::default(),
        };
        let state = PlatformState {
            log_file,
            state_path: config.state_path.clone(),
            ..state
        };
        if fresh {
            // Writing the empty state now turns a state path in a missing or read-only
            // directory into a start error instead of a 500 on every later change.
            state.save()?;
        }
        let listener = tokio::net::TcpListener::bind(config.bind).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            new_update: tokio::sync::Notify::new(),
            webhook: Mutex::new(None),
            webhook_attempts: Mutex::new(HashMap::new()),
            http: clawgate_channel_sdk::http::loopback_client_builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_default(),
            me: std::sync::OnceLock::new(),
            stopping: AtomicBool::new(false),
            state: Mutex::new(state),
        });
        let _ = shared.me.set(Arc::downgrade(&shared));
        let app = Router::new()
            .route(
                "/api/conversations/{conv}/messages",
                post(send_message).get(list_messages),
            )
            .route(
                "/api/conversations/{conv}/messages/{id}",
                patch(edit_message).delete(delete_message),
            )
            .route("/api/messages/by-key/{key}", get(lookup_by_key))
            .route("/api/updates", get(get_updates))
            .merge(
                // What only the platform's operator may do (write as anyone, read every
                // conversation, point the webhook anywhere): the same bearer token as the API.
                Router::new()
                    .route("/control/webhook", post(set_webhook))
                    .route("/control/faults", post(add_faults))
                    .route(
                        "/control/conversations/{conv}/inbound",
                        post(inject_inbound),
                    )
                    .route("/control/log", get(read_log))
                    .route_layer(axum::middleware::from_fn_with_state(
                        shared.clone(),
                        require_token,
                    )),
            )
            .with_state(shared.clone())
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| async move {
                    loopback_only(request, next, addr.port()).await
                },
            ));
        let (shutdown, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                warn!(error = %e, "QA platform server stopped with an error");
            }
        });
        Ok(QaPlatform {
            addr,
            shared,
            shutdown: Some(shutdown),
            server: Some(server),
        })
    }

    /// Stops serving and waits until the port is released and every request in flight has
    /// answered, so a new platform can take over the same address and state file.
    pub async fn stop(mut self) {
        self.signal_stop();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }

    fn signal_stop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.new_update.notify_waiters();
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn token(&self) -> &str {
        &self.shared.config.token
    }

    /// Queues faults for the next API calls (same as `POST /control/faults`).
    pub fn inject(&self, fault: Fault) {
        if fault.count > 0 {
            self.shared.lock().faults.push_back(fault);
        }
    }

    /// A person (or another bot) writes into a conversation (same as
    /// `POST /control/conversations/{conv}/inbound`).
    pub fn inject_inbound(
        &self,
        conversation: &str,
        request: InboundRequest,
    ) -> Result<PlatformMessage, String> {
        self.shared
            .inbound(conversation.to_owned(), request)
            .map_err(|refused| format!("inbound refused: {refused:?}"))
    }

    /// Pushes every new inbound update to `url` (same as `POST /control/webhook`).
    pub fn set_webhook(&self, url: Option<String>) {
        *self
            .shared
            .webhook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = url;
    }

    /// How many times an update was delivered to the webhook.
    pub fn webhook_attempts(&self, update_id: i64) -> u32 {
        self.shared
            .webhook_attempts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&update_id)
            .copied()
            .unwrap_or(0)
    }

    /// Everything that happened, in order.
    pub fn log(&self) -> Vec<LogEntry> {
        self.shared.lock().log.clone()
    }

    /// Messages currently in a conversation, in order.
    pub fn messages(&self, conversation: &str) -> Vec<PlatformMessage> {
        let mut messages: Vec<PlatformMessage> = self
            .shared
            .lock()
            .messages
            .values()
            .filter(|m| m.conversation_id == conversation)
            .cloned()
            .collect();
        messages.sort_by_key(|m| m.seq);
        messages
    }

    /// How many messages with this idempotency key landed (a replay is not a landing).
    pub fn landed_count(&self, idempotency_key: &str) -> usize {
        self.shared
            .lock()
            .log
            .iter()
            .filter(|e| {
                e.event == LogEvent::Sent && e.idempotency_key.as_deref() == Some(idempotency_key)
            })
            .count()
    }

    /// How many messages with this text landed.
    pub fn landed_with_text(&self, text: &str) -> usize {
        self.shared
            .lock()
            .log
            .iter()
            .filter(|e| e.event == LogEvent::Sent && e.text == text)
            .count()
    }

    /// How many messages carrying an attachment with this URL landed (a replay is not a
    /// landing).
    pub fn landed_with_attachment(&self, url: &str) -> usize {
        self.shared
            .lock()
            .log
            .iter()
            .filter(|e| e.event == LogEvent::Sent && e.attachments.iter().any(|a| a.url == url))
            .count()
    }

    /// Faults still queued.
    pub fn pending_faults(&self) -> usize {
        self.shared.lock().faults.len()
    }
}

impl Drop for QaPlatform {
    /// Stops accepting at once; the port is released shortly after, in the server task (use
    /// [`QaPlatform::stop`] to wait for that).
    fn drop(&mut self) {
        self.signal_stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_debug_never_prints_the_token() {
        let config = QaPlatformConfig {
            bind: "127.0.0.1:0".parse().expect("address"),
            token: "qa-platform-token-9f2c".into(),
            max_text_chars: 4096,
            log_path: None,
            state_path: None,
        };
        let printed = format!("{config:?}");
        assert!(!printed.contains("qa-platform-token-9f2c"), "{printed}");
        assert!(printed.contains("127.0.0.1:0"), "{printed}");
    }
}
