//! The Graph API server: `/<version>/<phone-number-id>` and `/<version>/<phone-number-id>/
//! messages`, behind a listener whose connections a handler can cut (a lost answer).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::Value;
use tokio::net::TcpListener;

use super::state::{Inner, Outcome, envelope};
use super::{CallRecord, GraphFault, SimulatorConfig, webhook};

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

/// `v<major>.<minor>`.
fn is_version(segment: &str) -> bool {
    segment
        .strip_prefix('v')
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(major, minor)| {
            !major.is_empty()
                && !minor.is_empty()
                && major.chars().all(|c| c.is_ascii_digit())
                && minor.chars().all(|c| c.is_ascii_digit())
        })
}

fn answer(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, axum::Json(body.clone())).into_response()
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let segments: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let (version, rest) = match segments.split_first() {
        Some((version, rest)) if is_version(version) => (*version, rest),
        _ => ("", segments.as_slice()),
    };
    let path = format!("/{}", rest.join("/"));
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let json: Value = if method == Method::POST {
        match serde_json::from_slice(&body) {
            Ok(value) => value,
            // Graph also reads form bodies; the Cloud API's clients send JSON.
            Err(_) => Value::Null,
        }
    } else {
        Value::Null
    };
    let mut world = inner.world();
    let trace = world.next();
    let outcome = if version.is_empty() {
        Outcome::Refused(GraphFault {
            status: 400,
            code: 2500,
            subcode: None,
            message: format!("Unknown path components: {}", uri.path()),
            details: None,
        })
    } else if let Err(fault) = world.authorize(bearer) {
        Outcome::Refused(fault)
    } else {
        let number = inner.config.phone_number_id.as_str();
        match (&method, rest) {
            (&Method::GET, [id]) if *id == number => Outcome::Answer(world.number()),
            (&Method::POST, [id, "messages"]) if *id == number => {
                if json.is_object() {
                    world.messages(&json)
                } else {
                    Outcome::Refused(GraphFault {
                        status: 400,
                        code: 100,
                        subcode: None,
                        message: "(#100) The parameter messaging_product is required.".into(),
                        details: None,
                    })
                }
            }
            (_, [id, ..]) => Outcome::Refused(world.unknown_object(id)),
            _ => Outcome::Refused(world.unknown_object("")),
        }
    };
    let (status, code, answered) = match &outcome {
        Outcome::Answer(_) => (200, None, true),
        Outcome::Refused(fault) => (fault.status, Some(fault.code), true),
        Outcome::Lost => (200, None, false),
        Outcome::ServerError(status) => (*status, None, true),
    };
    world.calls.push(CallRecord {
        method: method.to_string(),
        path,
        body: json,
        status,
        code,
        answered,
    });
    drop(world);
    inner.wake.notify_one();
    match outcome {
        Outcome::Answer(body) => answer(200, &body),
        Outcome::Refused(fault) => answer(fault.status, &envelope(&fault, trace)),
        Outcome::Lost => {
            connection.cut();
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
        Outcome::ServerError(status) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body><h1>502 Bad Gateway</h1></body></html>",
        )
            .into_response(),
    }
}
