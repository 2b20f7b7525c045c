//! The Bot API methods: validation in the server's order (markup, chat, thread, reply, length,
//! flood control), then the effect. A method that returns an error changed nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::http::Params;
use super::markup::{self, ParseModeError};
use super::state::{
    ApiError, ChatKind, DELETE_WINDOW_SECS, Inner, LongPoll, State, Success, nested,
};
use super::{SimDraft, SimMedia, SimMessage, webhook};

/// Every method served, in canonical case.
const METHODS: &[&str] = &[
    "getMe",
    "getUpdates",
    "setWebhook",
    "deleteWebhook",
    "getWebhookInfo",
    "sendMessage",
    "editMessageText",
    "deleteMessage",
    "deleteMessages",
    "sendChatAction",
    "sendMessageDraft",
    "sendPhoto",
    "sendDocument",
    "sendVideo",
    "sendAudio",
    "sendVoice",
    "sendAnimation",
    "getChat",
];

const CHAT_ACTIONS: &[&str] = &[
    "cancel",
    "typing",
    "record_video",
    "upload_video",
    "record_audio",
    "record_voice",
    "upload_audio",
    "upload_voice",
    "upload_photo",
    "upload_document",
    "choose_sticker",
    "pick_up_location",
    "find_location",
    "record_video_note",
    "upload_video_note",
];

/// The longest getUpdates hold the server grants.
const LONG_POLL_MAX_SECS: i64 = 50;

/// Method names are case-insensitive.
pub(crate) fn canonical(name: &str) -> Option<&'static str> {
    METHODS
        .iter()
        .copied()
        .find(|method| method.eq_ignore_ascii_case(name))
}

pub(crate) async fn call(
    inner: &Arc<Inner>,
    method: &'static str,
    params: &Params,
) -> Result<Success, ApiError> {
    match method {
        "setWebhook" => return webhook::set(inner, params),
        "deleteWebhook" => return webhook::delete(inner, params),
        _ => {}
    }
    let limits = inner.config.rate_limits;
    let outcome = match method {
        "getMe" => Ok(inner.with_state(|s| {
            let mut me = s.bot_user_json();
            me["can_join_groups"] = json!(true);
            me["can_read_all_group_messages"] = json!(false);
            me["supports_inline_queries"] = json!(false);
            me["can_connect_to_business"] = json!(false);
            me["has_main_web_app"] = json!(false);
            me["has_topics_enabled"] = json!(false);
            me
        })),
        "getUpdates" => get_updates(inner, params).await,
        "getWebhookInfo" => Ok(webhook::info(inner)),
        "sendMessage" => inner.with_state(|s| send_message(s, params, limits)),
        "editMessageText" => inner.with_state(|s| edit_message_text(s, params, limits)),
        "deleteMessage" => inner.with_state(|s| delete_message(s, params)),
        "deleteMessages" => inner.with_state(|s| delete_messages(s, params)),
        "sendChatAction" => inner.with_state(|s| send_chat_action(s, params)),
        "sendMessageDraft" => {
            let allowed = inner.config.drafts_allowed;
            inner.with_state(|s| send_message_draft(s, params, allowed))
        }
        "getChat" => inner.with_state(|s| get_chat(s, params)),
        "sendPhoto" => send_media(inner, "photo", params).await,
        "sendDocument" => send_media(inner, "document", params).await,
        "sendVideo" => send_media(inner, "video", params).await,
        "sendAudio" => send_media(inner, "audio", params).await,
        "sendVoice" => send_media(inner, "voice", params).await,
        "sendAnimation" => send_media(inner, "animation", params).await,
        other => Err(ApiError::new(
            500,
            format!("Internal Server Error: {other} has no handler"),
        )),
    };
    outcome.map(Success::from)
}

fn int(params: &Params, key: &str) -> Option<i64> {
    params.get(key).and_then(|v| v.trim().parse().ok())
}

fn flag(params: &Params, key: &str) -> bool {
    params
        .get(key)
        .is_some_and(|v| matches!(v.trim(), "true" | "True" | "1"))
}

/// Text plus entities, from `parse_mode` or an explicit `entities` array.
struct Text {
    text: String,
    entities: Option<Value>,
    parse_mode: Option<String>,
}

