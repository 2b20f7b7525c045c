//! The web server: Talk's OCS endpoints behind a listener whose connections a handler can cut.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::{CallRecord, FaultKind, Inner, Op, RoomType, SimMessage, World};
use crate::sign;

pub(crate) async fn start(config: super::SimulatorConfig) -> io::Result<Arc<Inner>> {
    let listener = TcpListener::bind(config.bind).await?;
    let addr = listener.local_addr()?;
    let inner = Arc::new(Inner::new(config, addr));
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(inner.clone());
    let mut shutdown = inner.shutdown.subscribe();
    let server = axum::serve(
        CuttableListener::new(listener),
        app.into_make_service_with_connect_info::<Connection>(),
    )
    .with_graceful_shutdown(async move {
        let _ = shutdown.wait_for(|stopped| *stopped).await;
    });
    let task = tokio::spawn(async move {
        let _ = server.await;
    });
    inner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(task);
    Ok(inner)
}

pub(crate) async fn stop(inner: &Arc<Inner>) {
    inner.shutdown.send_replace(true);
    let tasks: Vec<_> = std::mem::take(
        &mut *inner
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for task in tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

/// What a call comes to.
enum Reply {
    /// The OCS envelope with this status and data.
    Ocs(u16, Value),
    /// A failure envelope with Talk's statuscode and message.
    Failure(u16, i64, &'static str, Value),
    /// 304 Not Modified, no body.
    NotModified,
}

impl Reply {
    fn status(&self) -> u16 {
        match self {
            Reply::Ocs(status, _) | Reply::Failure(status, ..) => *status,
            Reply::NotModified => 304,
        }
    }
}

fn failure(status: u16) -> Reply {
    let message = match status {
        400 => "",
        401 => "",
        403 => "",
        404 => "",
        405 => "",
        412 => "",
        413 => "",
        429 => "Reached maximum delay",
        503 => "Service unavailable",
        _ => "",
    };
    Reply::Failure(status, i64::from(status), message, json!([]))
}

fn error(status: u16, error: &str) -> Reply {
    Reply::Failure(status, i64::from(status), "", json!({ "error": error }))
}

fn unauthenticated() -> Reply {
    Reply::Failure(401, 997, "Current user is not logged in", json!([]))
}

fn envelope(status: u16, statuscode: i64, message: &str, data: Value) -> Value {
    json!({ "ocs": {
        "meta": {
            "status": if (200..300).contains(&status) { "ok" } else { "failure" },
            "statuscode": statuscode,
            "message": message,
        },
        "data": data,
    } })
}

/// What a request brings.
struct Request {
    method: Method,
    segments: Vec<String>,
    query: HashMap<String, String>,
    headers: HeaderMap,
    body: Value,
}

impl Request {
    fn query_i64(&self, key: &str, default: i64) -> i64 {
        self.query
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn field(&self, key: &str) -> Option<&str> {
        self.body.get(key).and_then(Value::as_str)
    }
}

/// JSON, or a form body (both are what OCS controllers read).
fn parse_body(headers: &HeaderMap, body: &[u8]) -> Value {
    if body.is_empty() {
        return Value::Null;
    }
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if form {
        let map: serde_json::Map<String, Value> = form_urlencoded::parse(body)
            .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
            .collect();
        return Value::Object(map);
    }
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // OCS v1 answers success with statuscode 100; v2 with the HTTP status.
    let (rest, v1) = match (
        uri.path().strip_prefix("/ocs/v2.php/"),
        uri.path().strip_prefix("/ocs/v1.php/"),
    ) {
        (Some(rest), _) => (rest, false),
        (None, Some(rest)) => (rest, true),
        (None, None) => {
            return (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, "text/html")],
                "<html><body><h1>404 Not Found</h1></body></html>",
            )
                .into_response();
        }
    };
    let mut query: HashMap<String, String> =
        form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let parsed = parse_body(&headers, &body);
    // OCS reads GET parameters from the query and others from the body alike.
    if let Some(object) = parsed.as_object() {
        for (k, v) in object {
            if let Some(v) = v.as_str() {
                query.entry(k.clone()).or_insert_with(|| v.to_owned());
            }
        }
    }
    let request = Request {
        method: method.clone(),
        segments: rest
            .trim_end_matches('/')
            .split('/')
            .map(str::to_owned)
            .collect(),
        query,
        headers,
        body: parsed,
    };
    let (op, reply, lose, reference_id, last_given) = route(&inner, &request).await;
    let status = reply.status();
    inner.world().calls.push(CallRecord {
        method: method.to_string(),
        path: uri.path().to_owned(),
        op,
        status,
        answered: !lose,
        reference_id,
    });
    if lose {
        connection.cut();
        return StatusCode::BAD_GATEWAY.into_response();
    }
    let mut response = match reply {
        Reply::NotModified => StatusCode::NOT_MODIFIED.into_response(),
        Reply::Ocs(status, data) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
            axum::Json(envelope(
                status,
                if v1 { 100 } else { i64::from(status) },
                "OK",
                data,
            )),
        )
            .into_response(),
        Reply::Failure(status, code, message, data) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            axum::Json(envelope(status, code, message, data)),
        )
            .into_response(),
    };
    if uri.path().contains("/apps/spreed/") {
        // Talk's config hash on every answer (clients refresh capabilities when it changes),
        // and the room list's modification horizon.
        response.headers_mut().insert(
            "x-nextcloud-talk-hash",
            HeaderValue::from_static("5e0c5a1d3b7f4e2a9c8d6b4a2f0e1d3c5b7a9f8e"),
        );
        let now = inner.world().now_s();
        if let Ok(value) = HeaderValue::from_str(&now.to_string()) {
            response
                .headers_mut()
                .insert("x-nextcloud-talk-modified-before", value);
        }
    }
    if let Some(last) = last_given
        && let Ok(value) = HeaderValue::from_str(&last.to_string())
    {
        response.headers_mut().insert("x-chat-last-given", value);
    }
    response
}

