//! The server's REST routes, behind a listener whose connections a handler can cut.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::{CallRecord, FaultKind, Inner, World, webhook};

pub(crate) fn serve(inner: &Arc<Inner>, listener: TcpListener) {
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
    inner.spawn(async move {
        let _ = server.await;
    });
}

/// What a call comes to.
enum Outcome {
    /// 2xx with `message` and `data`.
    Ok(&'static str, Value),
    /// An error envelope: status, message, error type, error message, and `data` if any.
    Error(u16, &'static str, &'static str, String, Option<Value>),
    /// The work was done; the answer is never written.
    Lost,
}

fn bad_request(detail: impl Into<String>) -> Outcome {
    Outcome::Error(400, "Bad Request", "Validation Error", detail.into(), None)
}

fn not_found(detail: impl Into<String>) -> Outcome {
    Outcome::Error(404, "Not Found", "Database Error", detail.into(), None)
}

fn envelope(outcome: &Outcome) -> (u16, Value) {
    match outcome {
        Outcome::Ok(message, data) => (
            200,
            json!({ "status": 200, "message": message, "data": data }),
        ),
        Outcome::Error(status, message, kind, detail, data) => {
            let mut body = json!({
                "status": status,
                "message": message,
                "error": { "type": kind, "message": detail },
            });
            if let Some(data) = data {
                body["data"] = data.clone();
            }
            (*status, body)
        }
        Outcome::Lost => (200, Value::Null),
    }
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let query: Vec<(String, String)> =
        form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let authorized = query.iter().any(|(k, v)| {
        matches!(k.as_str(), "password" | "guid" | "token") && *v == inner.config.password
    });
    let json_body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let path = uri.path().to_owned();
    let outcome = if !authorized {
        Outcome::Error(
            401,
            "Unauthorized",
            "Authentication Error",
            "Missing server password!".into(),
            None,
        )
    } else {
        route(&inner, &method, &path, &query, &json_body).await
    };
    let (status, answer) = envelope(&outcome);
    let lost = matches!(outcome, Outcome::Lost);
    inner.world().calls.push(CallRecord {
        method: method.to_string(),
        path,
        body: json_body,
        status,
        answered: !lost,
        authorized,
    });
    if lost {
        connection.cut();
        return StatusCode::BAD_GATEWAY.into_response();
    }
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(answer),
    )
        .into_response()
}

async fn route(
    inner: &Arc<Inner>,
    method: &Method,
    path: &str,
    query: &[(String, String)],
    body: &Value,
) -> Outcome {
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    match (method.as_str(), segments.as_slice()) {
        ("GET", ["api", "v1", "ping"]) => Outcome::Ok("Ping received!", json!("pong")),
        ("GET", ["api", "v1", "server", "info"]) => Outcome::Ok(
            "Successfully fetched metadata",
            json!({
                "computer_id": "clawgate-sim",
                "os_version": "14.6.1",
                "server_version": "1.9.9",
                "private_api": inner.config.private_api,
                "proxy_service": "lan-url",
                "helper_connected": inner.config.private_api,
                "detected_icloud": "bot@icloud.com",
            }),
        ),
        ("POST", ["api", "v1", "message", "text"]) => send_text(inner, body).await,
        ("POST", ["api", "v1", "message", "query"]) => {
            let world = inner.world();
            let chat = body.get("chatGuid").and_then(Value::as_str);
            let after = body.get("after").and_then(Value::as_u64);
            let before = body.get("before").and_then(Value::as_u64);
            let desc = body.get("sort").and_then(Value::as_str) != Some("ASC");
            list(
                &world,
                chat,
                after,
                before,
                desc,
                body.get("offset").and_then(Value::as_u64),
                body.get("limit").and_then(Value::as_u64),
            )
        }
        ("GET", ["api", "v1", "chat", chat, "message"]) => {
            let world = inner.world();
            if world.chat(chat).is_none() {
                return not_found("Chat does not exist!");
            }
            let param = |key: &str| {
                query
                    .iter()
                    .find(|(k, _)| k == key)
                    .and_then(|(_, v)| v.parse::<u64>().ok())
            };
            let desc = !query.iter().any(|(k, v)| k == "sort" && v == "ASC");
            list(
                &world,
                Some(chat),
                param("after"),
                param("before"),
                desc,
                param("offset"),
                param("limit"),
            )
        }
        ("POST", ["api", "v1", "chat", chat, "read"]) => {
            if inner.world().chat(chat).is_none() {
                return not_found("Chat does not exist!");
            }
            Outcome::Ok("Successfully marked chat as read!", Value::Null)
        }
        ("GET", ["api", "v1", "message", guid]) => {
            let world = inner.world();
            match world.messages.iter().find(|m| m.guid == *guid) {
                Some(message) => Outcome::Ok("Success", world.serialize(message, false)),
                None => not_found("Message does not exist!"),
            }
        }
        ("POST", ["api", "v1", "message", guid, action @ ("edit" | "unsend")]) => {
            change(inner, guid, action, body)
        }
        _ => not_found(format!(
            "{} {path} is not a route of this server",
            method.as_str()
        )),
    }
}

fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn list(
    world: &World,
    chat: Option<&str>,
    after: Option<u64>,
    before: Option<u64>,
    desc: bool,
    offset: Option<u64>,
    limit: Option<u64>,
) -> Outcome {
    let mut rows: Vec<_> = world
        .messages
        .iter()
        .filter(|m| chat.is_none_or(|c| m.chat_guid == c))
        .filter(|m| after.is_none_or(|a| m.date_created >= a))
        .filter(|m| before.is_none_or(|b| m.date_created < b))
        .collect();
    if desc {
        rows.reverse();
    }
    let offset = offset.unwrap_or(0) as usize;
    let limit = limit.unwrap_or(100).min(1_000) as usize;
    let data: Vec<Value> = rows
        .into_iter()
        .skip(offset)
        .take(limit)
        .map(|m| world.serialize(m, false))
        .collect();
    Outcome::Ok("Success", Value::Array(data))
}

/// Takes the fault a send meets now, if any.
fn fault(world: &mut World) -> Option<FaultKind> {
    let fault = world.faults.first_mut()?;
    if fault.after > 0 {
        fault.after -= 1;
        return None;
    }
    let kind = fault.kind;
    fault.times -= 1;
    if fault.times == 0 {
        world.faults.remove(0);
    }
    Some(kind)
}