fn format_text(
    source: &str,
    parse_mode: Option<&String>,
    entities: Option<&String>,
) -> Result<Text, ApiError> {
    let mode = parse_mode.map(String::as_str).unwrap_or("");
    let mode = if mode.eq_ignore_ascii_case("none") {
        ""
    } else {
        mode
    };
    if mode.is_empty()
        && let Some(entities) = entities
    {
        let value: Value = serde_json::from_str(entities)
            .map_err(|_| ApiError::bad_request("can't parse entities JSON object"))?;
        let trimmed = source.trim().to_owned();
        return Ok(Text {
            text: trimmed,
            entities: value
                .as_array()
                .filter(|a| !a.is_empty())
                .map(|_| value.clone()),
            parse_mode: None,
        });
    }
    let formatted = markup::parse(source, mode).map_err(|error| match error {
        ParseModeError::Entities(detail) => {
            ApiError::bad_request(format!("can't parse entities: {detail}"))
        }
        ParseModeError::UnsupportedMode => ApiError::bad_request("unsupported parse_mode"),
    })?;
    Ok(Text {
        entities: formatted.entities_json(),
        text: formatted.text,
        parse_mode: (!mode.is_empty()).then(|| mode.to_owned()),
    })
}

/// `chat_id` → a chat the bot can write to, or the server's refusal.
fn resolve_chat(s: &State, params: &Params, write: bool) -> Result<i64, ApiError> {
    let raw = params.get("chat_id").map(|v| v.trim()).unwrap_or("");
    if raw.is_empty() {
        return Err(ApiError::bad_request("chat_id is empty"));
    }
    let chat_not_found = || ApiError::bad_request("chat not found");
    let id: i64 = raw.parse().map_err(|_| chat_not_found())?;
    let chat = s.chats.get(&id).ok_or_else(chat_not_found)?;
    if let Some(new_id) = chat.migrated_to {
        return Err(ApiError {
            migrate_to_chat_id: Some(new_id),
            ..ApiError::bad_request("group chat was upgraded to a supergroup chat")
        });
    }
    if write && chat.deactivated {
        return Err(ApiError::forbidden("user is deactivated"));
    }
    if write && chat.bot_removed {
        return Err(match chat.kind {
            ChatKind::Private => ApiError::forbidden("bot was blocked by the user"),
            ChatKind::Group => ApiError::forbidden("bot was kicked from the group chat"),
            ChatKind::Supergroup => ApiError::forbidden("bot was kicked from the supergroup chat"),
            ChatKind::Channel => ApiError::forbidden("bot is not a member of the channel chat"),
        });
    }
    Ok(id)
}

fn resolve_thread(s: &State, chat_id: i64, params: &Params) -> Result<Option<i64>, ApiError> {
    let Some(thread) = int(params, "message_thread_id").filter(|t| *t != 0) else {
        return Ok(None);
    };
    let chat = &s.chats[&chat_id];
    if chat.is_forum && chat.topics.contains_key(&thread) {
        Ok(Some(thread))
    } else {
        Err(ApiError::bad_request("message thread not found"))
    }
}

/// (replied message id, quote text, quote position in UTF-16 units).
type Reply = Option<(i64, Option<(String, usize)>)>;