type Routed = (Option<Op>, Reply, bool, Option<String>, Option<i64>);

fn plain(reply: Reply) -> Routed {
    (None, reply, false, None, None)
}

/// The user an HTTP Basic header proves, if any.
fn authenticated(inner: &Inner, request: &Request) -> bool {
    let Some(basic) = request
        .header("authorization")
        .and_then(|h| h.strip_prefix("Basic "))
    else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(basic.trim()) else {
        return false;
    };
    let expected = format!("{}:{}", inner.config.user, inner.config.app_password);
    decoded == expected.as_bytes()
}

async fn route(inner: &Arc<Inner>, request: &Request) -> Routed {
    let segments: Vec<&str> = request.segments.iter().map(String::as_str).collect();
    match (request.method.clone(), segments.as_slice()) {
        (Method::GET, ["cloud", "capabilities"]) => plain(Reply::Ocs(200, capabilities(inner))),
        (Method::GET, ["cloud", "user"]) => {
            if !authenticated(inner, request) {
                return plain(unauthenticated());
            }
            plain(Reply::Ocs(
                200,
                json!({ "id": inner.config.user, "displayname": inner.config.user_display_name,
                    "display-name": inner.config.user_display_name, "enabled": true }),
            ))
        }
        (Method::GET, ["apps", "spreed", "api", "v4", "room"]) => {
            if !authenticated(inner, request) {
                return plain(unauthenticated());
            }
            plain(Reply::Ocs(200, rooms(inner)))
        }
        (Method::POST, ["apps", "spreed", "api", "v1", "bot", token, "message"]) => {
            bot_send(inner, request, token)
        }
        (Method::GET, ["apps", "spreed", "api", "v1", "chat", token]) => {
            if !authenticated(inner, request) {
                return plain(unauthenticated());
            }
            read(inner, request, token).await
        }
        (Method::POST, ["apps", "spreed", "api", "v1", "chat", token]) => {
            if !authenticated(inner, request) {
                return plain(unauthenticated());
            }
            chat_send(inner, request, token)
        }
        (
            method @ (Method::PUT | Method::DELETE),
            ["apps", "spreed", "api", "v1", "chat", token, id],
        ) => {
            if !authenticated(inner, request) {
                return plain(unauthenticated());
            }
            change(inner, request, token, id, method == Method::DELETE)
        }
        _ => plain(Reply::Failure(
            404,
            998,
            "Invalid query, please check the syntax. API specifications are here: http://www.freedesktop.org/wiki/Specifications/open-collaboration-services.",
            json!([]),
        )),
    }
}

fn capabilities(inner: &Inner) -> Value {
    json!({
        "version": { "major": 31, "minor": 0, "micro": 0, "string": "31.0.0",
            "edition": "", "extendedSupport": false },
        "capabilities": {
            "spreed": {
                "features": ["chat-v2", "chat-reference-id", "bots-v1", "edit-messages",
                    "delete-messages", "rich-object-sharing", "silent-send"],
                "config": {
                    "chat": { "max-length": inner.config.max_length, "read-privacy": 0 },
                    "conversations": { "can-create": true },
                },
                "version": "21.0.0",
            }
        }
    })
}

