//! `/api/v4/websocket`: authentication (header or `authentication_challenge`), `hello`, events
//! with `seq`, and resume from the dead queue.
//!
//! As the server's hub does: a connection that resumes (its `connection_id` known, inactive, and
//! `sequence_number` inside the dead queue) gets no `hello`, only the events from
//! `sequence_number` on; any other gets a fresh `connection_id` in a `hello` with `seq` 0.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};

use super::state::{Connection, Inner, SimUser};

pub(crate) async fn upgrade(
    State(inner): State<Arc<Inner>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let user = super::http::bearer(&inner, &headers);
    let connection_id = query.get("connection_id").cloned().unwrap_or_default();
    let sequence: i64 = query
        .get("sequence_number")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ws.on_upgrade(move |socket| serve(inner, socket, user, connection_id, sequence))
}

async fn send(socket: &mut WebSocket, value: &Value) -> bool {
    socket
        .send(Message::Text(value.to_string().into()))
        .await
        .is_ok()
}

/// Registers the connection: resumed, or fresh with its hello queued; with the owner token of
/// the task serving it.
fn register(inner: &Inner, user: &SimUser, asked_id: &str, sequence: i64) -> (String, u64) {
    inner.with(|s| {
        s.next_id += 1;
        let owner = s.next_id;
        let now = s.now();
        let window = inner.config.resume_window;
        let resumable = s.connections.get(asked_id).is_some_and(|c| {
            let in_queue = sequence == c.sequence
                || c
                    .dead_queue
                    .front()
                    .is_some_and(|(first, _)| *first <= sequence && sequence < c.sequence);
            c.user_id == user.id
                && !c.active
                && now.saturating_sub(c.inactive_since) < window
                && in_queue
        });
        if resumable && let Some(c) = s.connections.get_mut(asked_id) {
            c.active = true;
            c.owner = owner;
            c.outbox = c
                .dead_queue
                .iter()
                .filter(|(seq, _)| *seq >= sequence)
                .map(|(_, e)| e.clone())
                .collect();
            s.stats.resumed += 1;
            s.stats.open += 1;
            return (asked_id.to_owned(), owner);
        }
        let id = s.new_id();
        let mut connection = Connection::new(&user.id);
        connection.owner = owner;
        connection.push(
            json!({
                "event": "hello",
                "data": { "connection_id": id, "server_version": "10.11.0.0.0.0.true" },
                "broadcast": { "omit_users": null, "user_id": user.id, "channel_id": "", "team_id": "" },
            }),
            inner.config.dead_queue,
        );
        s.connections.insert(id.clone(), connection);
        s.stats.fresh += 1;
        s.stats.open += 1;
        (id, owner)
    })
}

async fn serve(
    inner: Arc<Inner>,
    mut socket: WebSocket,
    header_user: Option<SimUser>,
    asked_id: String,
    sequence: i64,
) {
    let epoch = inner.with(|s| s.socket_epoch);
    let mut changes = inner.sockets.subscribe();
    let mut shutdown = inner.shutdown.subscribe();
    // Without a header token, the first frame must be the challenge.
    let user = match header_user {
        Some(user) => user,
        None => {
            let Some(Ok(Message::Text(text))) = socket.recv().await else {
                return;
            };
            let frame: Value = serde_json::from_str(&text).unwrap_or_default();
            let seq = frame["seq"].clone();
            let token = frame["data"]["token"].as_str().unwrap_or_default();
            let user = (frame["action"] == "authentication_challenge")
                .then(|| inner.with(|s| s.user_by_token(token)))
                .flatten();
            let Some(user) = user else {
                let _ = send(
                    &mut socket,
                    &json!({ "status": "FAIL", "seq_reply": seq, "error": {
                        "id": "api.web_socket_router.not_authenticated.app_error",
                        "message": "Not authenticated. Please log in and try again.",
                        "status_code": 401 } }),
                )
                .await;
                return;
            };
            if !send(&mut socket, &json!({ "status": "OK", "seq_reply": seq })).await {
                return;
            }
            user
        }
    };
    let (id, owner) = register(&inner, &user, &asked_id, sequence);
    loop {
        // Everything queued goes out, in order.
        let batch: Vec<Value> = inner.with(|s| {
            s.connections
                .get_mut(&id)
                .map(|c| c.outbox.drain(..).collect())
                .unwrap_or_default()
        });
        let mut written = true;
        for event in &batch {
            if !send(&mut socket, event).await {
                written = false;
                break;
            }
        }
        let dropped = inner.with(|s| s.socket_epoch != epoch);
        if !written || dropped {
            break;
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { break },
            _ = shutdown.changed() => break,
            frame = socket.recv() => match frame {
                Some(Ok(Message::Text(text))) => {
                    // Actions (`user_typing`, pings) are answered by `seq_reply`.
                    let frame: Value = serde_json::from_str(&text).unwrap_or_default();
                    if frame.get("action").is_some()
                        && !send(&mut socket, &json!({ "status": "OK", "seq_reply": frame["seq"] })).await
                    {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    // Abrupt on a drop: the socket goes without a close frame.
    drop(socket);
    inner.with(|s| {
        let now = s.now();
        if let Some(c) = s.connections.get_mut(&id).filter(|c| c.owner == owner) {
            c.disconnect(now);
        }
        s.stats.open = s.stats.open.saturating_sub(1);
    });
}