fn resolve_reply(s: &State, chat_id: i64, params: &Params) -> Result<Reply, ApiError> {
    let (message_id, allow_without, quote, reply_chat) =
        if let Some(raw) = params.get("reply_parameters") {
            let value: Value = serde_json::from_str(raw)
                .ok()
                .filter(Value::is_object)
                .ok_or_else(|| ApiError::bad_request("can't parse reply parameters JSON object"))?;
            (
                value["message_id"].as_i64().unwrap_or(0),
                value["allow_sending_without_reply"]
                    .as_bool()
                    .unwrap_or(false),
                value["quote"].as_str().map(str::to_owned),
                match &value["chat_id"] {
                    Value::Number(n) => n.as_i64(),
                    Value::String(text) => text.parse().ok(),
                    _ => None,
                },
            )
        } else if let Some(id) = int(params, "reply_to_message_id") {
            (id, flag(params, "allow_sending_without_reply"), None, None)
        } else {
            return Ok(None);
        };
    if message_id == 0 && !params.contains_key("reply_parameters") {
        return Ok(None);
    }
    let chat = &s.chats[&chat_id];
    let replied = if reply_chat.is_none_or(|c| c == chat_id) {
        chat.messages.get(&message_id)
    } else {
        None
    };
    let Some(replied) = replied else {
        if allow_without {
            return Ok(None);
        }
        return Err(ApiError::bad_request("message to be replied not found"));
    };
    let quote = match quote.filter(|q| !q.is_empty()) {
        None => None,
        Some(quote) => {
            let haystack = replied
                .text
                .as_deref()
                .or(replied.caption.as_deref())
                .unwrap_or("");
            let Some(byte) = haystack.find(&quote) else {
                return Err(ApiError::bad_request("QUOTE_TEXT_INVALID"));
            };
            let position = haystack[..byte].encode_utf16().count();
            Some((quote, position))
        }
    };
    Ok(Some((message_id, quote)))
}

fn link_preview(params: &Params) -> Option<Value> {
    if let Some(raw) = params.get("link_preview_options") {
        return serde_json::from_str::<Value>(raw)
            .ok()
            .filter(Value::is_object);
    }
    flag(params, "disable_web_page_preview").then(|| json!({"is_disabled": true}))
}

/// The Message object of a message the bot sends.
fn bot_message(
    s: &mut State,
    chat_id: i64,
    thread: Option<i64>,
    reply: &Reply,
    body: impl FnOnce(&mut Value),
) -> (i64, Value) {
    let now = s.clock.unix();
    let from = s.bot_user_json();
    let chat = s.chats.get_mut(&chat_id).expect("chat resolved");
    let message_id = chat.next_message_id();
    let mut raw = json!({"message_id": message_id, "date": now, "chat": chat.json()});
    if chat.kind == ChatKind::Channel {
        raw["sender_chat"] = chat.json();
    } else {
        raw["from"] = from;
    }
    if let Some(thread) = thread {
        raw["message_thread_id"] = json!(thread);
        raw["is_topic_message"] = json!(true);
    }
    if let Some((reply_id, quote)) = reply {
        if let Some(replied) = chat.messages.get(reply_id) {
            raw["reply_to_message"] = nested(&replied.raw);
        }
        if let Some((text, position)) = quote {
            raw["quote"] = json!({"text": text, "position": position, "is_manual": true});
        }
    }
    body(&mut raw);
    (message_id, raw)
}

fn send_message(s: &mut State, params: &Params, limits: bool) -> Result<Value, ApiError> {
    let source = params.get("text").map(String::as_str).unwrap_or("");
    if source.is_empty() {
        return Err(ApiError::bad_request("message text is empty"));
    }
    let text = format_text(source, params.get("parse_mode"), params.get("entities"))?;
    if text.text.is_empty() {
        return Err(ApiError::bad_request("message text is empty"));
    }
    let chat_id = resolve_chat(s, params, true)?;
    let thread = resolve_thread(s, chat_id, params)?;
    let reply = resolve_reply(s, chat_id, params)?;
    if text.text.chars().count() > 4096 {
        return Err(ApiError::bad_request("message is too long"));
    }
    if limits {
        let kind = s.chats[&chat_id].kind;
        s.rate_check(chat_id, kind)?;
    }
    let preview = link_preview(params);
    let (message_id, raw) = bot_message(s, chat_id, thread, &reply, |raw| {
        raw["text"] = json!(text.text);
        if let Some(entities) = &text.entities {
            raw["entities"] = entities.clone();
        }
        if let Some(preview) = preview {
            raw["link_preview_options"] = preview;
        }
    });
    store(
        s,
        chat_id,
        message_id,
        thread,
        &reply,
        text.parse_mode,
        raw.clone(),
        |m| {
            m.text = Some(text.text.clone());
        },
    );
    Ok(raw)
}

