//! The OA API and OAuth server: `/v3.0/oa/message/cs`, `/v2.0/oa/getoa` and
//! `/v4/oa/access_token`, behind a listener whose connections a handler can cut (a lost
//! answer).

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::state::{Inner, Outcome, error};
use super::{CallRecord, SimulatorConfig, webhook};

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
    let server_task = tokio::spawn(async move {
        let _ = server.await;
    });
    let webhook_task = tokio::spawn(webhook::run(inner.clone()));
    inner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend([server_task, webhook_task]);
    Ok(inner)
}

pub(crate) async fn stop(inner: &Arc<Inner>) {
    inner.shutdown.send_replace(true);
    inner.wake.notify_one();
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

/// `application/x-www-form-urlencoded` fields (`+` is a space, `%XX` a byte).
fn form_fields(body: &[u8]) -> HashMap<String, String> {
    fn decode(text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    match std::str::from_utf8(&bytes[i + 1..i + 3])
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                    {
                        Some(byte) => {
                            out.push(byte);
                            i += 2;
                        }
                        None => out.push(b'%'),
                    }
                }
                byte => out.push(byte),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
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
    let header_of = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let access_token = header_of("access_token");
    let mut world = inner.world();
    let (recorded, outcome) = match (&method, path.as_str()) {
        (&Method::POST, "/v4/oa/access_token") => {
            let form = form_fields(&body);
            let recorded: Value = form
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect::<serde_json::Map<_, _>>()
                .into();
            let outcome = world.access_token(header_of("secret_key"), &form);
            (recorded, outcome)
        }
        (&Method::POST, "/v3.0/oa/message/cs") => {
            let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let outcome = match world.authorize(access_token) {
                Err(refusal) => Outcome::Answer(refusal),
                Ok(()) if !json.is_object() => Outcome::Answer(error(
                    -201,
                    "Parameters are invalid: the body is not a JSON object",
                )),
                Ok(()) => world.message_cs(&json),
            };
            (json, outcome)
        }
        (&Method::GET, "/v2.0/oa/getoa") => {
            let outcome = match world.authorize(access_token) {
                Err(refusal) => Outcome::Answer(refusal),
                Ok(()) => Outcome::Answer(world.oa_info()),
            };
            (Value::Null, outcome)
        }
        _ => (Value::Null, Outcome::ServerError(404)),
    };
    let (status, code, answered) = match &outcome {
        Outcome::Answer(body) => (
            200,
            body.get("error").and_then(Value::as_i64).unwrap_or(0),
            true,
        ),
        Outcome::Lost => (200, 0, false),
        Outcome::ServerError(status) => (*status, 0, true),
        Outcome::Status(status, body) => (
            *status,
            body.get("error").and_then(Value::as_i64).unwrap_or(0),
            true,
        ),
    };
    world.calls.push(CallRecord {
        method: method.to_string(),
        path,
        body: recorded,
        status,
        error: code,
        answered,
    });
    drop(world);
    inner.wake.notify_one();
    match outcome {
        // Zalo answers failures with HTTP 200 too.
        Outcome::Answer(body) => (StatusCode::OK, axum::Json(body)).into_response(),
        Outcome::Lost => {
            connection.cut();
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
        Outcome::Status(status, body) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            axum::Json(body),
        )
            .into_response(),
        Outcome::ServerError(404) => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({ "error": 404, "message": "Not Found" })),
        )
            .into_response(),
        Outcome::ServerError(status) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body><h1>502 Bad Gateway</h1></body></html>",
        )
            .into_response(),
    }
}
