//! Helix `POST /helix/chat/messages` ("Send Chat Message"): Bearer token + `Client-Id`, the
//! points bucket with its `Ratelimit-*` headers, Helix error bodies, and `is_sent: false` with
//! a `drop_reason` for a message a chat rule dropped.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::state::{MAX_CHARS, Posted};
use super::{FaultKind, Inner, Via};

pub(crate) async fn serve(inner: Arc<Inner>, listener: TcpListener) {
    let mut shutdown = inner.shutdown.subscribe();
    let app = axum::Router::new()
        .route(
            "/helix/chat/messages",
            axum::routing::post(send_chat_message),
        )
        // The layout of twitch-cli's mock API, which client libraries (twurple's
        // TWURPLE_MOCK_API_PORT) can be pointed at: Helix under /mock, id.twitch.tv under /auth.
        .route(
            "/mock/chat/messages",
            axum::routing::post(send_chat_message),
        )
        .route("/auth/validate", axum::routing::get(validate))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "Not Found", "") })
        .with_state(inner);
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await;
}

/// A Helix error body: `{"error": <reason phrase>, "status": <code>, "message": …}`.
fn error(status: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({ "error": reason, "status": status.as_u16(), "message": message });
    (status, axum::Json(body)).into_response()
}

fn reason_of(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// Takes one point; returns the headers to send and whether the call may proceed.
fn take_point(inner: &Inner) -> (u32, u32, u64, bool) {
    let mut state = inner.state();
    let limit = state.config.helix_points_per_minute;
    let now = state.now();
    if now >= state.points.1 {
        state.points = (limit, now + Duration::from_secs(60));
    }
    let allowed = state.points.0 > 0;
    state.points.0 = state.points.0.saturating_sub(1);
    let reset_in = state.points.1.saturating_duration_since(now);
    let reset = SystemTime::now()
        .checked_add(reset_in)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs().max(1));
    (limit, state.points.0, reset, allowed)
}

/// `GET id.twitch.tv/oauth2/validate` (`Authorization: OAuth <token>`).
async fn validate(
    axum::extract::State(inner): axum::extract::State<Arc<Inner>>,
    headers: HeaderMap,
) -> Response {
    let state = inner.state();
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("OAuth ")
                .or_else(|| v.strip_prefix("Bearer "))
        });
    match token.and_then(|t| state.user_by_token(t)) {
        Some(user) => axum::Json(json!({
            "client_id": state.config.client_id,
            "login": user.login,
            "scopes": ["chat:read", "chat:edit", "user:write:chat"],
            "user_id": user.id,
            "expires_in": 14_400,
        }))
        .into_response(),
        None => (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({ "status": 401, "message": "invalid access token" })),
        )
            .into_response(),
    }
}

async fn send_chat_message(
    axum::extract::State(inner): axum::extract::State<Arc<Inner>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (limit, remaining, reset, allowed) = take_point(&inner);
    let mut response = answer(&inner, &headers, query.as_deref(), &body, allowed);
    let h = response.headers_mut();
    h.insert("Ratelimit-Limit", HeaderValue::from(limit));
    h.insert("Ratelimit-Remaining", HeaderValue::from(remaining));
    h.insert("Ratelimit-Reset", HeaderValue::from(reset));
    response
}

fn answer(
    inner: &Inner,
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
    allowed: bool,
) -> Response {
    if !allowed {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            "Too Many Requests",
            "Request limit exceeded",
        );
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let mut state = inner.state();
    let Some(token) = header("authorization").and_then(|v| v.strip_prefix("Bearer ")) else {
        return error(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "OAuth token is missing",
        );
    };
    let Some(user) = state.user_by_token(token).cloned() else {
        return error(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Invalid OAuth token",
        );
    };
    match header("client-id") {
        None => {
            return error(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "Client-Id header required",
            );
        }
        Some(id) if id != state.config.client_id => {
            return error(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "Client ID and OAuth token do not match",
            );
        }
        Some(_) => {}
    }
    let Ok(mut params) = serde_json::from_slice::<Value>(body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            "Malformed request body",
        );
    };
    // The ids may come as query parameters too (Helix's general convention; twurple sends
    // them so); the body wins where both give one.
    for pair in query.unwrap_or_default().split('&') {
        if let Some((key, value)) = pair.split_once('=')
            && ["broadcaster_id", "sender_id"].contains(&key)
            && params.get(key).is_none()
            && let Some(object) = params.as_object_mut()
        {
            object.insert(key.to_owned(), json!(value));
        }
    }
    let field = |key: &str| params.get(key).and_then(Value::as_str).map(str::to_owned);
    let (Some(broadcaster_id), Some(sender_id), Some(text)) = (
        field("broadcaster_id"),
        field("sender_id"),
        field("message"),
    ) else {
        let missing = ["broadcaster_id", "sender_id", "message"]
            .into_iter()
            .find(|k| field(k).is_none())
            .unwrap_or("message");
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            &format!("Missing required parameter \"{missing}\""),
        );
    };
    if sender_id != user.id {
        return error(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "The sender_id in the body must match the user ID in the access token",
        );
    }
    if text.is_empty() || text.chars().count() > MAX_CHARS {
        // Twitch documents the 500-character limit; the wording of the refusal is the
        // simulator's.
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            "The parameter \"message\" must be between 1 and 500 characters",
        );
    }
    let Some(channel) = state.room_by_id(&broadcaster_id) else {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            "The ID in broadcaster_id is not valid",
        );
    };
    let fault = state.take_fault(Via::Helix);
    match &fault {
        Some(FaultKind::HelixError { status, message }) => {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return error(status, reason_of(status.as_u16()), message);
        }
        Some(FaultKind::HelixDrop { code, message }) => return dropped("", code, message),
        _ => {}
    }
    let reply = field("reply_parent_message_id");
    let posted = state.post(
        &user.login,
        &channel,
        &text,
        reply.as_deref(),
        None,
        Via::Helix,
    );
    match posted {
        Posted::Sent(message) => {
            // Twitch does not say; the simulator relays a Helix message to every IRC
            // connection in the channel, the sender's own too.
            state.relay(&message, None);
            let body = json!({ "data": [{ "message_id": message.id, "is_sent": true }] });
            if matches!(fault, Some(FaultKind::HelixLoseAnswer)) {
                return lost_body();
            }
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Posted::Dropped { code, message } => dropped("", &code, &message),
    }
}

fn dropped(id: &str, code: &str, message: &str) -> Response {
    let body = json!({ "data": [{
        "message_id": id,
        "is_sent": false,
        "drop_reason": { "code": code, "message": message },
    }] });
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// A 200 whose body breaks off: the message landed, the client never learns its id.
fn lost_body() -> Response {
    let stream = futures_util::stream::iter([
        Ok(Bytes::from_static(b"{\"data\":[{\"message_id\":\"")),
        Err(std::io::Error::other("connection reset")),
    ]);
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