/// Records a message the bot sent as visible in its chat.
#[allow(
    clippy::too_many_arguments,
    reason = "the parts of one message, shared by text and media sends"
)]
fn store(
    s: &mut State,
    chat_id: i64,
    message_id: i64,
    thread: Option<i64>,
    reply: &Reply,
    parse_mode: Option<String>,
    raw: Value,
    fill: impl FnOnce(&mut SimMessage),
) {
    let now = s.clock.unix();
    let from_id = if s.chats[&chat_id].kind == ChatKind::Channel {
        chat_id
    } else {
        s.bot_id
    };
    let mut message = SimMessage {
        message_id,
        chat_id,
        from_bot_self: true,
        from_id,
        text: None,
        caption: None,
        media: None,
        thread_id: thread,
        reply_to_message_id: reply.as_ref().map(|(id, _)| *id),
        quote: reply
            .as_ref()
            .and_then(|(_, quote)| quote.as_ref().map(|(text, _)| text.clone())),
        parse_mode,
        edit_count: 0,
        date: now,
        raw,
    };
    fill(&mut message);
    if let Some(chat) = s.chats.get_mut(&chat_id) {
        chat.messages.insert(message_id, message);
    }
}

fn edit_message_text(s: &mut State, params: &Params, limits: bool) -> Result<Value, ApiError> {
    if params.contains_key("inline_message_id") {
        return Err(ApiError::bad_request("message to edit not found"));
    }
    let source = params.get("text").map(String::as_str).unwrap_or("");
    if source.is_empty() {
        return Err(ApiError::bad_request("message text is empty"));
    }
    let text = format_text(source, params.get("parse_mode"), params.get("entities"))?;
    if text.text.is_empty() {
        return Err(ApiError::bad_request("message text is empty"));
    }
    let chat_id = resolve_chat(s, params, true)?;
    let message_id = int(params, "message_id").unwrap_or(0);
    let kind = s.chats[&chat_id].kind;
    let message = s.chats[&chat_id]
        .messages
        .get(&message_id)
        .ok_or_else(|| ApiError::bad_request("message to edit not found"))?;
    if !message.from_bot_self {
        return Err(ApiError::bad_request("message can't be edited"));
    }
    if message.text.is_none() {
        return Err(ApiError::bad_request(
            "there is no text in the message to edit",
        ));
    }
    if text.text.chars().count() > 4096 {
        return Err(ApiError::bad_request("message is too long"));
    }
    let same_entities = message.raw.get("entities") == text.entities.as_ref();
    if message.text.as_deref() == Some(text.text.as_str()) && same_entities {
        return Err(ApiError::bad_request(
            "message is not modified: specified new message content and reply markup are exactly \
             the same as a current content and reply markup of the message",
        ));
    }
    if limits {
        s.rate_check(chat_id, kind)?;
    }
    let now = s.clock.unix();
    let preview = link_preview(params);
    let chat = s.chats.get_mut(&chat_id).expect("chat resolved");
    let message = chat.messages.get_mut(&message_id).expect("message found");
    message.text = Some(text.text.clone());
    message.edit_count += 1;
    message.parse_mode = text.parse_mode;
    message.raw["text"] = json!(text.text);
    message.raw["edit_date"] = json!(now);
    if let Some(object) = message.raw.as_object_mut() {
        object.remove("entities");
    }
    if let Some(entities) = text.entities {
        message.raw["entities"] = entities;
    }
    if let Some(preview) = preview {
        message.raw["link_preview_options"] = preview;
    }
    Ok(message.raw.clone())
}

/// Whether the bot may delete `message_id` now: it exists, is younger than 48 h, and is the
/// bot's own or sits in a private chat or a channel (where the bot is an administrator).
fn deletable(s: &State, chat_id: i64, message_id: i64) -> Result<(), ApiError> {
    let chat = &s.chats[&chat_id];
    let message = chat
        .messages
        .get(&message_id)
        .ok_or_else(|| ApiError::bad_request("message to delete not found"))?;
    let too_old = s.clock.unix() - message.date >= DELETE_WINDOW_SECS;
    let allowed =
        message.from_bot_self || matches!(chat.kind, ChatKind::Private | ChatKind::Channel);
    if too_old || !allowed {
        return Err(ApiError::bad_request("message can't be deleted"));
    }
    Ok(())
}

