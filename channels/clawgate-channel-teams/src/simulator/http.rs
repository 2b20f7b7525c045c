//! The HTTP side: the listener (whose connections a fault can cut), routing of the connector
//! paths, the bearer check, the token endpoint, the OpenID documents and the call record.

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

use super::state::{Answer, ApiError, Inner};
use super::{CallRecord, FaultKind, Op, SimulatorConfig, TOKEN_PATH, keys, sender};

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
    let sender_task = tokio::spawn(sender::run(inner.clone()));
    inner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend([server_task, sender_task]);
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

/// The pairs of an `application/x-www-form-urlencoded` text, percent-decoded.
fn form_pairs(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (
                percent_decode(&key.replace('+', " ")),
                percent_decode(&value.replace('+', " ")),
            )
        })
        .collect()
}

/// `%XX` decoded (a path segment keeps `+`).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: Option<&u8>| b.and_then(|b| char::from(*b).to_digit(16));
        match (bytes[i], hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
            (b'%', Some(high), Some(low)) => {
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A connector call, as its path and method name it.
struct Route {
    conversation: String,
    activity: Option<String>,
}

fn route(path: &str) -> Option<Route> {
    let rest = path.strip_prefix("/v3/conversations/")?;
    let mut parts = rest.split('/');
    let conversation = percent_decode(parts.next().filter(|s| !s.is_empty())?);
    if parts.next()? != "activities" {
        return None;
    }
    let activity = parts.next().filter(|s| !s.is_empty()).map(percent_decode);
    if parts.next().is_some() {
        return None;
    }
    Some(Route {
        conversation,
        activity,
    })
}

fn respond(answer: &Answer) -> Response {
    match answer {
        Ok((status, body)) => {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::OK);
            if body.is_null() {
                status.into_response()
            } else {
                (status, axum::Json(body.clone())).into_response()
            }
        }
        Err(error) => {
            let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_REQUEST);
            let mut response = (status, axum::Json(error.body())).into_response();
            if let Some(secs) = error.retry_after_s
                && let Ok(value) = HeaderValue::from_str(&secs.to_string())
            {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
    }
}

fn streaming(body: &Value) -> bool {
    super::state::streaminfo(body).is_some()
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let origin = format!("http://{}", inner.addr);
    match uri.path() {
        keys::OPENID_PATH if method == Method::GET => {
            return axum::Json(keys::openid_configuration(&origin)).into_response();
        }
        keys::JWKS_PATH if method == Method::GET => {
            return axum::Json(keys::jwks()).into_response();
        }
        TOKEN_PATH if method == Method::POST => return token(&inner, &connection, &body),
        _ => {}
    }
    let Some(route) = route(uri.path()) else {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({ "error": { "code": "NotFound", "message": "No such resource." } })),
        )
            .into_response();
    };
    let parsed: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(value) => value,
            Err(error) => {
                return respond(&Err(ApiError::new(
                    400,
                    "BadSyntax",
                    format!("The request body is not JSON: {error}"),
                )));
            }
        }
    };
    let op = match (&method, &route.activity) {
        (&Method::POST, _) if streaming(&parsed) => {
            if parsed["type"].as_str() == Some("message") {
                Op::StreamFinal
            } else {
                Op::Stream
            }
        }
        (&Method::POST, None) if parsed["type"].as_str() == Some("typing") => Op::Typing,
        (&Method::POST, None) => Op::Send,
        (&Method::POST, Some(_)) => Op::Reply,
        (&Method::PUT, Some(_)) => Op::Update,
        (&Method::DELETE, Some(_)) => Op::Delete,
        _ => {
            return (StatusCode::METHOD_NOT_ALLOWED, "method not allowed").into_response();
        }
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let mut world = inner.world();
    let path = percent_decode(uri.path());
    let fault = world.take_fault(op);
    let answer: Answer = if !bearer.as_deref().is_some_and(|t| world.token_valid(t)) {
        Err(ApiError::new(
            401,
            "Unauthorized",
            "Authorization has been denied for this request.",
        ))
    } else {
        match &fault {
            Some(FaultKind::ServerError(status)) => Err(ApiError::new(
                *status,
                "ServiceError",
                "The service encountered an error processing the request.",
            )),
            Some(FaultKind::RateLimited(secs)) => Err(ApiError::throttled(*secs)),
            Some(FaultKind::Error {
                status,
                code,
                message,
            }) => Err(ApiError::new(*status, code, message.clone())),
            Some(FaultKind::LoseAnswer) | None => match op {
                Op::Send | Op::Typing | Op::Reply | Op::Stream | Op::StreamFinal => world
                    .post_activity(
                        &inner.config,
                        &route.conversation,
                        route.activity.as_deref(),
                        &parsed,
                    ),
                Op::Update => world.update_activity(
                    &route.conversation,
                    route.activity.as_deref().unwrap_or_default(),
                    &parsed,
                ),
                Op::Delete => world.delete_activity(
                    &route.conversation,
                    route.activity.as_deref().unwrap_or_default(),
                ),
                Op::Token => Err(ApiError::new(400, "BadArgument", "not a connector call")),
            },
        }
    };
    let lost = fault == Some(FaultKind::LoseAnswer);
    let (status, error_code) = match &answer {
        Ok((status, body)) => (*status, body["error"]["code"].as_str().map(str::to_owned)),
        Err(error) => (error.status, Some(error.code.clone())),
    };
    let created = match (&answer, op) {
        (Ok((201, body)), Op::Send | Op::Reply | Op::Stream) => {
            body["id"].as_str().map(str::to_owned)
        }
        _ => None,
    };
    world.calls.push(CallRecord {
        op,
        path,
        body: parsed,
        status,
        error_code,
        answered: !lost,
        created,
    });
    drop(world);
    if lost {
        connection.cut();
    }
    respond(&answer)
}