fn rooms(inner: &Inner) -> Value {
    let world = inner.world();
    Value::Array(
        world
            .rooms
            .iter()
            .enumerate()
            .filter(|(_, r)| r.user_joined)
            .map(|(i, r)| {
                let last = world.messages.iter().rev().find(|m| m.token == r.token);
                json!({
                    "id": i + 1,
                    "token": r.token,
                    "type": r.kind.code(),
                    "name": r.name,
                    "displayName": r.name,
                    "readOnly": u8::from(r.read_only),
                    "lobbyState": u8::from(r.lobby),
                    "participantType": if r.kind == RoomType::Public { 1 } else { 3 },
                    "lastMessage": last.map(SimMessage::to_json).unwrap_or(json!([])),
                })
            })
            .collect(),
    )
}

/// Applies an injected fault: `Some` when the call is refused, and whether its answer is lost.
/// (A stall is applied by the chat read only.)
fn fault_of(world: &mut World, op: Op) -> (Option<Reply>, bool) {
    match world.fault(op) {
        Some(FaultKind::Refuse(status)) => (Some(failure(status)), false),
        Some(FaultKind::LoseAnswer) => (None, true),
        Some(FaultKind::Stall(_)) | None => (None, false),
    }
}

fn bot_send(inner: &Arc<Inner>, request: &Request, token: &str) -> Routed {
    let op = Some(Op::BotSend);
    let message = request.field("message").unwrap_or_default().to_owned();
    let reference = request.field("referenceId").map(str::to_owned);
    let random = request
        .header("x-nextcloud-talk-bot-random")
        .unwrap_or_default();
    let signature = request
        .header("x-nextcloud-talk-bot-signature")
        .unwrap_or_default();
    let mut world = inner.world();
    let (refused, lose) = fault_of(&mut world, Op::BotSend);
    if let Some(reply) = refused {
        return (op, reply, false, reference, None);
    }
    // BotController::getBotFromHeaders: a bot enabled in the conversation whose secret signs
    // random ‖ message; else 401 (brute-force throttled).
    let room = world.room(token).cloned();
    let verified = random.len() >= 32
        && room.as_ref().is_some_and(|r| r.bot_enabled)
        && sign::verify(
            &inner.config.bot_secret,
            random,
            message.as_bytes(),
            signature,
        );
    if !verified {
        return (op, failure(401), false, reference, None);
    }
    if message.trim().is_empty() {
        return (op, failure(400), false, reference, None);
    }
    if message.chars().count() > inner.config.max_length {
        return (op, failure(413), false, reference, None);
    }
    let bot = inner.bot_actor_id();
    let name = inner.config.bot_name.clone();
    world.post(
        token,
        "bots",
        &bot,
        &name,
        &message,
        reference.as_deref().unwrap_or_default(),
        "",
        None,
    );
    drop(world);
    inner.wake();
    // 201, no message id.
    (op, Reply::Ocs(201, Value::Null), lose, reference, None)
}

fn chat_send(inner: &Arc<Inner>, request: &Request, token: &str) -> Routed {
    let op = Some(Op::ChatSend);
    let message = request.field("message").unwrap_or_default().to_owned();
    let reference = request.field("referenceId").map(str::to_owned);
    let mut world = inner.world();
    let (refused, lose) = fault_of(&mut world, Op::ChatSend);
    if let Some(reply) = refused {
        return (op, reply, false, reference, None);
    }
    let Some(room) = world.room(token).cloned().filter(|r| r.user_joined) else {
        return (op, failure(404), false, reference, None);
    };
    if room.read_only {
        return (op, failure(403), false, reference, None);
    }
    if room.lobby {
        return (op, failure(412), false, reference, None);
    }
    if message.trim().is_empty() {
        return (op, failure(400), false, reference, None);
    }
    if message.chars().count() > inner.config.max_length {
        return (op, failure(413), false, reference, None);
    }
    let user = inner.config.user.clone();
    let display = inner.config.user_display_name.clone();
    let posted = world.post(
        token,
        "users",
        &user,
        &display,
        &message,
        reference.as_deref().unwrap_or_default(),
        "",
        None,
    );
    // The user's message reaches the bot, if one is enabled here (users wake bots).
    if room.bot_enabled
        && let Some(url) = world.bot_url.clone()
    {
        let event = json!({
            "type": "Create",
            "actor": { "type": "Person", "id": format!("users/{user}"), "name": display },
            "object": { "type": "Note", "id": posted.id, "name": "message",
                "content": json!({ "message": message, "parameters": [] }).to_string(),
                "mediaType": "text/markdown" },
            "target": { "type": "Collection", "id": token, "name": room.name },
        });
        super::webhook::enqueue(inner, &mut world, url, event.to_string());
    }
    drop(world);
    inner.wake();
    (op, Reply::Ocs(201, posted.to_json()), lose, reference, None)
}

