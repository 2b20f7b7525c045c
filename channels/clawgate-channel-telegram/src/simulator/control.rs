//! The control API under `/control/…`: the Rust API's main functions as JSON over HTTP, so a
//! client in another process (a Python script, a shell) can play users and read the record.
//!
//! | request | body / answer |
//! |---|---|
//! | `POST /control/private_chat` | `{"id","first_name","username"?}` → `{"chat_id"}` |
//! | `POST /control/group` | `{"title"}` → `{"chat_id"}` |
//! | `POST /control/supergroup` | `{"title","forum"?}` → `{"chat_id"}` |
//! | `POST /control/channel` | `{"title"}` → `{"chat_id"}` |
//! | `POST /control/topic` | `{"chat_id","name"}` → `{"message_thread_id"}` |
//! | `POST /control/write` | `{"chat_id","from":{"id","first_name","username"?,"is_bot"?},"text","thread_id"?,"reply_to"?}` → the Update (or null) |
//! | `POST /control/edit` | `{"chat_id","message_id","text"}` → the Update |
//! | `POST /control/fault` | `{"method"?,"after"?,"count"?,"kind":"error"\|"lose_answer"\|"unreachable"\|"delay","status"?,"description"?,"retry_after"?,"migrate_to_chat_id"?,"delay_ms"?}` |
//! | `POST /control/advance_clock` | `{"seconds"}` |
//! | `POST /control/block` | `{"user_id"}`: the user blocks the bot |
//! | `POST /control/kick` | `{"chat_id"}`: the bot is removed from the chat |
//! | `POST /control/upgrade` | `{"chat_id"}` (a basic group) → `{"chat_id"}` of the supergroup |
//! | `GET /control/messages/{chat_id}` | the visible messages |
//! | `GET /control/log` | every call |
//! | `GET /control/long_poll` | `{"holding"}`: whether a getUpdates is held now |
//! | `GET /control/drafts/{chat_id}` | the drafts seen (`draft_id`, `text`, `at`) |
//! | `GET /control/chat_actions/{chat_id}` | the chat actions seen |
//! | `GET /control/pending_updates` | `{"count"}` of unconfirmed updates |
//! | `GET /control/webhook_deliveries` | every webhook POST (`update_id`, `attempt`, `status` or `error`) |

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::state::Inner;
use super::{CallRecord, Fault, FaultKind, SimMessage, SimUser, WriteOptions};

pub(crate) async fn handle(
    inner: &Arc<Inner>,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Response {
    let request: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(value) => value,
            Err(error) => return answer(Err(format!("the body is not JSON: {error}"))),
        }
    };
    let outcome = match (method.as_str(), path) {
        ("GET", "log") => Ok(Value::Array(
            inner.with_state(|s| s.log.iter().map(record_json).collect()),
        )),
        ("GET", "long_poll") => Ok(json!({"holding": inner.with_state(|s| s.long_poll.is_some())})),
        ("GET", "pending_updates") => {
            Ok(json!({"count": inner.with_state(|s| s.pending_updates())}))
        }
        ("GET", "webhook_deliveries") => Ok(Value::Array(inner.with_state(|s| {
            s.webhook_deliveries
                .iter()
                .map(|d| match &d.status {
                    Ok(status) => {
                        json!({"update_id": d.update_id, "attempt": d.attempt, "status": status})
                    }
                    Err(error) => {
                        json!({"update_id": d.update_id, "attempt": d.attempt, "error": error})
                    }
                })
                .collect()
        }))),
        ("GET", path) if path.contains('/') => {
            let (what, chat) = path.split_once('/').expect("contains a slash");
            let chat_id = chat
                .parse::<i64>()
                .map_err(|_| format!("{path}: the chat id is not a number"));
            chat_id.and_then(|chat_id| {
                inner.with_state(|s| match what {
                    "messages" => Ok(Value::Array(
                        s.messages(chat_id).iter().map(message_json).collect(),
                    )),
                    "drafts" => Ok(Value::Array(
                        s.drafts(chat_id)
                            .iter()
                            .map(|d| json!({"draft_id": d.draft_id, "text": d.text, "at": d.at}))
                            .collect(),
                    )),
                    "chat_actions" => Ok(json!(s.chat_actions(chat_id))),
                    _ => Err(format!("no control endpoint GET /control/{path}")),
                })
            })
        }
        ("POST", action) => post(inner, action, &request),
        _ => Err(format!("no control endpoint {method} /control/{path}")),
    };
    answer(outcome)
}

