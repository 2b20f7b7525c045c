//! REST v10 on loopback: routing, auth, the global limit, per-route buckets and their headers,
//! faults, and the message operations.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::state::{
    self, ApiError, Bucket, CallRecord, Inner, MAX_CONTENT, MAX_NONCE, State as SimState,
};
use super::{FaultKind, Limit, Route};

pub(crate) async fn start(inner: &Arc<Inner>) -> io::Result<()> {
    let listener = TcpListener::bind(inner.config.rest_bind).await?;
    let _ = inner.rest_addr.set(listener.local_addr()?);
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
    let task = tokio::spawn(async move {
        let _ = server.await;
    });
    inner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(task);
    Ok(())
}

/// A parsed REST path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    GatewayBot,
    Gateway,
    Me,
    Channel(String),
    Messages(String),
    Message(String, String),
    Threads(String),
    MessageThreads(String, String),
}

fn endpoint(path: &str) -> Option<Endpoint> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    Some(match parts.as_slice() {
        ["gateway", "bot"] => Endpoint::GatewayBot,
        ["gateway"] => Endpoint::Gateway,
        ["users", "@me"] => Endpoint::Me,
        ["channels", c] => Endpoint::Channel((*c).to_owned()),
        ["channels", c, "messages"] => Endpoint::Messages((*c).to_owned()),
        ["channels", c, "messages", m] => Endpoint::Message((*c).to_owned(), (*m).to_owned()),
        ["channels", c, "threads"] => Endpoint::Threads((*c).to_owned()),
        ["channels", c, "messages", m, "threads"] => {
            Endpoint::MessageThreads((*c).to_owned(), (*m).to_owned())
        }
        _ => return None,
    })
}

/// The route family, its bucket hash (opaque, shared by the routes of one bucket, as
/// Discord's are) and the major parameter.
fn route_of(method: &Method, endpoint: &Endpoint) -> (Route, &'static str, String) {
    match (method, endpoint) {
        (&Method::POST, Endpoint::Messages(c)) => (
            Route::CreateMessage,
            "80c17d2f203122d936070c88c8d10f33",
            c.clone(),
        ),
        (&Method::PATCH, Endpoint::Message(c, _)) => (
            Route::EditMessage,
            "d9c1d6a1e8fb5b1b7d2a3fc1f0e9a6b2",
            c.clone(),
        ),
        (&Method::DELETE, Endpoint::Message(c, _)) => (
            Route::DeleteMessage,
            "d9c1d6a1e8fb5b1b7d2a3fc1f0e9a6b2",
            c.clone(),
        ),
        (&Method::GET, Endpoint::Messages(c) | Endpoint::Message(c, _)) => (
            Route::GetMessages,
            "3f6bcc1a9e1c4e7f00d3c1b2a4e5f607",
            c.clone(),
        ),
        (_, Endpoint::Channel(c) | Endpoint::Threads(c) | Endpoint::MessageThreads(c, _)) => {
            (Route::Other, "b5a2f4c1d7e8091a2b3c4d5e6f708192", c.clone())
        }
        _ => (
            Route::Other,
            "0c7e2b9d4f6a8c1e3b5d7f9a1c3e5b7d",
            String::new(),
        ),
    }
}

fn limit_of(inner: &Inner, route: Route) -> Limit {
    match route {
        Route::CreateMessage => inner.config.create_limit,
        Route::EditMessage | Route::DeleteMessage => inner.config.edit_limit,
        Route::GetMessages | Route::Other => inner.config.read_limit,
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

fn json_response(status: u16, body: &Value, headers: &[(String, String)]) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let map = response.headers_mut();
    map.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for (k, v) in headers {
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            map.insert(name, value);
        }
    }
    response
}

struct Call {
    method: Method,
    path: String,
    route: Route,
    bot: Option<String>,
    body: Value,
}

fn record(inner: &Inner, call: &Call, status: u16, answered: bool, scope: Option<&str>) {
    inner.with_state(|s| {
        s.log.push(CallRecord {
            method: call.method.to_string(),
            path: call.path.clone(),
            route: call.route,
            bot: call.bot.clone(),
            status,
            answered,
            body: call.body.clone(),
            scope: scope.map(str::to_owned),
        });
    });
}

