//! The HTTP side: the listener (whose connections a fault can cut), the token check, LINE's
//! headers and error bodies, faults, and the call record.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::Value;
use tokio::net::TcpListener;

use super::state::{Answer, ApiError, Inner};
use super::{CallRecord, FaultKind, PUSH_PATH, REPLY_PATH, SimulatorConfig, webhook};

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
    let webhook_task = tokio::spawn(webhook::run(inner.clone()));
    inner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend([server_task, webhook_task]);
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

fn respond(status: u16, body: &Value, request_id: &str, accepted: Option<&str>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(body.clone())).into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert("x-line-request-id", value);
    }
    if let Some(value) = accepted.and_then(|a| HeaderValue::from_str(a).ok()) {
        headers.insert("x-line-accepted-request-id", value);
    }
    response
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
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let retry_key = headers
        .get("x-line-retry-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut world = inner.world();
    let request_id = world.request_id();
    let fault = if bearer == Some(inner.config.access_token.as_str()) {
        world.take_fault(&path)
    } else {
        None
    };
    let outcome: Result<Answer, ApiError> = if bearer != Some(inner.config.access_token.as_str()) {
        Err(ApiError::new(
            401,
            "Authentication failed. Confirm that the access token in the authorization header is valid.",
        ))
    } else {
        match (&fault, method.as_str(), path.as_str()) {
            (Some(FaultKind::RateLimited), _, _) => Err(ApiError::new(
                429,
                "The API rate limit has been exceeded. Try again later.",
            )),
            (Some(FaultKind::Refuse(status, message)), _, _) => {
                Err(ApiError::new(*status, message))
            }
            (Some(FaultKind::InternalError(status)), _, _) => {
                Err(ApiError::new(*status, "Internal server error"))
            }
            (Some(FaultKind::ServerError(status)), _, _) => Err(ApiError {
                status: *status,
                body: Value::Null,
            }),
            (_, "GET", "/v2/bot/info") => Ok(Answer {
                status: 200,
                body: world.bot_info(),
                accepted_request_id: None,
            }),
            (_, "POST", REPLY_PATH) if json.is_object() => {
                world.reply(&json, retry_key.as_deref(), &request_id)
            }
            (_, "POST", PUSH_PATH) if json.is_object() => {
                world.push(&json, retry_key.as_deref(), &request_id)
            }
            (_, "POST", REPLY_PATH | PUSH_PATH) => Err(ApiError::new(
                400,
                "The request body could not be parsed as JSON",
            )),
            _ => Err(ApiError::new(404, "Not found")),
        }
    };
    let lost = fault == Some(FaultKind::LoseAnswer);
    let (status, error) = match &outcome {
        Ok(answer) => (
            answer.status,
            answer.body["message"].as_str().map(str::to_owned),
        ),
        Err(error) => (error.status, error.message()),
    };
    world.calls.push(CallRecord {
        method: method.to_string(),
        path: path.clone(),
        retry_key,
        body: json,
        status,
        error,
        request_id: request_id.clone(),
        answered: !lost,
    });
    drop(world);
    if lost {
        connection.cut();
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    match outcome {
        Ok(answer) => respond(
            answer.status,
            &answer.body,
            &request_id,
            answer.accepted_request_id.as_deref(),
        ),
        Err(ApiError { status, body }) if body.is_null() => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            (status, "<html><body>upstream error</body></html>").into_response()
        }
        Err(error) => respond(error.status, &error.body, &request_id, None),
    }
}