fn post(inner: &Arc<Inner>, action: &str, request: &Value) -> Result<Value, String> {
    let text = |key: &str| {
        request[key]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{action}: `{key}` (a string) is required"))
    };
    let number = |key: &str| {
        request[key]
            .as_i64()
            .ok_or_else(|| format!("{action}: `{key}` (an integer) is required"))
    };
    let known_chat = |chat_id: i64| {
        if inner.with_state(|s| s.chats.contains_key(&chat_id)) {
            Ok(chat_id)
        } else {
            Err(format!("{action}: no chat {chat_id}; create it first"))
        }
    };
    match action {
        "private_chat" => {
            let user = user_from(request, action)?;
            Ok(json!({"chat_id": inner.with_state(|s| s.private_chat(&user))}))
        }
        "group" => {
            let title = text("title")?;
            Ok(json!({"chat_id": inner.with_state(|s| s.new_group(&title))}))
        }
        "supergroup" | "channel" => {
            let title = text("title")?;
            let forum = request["forum"].as_bool().unwrap_or(false);
            Ok(json!({"chat_id": inner.with_state(|s| s.new_supergroup(&title, forum, action))}))
        }
        "topic" => {
            let chat_id = known_chat(number("chat_id")?)?;
            let name = text("name")?;
            if !inner.with_state(|s| s.chats[&chat_id].is_forum) {
                return Err(format!("topic: chat {chat_id} is not a forum"));
            }
            Ok(json!({"message_thread_id": inner.with_state(|s| s.create_topic(chat_id, &name))}))
        }
        "write" => {
            let chat_id = known_chat(number("chat_id")?)?;
            let from = user_from(&request["from"], action)?;
            let body = text("text")?;
            let options = WriteOptions {
                thread_id: request["thread_id"].as_i64(),
                reply_to: request["reply_to"].as_i64(),
            };
            let valid = inner.with_state(|s| {
                let chat = &s.chats[&chat_id];
                options
                    .thread_id
                    .is_none_or(|t| chat.topics.contains_key(&t))
                    && options
                        .reply_to
                        .is_none_or(|r| chat.messages.contains_key(&r))
            });
            if !valid {
                return Err("write: unknown thread_id or reply_to".to_owned());
            }
            let update = inner.with_state(|s| s.user_writes(chat_id, &from, &body, &options));
            inner.updates_changed();
            Ok(update)
        }
        "edit" => {
            let chat_id = known_chat(number("chat_id")?)?;
            let message_id = number("message_id")?;
            let body = text("text")?;
            if !inner.with_state(|s| s.chats[&chat_id].messages.contains_key(&message_id)) {
                return Err(format!("edit: chat {chat_id} has no message {message_id}"));
            }
            let update = inner.with_state(|s| s.user_edits(chat_id, message_id, &body));
            inner.updates_changed();
            Ok(update)
        }
        "fault" => {
            let kind = match request["kind"].as_str().unwrap_or("") {
                "error" => FaultKind::Error {
                    status: request["status"].as_u64().unwrap_or(400) as u16,
                    description: text("description")?,
                    retry_after: request["retry_after"].as_u64(),
                    migrate_to_chat_id: request["migrate_to_chat_id"].as_i64(),
                },
                "lose_answer" => FaultKind::LoseAnswer,
                "unreachable" => FaultKind::Unreachable,
                "delay" => FaultKind::Delay(Duration::from_millis(
                    request["delay_ms"].as_u64().unwrap_or(1000),
                )),
                other => {
                    return Err(format!(
                        "fault: kind {other:?} is none of error, lose_answer, unreachable, delay"
                    ));
                }
            };
            let fault = Fault {
                method: request["method"].as_str().map(str::to_owned),
                after: request["after"].as_u64().unwrap_or(0) as u32,
                count: request["count"].as_u64().unwrap_or(1) as u32,
                kind,
            };
            inner.with_state(|s| s.inject(fault));
            Ok(json!(true))
        }
        "advance_clock" => {
            let seconds = request["seconds"]
                .as_f64()
                .filter(|s| *s >= 0.0)
                .ok_or("advance_clock: `seconds` (a non-negative number) is required")?;
            inner.with_state(|s| s.clock.advance(Duration::from_secs_f64(seconds)));
            inner.updates_changed();
            Ok(json!(true))
        }
        "block" => {
            let user_id = number("user_id")?;
            let private = inner.with_state(|s| {
                s.chats
                    .get(&user_id)
                    .is_some_and(|c| c.kind == super::state::ChatKind::Private)
            });
            if !private {
                return Err(format!("block: no private chat with user {user_id}"));
            }
            inner.with_state(|s| s.block(user_id));
            inner.updates_changed();
            Ok(json!(true))
        }
        "kick" => {
            let chat_id = known_chat(number("chat_id")?)?;
            inner.with_state(|s| s.kick(chat_id));
            inner.updates_changed();
            Ok(json!(true))
        }
        "upgrade" => {
            let chat_id = known_chat(number("chat_id")?)?;
            let basic = inner.with_state(|s| {
                let chat = &s.chats[&chat_id];
                chat.kind == super::state::ChatKind::Group && chat.migrated_to.is_none()
            });
            if !basic {
                return Err(format!("upgrade: chat {chat_id} is not a basic group"));
            }
            let new_id = inner.with_state(|s| s.upgrade(chat_id));
            inner.updates_changed();
            Ok(json!({"chat_id": new_id}))
        }
        other => Err(format!("no control endpoint POST /control/{other}")),
    }
}

