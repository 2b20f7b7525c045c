//! The HTTP side: the listener (whose connections a fault can cut), argument decoding (query
//! string, form, JSON), the token check, Slack's envelope and the call record.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::state::{ApiError, Inner, arg};
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
    inner.events_changed.notify_one();
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

/// The arguments of one call: the query string, then the body (form or JSON).
fn decode_args(uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Result<(Value, bool), ApiError> {
    let mut args = serde_json::Map::new();
    for (key, value) in decode_form(uri.query().unwrap_or_default()) {
        args.insert(key, Value::String(value));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let json = content_type.starts_with("application/json");
    if json {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => args.extend(map),
            _ => {
                return Err(ApiError {
                    status: 200,
                    error: "invalid_json".into(),
                    retry_after: None,
                });
            }
        }
    } else if !body.is_empty() {
        let text = std::str::from_utf8(body).map_err(|_| ApiError {
            status: 200,
            error: "invalid_form_data".into(),
            retry_after: None,
        })?;
        for (key, value) in decode_form(text) {
            args.insert(key, Value::String(value));
        }
    }
    Ok((Value::Object(args), json))
}

fn envelope(outcome: &Result<Value, ApiError>) -> Response {
    match outcome {
        Ok(answer) => (StatusCode::OK, axum::Json(answer.clone())).into_response(),
        Err(error) => {
            let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::OK);
            let body = axum::Json(json!({ "ok": false, "error": error.error }));
            match error.retry_after {
                Some(secs) => {
                    (status, [(header::RETRY_AFTER, secs.to_string())], body).into_response()
                }
                None => (status, body).into_response(),
            }
        }
    }
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(method) = uri.path().strip_prefix("/api/").map(str::to_owned) else {
        return (StatusCode::NOT_FOUND, "not a Web API path").into_response();
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let decoded = decode_args(&uri, &headers, &body);
    let mut world = inner.world();
    let (args, outcome, fault) = match decoded {
        Err(error) => (Value::Null, Err(error), None),
        Ok((args, json)) => {
            // JSON bodies carry the token only in the header; forms may carry it as `token`.
            let token = bearer
                .clone()
                .or_else(|| if json { None } else { arg(&args, "token") });
            let fault = world.take_fault(&method);
            let outcome = match (
                &fault,
                world.authorize(token.as_deref(), &inner.config.bot_token),
            ) {
                (_, Err(error)) => Err(error),
                (Some(FaultKind::Error(code)), _) => Err(ApiError {
                    status: 200,
                    error: code.clone(),
                    retry_after: None,
                }),
                (Some(FaultKind::RateLimited(secs)), _) => Err(ApiError {
                    status: 429,
                    error: "ratelimited".into(),
                    retry_after: Some(*secs),
                }),
                (Some(FaultKind::ServerError(status)), _) => Err(ApiError {
                    status: *status,
                    error: String::new(),
                    retry_after: None,
                }),
                _ => world.call(&method, &args),
            };
            (args, outcome, fault)
        }
    };
    let lost = fault == Some(FaultKind::LoseAnswer);
    let mut shown = args;
    if let Some(map) = shown.as_object_mut() {
        map.remove("token");
    }
    world.calls.push(CallRecord {
        method: method.clone(),
        args: shown,
        status: outcome.as_ref().map_or_else(|e| e.status, |_| 200),
        error: outcome
            .as_ref()
            .err()
            .map(|e| e.error.clone())
            .filter(|e| !e.is_empty()),
        answered: !lost,
    });
    drop(world);
    inner.events_changed.notify_one();
    if lost {
        connection.cut();
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if let Some(FaultKind::ServerError(status)) = fault {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (status, "<html><body>upstream error</body></html>").into_response();
    }
    envelope(&outcome)
}

pub(crate) fn decode_form(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key), percent_decode(value))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
                match (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
                    (Some(high), Some(low)) => {
                        out.push((high * 16 + low) as u8);
                        i += 3;
                    }
                    _ => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