fn delete_message(s: &mut State, params: &Params) -> Result<Value, ApiError> {
    let chat_id = resolve_chat(s, params, true)?;
    let message_id = int(params, "message_id").unwrap_or(0);
    deletable(s, chat_id, message_id)?;
    if let Some(chat) = s.chats.get_mut(&chat_id) {
        chat.messages.remove(&message_id);
    }
    Ok(json!(true))
}

fn delete_messages(s: &mut State, params: &Params) -> Result<Value, ApiError> {
    let raw = params.get("message_ids").map(String::as_str).unwrap_or("");
    if raw.is_empty() {
        return Err(ApiError::bad_request(
            "message identifiers are not specified",
        ));
    }
    let value: Value = serde_json::from_str(raw)
        .map_err(|_| ApiError::bad_request("can't parse message_ids JSON object"))?;
    let ids = value
        .as_array()
        .ok_or_else(|| ApiError::bad_request("expected an Array of message identifiers"))?;
    if ids.len() > 100 {
        return Err(ApiError::bad_request(
            "too many message identifiers specified",
        ));
    }
    let ids: Vec<i64> = ids
        .iter()
        .map(|id| match id {
            Value::Number(n) => n.as_i64().filter(|id| *id > 0).ok_or(()),
            Value::String(text) => text.parse().ok().filter(|id: &i64| *id > 0).ok_or(()),
            _ => Err(()),
        })
        .collect::<Result<_, ()>>()
        .map_err(|()| ApiError::bad_request("invalid message identifier specified"))?;
    if ids.is_empty() {
        return Err(ApiError::bad_request(
            "message identifiers are not specified",
        ));
    }
    let chat_id = resolve_chat(s, params, true)?;
    // Missing messages are skipped; one that exists but may not be deleted refuses the call.
    let mut present = Vec::new();
    for id in ids {
        match deletable(s, chat_id, id) {
            Ok(()) => present.push(id),
            Err(error) if error.description.ends_with("not found") => {}
            Err(error) => return Err(error),
        }
    }
    if let Some(chat) = s.chats.get_mut(&chat_id) {
        for id in present {
            chat.messages.remove(&id);
        }
    }
    Ok(json!(true))
}

fn send_chat_action(s: &mut State, params: &Params) -> Result<Value, ApiError> {
    let action = params.get("action").map(String::as_str).unwrap_or("");
    if !CHAT_ACTIONS.contains(&action) {
        return Err(ApiError::bad_request("wrong parameter action in request"));
    }
    let chat_id = resolve_chat(s, params, true)?;
    resolve_thread(s, chat_id, params)?;
    if let Some(chat) = s.chats.get_mut(&chat_id) {
        chat.actions.push(action.to_owned());
    }
    Ok(json!(true))
}

fn send_message_draft(s: &mut State, params: &Params, allowed: bool) -> Result<Value, ApiError> {
    let draft_id = int(params, "draft_id").unwrap_or(0);
    let source = params.get("text").map(String::as_str).unwrap_or("");
    let text = format_text(source, params.get("parse_mode"), params.get("entities"))?;
    let chat_id = resolve_chat(s, params, true)?;
    // Telegram refuses drafts outside private chats, and for bots it does not allow them.
    if !allowed || s.chats[&chat_id].kind != ChatKind::Private {
        return Err(ApiError::bad_request("TEXTDRAFT_PEER_INVALID"));
    }
    if draft_id == 0 {
        return Err(ApiError::bad_request("draft_id must be non-zero"));
    }
    if text.text.chars().count() > 4096 {
        return Err(ApiError::bad_request("message is too long"));
    }
    let at = s.clock.unix();
    if let Some(chat) = s.chats.get_mut(&chat_id) {
        chat.drafts.push(SimDraft {
            draft_id,
            text: text.text,
            at,
        });
    }
    Ok(json!(true))
}

fn get_chat(s: &mut State, params: &Params) -> Result<Value, ApiError> {
    let chat_id = resolve_chat(s, params, false)?;
    let chat = &s.chats[&chat_id];
    let mut info = chat.json();
    info["accent_color_id"] = json!(0);
    info["max_reaction_count"] = json!(11);
    info["accepted_gift_types"] = json!({
        "unlimited_gifts": false, "limited_gifts": false,
        "unique_gifts": false, "premium_subscription": false,
    });
    Ok(info)
}