async fn send_text(inner: &Arc<Inner>, body: &Value) -> Outcome {
    let text = |key: &str| body.get(key).and_then(Value::as_str);
    let Some(chat_guid) = text("chatGuid").filter(|c| !c.is_empty()) else {
        return bad_request("The chatGuid field is required.");
    };
    let method = text("method").unwrap_or("apple-script");
    if !matches!(method, "apple-script" | "private-api") {
        return bad_request("The selected method is invalid.");
    }
    let temp_guid = text("tempGuid").filter(|t| !t.is_empty());
    let message = text("message").unwrap_or_default();
    if method == "apple-script" && temp_guid.is_none() {
        return bad_request("A 'tempGuid' is required when sending via AppleScript");
    }
    if method == "apple-script" && message.is_empty() {
        return bad_request("A 'message' is required when sending via AppleScript");
    }
    if method == "private-api" && !inner.config.private_api {
        return bad_request("iMessage Private API is not enabled!");
    }
    if message.is_empty() {
        return bad_request(
            "A 'message' or 'subject' is required when sending via the Private API",
        );
    }
    let (sent, injected) = {
        let mut world = inner.world();
        if world.chat(chat_guid).is_none() {
            return not_found("Chat does not exist!");
        }
        if let Some(temp) = temp_guid {
            if world.in_flight.contains(temp) {
                return bad_request(format!(
                    "Message is already queued to be sent! (Temp GUID: {temp})"
                ));
            }
            world.in_flight.insert(temp.to_owned());
        }
        let injected = fault(&mut world);
        let sent = match injected {
            Some(FaultKind::ServerError | FaultKind::LoseRequest) => None,
            _ => {
                let mut row =
                    world.row(chat_guid, message, true, None, temp_guid.map(str::to_owned));
                if injected == Some(FaultKind::SendError) {
                    row.error = 22;
                    if let Some(stored) = world.messages.iter_mut().find(|m| m.guid == row.guid) {
                        stored.error = 22;
                    }
                    let body = json!({ "type": "message-send-error", "data": world.serialize(&row, true) });
                    webhook::enqueue(inner, &mut world, body);
                } else {
                    // The poller sees the row; its `new-message` comes a little later.
                    let echo = world.serialize(&row, inner.config.echo_carries_temp_guid);
                    webhook::later(
                        inner,
                        &mut world,
                        json!({ "type": "new-message", "data": echo }),
                        inner.config.echo_delay,
                    );
                }
                Some(row)
            }
        };
        (sent, injected)
    };
    if !inner.config.answer_delay.is_zero() {
        tokio::time::sleep(inner.config.answer_delay).await;
    }
    let mut world = inner.world();
    if let Some(temp) = temp_guid {
        world.in_flight.remove(temp);
    }
    let data = sent.as_ref().map(|row| world.serialize(row, true));
    match (injected, data) {
        (Some(FaultKind::ServerError), _) => Outcome::Error(
            500,
            "Server Error",
            "Server Error",
            "An unhandled error occurred".into(),
            None,
        ),
        (Some(FaultKind::LoseRequest | FaultKind::LoseAnswer), _) => Outcome::Lost,
        (Some(FaultKind::Timeout), _) => Outcome::Error(
            504,
            "Gateway Timeout",
            "Gateway Timeout",
            "The request took too long to complete".into(),
            None,
        ),
        (Some(FaultKind::SendError), data) => Outcome::Error(
            500,
            "Message Send Error",
            "iMessage Error",
            "Failed to send message! See attached message error code.".into(),
            data,
        ),
        (None, Some(data)) => Outcome::Ok("Message sent!", data),
        (None, None) => Outcome::Error(500, "Server Error", "Server Error", "no row".into(), None),
    }
}

/// `edit` or `unsend` of message `guid`.
fn change(inner: &Arc<Inner>, guid: &str, action: &str, body: &Value) -> Outcome {
    if !inner.config.private_api {
        return bad_request("iMessage Private API is not enabled!");
    }
    let mut world = inner.world();
    let now = world.now();
    let Some(index) = world.messages.iter().position(|m| m.guid == guid) else {
        return not_found("Message does not exist!");
    };
    let message = world.messages[index].clone();
    let sms = world
        .chat(&message.chat_guid)
        .is_some_and(|c| c.service != "iMessage");
    let refuse = |detail: &str| {
        Outcome::Error(
            500,
            "Server Error",
            "iMessage Error",
            detail.to_owned(),
            None,
        )
    };
    if !message.is_from_me || message.date_retracted.is_some() || message.error != 0 {
        return refuse("The message cannot be changed");
    }
    if sms {
        return refuse("SMS messages cannot be edited or unsent");
    }
    let age = now.saturating_sub(message.date_created);
    if action == "edit" {
        let Some(text) = body
            .get("editedMessage")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        else {
            return bad_request("The editedMessage field is required.");
        };
        if age > 15 * 60 * 1000 || message.edits >= 5 {
            return refuse("Failed to edit message: past the edit window or the edit limit");
        }
        let stored = &mut world.messages[index];
        stored.text = text.to_owned();
        stored.edits += 1;
        stored.date_edited = Some(now);
    } else {
        if age > 2 * 60 * 1000 {
            return refuse("Failed to unsend message: past the unsend window");
        }
        let stored = &mut world.messages[index];
        stored.text = String::new();
        stored.date_retracted = Some(now);
    }
    let updated = world.messages[index].clone();
    let data = world.serialize(&updated, false);
    let event = json!({ "type": "updated-message", "data": data.clone() });
    webhook::enqueue(inner, &mut world, event);
    Outcome::Ok(
        if action == "edit" {
            "Message edited!"
        } else {
            "Message unsent!"
        },
        data,
    )
}
