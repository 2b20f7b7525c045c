//! REST v4 on loopback: routing, Bearer tokens, faults, rate limiting, and the post operations.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::state::{ApiError, CallRecord, Inner, Pending, SimPost, SimUser, State as Sim};
use super::{FaultKind, Route};

pub(crate) async fn start(inner: &Arc<Inner>) -> io::Result<()> {
    let listener = TcpListener::bind(inner.config.bind).await?;
    let _ = inner.addr.set(listener.local_addr()?);
    let app = axum::Router::new()
        .route("/api/v4/websocket", axum::routing::get(super::ws::upgrade))
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
    tokio::spawn(async move {
        let _ = server.await;
    });
    Ok(())
}

/// The user a request's `Authorization: Bearer` (or `Token`) names.
pub(crate) fn bearer(inner: &Inner, headers: &HeaderMap) -> Option<SimUser> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    if !(scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token")) {
        return None;
    }
    inner.with(|s| s.user_by_token(token.trim()))
}

fn request_id(s: &mut Sim) -> String {
    s.new_id()
}

fn error_response(inner: &Inner, error: &ApiError) -> Response {
    let rid = inner.with(request_id);
    json_response(error.status, &error.body(&rid), &[])
}

fn json_response(status: u16, body: &Value, headers: &[(String, String)]) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (
            header::HeaderName::from_bytes(k.as_bytes()),
            header::HeaderValue::from_str(v),
        ) {
            h.insert(k, v);
        }
    }
    response
}

/// `limit exceeded`, plain text, as the server's throttler writes it.
fn too_many(limit: u32, reset_s: u64) -> Response {
    let mut response = Response::new(Body::from("limit exceeded\n"));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    for (k, v) in [
        ("x-ratelimit-limit", limit.to_string()),
        ("x-ratelimit-remaining", "0".to_owned()),
        ("x-ratelimit-reset", reset_s.to_string()),
    ] {
        if let Ok(v) = header::HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    }
    response
}

/// A parsed REST path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    Me,
    MyTeams,
    MyTeamChannels,
    Channel(String),
    ChannelPosts(String),
    Posts,
    Post(String),
    PatchPost(String),
}

fn endpoint(path: &str) -> Option<Endpoint> {
    let rest = path.strip_prefix("/api/v4/")?;
    let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    Some(match parts.as_slice() {
        ["users", "me"] => Endpoint::Me,
        ["users", "me", "teams"] => Endpoint::MyTeams,
        ["users", "me", "teams", _, "channels"] => Endpoint::MyTeamChannels,
        ["channels", c] => Endpoint::Channel((*c).to_owned()),
        ["channels", c, "posts"] => Endpoint::ChannelPosts((*c).to_owned()),
        ["posts"] => Endpoint::Posts,
        ["posts", p] => Endpoint::Post((*p).to_owned()),
        ["posts", p, "patch"] => Endpoint::PatchPost((*p).to_owned()),
        _ => return None,
    })
}

fn route_of(method: &Method, endpoint: &Endpoint) -> Route {
    match (method, endpoint) {
        (&Method::POST, Endpoint::Posts) => Route::CreatePost,
        (&Method::PUT, Endpoint::Post(_) | Endpoint::PatchPost(_)) => Route::EditPost,
        (&Method::DELETE, Endpoint::Post(_)) => Route::DeletePost,
        (&Method::GET, Endpoint::ChannelPosts(_)) => Route::ListPosts,
        _ => Route::Other,
    }
}

fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn record(inner: &Inner, method: &Method, path: &str, status: u16, answered: bool) {
    inner.with(|s| {
        s.calls.push(CallRecord {
            method: method.to_string(),
            path: path.to_owned(),
            status,
            answered,
        });
    });
}

fn session_expired() -> ApiError {
    ApiError::new(
        401,
        "api.context.session_expired.app_error",
        "Invalid or expired session, please login again.",
    )
}

fn no_permission() -> ApiError {
    ApiError::new(
        403,
        "api.context.permissions.app_error",
        "You do not have the appropriate permissions.",
    )
}

fn invalid_body(what: &str) -> ApiError {
    ApiError::new(
        400,
        "api.context.invalid_body_param.app_error",
        &format!("Invalid or missing {what} in request body."),
    )
}

