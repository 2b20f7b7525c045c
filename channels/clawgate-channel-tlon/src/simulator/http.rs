//! The simulator's Eyre routes.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State as Extract};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Chan, Fault, Inner, Stream, sse};

type Shared = Arc<Inner>;

pub(super) async fn serve(inner: Shared) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app = Router::new()
        .route("/~/login", post(login))
        .route("/~/name", get(name))
        .route("/~/host", get(name))
        .route("/~/channel/{uid}", get(stream).put(actions).post(actions))
        .route("/~/scry/{*path}", get(scry))
        .with_state(inner);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

fn plain(status: StatusCode, body: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain")],
        body.to_owned(),
    )
        .into_response()
}

fn cookie_name(inner: &Inner) -> String {
    format!("urbauth-{}", inner.config.our)
}

/// Whether the request carries a live session cookie.
fn authed(inner: &Inner, headers: &HeaderMap) -> bool {
    let name = cookie_name(inner);
    let state = inner.state();
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(k, v)| k == name && state.sessions.contains(v))
}

async fn login(Extract(inner): Extract<Shared>, body: Bytes) -> Response {
    let password = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "password")
        .map(|(_, v)| v.into_owned());
    if password.as_deref() != Some(inner.config.code.as_str()) {
        return plain(StatusCode::BAD_REQUEST, "invalid password");
    }
    let token = {
        let mut state = inner.state();
        let token = format!("0v{}.{}", state.sessions.len() + 1, super::now_ms());
        state.sessions.insert(token.clone());
        token
    };
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .header(
            header::SET_COOKIE,
            format!("{}={token}; Path=/; Max-Age=604800", cookie_name(&inner)),
        )
        .body(Body::empty())
        .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "response"))
}

async fn name(Extract(inner): Extract<Shared>) -> Response {
    plain(StatusCode::OK, &inner.config.our)
}

async fn actions(
    Extract(inner): Extract<Shared>,
    Path(uid): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authed(&inner, &headers) {
        return plain(StatusCode::FORBIDDEN, "not logged in");
    }
    let Ok(Value::Array(actions)) = serde_json::from_slice::<Value>(&body) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "a channel request is a JSON array of actions",
        );
    };
    let mut state = inner.state();
    let pokes_here = actions
        .iter()
        .any(|a| a["action"] == "poke" && matches!(a["app"].as_str(), Some("chat" | "channels")));
    let mut fault = if pokes_here { state.take_fault() } else { None };
    if let Some(Fault::PutStatus(status)) = fault {
        return plain(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "simulated failure",
        );
    }
    let mut drop_streams = false;
    for action in &actions {
        let id = action.get("id").and_then(Value::as_u64).unwrap_or_default();
        match action.get("action").and_then(Value::as_str) {
            Some("poke") => {
                let app = action["app"].as_str().unwrap_or_default();
                let mark = action["mark"].as_str().unwrap_or_default();
                let faulted = matches!(app, "chat" | "channels");
                let this_fault = if faulted { fault.take() } else { None };
                let result = match &this_fault {
                    Some(Fault::Nack(trace)) => Err(trace.clone()),
                    _ => inner.apply_poke(&mut state, app, mark, &action["json"]),
                };
                if result.is_ok() && faulted {
                    state.applied_pokes += 1;
                }
                if this_fault == Some(Fault::DropStreams) {
                    drop_streams = true;
                }
                if this_fault == Some(Fault::LoseResult) {
                    continue;
                }
                let event = match result {
                    Ok(()) => json!({ "id": id, "response": "poke", "ok": "ok" }),
                    Err(err) => json!({ "id": id, "response": "poke", "err": err }),
                };
                state.channels.entry(uid.clone()).or_default().emit(event);
            }
            Some("subscribe") => {
                let app = action["app"].as_str().unwrap_or_default().to_owned();
                let path = action["path"].as_str().unwrap_or_default().to_owned();
                let chan = state.channels.entry(uid.clone()).or_default();
                if matches!(app.as_str(), "chat" | "channels") {
                    chan.subs.insert(id, (app, path));
                    chan.emit(json!({ "id": id, "response": "subscribe", "ok": "ok" }));
                } else {
                    chan.emit(json!({ "id": id, "response": "subscribe", "err": format!("no agent {app}") }));
                }
            }
            Some("unsubscribe") => {
                let sub = action["subscription"].as_u64().unwrap_or_default();
                state
                    .channels
                    .entry(uid.clone())
                    .or_default()
                    .subs
                    .remove(&sub);
            }
            Some("ack") => {
                let Some(to) = action["event-id"].as_u64() else {
                    return plain(StatusCode::BAD_REQUEST, "ack without event-id");
                };
                state.acks += 1;
                if let Some(chan) = state.channels.get_mut(&uid) {
                    chan.queue = chan.queue.split_off(&(to + 1));
                }
            }
            Some("delete") => {
                state.channels.remove(&uid);
                return StatusCode::NO_CONTENT.into_response();
            }
            _ => return plain(StatusCode::BAD_REQUEST, "unknown channel action"),
        }
    }
    state.channels.entry(uid).or_default();
    if drop_streams {
        for chan in state.channels.values_mut() {
            chan.stream = None;
        }
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn stream(
    Extract(inner): Extract<Shared>,
    Path(uid): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authed(&inner, &headers) {
        return plain(StatusCode::FORBIDDEN, "not logged in");
    }
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    {
        let mut state = inner.state();
        let Some(chan) = state.channels.get_mut(&uid) else {
            return plain(StatusCode::NOT_FOUND, "no such channel");
        };
        if let Some(last) = last {
            chan.queue = chan.queue.split_off(&(last + 1));
        }
        let chan: &mut Chan = chan;
        for (id, (data, _)) in &chan.queue {
            let _ = tx.send(sse(*id, data));
        }
        chan.stream = Some(Stream { tx });
        state.streams_opened += 1;
    }
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|item| (Ok::<_, Infallible>(Bytes::from(item)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "response"))
}

async fn scry(
    Extract(inner): Extract<Shared>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authed(&inner, &headers) {
        return plain(StatusCode::FORBIDDEN, "not logged in");
    }
    let Some(path) = path.strip_suffix(".json") else {
        return plain(StatusCode::NOT_FOUND, "only .json scries are served");
    };
    match inner.scry(path) {
        Some(value) => axum::Json(value).into_response(),
        None => plain(StatusCode::NOT_FOUND, "nothing at that path"),
    }
}