fn user_from(value: &Value, action: &str) -> Result<SimUser, String> {
    let id = value["id"]
        .as_i64()
        .filter(|id| *id > 0)
        .ok_or_else(|| format!("{action}: the user's `id` (a positive integer) is required"))?;
    Ok(SimUser {
        id,
        first_name: value["first_name"].as_str().unwrap_or("User").to_owned(),
        username: value["username"].as_str().map(str::to_owned),
        is_bot: value["is_bot"].as_bool().unwrap_or(false),
    })
}

fn record_json(record: &CallRecord) -> Value {
    json!({
        "method": record.method, "chat_id": record.chat_id, "status": record.status,
        "description": record.description, "answered": record.answered, "params": record.params,
    })
}

fn message_json(message: &SimMessage) -> Value {
    json!({
        "message_id": message.message_id, "chat_id": message.chat_id,
        "from_bot_self": message.from_bot_self, "from_id": message.from_id,
        "text": message.text, "caption": message.caption,
        "media": message.media.as_ref().map(|m| json!({"kind": m.kind, "url": m.url})),
        "thread_id": message.thread_id, "reply_to_message_id": message.reply_to_message_id,
        "quote": message.quote, "parse_mode": message.parse_mode,
        "edit_count": message.edit_count, "date": message.date, "raw": message.raw,
    })
}

fn answer(outcome: Result<Value, String>) -> Response {
    let (status, body) = match outcome {
        Ok(value) => (StatusCode::OK, value),
        Err(error) => (StatusCode::BAD_REQUEST, json!({"error": error})),
    };
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