/// Media by URL (fetched, so a dead link fails as it does on Telegram) or by a file_id this
/// server issued.
async fn send_media(
    inner: &Arc<Inner>,
    kind: &'static str,
    params: &Params,
) -> Result<Value, ApiError> {
    let source = params
        .get(kind)
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    if source.is_empty() {
        return Err(ApiError::bad_request(format!(
            "there is no {kind} in the request"
        )));
    }
    let caption_source = params.get("caption").map(String::as_str).unwrap_or("");
    let caption = format_text(
        caption_source,
        params.get("parse_mode"),
        params.get("caption_entities"),
    )?;
    let (chat_id, thread, reply) = inner.with_state(|s| {
        let chat_id = resolve_chat(s, params, true)?;
        let thread = resolve_thread(s, chat_id, params)?;
        let reply = resolve_reply(s, chat_id, params)?;
        Ok::<_, ApiError>((chat_id, thread, reply))
    })?;
    if caption.text.chars().count() > 1024 {
        return Err(ApiError::bad_request("message caption is too long"));
    }
    let is_url = source.starts_with("http://") || source.starts_with("https://");
    if is_url {
        fetch(&source).await?;
    } else if !inner.with_state(|s| s.files.contains_key(&source)) {
        return Err(ApiError::bad_request(
            "wrong file identifier/HTTP URL specified",
        ));
    }
    let limits = inner.config.rate_limits;
    inner.with_state(|s| {
        if limits {
            let chat_kind = s.chats.get(&chat_id).map_or(ChatKind::Private, |c| c.kind);
            s.rate_check(chat_id, chat_kind)?;
        }
        let file_id = if is_url {
            s.new_file_id(kind, &source)
        } else {
            source.clone()
        };
        let unique = format!("U{file_id}");
        let media = match kind {
            "photo" => json!([{"file_id": file_id, "file_unique_id": unique, "width": 90, "height": 90, "file_size": 1024}]),
            "video" | "animation" => json!({"file_id": file_id, "file_unique_id": unique, "width": 320, "height": 240, "duration": 1}),
            "audio" | "voice" => json!({"file_id": file_id, "file_unique_id": unique, "duration": 1}),
            _ => {
                let name = source.rsplit('/').next().unwrap_or("file").to_owned();
                json!({"file_id": file_id, "file_unique_id": unique, "file_name": name})
            }
        };
        let (message_id, raw) = bot_message(s, chat_id, thread, &reply, |raw| {
            // An animation's Message also carries it as `document`, as Telegram's does.
            if kind == "animation" {
                raw["document"] = media.clone();
            }
            raw[kind] = media;
            if !caption.text.is_empty() {
                raw["caption"] = json!(caption.text);
                if let Some(entities) = &caption.entities {
                    raw["caption_entities"] = entities.clone();
                }
            }
        });
        let url = s
            .files
            .get(&source)
            .map_or(source.clone(), |(_, url)| url.clone());
        store(s, chat_id, message_id, thread, &reply, caption.parse_mode.clone(), raw.clone(), |m| {
            m.caption = (!caption.text.is_empty()).then(|| caption.text.clone());
            m.media = Some(SimMedia {
                kind: kind.to_owned(),
                url,
            });
        });
        Ok(raw)
    })
}

/// Only loopback URLs can be fetched here; anything else is as unreachable as a dead host.
async fn fetch(url: &str) -> Result<(), ApiError> {
    let failed = || ApiError::bad_request("failed to get HTTP URL content");
    let host = url
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""))
        .unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
    let hostname = host.rsplit_once(':').map_or(host, |(name, _)| name);
    if hostname != "127.0.0.1" {
        return Err(failed());
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|_| failed())?;
    let response = client.get(url).send().await.map_err(|_| failed())?;
    if !response.status().is_success() {
        return Err(failed());
    }
    response.bytes().await.map_err(|_| failed())?;
    Ok(())
}