/// Outcome of an operation: a status and a JSON body.
type Outcome = Result<(u16, Value), ApiError>;

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let Some(endpoint) = endpoint(&path) else {
        let error = ApiError::new(
            404,
            "api.context.404.app_error",
            "Sorry, we could not find the page.",
        );
        record(&inner, &method, &path, 404, true);
        return error_response(&inner, &error);
    };
    let Some(user) = bearer(&inner, &headers) else {
        record(&inner, &method, &path, 401, true);
        return error_response(&inner, &session_expired());
    };
    let route = route_of(&method, &endpoint);
    // RateLimitSettings: per token, per second of the server's clock.
    let limited = inner.with(|s| {
        let limit = inner.config.rate_limit_per_second?;
        let now = s.now();
        let window = s.rate.entry(user.token.clone()).or_insert((now, 0));
        if now.saturating_sub(window.0) >= Duration::from_secs(1) {
            *window = (now, 0);
        }
        window.1 += 1;
        (window.1 > limit).then_some(limit)
    });
    if let Some(limit) = limited {
        record(&inner, &method, &path, 429, true);
        return too_many(limit, 1);
    }
    let fault = inner.with(|s| s.take_fault(route));
    let lose = matches!(fault, Some(FaultKind::LoseAnswer));
    let outcome = match fault {
        Some(FaultKind::Error {
            status,
            id,
            message,
        }) => Err(ApiError::new(status, &id, &message)),
        Some(FaultKind::RateLimited { reset_s }) => {
            record(&inner, &method, &path, 429, true);
            return too_many(inner.config.rate_limit_per_second.unwrap_or(10), reset_s);
        }
        hold => {
            let body: Option<Value> = if body.is_empty() {
                None
            } else {
                match serde_json::from_slice(&body) {
                    Ok(v) => Some(v),
                    Err(_) => {
                        record(&inner, &method, &path, 400, true);
                        return error_response(&inner, &invalid_body("body"));
                    }
                }
            };
            let held = matches!(hold, Some(FaultKind::Hold));
            // The server finishes what it started even when the client gives up waiting.
            let task = {
                let (inner, method, user) = (inner.clone(), method.clone(), user.clone());
                let query = uri.query().map(str::to_owned);
                tokio::spawn(async move {
                    operate(
                        &inner,
                        &method,
                        &endpoint,
                        &user,
                        body,
                        query.as_deref(),
                        held,
                    )
                    .await
                })
            };
            task.await.unwrap_or_else(|_| {
                Err(ApiError::new(
                    500,
                    "api.context.server_error",
                    "Internal server error.",
                ))
            })
        }
    };
    let (status, body) = match outcome {
        Ok(answer) => answer,
        Err(error) => {
            let rid = inner.with(request_id);
            (error.status, error.body(&rid))
        }
    };
    if lose {
        record(&inner, &method, &path, status, false);
        connection.cut();
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    record(&inner, &method, &path, status, true);
    let limit_headers = inner.config.rate_limit_per_second.map(|limit| {
        let used = inner.with(|s| s.rate.get(&user.token).map_or(0, |w| w.1));
        vec![
            ("x-ratelimit-limit".to_owned(), limit.to_string()),
            (
                "x-ratelimit-remaining".to_owned(),
                limit.saturating_sub(used).to_string(),
            ),
            ("x-ratelimit-reset".to_owned(), "1".to_owned()),
        ]
    });
    json_response(status, &body, &limit_headers.unwrap_or_default())
}

fn user_json(user: &SimUser) -> Value {
    json!({
        "id": user.id,
        "username": user.username,
        "is_bot": user.is_bot,
        "roles": "system_user",
        "delete_at": 0,
    })
}

fn channel_json(inner: &Inner, c: &super::state::SimChannel) -> Value {
    let team = if c.kind == "D" || c.kind == "G" {
        String::new()
    } else {
        inner.team_id.clone()
    };
    json!({
        "id": c.id, "type": c.kind, "name": c.name, "display_name": c.name, "team_id": team,
        "delete_at": 0,
    })
}

/// The member check every channel-scoped call makes (a missing channel looks the same).
fn member_of(s: &Sim, channel: &str, user: &SimUser) -> Result<(), ApiError> {
    match s.channels.get(channel) {
        Some(c) if c.members.contains(&user.id) => Ok(()),
        _ => Err(no_permission()),
    }
}

