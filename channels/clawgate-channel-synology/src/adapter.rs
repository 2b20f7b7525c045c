//! Sending: a DM (`direct` target, the person's DSM user name) through the bot's `chatbot`
//! method, to the Chat-internal user id `user_list` names for that user name (cached); a
//! channel (`group` target, the channel id) through that channel's incoming webhook. Posts of
//! one token are spaced by `send_interval_ms`, and a 411 ("too fast") is a rate limit.
//!
//! Synology answers a post with `{"success":true}` and nothing else: no post id, no history a
//! bot can read, no edit, no delete (\[obs\], platform-apis-wave2 §7). So:
//! - the receipt of a unit is its own idempotency key (`synology:<via>:<unit key>`), with the
//!   recipient in `raw`;
//! - a send whose answer was lost cannot be settled: the channel does not declare
//!   `reconcileUnknownSend`, the engine keeps it as unknown for an operator, and it is never
//!   sent again blindly;
//! - finals are plain durable sends: no previews, no edits.
//!
//! An attachment is a post of its own with `file_url` (Synology fetches the file); the text
//! goes before it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clawgate_channel_sdk::{ChannelMessageAdapter, Reconciliation, Secret, SendContext, SendError};
use clawgate_types::{
    AttachmentCapabilities, DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities,
    MessagePartKind, MessageReceiptPart, RenderedMessageUnit, TargetKind, TextCapabilities,
};
use serde_json::{Value, json};
use tracing::warn;

use crate::client::{CallError, ChatApi};

/// The longest text of one post this channel sends. Synology documents no limit; 2000
/// characters is what Chat clients stay under, and longer replies are chunked.
pub const MAX_TEXT_CHARS: u32 = 2_000;

/// Where a channel's posts go: its incoming webhook's token.
#[derive(Clone)]
pub(crate) struct ChannelRoute {
    pub(crate) incoming_token: Secret,
}

/// One token's posts, one at a time, spaced.
type Lane = Arc<tokio::sync::Mutex<Option<Instant>>>;

/// The Synology Chat sender: the bot (DMs) and the channels' incoming webhooks.
pub struct SynologyAdapter {
    name: String,
    api: ChatApi,
    bot_token: Option<Secret>,
    channels: HashMap<String, ChannelRoute>,
    capabilities: MessageCapabilities,
    interval: Duration,
    lanes: std::sync::Mutex<HashMap<String, Lane>>,
    /// DSM user name → Chat-internal user id, from `user_list`.
    users: std::sync::Mutex<HashMap<String, u64>>,
}

impl std::fmt::Debug for SynologyAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SynologyAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("bot", &self.bot_token.is_some())
            .field("channels", &self.channels.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// What the channel can do, as the engine and the conformance suite read it.
fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        // Files by URL: the NAS fetches `file_url` itself.
        .with_attachments(AttachmentCapabilities::default().with_remote_url(true))
        // No idempotency key, no ids, no history: an unknown send stays unknown.
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(false)
                .with_retry_after(true)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(false)
                .with_duplicates_acceptable(false),
        )
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

