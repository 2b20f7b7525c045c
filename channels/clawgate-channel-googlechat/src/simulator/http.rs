//! The HTTP side: the listener (whose connections a fault can cut), routing of the REST paths,
//! the bearer check, Google's error envelope, the certificate endpoints and the call record.

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

use super::oauth::{Bearer, TOKEN_PATH};
use super::state::{ApiError, CreateArgs, Inner, quota_exceeded};
use super::{CallRecord, FaultKind, Op, SimulatorConfig, events, keys};

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

/// The query string's pairs, percent-decoded.
pub(crate) fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    form_pairs(uri.query().unwrap_or_default())
}

/// The pairs of an `application/x-www-form-urlencoded` text, percent-decoded.
pub(crate) fn form_pairs(text: &str) -> Vec<(String, String)> {
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
        let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => match (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
                (Some(high), Some(low)) => {
                    out.push((high * 16 + low) as u8);
                    i += 3;
                }
                _ => {
                    out.push(b'%');
                    i += 1;
                }
            },
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A REST call, as the path and method name it.
struct Route {
    op: Op,
    space: String,
    message: Option<String>,
}

fn route(method: &Method, path: &str) -> Option<Route> {
    let rest = path.strip_prefix("/v1/spaces/")?;
    let mut parts = rest.split('/');
    let space = format!("spaces/{}", parts.next().filter(|s| !s.is_empty())?);
    if parts.next()? != "messages" {
        return None;
    }
    let message = parts.next().map(percent_decode);
    if parts.next().is_some() {
        return None;
    }
    let op = match (method, &message) {
        (&Method::POST, None) => Op::Create,
        (&Method::GET, None) => Op::List,
        (&Method::GET, Some(_)) => Op::Get,
        (&Method::PATCH | &Method::PUT, Some(_)) => Op::Patch,
        (&Method::DELETE, Some(_)) => Op::Delete,
        _ => return None,
    };
    Some(Route { op, space, message })
}

fn answer(outcome: &Result<Value, ApiError>) -> Response {
    match outcome {
        Ok(value) => (StatusCode::OK, axum::Json(value.clone())).into_response(),
        Err(error) => {
            let status = StatusCode::from_u16(error.code).unwrap_or(StatusCode::BAD_REQUEST);
            (status, axum::Json(error.body())).into_response()
        }
    }
}

fn unauthenticated(present: bool) -> ApiError {
    let message = if present {
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login \
         cookie or other valid authentication credential."
    } else {
        "Request is missing required authentication credential. Expected OAuth 2 access \
         token, login cookie or other valid authentication credential."
    };
    ApiError::new(401, "UNAUTHENTICATED", message)
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match uri.path() {
        keys::JWKS_PATH => return axum::Json(keys::jwks()).into_response(),
        keys::X509_PATH => return axum::Json(keys::x509()).into_response(),
        TOKEN_PATH if method == Method::POST => {
            let form = form_pairs(&String::from_utf8_lossy(&body));
            let own_uri = format!("http://{}{TOKEN_PATH}", inner.addr);
            let mut world = inner.world();
            if world.oauth.take_lost() {
                drop(world);
                connection.cut();
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            }
            let (status, answer) = world.oauth.grant(&form, &own_uri);
            drop(world);
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            return (status, axum::Json(answer)).into_response();
        }
        _ => {}
    }
    let Some(route) = route(&method, uri.path()) else {
        let error = ApiError::new(
            404,
            "NOT_FOUND",
            format!("No such method: {method} {}", uri.path()),
        );
        return answer(&Err(error));
    };
    let query = query_pairs(&uri);
    let param = |key: &str| query.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or_default().to_owned());
    let parsed: Result<Value, ApiError> = if body.is_empty() {
        Ok(Value::Null)
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::new(
                400,
                "INVALID_ARGUMENT",
                format!("Invalid JSON payload received. {e}"),
            )
        })
    };
    let mut world = inner.world();
    let fault = world.take_fault(route.op);
    let credentials = match &bearer {
        None => Err(unauthenticated(false)),
        Some(token) if *token == inner.config.access_token => Ok(()),
        Some(token) => match world.oauth.bearer(token) {
            Bearer::Valid => Ok(()),
            Bearer::NoScope => Err(ApiError::new(
                403,
                "PERMISSION_DENIED",
                "Request had insufficient authentication scopes.",
            )),
            Bearer::Invalid => Err(unauthenticated(true)),
        },
    };
    let outcome = match (credentials, &parsed) {
        (Err(error), _) => Err(error),
        (_, Err(error)) => Err(error.clone()),
        (_, Ok(body)) => match &fault {
            Some(FaultKind::Error {
                code,
                status,
                message,
            }) => Err(ApiError::new(*code, status, message.clone())),
            Some(FaultKind::RateLimited) => Err(quota_exceeded("Write requests per space")),
            Some(FaultKind::ServerError(code)) => Err(ApiError::new(
                *code,
                if *code == 503 {
                    "UNAVAILABLE"
                } else {
                    "INTERNAL"
                },
                if *code == 503 {
                    "The service is currently unavailable."
                } else {
                    "Internal error encountered."
                },
            )),
            Some(FaultKind::NotGoogle(_)) => Ok(Value::Null),
            _ => {
                let message = route.message.as_deref().unwrap_or_default();
                match route.op {
                    Op::Create => {
                        let args = CreateArgs {
                            request_id: param("requestId"),
                            message_id: param("messageId"),
                            reply_option: param("messageReplyOption"),
                        };
                        world.create(&route.space, &args, body)
                    }
                    Op::Get => world.get(&route.space, message),
                    Op::Patch => world.patch(
                        &route.space,
                        message,
                        param("updateMask").as_deref(),
                        param("allowMissing").as_deref() == Some("true"),
                        body,
                    ),
                    Op::Delete => world.delete(&route.space, message),
                    Op::List => world.list(
                        &route.space,
                        param("pageSize").and_then(|s| s.parse().ok()),
                        param("pageToken").as_deref(),
                    ),
                }
            }
        },
    };
    let lost = fault == Some(FaultKind::LoseAnswer);
    world.calls.push(CallRecord {
        op: route.op,
        path: uri.path().to_owned(),
        query: query.clone(),
        body: parsed.unwrap_or(Value::Null),
        status: outcome.as_ref().map_or_else(|e| e.code, |_| 200),
        error_status: outcome.as_ref().err().map(|e| e.status.to_owned()),
        answered: !lost,
    });
    drop(world);
    inner.events_changed.notify_one();
    if lost {
        connection.cut();
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if let Some(FaultKind::NotGoogle(code)) = fault {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
        return (status, "<html><body>upstream connect error</body></html>").into_response();
    }
    answer(&outcome)
}

impl super::state::World {
    /// The fault the next call of `op` meets, if any (each call counts against `after`).
    pub(crate) fn take_fault(&mut self, op: Op) -> Option<FaultKind> {
        let index = self
            .faults
            .iter()
            .position(|f| f.op.is_none_or(|o| o == op))?;
        let fault = &mut self.faults[index];
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        let kind = fault.kind.clone();
        fault.times = fault.times.saturating_sub(1);
        if fault.times == 0 {
            self.faults.remove(index);
        }
        Some(kind)
    }
}
