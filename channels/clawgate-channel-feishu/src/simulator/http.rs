//! The HTTP side: the listener (whose connections a fault can cut), the token check, Feishu's
//! answers and error bodies, faults, and the call record.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::state::{ApiError, Inner};
use super::{CallRecord, FaultKind, SimulatorConfig, events};

pub(crate) async fn start(config: SimulatorConfig) -> io::Result<Arc<Inner>> {
    let listener = TcpListener::bind(config.bind).await?;
    let addr = listener.local_addr()?;
    let inner = Arc::new(Inner::new(config, addr));
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(inner.clone());
    let mut shutdown = inner.shutdown_tx.subscribe();
    let server = axum::serve(
        CuttableListener::new(listener),
        app.into_make_service_with_connect_info::<Connection>(),
    )
    .with_graceful_shutdown(async move {
        let _ = shutdown.wait_for(|stopped| *stopped).await;
    });
    let server_task = tokio::spawn(async move {
        let _ = server.await;
    });
    let events_task = tokio::spawn(events::run(inner.clone()));
    inner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend([server_task, events_task]);
    Ok(inner)
}

pub(crate) async fn stop(inner: &Arc<Inner>) {
    inner.shutdown_tx.send_replace(true);
    inner.changed.notify_one();
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

fn respond(status: u16, body: &Value, reset: Option<u64>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(body.clone())).into_response();
    let headers = response.headers_mut();
    if let Some(reset) = reset {
        headers.insert("x-ogw-ratelimit-limit", HeaderValue::from_static("50"));
        if let Ok(value) = HeaderValue::from_str(&reset.to_string()) {
            headers.insert("x-ogw-ratelimit-reset", value);
        }
    }
    response
}

fn query_of(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((decode(k), decode(v)))
        })
        .collect()
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query = query_of(&uri);
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut world = inner.world();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let token_call = path == "/open-apis/auth/v3/tenant_access_token/internal";
    let authorized = token_call || world.check_token(bearer.as_deref()).is_ok();
    let fault = if authorized {
        world.take_fault(&path)
    } else {
        None
    };
    let mut reset = None;
    let outcome: Result<Value, ApiError> = match (&fault, method.as_str(), segments.as_slice()) {
        _ if !authorized => Err(world
            .check_token(bearer.as_deref())
            .err()
            .unwrap_or_else(|| ApiError::new(400, 99_991_663, "Invalid access token"))),
        (Some(FaultKind::RateLimited(seconds)), _, _) => {
            reset = Some(*seconds);
            Err(ApiError::new(
                429,
                99_991_400,
                "request trigger frequency limit",
            ))
        }
        (Some(FaultKind::ChatRateLimited), _, _) => Err(ApiError::new(
            400,
            230_020,
            "This operation triggers the frequency limit.",
        )),
        (Some(FaultKind::Refuse(status, code, msg)), _, _) => {
            Err(ApiError::new(*status, *code, msg))
        }
        (Some(FaultKind::InternalError), _, _) => {
            Err(ApiError::new(500, 1_500, "Internal Server Error"))
        }
        (Some(FaultKind::ServerError(status)), _, _) => Err(ApiError::new(*status, 0, "")),
        (_, "POST", ["open-apis", "auth", "v3", "tenant_access_token", "internal"]) => {
            world.issue_token(&json)
        }
        (_, "GET", ["open-apis", "bot", "v3", "info"]) => Ok(world.bot_info()),
        (_, "POST", ["open-apis", "im", "v1", "messages"]) => world.create(&query, &json).map(data),
        (_, "GET", ["open-apis", "im", "v1", "messages"]) => world.list(&query).map(data),
        (_, "GET", ["open-apis", "im", "v1", "messages", id]) => world.get(id).map(data),
        (_, "POST", ["open-apis", "im", "v1", "messages", id, "reply"]) => {
            world.reply(id, &json).map(data)
        }
        (_, "PUT", ["open-apis", "im", "v1", "messages", id]) => {
            world.update(id, &json, false).map(data)
        }
        (_, "PATCH", ["open-apis", "im", "v1", "messages", id]) => {
            world.update(id, &json, true).map(data)
        }
        (_, "DELETE", ["open-apis", "im", "v1", "messages", id]) => world.recall(id).map(data),
        (_, "POST", ["open-apis", "cardkit", "v1", "cards"]) => world.create_card(&json).map(data),
        (_, "PUT", ["open-apis", "cardkit", "v1", "cards", id]) => {
            world.replace_card(id, &json).map(data)
        }
        (_, "PATCH", ["open-apis", "cardkit", "v1", "cards", id, "settings"]) => {
            world.card_settings(id, &json).map(data)
        }
        (
            _,
            "PUT",
            [
                "open-apis",
                "cardkit",
                "v1",
                "cards",
                id,
                "elements",
                element,
                "content",
            ],
        ) => world.stream_element(id, element, &json).map(data),
        _ => Err(ApiError::new(404, 404, "404 page not found")),
    };
    let lost = fault == Some(FaultKind::LoseAnswer);
    let (status, code) = match &outcome {
        Ok(body) => (200, body["code"].as_i64().unwrap_or(0)),
        Err(error) => (error.status, error.code),
    };
    world.calls.push(CallRecord {
        method: method.to_string(),
        path,
        query: uri.query().unwrap_or_default().to_owned(),
        body: json,
        status,
        code,
        answered: !lost,
    });
    drop(world);
    if lost {
        connection.cut();
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    match outcome {
        Ok(body) => respond(200, &body, None),
        Err(ApiError {
            status, code: 0, ..
        }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            (status, "<html><body>502 Bad Gateway</body></html>").into_response()
        }
        Err(error) => respond(
            error.status,
            &json!({ "code": error.code, "msg": error.msg, "error": {
                "log_id": "simulator", "troubleshooter": "https://open.feishu.cn/search?q=".to_owned() + &error.code.to_string() } }),
            reset,
        ),
    }
}

/// Feishu's success answer around `data`.
fn data(data: Value) -> Value {
    json!({ "code": 0, "msg": "success", "data": data })
}