/// The post a unit is: `{"text"}` for text, `{"file_url"}` for an attachment Synology fetches
/// itself by URL.
fn content_of(unit: &RenderedMessageUnit) -> Result<Value, SendError> {
    if unit.kind == MessagePartKind::Text {
        let text = unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a Synology Chat unit needs a `text` string"))?;
        if text.trim().is_empty() {
            return Err(invalid("Synology Chat refuses an empty post"));
        }
        if text.chars().count() > MAX_TEXT_CHARS as usize {
            return Err(invalid(format!(
                "a Synology Chat post holds at most {MAX_TEXT_CHARS} characters here"
            )));
        }
        return Ok(json!({ "text": text }));
    }
    let url = unit
        .payload
        .get("url")
        .and_then(Value::as_str)
        .filter(|u| u.starts_with("https://") || u.starts_with("http://"))
        .ok_or_else(|| {
            invalid(
                "Synology Chat posts files by an http(s) URL (file_url); uploads are not supported",
            )
        })?;
    Ok(json!({ "file_url": url }))
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SynologyAdapter {
    pub(crate) fn new(
        name: &str,
        api: ChatApi,
        bot_token: Option<Secret>,
        channels: HashMap<String, ChannelRoute>,
        interval: Duration,
    ) -> SynologyAdapter {
        SynologyAdapter {
            name: name.to_owned(),
            api,
            bot_token,
            channels,
            capabilities: capabilities(),
            interval,
            lanes: std::sync::Mutex::new(HashMap::new()),
            users: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn pace_ms(&self) -> u64 {
        u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX)
    }

    fn lane(&self, key: &str) -> Lane {
        lock(&self.lanes).entry(key.to_owned()).or_default().clone()
    }

    /// `user_list` as user name → Chat-internal id.
    pub(crate) async fn user_list(
        &self,
        token: &Secret,
    ) -> Result<HashMap<String, u64>, CallError> {
        let data = self.api.call("user_list", token, None).await?;
        Ok(data
            .get("users")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|u| {
                Some((
                    u.get("username")?.as_str()?.to_owned(),
                    u.get("user_id")?.as_u64()?,
                ))
            })
            .collect())
    }

    /// The Chat-internal id of `username`: cached, else from a fresh `user_list`.
    async fn resolve(&self, token: &Secret, username: &str) -> Result<u64, SendError> {
        if let Some(id) = lock(&self.users).get(username) {
            return Ok(*id);
        }
        let users = self
            .user_list(token)
            .await
            // A lookup posts nothing: even a lost answer left no message behind.
            .map_err(|e| {
                let mut error = e.into_send_error("user_list", self.pace_ms());
                error.side_effect = clawgate_channel_sdk::SideEffect::None;
                if error.kind == DeliveryFailureKind::Unknown {
                    error.kind = DeliveryFailureKind::Transient;
                }
                error
            })?;
        let found = users.get(username).copied();
        *lock(&self.users) = users;
        found.ok_or_else(|| {
            SendError::before_io(
                DeliveryFailureKind::NotFound,
                format!(
                    "Synology Chat: no user named {username:?} in user_list (the DM target is \
                     the person's DSM user name)"
                ),
            )
        })
    }

    /// Posts `payload` with `token` through `method`, spaced from the lane's previous post.
    async fn post(
        &self,
        lane: &str,
        method: &str,
        token: &Secret,
        payload: &Value,
    ) -> Result<(), SendError> {
        let lane = self.lane(lane);
        let mut last = lane.lock().await;
        if let Some(at) = *last {
            let wait = self.interval.saturating_sub(at.elapsed());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        let outcome = self.api.call(method, token, Some(payload)).await;
        *last = Some(Instant::now());
        drop(last);
        outcome
            .map(|_| ())
            .map_err(|e| e.into_send_error(method, self.pace_ms()))
    }
}

#[async_trait]
impl ChannelMessageAdapter for SynologyAdapter {
    fn channel(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> &MessageCapabilities {
        &self.capabilities
    }

    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let content = content_of(unit)?;
        let target = &ctx.message.target;
        let key = ctx.unit_key(unit);
        let (via, raw) = match target.kind {
            TargetKind::Direct => {
                let token = self.bot_token.as_ref().ok_or_else(|| {
                    SendError::before_io(
                        DeliveryFailureKind::Permission,
                        format!(
                            "Synology Chat channel {}: a DM needs the bot: set bot_token_env",
                            self.name
                        ),
                    )
                })?;
                let user_id = self.resolve(token, &target.id).await?;
                let mut payload = content.clone();
                payload["user_ids"] = json!([user_id]);
                self.post("bot", "chatbot", token, &payload).await?;
                (
                    "chatbot",
                    json!({ "via": "chatbot", "userId": user_id, "username": target.id }),
                )
            }
            _ => {
                let route = self.channels.get(&target.id).ok_or_else(|| {
                    SendError::before_io(
                        DeliveryFailureKind::NotFound,
                        format!(
                            "Synology Chat channel {}: no incoming webhook for Chat channel {} \
                             (add it to settings.channels with its incoming_token_env)",
                            self.name, target.id
                        ),
                    )
                })?;
                let payload = content;
                self.post(
                    &format!("channel:{}", target.id),
                    "incoming",
                    &route.incoming_token,
                    &payload,
                )
                .await?;
                (
                    "incoming",
                    json!({ "via": "incoming", "channelId": target.id }),
                )
            }
        };
        // Synology returns no post id: the unit's own key is the receipt.
        let mut part =
            MessageReceiptPart::new(format!("synology:{via}:{key}"), unit.kind, unit.index);
        part.raw = Some(raw);
        Ok(part)
    }

    /// Never called while `reconcileUnknownSend` is not declared; an engine that asks anyway
    /// is told the truth: Synology cannot say whether the post landed.
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        warn!(channel = %self.name, unit = %ctx.unit_key(unit), "a Synology Chat post's outcome is unknown and cannot be settled (no ids, no history): parked for an operator");
        Ok(Reconciliation::Undecidable)
    }
}