/// A 429: Discord's body, `Retry-After`, and the scope headers.
fn too_many(
    retry: Duration,
    global: bool,
    scope: &str,
    mut headers: Vec<(String, String)>,
) -> Response {
    let message = if global {
        "You are being rate limited."
    } else {
        "The resource is being rate limited."
    };
    let retry_after = (retry.as_secs_f64() * 1000.0).ceil() / 1000.0;
    headers.push((
        "retry-after".into(),
        retry.as_secs_f64().ceil().max(1.0).to_string(),
    ));
    headers.push(("x-ratelimit-scope".into(), scope.into()));
    if global {
        headers.push(("x-ratelimit-global".into(), "true".into()));
    }
    json_response(
        429,
        &json!({ "message": message, "retry_after": retry_after, "global": global }),
        &headers,
    )
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(path) = uri.path().strip_prefix("/api/v10") else {
        return json_response(404, &json!({"message": "404: Not Found", "code": 0}), &[]);
    };
    let parsed_body: Option<Result<Value, ()>> =
        (!body.is_empty()).then(|| serde_json::from_slice(&body).map_err(|_| ()));
    let Some(endpoint) = endpoint(path) else {
        return json_response(404, &json!({"message": "404: Not Found", "code": 0}), &[]);
    };
    let (route, bucket_hash, major) = route_of(&method, &endpoint);
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bot "))
        .map(str::to_owned);
    let mut call = Call {
        method: method.clone(),
        path: path.to_owned(),
        route,
        bot: None,
        body: parsed_body
            .clone()
            .and_then(Result::ok)
            .unwrap_or(Value::Null),
    };
    // Ban, auth, global limit, fault, bucket: in the order Discord's edge applies them.
    enum Gate {
        Pass(Option<FaultKind>, Vec<(String, String)>),
        Refuse(Response, u16, Option<&'static str>),
        Cut,
    }
    let limit = limit_of(&inner, route);
    let invalid_limit = inner.config.invalid_request_limit;
    let global_limit = inner.config.global_per_second;
    let gate = inner.with_state(|s| {
        let now = s.now();
        if let Some(until) = s.banned_until.filter(|u| *u > now) {
            let body = json!({
                "message": "You are being blocked from accessing our API temporarily due to exceeding our rate limits frequently. Please read our docs at https://discord.com/developers/docs/topics/rate-limits to prevent this moving forward.",
                "code": 0,
                "retry_after": (until - now).as_secs_f64(),
                "global": true,
            });
            return Gate::Refuse(json_response(429, &body, &[]), 429, Some("global"));
        }
        let Some(user) = token.as_deref().and_then(|t| s.token_user(t)).cloned() else {
            state::count_invalid(s, invalid_limit);
            return Gate::Refuse(
                json_response(401, &json!({"message": "401: Unauthorized", "code": 0}), &[]),
                401,
                None,
            );
        };
        call.bot = Some(user.id.clone());
        let global = s.global.entry(user.id.clone()).or_insert(Bucket {
            remaining: global_limit,
            reset_at: now,
        });
        if let Err(retry) = state::take(global, Limit::new(global_limit, Duration::from_secs(1)), now) {
            state::count_invalid(s, invalid_limit);
            return Gate::Refuse(too_many(retry, true, "global", Vec::new()), 429, Some("global"));
        }
        let fault = state::match_fault(s, route);
        if matches!(fault, Some(FaultKind::Unreachable)) {
            return Gate::Cut;
        }
        let bucket = s.buckets.entry((route, major.clone())).or_insert(Bucket {
            remaining: limit.limit,
            reset_at: now,
        });
        let taken = state::take(bucket, limit, now);
        let bucket = *bucket;
        let reset_after = bucket.reset_at.saturating_duration_since(now);
        let reset_epoch = (s.wall_ms() as f64 + reset_after.as_secs_f64() * 1000.0) / 1000.0;
        let limit_headers = vec![
            ("x-ratelimit-limit".to_owned(), limit.limit.to_string()),
            ("x-ratelimit-remaining".to_owned(), bucket.remaining.to_string()),
            ("x-ratelimit-reset".to_owned(), format!("{reset_epoch:.3}")),
            ("x-ratelimit-reset-after".to_owned(), secs(reset_after)),
            ("x-ratelimit-bucket".to_owned(), bucket_hash.to_owned()),
        ];
        if let Some(FaultKind::RateLimited { retry_after, global }) = fault {
            state::count_invalid(s, invalid_limit);
            let retry = Duration::from_secs_f64(retry_after.max(0.0));
            // As with a real 429, the limit stays spent until `retry_after` has passed.
            let spent = Bucket {
                remaining: 0,
                reset_at: now + retry,
            };
            if global {
                s.global.insert(call.bot.clone().unwrap_or_default(), spent);
            } else {
                s.buckets.insert((route, major.clone()), spent);
            }
            let scope = if global { "global" } else { "user" };
            let headers = if global { Vec::new() } else { limit_headers };
            return Gate::Refuse(too_many(retry, global, scope, headers), 429, Some(scope));
        }
        if let Err(retry) = taken {
            state::count_invalid(s, invalid_limit);
            return Gate::Refuse(too_many(retry, false, "user", limit_headers), 429, Some("user"));
        }
        Gate::Pass(fault, limit_headers)
    });
    let (fault, limit_headers) = match gate {
        Gate::Pass(fault, headers) => (fault, headers),
        Gate::Refuse(response, status, scope) => {
            record(&inner, &call, status, true, scope);
            return response;
        }
        Gate::Cut => {
            connection.cut();
            record(&inner, &call, 0, false, None);
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    };
    let lose = matches!(fault, Some(FaultKind::LoseAnswer));
    let outcome = match fault {
        Some(FaultKind::Error {
            status,
            code,
            message,
        }) => Err(ApiError::new(status, code, &message)),
        _ => match parsed_body {
            Some(Err(())) => Err(ApiError::new(
                400,
                50109,
                "The request body contains invalid JSON.",
            )),
            _ => {
                let bot = call.bot.clone().unwrap_or_default();
                let outcome = inner.with_state(|s| {
                    operate(s, &inner, &method, &endpoint, &bot, &call.body, uri.query())
                });
                inner.events_changed();
                outcome
            }
        },
    };
    let (status, body) = match outcome {
        Ok((status, body)) => (status, body),
        Err(error) => {
            if matches!(error.status, 401 | 403) {
                inner.with_state(|s| state::count_invalid(s, invalid_limit));
            }
            (error.status, error.body)
        }
    };
    if lose {
        record(&inner, &call, status, false, None);
        connection.cut();
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    record(&inner, &call, status, true, None);
    if status == 204 {
        let mut response = json_response(204, &Value::Null, &limit_headers);
        *response.body_mut() = Body::empty();
        response.headers_mut().remove(header::CONTENT_TYPE);
        return response;
    }
    json_response(status, &body, &limit_headers)
}

fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn channel_json(s: &SimState, id: &str) -> Option<Value> {
    let c = s.channels.get(id)?;
    let kind = if c.dm {
        1
    } else if c.parent.is_some() {
        11
    } else {
        0
    };
    let mut value = json!({ "id": c.id, "type": kind, "name": c.name });
    if !c.dm {
        value["guild_id"] = json!(s.guild_id);
    }
    if let Some(parent) = &c.parent {
        value["parent_id"] = json!(parent);
    }
    Some(value)
}

/// A checked, visible channel the bot may see.
fn visible_channel(s: &SimState, channel: &str, bot: &str) -> Result<(), ApiError> {
    let c = s
        .channels
        .get(channel)
        .ok_or_else(ApiError::unknown_channel)?;
    if s.denied(c, bot, "VIEW_CHANNEL") {
        return Err(ApiError::new(403, 50001, "Missing Access"));
    }
    Ok(())
}

fn operate(
    s: &mut SimState,
    inner: &Inner,
    method: &Method,
    endpoint: &Endpoint,
    bot: &str,
    body: &Value,
    query: Option<&str>,
) -> Result<(u16, Value), ApiError> {
    let guild = s.guild_id.clone();
    match (method, endpoint) {
        (&Method::GET, Endpoint::GatewayBot) => Ok((
            200,
            json!({
                "url": format!("ws://{}", inner.gateway_addr()),
                "shards": 1,
                "session_start_limit": { "total": 1000, "remaining": 999, "reset_after": 14_400_000, "max_concurrency": 1 }
            }),
        )),
        (&Method::GET, Endpoint::Gateway) => Ok((
            200,
            json!({ "url": format!("ws://{}", inner.gateway_addr()) }),
        )),
        (&Method::GET, Endpoint::Me) => {
            let user = s
                .users
                .get(bot)
                .cloned()
                .ok_or_else(ApiError::unknown_channel)?;
            Ok((
                200,
                json!({ "id": user.id, "username": user.username, "discriminator": "0", "global_name": null, "avatar": null, "bot": true, "verified": true, "flags": 0 }),
            ))
        }
        (&Method::GET, Endpoint::Channel(c)) => {
            visible_channel(s, c, bot)?;
            Ok((200, channel_json(s, c).unwrap_or_default()))
        }
        (&Method::POST, Endpoint::Messages(c)) => {
            create_message(s, c, bot, body, inner.config.nonce_window)
        }
        (&Method::GET, Endpoint::Messages(c)) => {
            visible_channel(s, c, bot)?;
            let limit = match query_param(query, "limit") {
                None => 50,
                Some(l) => match l.parse::<usize>() {
                    Ok(n @ 1..=100) => n,
                    _ => {
                        return Err(ApiError::form(
                            "limit",
                            "NUMBER_TYPE_MAX",
                            "int value should be less than or equal to 100.",
                        ));
                    }
                },
            };
            let before = query_param(query, "before").and_then(|v| v.parse::<u64>().ok());
            let after = query_param(query, "after").and_then(|v| v.parse::<u64>().ok());
            let channel = s.channels.get(c).ok_or_else(ApiError::unknown_channel)?;
            let guild_id = (!channel.dm).then_some(guild.as_str());
            let mut found: Vec<Value> = channel
                .messages
                .iter()
                .rev()
                .filter(|m| !m.deleted)
                .filter(|m| {
                    let id = m.id.parse::<u64>().unwrap_or(0);
                    before.is_none_or(|b| id < b) && after.is_none_or(|a| id > a)
                })
                .map(|m| m.to_json(guild_id))
                .collect();
            if after.is_some() && before.is_none() {
                // `after` pages start at the oldest message past it (answer still newest first).
                found.reverse();
                found.truncate(limit);
                found.reverse();
            } else {
                found.truncate(limit);
            }
            Ok((200, Value::Array(found)))
        }
        (&Method::GET, Endpoint::Message(c, m)) => {
            visible_channel(s, c, bot)?;
            let channel = s.channels.get(c).ok_or_else(ApiError::unknown_channel)?;
            let guild_id = (!channel.dm).then_some(guild.as_str());
            channel
                .messages
                .iter()
                .find(|x| &x.id == m && !x.deleted)
                .map(|x| (200, x.to_json(guild_id)))
                .ok_or_else(ApiError::unknown_message)
        }
        (&Method::PATCH, Endpoint::Message(c, m)) => {
            visible_channel(s, c, bot)?;
            let content = body
                .get("content")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if content
                .as_ref()
                .is_some_and(|t| t.chars().count() > MAX_CONTENT)
            {
                return Err(ApiError::form(
                    "content",
                    "BASE_TYPE_MAX_LENGTH",
                    "Must be 2000 or fewer in length.",
                ));
            }
            let now = s.wall_ms();
            let channel = s
                .channels
                .get_mut(c)
                .ok_or_else(ApiError::unknown_channel)?;
            let dm = channel.dm;
            let message = channel
                .messages
                .iter_mut()
                .find(|x| &x.id == m && !x.deleted)
                .ok_or_else(ApiError::unknown_message)?;
            if message.author_id != bot {
                return Err(ApiError::new(
                    403,
                    50005,
                    "Cannot edit a message authored by another user",
                ));
            }
            if let Some(content) = content {
                let (everyone, users) = state::mentions(
                    &content,
                    body.get("allowed_mentions")
                        .or(message.allowed_mentions.as_ref()),
                );
                message.content = content;
                message.mention_everyone = everyone;
                message.mentions = users;
            }
            message.edits += 1;
            message.edited_ms = Some(now);
            let edited = message.clone();
            s.dispatch("MESSAGE_UPDATE", |b, intents_of| {
                SimState::message_event(&guild, dm, &edited, b, intents_of)
            });
            Ok((200, edited.to_json((!dm).then_some(guild.as_str()))))
        }
        (&Method::DELETE, Endpoint::Message(c, m)) => {
            visible_channel(s, c, bot)?;
            let channel = s.channels.get(c).ok_or_else(ApiError::unknown_channel)?;
            let may_manage = !s.denied(channel, bot, "MANAGE_MESSAGES_GRANTED");
            let dm = channel.dm;
            let channel = s
                .channels
                .get_mut(c)
                .ok_or_else(ApiError::unknown_channel)?;
            let message = channel
                .messages
                .iter_mut()
                .find(|x| &x.id == m && !x.deleted)
                .ok_or_else(ApiError::unknown_message)?;
            if message.author_id != bot && may_manage {
                // Bots get no MANAGE_MESSAGES here: others' messages stay.
                return Err(ApiError::new(403, 50013, "Missing Permissions"));
            }
            message.deleted = true;
            let (id, channel_id) = (message.id.clone(), message.channel_id.clone());
            s.dispatch("MESSAGE_DELETE", |_, intents_of| {
                let needed = if dm {
                    crate::wire::intents::DIRECT_MESSAGES
                } else {
                    crate::wire::intents::GUILD_MESSAGES
                };
                (intents_of & needed != 0).then(|| {
                    let mut d = json!({ "id": id, "channel_id": channel_id });
                    if !dm {
                        d["guild_id"] = json!(guild);
                    }
                    d
                })
            });
            Ok((204, Value::Null))
        }
        (&Method::POST, Endpoint::Threads(c) | Endpoint::MessageThreads(c, _)) => {
            visible_channel(s, c, bot)?;
            let name = body
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty() && n.chars().count() <= 100)
                .ok_or_else(|| {
                    ApiError::form("name", "BASE_TYPE_REQUIRED", "This field is required")
                })?
                .to_owned();
            let id = s.snowflake();
            s.channels.insert(
                id.clone(),
                state::Channel {
                    id: id.clone(),
                    name,
                    parent: Some(c.clone()),
                    dm: false,
                    messages: Vec::new(),
                    denied: Default::default(),
                },
            );
            Ok((201, channel_json(s, &id).unwrap_or_default()))
        }
        _ => Err(ApiError::new(405, 0, "405: Method Not Allowed")),
    }
}

fn create_message(
    s: &mut SimState,
    c: &str,
    bot: &str,
    body: &Value,
    window: Duration,
) -> Result<(u16, Value), ApiError> {
    visible_channel(s, c, bot)?;
    let channel = s.channels.get(c).ok_or_else(ApiError::unknown_channel)?;
    if s.denied(channel, bot, "SEND_MESSAGES") {
        return Err(ApiError::new(403, 50013, "Missing Permissions"));
    }
    let content = body
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if content.chars().count() > MAX_CONTENT {
        return Err(ApiError::form(
            "content",
            "BASE_TYPE_MAX_LENGTH",
            "Must be 2000 or fewer in length.",
        ));
    }
    let nonce = body.get("nonce").filter(|n| !n.is_null()).cloned();
    let nonce_text = match &nonce {
        Some(Value::String(t)) => Some(t.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(_) => {
            return Err(ApiError::form(
                "nonce",
                "BASE_TYPE_BAD_TYPE",
                "Must be an integer or a string.",
            ));
        }
        None => None,
    };
    if nonce_text
        .as_ref()
        .is_some_and(|t| t.chars().count() > MAX_NONCE)
    {
        return Err(ApiError::form(
            "nonce",
            "BASE_TYPE_MAX_LENGTH",
            "Must be 25 or fewer in length.",
        ));
    }
    if content.is_empty() {
        return Err(ApiError::new(400, 50006, "Cannot send an empty message"));
    }
    let guild = s.guild_id.clone();
    let dm = channel.dm;
    let enforce = body.get("enforce_nonce").and_then(Value::as_bool) == Some(true);
    let now = s.now();
    let earlier = match (enforce, &nonce_text) {
        (true, Some(n)) => s
            .nonces
            .get(&(bot.to_owned(), n.clone()))
            .filter(|(_, at)| now.duration_since(*at) < window)
            .map(|(id, _)| id.clone()),
        _ => None,
    };
    if let Some(id) = earlier {
        // The earlier message is returned and nothing new is created.
        let found = s.channels.values().find_map(|c| {
            c.messages
                .iter()
                .find(|m| m.id == id)
                .map(|m| (m.clone(), c.dm))
        });
        if let Some((message, earlier_dm)) = found {
            return Ok((
                200,
                message.to_json((!earlier_dm).then_some(guild.as_str())),
            ));
        }
    }
    let reply_to = match body.get("message_reference") {
        Some(reference) if !reference.is_null() => {
            let target = reference
                .get("message_id")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let target_channel = reference
                .get("channel_id")
                .and_then(Value::as_str)
                .unwrap_or(c)
                .to_owned();
            let exists = target.as_ref().is_some_and(|t| {
                s.channels
                    .get(&target_channel)
                    .is_some_and(|ch| ch.messages.iter().any(|m| &m.id == t && !m.deleted))
            });
            let fail = reference.get("fail_if_not_exists").and_then(Value::as_bool) != Some(false);
            match (exists, fail) {
                (true, _) => target,
                (false, true) => {
                    return Err(ApiError::form(
                        "message_reference",
                        "REPLIES_UNKNOWN_MESSAGE",
                        "Unknown message",
                    ));
                }
                (false, false) => None,
            }
        }
        _ => None,
    };
    let author = s
        .users
        .get(bot)
        .cloned()
        .ok_or_else(ApiError::unknown_channel)?;
    let allowed = body
        .get("allowed_mentions")
        .filter(|a| !a.is_null())
        .cloned();
    let message = Inner::land(s, c, &author, content, nonce, reply_to, allowed)?;
    if let Some(n) = nonce_text {
        s.nonces
            .insert((bot.to_owned(), n), (message.id.clone(), now));
    }
    Ok((200, message.to_json((!dm).then_some(guild.as_str()))))
}