fn runes(text: &str) -> usize {
    text.chars().count()
}

fn too_long(max: usize) -> ApiError {
    ApiError::new(
        400,
        "model.post.is_valid.message_length.app_error",
        &format!(
            "Post Message property is longer than the maximum permitted length of {max} characters."
        ),
    )
}

fn posts_list(posts: &[&SimPost]) -> Value {
    let mut map = serde_json::Map::new();
    for p in posts {
        map.insert(p.id.clone(), serde_json::to_value(p).unwrap_or_default());
    }
    json!({
        "order": posts.iter().map(|p| p.id.clone()).collect::<Vec<_>>(),
        "posts": map,
        "next_post_id": "",
        "prev_post_id": "",
        "has_next": false,
    })
}

async fn operate(
    inner: &Arc<Inner>,
    method: &Method,
    endpoint: &Endpoint,
    user: &SimUser,
    body: Option<Value>,
    query: Option<&str>,
    held: bool,
) -> Outcome {
    match (method, endpoint) {
        (&Method::GET, Endpoint::Me) => Ok((200, user_json(user))),
        (&Method::GET, Endpoint::MyTeams) => Ok((
            200,
            json!([{ "id": inner.team_id, "name": "team", "display_name": "Team" }]),
        )),
        (&Method::GET, Endpoint::MyTeamChannels) => Ok((
            200,
            inner.with(|s| {
                let mut channels: Vec<_> = s
                    .channels
                    .values()
                    .filter(|c| c.members.contains(&user.id))
                    .map(|c| channel_json(inner, c))
                    .collect();
                channels.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
                Value::Array(channels)
            }),
        )),
        (&Method::GET, Endpoint::Channel(id)) => inner.with(|s| {
            member_of(s, id, user)?;
            Ok((200, channel_json(inner, &s.channels[id])))
        }),
        (&Method::GET, Endpoint::ChannelPosts(id)) => inner.with(|s| {
            member_of(s, id, user)?;
            let in_channel = s.posts.iter().filter(|p| &p.channel_id == id);
            if let Some(since) = query_param(query, "since").and_then(|v| v.parse::<i64>().ok()) {
                // Everything created, edited or deleted after `since`, deleted posts included
                // (clients remove them), oldest last in `order` as the server sorts.
                let mut posts: Vec<&SimPost> = in_channel
                    .filter(|p| p.create_at > since || p.update_at > since)
                    .collect();
                posts.reverse();
                return Ok((200, posts_list(&posts)));
            }
            let page: usize = query_param(query, "page")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let per_page: usize = query_param(query, "per_page")
                .and_then(|v| v.parse().ok())
                .unwrap_or(60)
                .clamp(1, 200);
            let mut posts: Vec<&SimPost> = in_channel.filter(|p| p.delete_at == 0).collect();
            posts.reverse();
            let posts: Vec<&SimPost> = posts
                .into_iter()
                .skip(page * per_page)
                .take(per_page)
                .collect();
            Ok((200, posts_list(&posts)))
        }),
        (&Method::POST, Endpoint::Posts) => create(inner, user, body, held).await,
        (&Method::GET, Endpoint::Post(id)) => inner.with(|s| {
            let post = s.find_post(id)?.clone();
            member_of(s, &post.channel_id, user)?;
            Ok((200, serde_json::to_value(&post).unwrap_or_default()))
        }),
        (&Method::PUT, Endpoint::PatchPost(id)) => inner.with(|s| {
            let body = body.ok_or_else(|| invalid_body("patch"))?;
            let post = s.find_post(id)?.clone();
            if post.user_id != user.id {
                return Err(no_permission());
            }
            let message = body.get("message").and_then(Value::as_str);
            if message.is_some_and(|m| runes(m) > inner.config.max_runes) {
                return Err(too_long(inner.config.max_runes));
            }
            let props = body.get("props").cloned();
            let post = s.patch_post(inner, id, message, props)?;
            Ok((200, serde_json::to_value(&post).unwrap_or_default()))
        }),
        (&Method::PUT, Endpoint::Post(id)) => inner.with(|s| {
            let body = body.ok_or_else(|| invalid_body("post"))?;
            if body.get("id").and_then(Value::as_str) != Some(id.as_str()) {
                return Err(ApiError::new(
                    400,
                    "api.context.invalid_param.app_error",
                    "Invalid id parameter.",
                ));
            }
            let post = s.find_post(id)?.clone();
            if post.user_id != user.id {
                return Err(no_permission());
            }
            // A full update: what is omitted is blanked.
            let message = body.get("message").and_then(Value::as_str).unwrap_or("");
            if runes(message) > inner.config.max_runes {
                return Err(too_long(inner.config.max_runes));
            }
            let props = body.get("props").cloned().unwrap_or_else(|| json!({}));
            let post = s.patch_post(inner, id, Some(message), Some(props))?;
            Ok((200, serde_json::to_value(&post).unwrap_or_default()))
        }),
        (&Method::DELETE, Endpoint::Post(id)) => inner.with(|s| {
            let post = s.find_post(id)?.clone();
            if post.user_id != user.id {
                return Err(no_permission());
            }
            s.delete_post(inner, id)?;
            Ok((200, json!({ "status": "OK" })))
        }),
        _ => Err(ApiError::new(
            405,
            "api.context.405.app_error",
            "Method not allowed.",
        )),
    }
}

