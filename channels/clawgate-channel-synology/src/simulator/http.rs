//! The DSM web server: `/webapi/entry.cgi` (`SYNO.Chat.External`), behind a listener whose
//! connections a handler can cut (a lost answer).

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::{
    Author, CallRecord, Conversation, FaultKind, Inner, SimPost, SimulatorConfig, World, outgoing,
};

pub(crate) async fn start(config: SimulatorConfig) -> io::Result<Arc<Inner>> {
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
enum Outcome {
    /// `success: true`, with `data` when there is some.
    Answer(Option<Value>),
    /// `success: false` with this code (HTTP 200, as DSM answers failures).
    Refused(i64, Option<String>),
    /// The post was made; the answer is never written.
    Lost,
    /// A web server error page; nothing was done.
    ServerError(u16),
}

fn refused(code: i64, errors: impl Into<String>) -> Outcome {
    Outcome::Refused(code, Some(errors.into()))
}

/// DSM's envelope.
fn envelope(outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Answer(Some(data)) => json!({ "success": true, "data": data }),
        Outcome::Answer(None) => json!({ "success": true }),
        Outcome::Refused(code, Some(errors)) => {
            json!({ "success": false, "error": { "code": code, "errors": errors } })
        }
        Outcome::Refused(code, None) => json!({ "success": false, "error": { "code": code } }),
        Outcome::Lost | Outcome::ServerError(_) => Value::Null,
    }
}

/// The token of a call: `"…"` inside the (decoded) parameter; a bare one matches nothing.
fn unquote(raw: &str) -> Option<&str> {
    raw.strip_prefix('"')?.strip_suffix('"')
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    if uri.path() != "/webapi/entry.cgi" {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body><h1>404 Not Found</h1></body></html>",
        )
            .into_response();
    }
    // DSM reads its parameters from the query and from a form body alike.
    let mut params: HashMap<String, String> =
        form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    if method == Method::POST {
        for (key, value) in form_urlencoded::parse(&body).into_owned() {
            params.entry(key).or_insert(value);
        }
    }
    let param = |key: &str| params.get(key).map(String::as_str).unwrap_or_default();
    let payload: Value = params
        .get("payload")
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or(Value::Null);
    let chat_method = param("method").to_owned();
    let raw_token = param("token").to_owned();
    let mut world = inner.world();
    let outcome = if param("api") != "SYNO.Chat.External" {
        Outcome::Refused(102, None)
    } else if !matches!(
        chat_method.as_str(),
        "incoming" | "chatbot" | "user_list" | "channel_list"
    ) {
        Outcome::Refused(103, None)
    } else if param("version") != "2" {
        Outcome::Refused(104, None)
    } else {
        call(&inner, &mut world, &chat_method, &raw_token, &payload)
    };
    let (status, success, code, answered) = match &outcome {
        Outcome::Answer(_) => (200, Some(true), None, true),
        Outcome::Refused(code, _) => (200, Some(false), Some(*code), true),
        Outcome::Lost => (200, Some(true), None, false),
        Outcome::ServerError(status) => (*status, None, None, true),
    };
    world.calls.push(CallRecord {
        http_method: method.to_string(),
        method: chat_method,
        raw_token,
        payload,
        status,
        success,
        code,
        answered,
    });
    drop(world);
    match outcome {
        Outcome::Lost => {
            connection.cut();
            StatusCode::BAD_GATEWAY.into_response()
        }
        Outcome::ServerError(status) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>",
        )
            .into_response(),
        outcome => (StatusCode::OK, axum::Json(envelope(&outcome))).into_response(),
    }
}