/// getUpdates as the server does it: webhook conflict, clamps, the repeated-poll throttle,
/// confirmation by offset, and a hold that an update, the timeout or a newer poll ends.
async fn get_updates(inner: &Arc<Inner>, params: &Params) -> Result<Value, ApiError> {
    let offset = int(params, "offset").unwrap_or(0);
    let limit = int(params, "limit").unwrap_or(100).clamp(1, 100);
    let timeout = int(params, "timeout")
        .unwrap_or(0)
        .clamp(0, LONG_POLL_MAX_SECS);
    enum Step {
        Done(Vec<Value>),
        Hold(
            u64,
            tokio::sync::oneshot::Receiver<&'static str>,
            i64,
            usize,
            u64,
        ),
        Conflict(&'static str),
    }
    let step = inner.with_state(|s| {
        if s.webhook.is_some() {
            return Step::Conflict(
                "can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first",
            );
        }
        if let Some(raw) = params.get("allowed_updates")
            && let Ok(Value::Array(list)) = serde_json::from_str::<Value>(raw)
        {
            s.allowed_updates = Some(
                list.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
            );
        }
        let now = Instant::now();
        let mut timeout = timeout;
        let mut limit = limit as usize;
        if let Some((previous, at)) = s.previous_poll
            && previous == offset
        {
            let since = now.duration_since(at);
            if timeout < 3 && since < Duration::from_secs(3) {
                timeout = 3;
            }
            if since < Duration::from_millis(500) {
                limit = 1;
            }
        }
        s.previous_poll = Some((offset, now));
        let updates = s.take_updates(offset, limit);
        if !updates.is_empty() || timeout == 0 {
            return Step::Done(updates);
        }
        // A negative offset has trimmed the queue already; the hold continues from its head.
        let offset = offset.max(0);
        if let Some(previous) = s.long_poll.take() {
            let _ = previous.end.send(
                "terminated by other getUpdates request; make sure that only one bot instance is running",
            );
        }
        let (end, ended) = tokio::sync::oneshot::channel();
        let id = s.next_poll_id;
        s.next_poll_id += 1;
        s.long_poll = Some(LongPoll { id, end });
        Step::Hold(id, ended, offset, limit, timeout as u64)
    });
    let (id, mut ended, offset, limit, timeout) = match step {
        Step::Done(updates) => return Ok(Value::Array(updates)),
        Step::Conflict(detail) => return Err(conflict(inner, detail).await),
        Step::Hold(id, ended, offset, limit, timeout) => (id, ended, offset, limit, timeout),
    };
    let mut updates = inner.updates_tx.subscribe();
    let mut shutdown = inner.shutdown_tx.subscribe();
    let deadline = tokio::time::sleep(Duration::from_secs(timeout));
    tokio::pin!(deadline);
    let release = |inner: &Inner| {
        inner.with_state(|s| {
            if s.long_poll.as_ref().is_some_and(|poll| poll.id == id) {
                s.long_poll = None;
            }
        })
    };
    loop {
        tokio::select! {
            () = &mut deadline => {
                release(inner);
                return Ok(Value::Array(inner.with_state(|s| s.take_updates(offset, limit))));
            }
            detail = &mut ended => {
                let detail = detail.unwrap_or("terminated by other getUpdates request; make sure that only one bot instance is running");
                return Err(conflict(inner, detail).await);
            }
            changed = updates.changed() => {
                if changed.is_err() {
                    release(inner);
                    return Ok(json!([]));
                }
                let found = inner.with_state(|s| s.take_updates(offset, limit));
                if !found.is_empty() {
                    release(inner);
                    return Ok(Value::Array(found));
                }
            }
            _ = shutdown.changed() => {
                release(inner);
                return Ok(json!([]));
            }
        }
    }
}

/// 409 answers are spaced: one right away, then later ones wait 3 s, as the server does.
async fn conflict(inner: &Inner, detail: &str) -> ApiError {
    let now = Instant::now();
    let delay = inner.with_state(|s| {
        let free = s.next_conflict_at.is_none_or(|at| now >= at);
        if free {
            s.next_conflict_at = Some(now + Duration::from_secs(3));
            None
        } else {
            Some(Duration::from_secs(3))
        }
    });
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    ApiError::conflict(detail)
}