/// Edit (PUT) or delete (DELETE) message `id`.
fn change(inner: &Arc<Inner>, request: &Request, token: &str, id: &str, delete: bool) -> Routed {
    let op = Some(if delete { Op::Delete } else { Op::Edit });
    let mut world = inner.world();
    let (refused, lose) = fault_of(&mut world, if delete { Op::Delete } else { Op::Edit });
    if let Some(reply) = refused {
        return (op, reply, false, None, None);
    }
    let Some(room) = world.room(token).cloned().filter(|r| r.user_joined) else {
        return (op, failure(404), false, None, None);
    };
    let now = world.now_s();
    let id: i64 = id.parse().unwrap_or(-1);
    let Some(index) = world
        .messages
        .iter()
        .position(|m| m.id == id && m.token == token)
    else {
        return (op, failure(404), false, None, None);
    };
    let target = world.messages[index].clone();
    if target.message_type != "comment" {
        return (op, failure(405), false, None, None);
    }
    if target.actor_type != "users" || target.actor_id != inner.config.user {
        return (op, failure(403), false, None, None);
    }
    let window = if delete { 6 * 3_600 } else { 24 * 3_600 };
    if now - target.timestamp > window {
        return (op, error(400, "age"), false, None, None);
    }
    let text = request.field("message").unwrap_or_default().to_owned();
    if !delete && text.trim().is_empty() {
        return (op, error(400, "message"), false, None, None);
    }
    {
        let m = &mut world.messages[index];
        if delete {
            m.message_type = "comment_deleted".into();
            m.message = "Message deleted by you".into();
        } else {
            m.message = text;
            m.last_edit = Some(now);
        }
    }
    let parent = world.messages[index].to_json();
    let user = inner.config.user.clone();
    let display = inner.config.user_display_name.clone();
    let system = world.post(
        token,
        "users",
        &user,
        &display,
        if delete {
            "You deleted a message"
        } else {
            "You edited a message"
        },
        "",
        if delete {
            "message_deleted"
        } else {
            "message_edited"
        },
        Some(id),
    );
    drop(world);
    inner.wake();
    let mut data = system.to_json();
    data["parent"] = parent;
    let status = if room.bot_enabled { 202 } else { 200 };
    (op, Reply::Ocs(status, data), lose, None, None)
}

/// `GET …/chat/{token}`: the long poll (`lookIntoFuture=1`) or history (`0`).
async fn read(inner: &Arc<Inner>, request: &Request, token: &str) -> Routed {
    let op = Some(Op::ChatRead);
    let future = request.query_i64("lookIntoFuture", 0) == 1;
    let last_known = request.query_i64("lastKnownMessageId", 0);
    let limit = usize::try_from(request.query_i64("limit", 100).clamp(1, 200)).unwrap_or(100);
    let timeout = Duration::from_secs(
        u64::try_from(request.query_i64("timeout", 30).clamp(0, 60)).unwrap_or(30),
    );
    let deadline = Instant::now() + timeout;
    let mut news = inner.news.subscribe();
    let (lose, stall) = {
        let mut world = inner.world();
        let (lose, stall) = match world.fault(Op::ChatRead) {
            Some(FaultKind::Refuse(status)) => return (op, failure(status), false, None, None),
            Some(FaultKind::LoseAnswer) => (true, None),
            Some(FaultKind::Stall(by)) => (false, Some(by)),
            None => (false, None),
        };
        if world.room(token).is_none_or(|r| !r.user_joined) {
            return (op, failure(404), false, None, None);
        }
        (lose, stall)
    };
    loop {
        news.borrow_and_update();
        let page: Vec<Value> = {
            let world = inner.world();
            let mut messages: Vec<&SimMessage> = world
                .messages
                .iter()
                .filter(|m| m.token == token)
                .filter(|m| {
                    if future {
                        m.id > last_known
                    } else {
                        last_known == 0 || m.id < last_known
                    }
                })
                .collect();
            if future {
                messages.sort_by_key(|m| m.id);
            } else {
                messages.sort_by_key(|m| std::cmp::Reverse(m.id));
            }
            messages
                .into_iter()
                .take(limit)
                .map(SimMessage::to_json)
                .collect()
        };
        if let Some(last) = page
            .last()
            .and_then(|m| m.get("id"))
            .and_then(Value::as_i64)
        {
            if let Some(by) = stall {
                tokio::time::sleep(by).await;
            }
            return (
                op,
                Reply::Ocs(200, Value::Array(page)),
                lose,
                None,
                Some(last),
            );
        }
        let now = Instant::now();
        if !future || now >= deadline {
            if let Some(by) = stall {
                tokio::time::sleep(by).await;
            }
            return (op, Reply::NotModified, lose, None, None);
        }
        let _ = tokio::time::timeout(deadline - now, news.changed()).await;
    }
}