/// `POST /api/v4/posts`: the member check, then `deduplicateCreatePost`, then validation and
/// the insert (a failure after the cache entry removes it, as the server's deferred cleanup does).
async fn create(inner: &Arc<Inner>, user: &SimUser, body: Option<Value>, held: bool) -> Outcome {
    let body = body.ok_or_else(|| invalid_body("post"))?;
    let channel = body
        .get("channel_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if channel.is_empty() {
        return Err(invalid_body("post"));
    }
    let pending_id = body
        .get("pending_post_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let ttl = inner.config.pending_post_ttl;
    let seen = inner.with(|s| -> Result<Option<SimPost>, ApiError> {
        member_of(s, &channel, user)?;
        if pending_id.is_empty() {
            return Ok(None);
        }
        s.expire_pending(ttl);
        match s.pending.get(&pending_id) {
            Some(Pending {
                post_id: Some(id), ..
            }) => {
                let id = id.clone();
                Ok(s.posts.iter().find(|p| p.id == id).cloned())
            }
            Some(Pending { post_id: None, .. }) => Err(ApiError::new(
                500,
                "api.post.deduplicate_create_post.pending",
                "Post rejected by server. Please try again later.",
            )),
            None => {
                let now = s.now();
                s.pending.insert(
                    pending_id.clone(),
                    Pending {
                        seen_at: now,
                        post_id: None,
                    },
                );
                Ok(None)
            }
        }
    })?;
    if let Some(existing) = seen {
        return Ok((201, serde_json::to_value(&existing).unwrap_or_default()));
    }
    if held {
        loop {
            // Registered before the flag is read, so a release in between is not missed.
            let notified = inner.release.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if inner.with(|s| std::mem::take(&mut s.held_release)) {
                break;
            }
            notified.await;
        }
    }
    let result = inner.with(|s| -> Outcome {
        let message = body
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if runes(message) > inner.config.max_runes {
            return Err(too_long(inner.config.max_runes));
        }
        let root = body
            .get("root_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !root.is_empty() {
            // The root must be a root post of this channel: a reply's id is refused.
            let valid = s
                .posts
                .iter()
                .find(|p| p.id == root && p.delete_at == 0)
                .is_some_and(|p| p.channel_id == channel && p.root_id.is_empty());
            if !valid {
                return Err(ApiError::new(
                    400,
                    "api.post.create_post.root_id.app_error",
                    "Invalid RootId parameter.",
                ));
            }
        }
        let props = match body.get("props") {
            Some(Value::Object(map)) => Value::Object(map.clone()),
            _ => json!({}),
        };
        let post = s.create_post(inner, &user.id, &channel, message, root, props, &pending_id);
        if let Some(entry) = s.pending.get_mut(&pending_id) {
            entry.post_id = Some(post.id.clone());
        }
        Ok((201, serde_json::to_value(&post).unwrap_or_default()))
    });
    if result.is_err() && !pending_id.is_empty() {
        inner.with(|s| s.pending.remove(&pending_id));
    }
    result
}