/// `POST /botframework.com/oauth2/v2.0/token` (client credentials).
fn token(inner: &Inner, connection: &Connection, body: &Bytes) -> Response {
    let form = form_pairs(&String::from_utf8_lossy(body));
    let get = |key: &str| {
        form.iter()
            .find(|(k, _)| k == key)
            .map_or("", |(_, v)| v.as_str())
    };
    let mut world = inner.world();
    let fault = world.take_fault(Op::Token);
    let outcome = match (&fault, get("grant_type")) {
        (Some(FaultKind::ServerError(status)), _) => Err((
            *status,
            json!({ "error": "temporarily_unavailable",
                "error_description": "AADSTS90033: A transient error has occurred. Please try again." }),
        )),
        (_, "client_credentials") => world.issue_token(
            &inner.config.app_id,
            get("client_id"),
            get("client_secret"),
            get("scope"),
            inner.config.token_lifetime,
        ),
        (_, grant) => Err((
            400,
            json!({ "error": "unsupported_grant_type",
                "error_description": format!("AADSTS70003: The app requested an unsupported grant type '{grant}'.") }),
        )),
    };
    let lost = fault == Some(FaultKind::LoseAnswer);
    let status = outcome.as_ref().map_or_else(|(s, _)| *s, |_| 200);
    world.calls.push(CallRecord {
        op: Op::Token,
        path: TOKEN_PATH.to_owned(),
        body: Value::Null,
        status,
        error_code: outcome
            .as_ref()
            .err()
            .and_then(|(_, b)| b["error"].as_str().map(str::to_owned)),
        answered: !lost,
        created: None,
    });
    drop(world);
    if lost {
        connection.cut();
    }
    match outcome {
        Ok((token, expires_in)) => axum::Json(json!({
            "token_type": "Bearer",
            "expires_in": expires_in,
            "ext_expires_in": expires_in,
            "access_token": token,
        }))
        .into_response(),
        Err((status, body)) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            axum::Json(body),
        )
            .into_response(),
    }
}
