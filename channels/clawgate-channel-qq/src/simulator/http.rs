//! The QQ Bot API and token server: `/app/getAppAccessToken`, `/v2/users/{openid}/…` and
//! `/v2/groups/{group_openid}/…` (messages, files, recalls), behind a listener whose
//! connections a handler can cut (a lost answer).

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

use super::state::{Inner, Outcome, SimChat};
use super::{CallRecord, SimulatorConfig, callback};

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
    let callback_task = tokio::spawn(callback::run(inner.clone()));
    inner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend([server_task, callback_task]);
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

/// `(chat, rest)` of `/v2/users/{openid}/<rest>` or `/v2/groups/{group_openid}/<rest>`.
fn chat_path(path: &str) -> Option<(SimChat, &str)> {
    let (kind, rest) = if let Some(rest) = path.strip_prefix("/v2/users/") {
        ("user", rest)
    } else {
        ("group", path.strip_prefix("/v2/groups/")?)
    };
    let (id, rest) = rest.split_once('/')?;
    if id.is_empty() {
        return None;
    }
    let chat = if kind == "user" {
        SimChat::User(id.to_owned())
    } else {
        SimChat::Group(id.to_owned())
    };
    Some((chat, rest))
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
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut world = inner.world();
    let outcome = match (&method, path.as_str()) {
        (&Method::POST, "/app/getAppAccessToken") => world.access_token(&json),
        (method, _) => match chat_path(&path) {
            None => Outcome::error(404, 11_404, "not found"),
            Some((chat, rest)) => match world.authorize(authorization.as_deref()) {
                Err(refusal) => refusal,
                Ok(()) => match (method, rest) {
                    (&Method::POST, "messages") => world.post_message(&chat, &json),
                    (&Method::POST, "files") => world.post_file(&chat, &json),
                    (&Method::DELETE, rest) => match rest.strip_prefix("messages/") {
                        Some(id) => world.recall(&chat, id),
                        None => Outcome::error(404, 11_404, "not found"),
                    },
                    _ => Outcome::error(404, 11_404, "not found"),
                },
            },
        },
    };
    let (status, code, answered) = match &outcome {
        Outcome::Answer(status, body) => (
            *status,
            body.get("code").and_then(Value::as_i64).unwrap_or(0),
            true,
        ),
        Outcome::Lost => (200, 0, false),
        Outcome::ServerError(status) => (*status, 0, true),
    };
    // The token endpoint's secret is not kept in the record.
    let recorded = if path == "/app/getAppAccessToken" {
        serde_json::json!({ "appId": json.get("appId") })
    } else {
        json
    };
    world.calls.push(CallRecord {
        method: method.to_string(),
        path,
        body: recorded,
        status,
        code,
        answered,
    });
    let trace = world.next_trace();
    drop(world);
    inner.wake.notify_one();
    match outcome {
        Outcome::Answer(status, body) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            [("x-tps-trace-id", trace)],
            axum::Json(body),
        )
            .into_response(),
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