/// A call whose api, method and version are right.
fn call(
    inner: &Arc<Inner>,
    world: &mut World,
    method: &str,
    raw: &str,
    payload: &Value,
) -> Outcome {
    let token = unquote(raw);
    let bot = token == Some(inner.config.bot_token.as_str()) && !world.bot_token_revoked;
    let invalid_token = || refused(404, "invalid token");
    match method {
        "user_list" if bot => {
            Outcome::Answer(Some(json!({ "users": world.users.iter().map(|u| json!({
            "user_id": u.user_id,
            "username": u.username,
            "nickname": u.nickname,
            "user_type": "normal",
            "is_disabled": false,
        })).collect::<Vec<_>>() })))
        }
        "channel_list" if bot => Outcome::Answer(Some(
            json!({ "channels": world.channels.iter().map(|c| json!({
            "channel_id": c.channel_id,
            "name": c.name,
            "type": "public",
        })).collect::<Vec<_>>() }),
        )),
        "user_list" | "channel_list" => invalid_token(),
        "chatbot" if !bot => invalid_token(),
        "chatbot" => post(inner, world, method, raw, payload, None),
        _ => {
            let channel = token.and_then(|t| {
                world
                    .channels
                    .iter()
                    .find(|c| c.incoming_token == t)
                    .map(|c| (c.channel_id, c.incoming_name.clone()))
            });
            match channel {
                Some(channel) => post(inner, world, method, raw, payload, Some(channel)),
                None => invalid_token(),
            }
        }
    }
}

/// Takes the fault a post of `method` meets now, if any.
fn fault(world: &mut World, method: &str) -> Option<FaultKind> {
    let index = world
        .faults
        .iter()
        .position(|f| f.method.as_deref().is_none_or(|m| m == method))?;
    let fault = &mut world.faults[index];
    if fault.after > 0 {
        fault.after -= 1;
        return None;
    }
    let kind = fault.kind.clone();
    fault.times -= 1;
    if fault.times == 0 {
        world.faults.remove(index);
    }
    Some(kind)
}

/// `incoming` (into `channel`) or `chatbot` (to `user_ids`).
fn post(
    inner: &Arc<Inner>,
    world: &mut World,
    method: &str,
    raw_token: &str,
    payload: &Value,
    channel: Option<(u64, String)>,
) -> Outcome {
    let injected = fault(world, method);
    match injected {
        Some(FaultKind::Refuse(code)) => return refused(code, "injected"),
        Some(FaultKind::ServerError(status)) => return Outcome::ServerError(status),
        _ => {}
    }
    if !payload.is_object() {
        return refused(117, "payload: not a JSON object");
    }
    let text = payload
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let file_url = payload.get("file_url").and_then(Value::as_str);
    if text.is_empty() && file_url.is_none() {
        return refused(117, "payload: neither text nor file_url");
    }
    if text.chars().count() > inner.config.max_text_chars {
        return refused(117, "payload: text too long");
    }
    if let Some(url) = file_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        return refused(117, "payload: file_url is not a URL");
    }
    let recipients: Vec<u64> = match &channel {
        Some(_) => Vec::new(),
        None => {
            let Some(ids) = payload.get("user_ids").and_then(Value::as_array) else {
                return refused(117, "payload: user_ids missing");
            };
            let ids: Option<Vec<u64>> = ids.iter().map(Value::as_u64).collect();
            match ids {
                Some(ids) if !ids.is_empty() => ids,
                _ => return refused(117, "payload: user_ids must be a list of integers"),
            }
        }
    };
    if let Some(unknown) = recipients
        .iter()
        .find(|id| !world.users.iter().any(|u| u.user_id == **id))
    {
        return refused(117, format!("payload: no user {unknown}"));
    }
    let now = Instant::now();
    if let Some(last) = world.last_post.get(raw_token)
        && now.duration_since(*last) < inner.config.min_send_interval
    {
        return refused(411, "create post too fast");
    }
    world.last_post.insert(raw_token.to_owned(), now);
    let file_url = file_url.map(str::to_owned);
    match channel {
        Some((channel_id, name)) => {
            let post_id = world.next();
            world.posts.push(SimPost {
                post_id,
                conversation: Conversation::Channel(channel_id),
                author: Author::Integration(name.clone()),
                text: text.to_owned(),
                file_url,
            });
            if inner.config.echo_integration_posts {
                outgoing(inner, world, channel_id, post_id, "0", &name, text);
            }
        }
        None => {
            for user in recipients {
                let post_id = world.next();
                world.posts.push(SimPost {
                    post_id,
                    conversation: Conversation::Direct(user),
                    author: Author::Bot,
                    text: text.to_owned(),
                    file_url: file_url.clone(),
                });
            }
        }
    }
    match injected {
        Some(FaultKind::LoseAnswer) => Outcome::Lost,
        _ => Outcome::Answer(None),
    }
}
