//! Sending, in the account's mode.
//!
//! **Bot mode** — `POST /ocs/v2.php/apps/spreed/api/v1/bot/{token}/message`
//! `{message, referenceId}` with `X-Nextcloud-Talk-Bot-Random` (64 hex characters) and
//! `X-Nextcloud-Talk-Bot-Signature` = hex HMAC-SHA256(secret, random ‖ message text). Talk
//! answers 201 with no message id, and a bot can read no history, edit nothing and delete
//! nothing (platform-apis-wave2 §6.2). So the receipt of a unit is its `referenceId` (hex
//! SHA-256 of the unit's idempotency key, stored on the message in Talk), and a send whose answer
//! was lost cannot be settled: it is [`Reconciliation::Undecidable`] — parked for an operator,
//! never sent again blindly. Finals are plain sends, no previews.
//!
//! **User mode** — `POST /ocs/v2.php/apps/spreed/api/v1/chat/{token}` `{message, referenceId}`
//! with the user's app password; Talk answers 201 with the message, whose `id` is the receipt.
//! A lost answer is settled by reading the conversation's history backwards for the unit's
//! `referenceId` by this user: found is `Sent` with that message's id; absence is proven only by
//! history reaching back past the attempt's journaled start (less `clock_slack`; the journal is
//! in the gateway's store, so the attempt may be another gateway's), or the
//! conversation's beginning, once the attempt is older than the request timeout — else
//! `Unresolved` (asked again later). Live previews are the message edited in place
//! (`PUT …/chat/{token}/{id}`, allowed for 24 h) and deleted when abandoned (`DELETE`, 6 h).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, Reconciliation, Secret, SendContext, SendError, SideEffect,
};
use clawgate_types::clock::Clock;
use clawgate_types::{
    DeliveryCapabilities, DeliveryFailureKind, LiveCapabilities, MessageCapabilities,
    MessagePartKind, MessageReceiptPart, RenderedMessageUnit, TextCapabilities,
};
use reqwest::Method;
use serde_json::{Value, json};
use tracing::warn;

use crate::journal::Journal;
use crate::ocs::{SPREED, TalkApi};
use crate::receive::ChatMessage;
use crate::sign;

/// Talk's chat limit (`spreed.config.chat.max-length`): longer messages are refused with 413.
pub const MAX_MESSAGE_CHARS: u32 = 32_000;
/// How long after sending Talk lets a user edit a message.
pub const EDIT_WINDOW: Duration = Duration::from_secs(24 * 3_600);
/// How long after sending Talk lets a user delete a message.
pub const DELETE_WINDOW: Duration = Duration::from_secs(6 * 3_600);
/// History read per page when a lost answer is looked for (Talk's maximum `limit`).
const HISTORY_PAGE: u32 = 200;

/// Which Talk API the account speaks.
#[derive(Clone)]
pub(crate) enum Mode {
    /// A webhook bot with its shared secret.
    Bot { secret: Secret },
    /// A Talk user (app password in the client), its journal, and how far back a lost answer
    /// is looked for.
    User {
        user: String,
        journal: Arc<Journal>,
        clock_slack: Duration,
        history_pages: u32,
    },
}

/// The Talk sender.
pub struct TalkAdapter {
    name: String,
    api: TalkApi,
    mode: Mode,
    max_chars: u32,
    capabilities: MessageCapabilities,
    /// The gateway's clock (attempt times, the edit and delete windows).
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for TalkAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalkAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field(
                "mode",
                &match &self.mode {
                    Mode::Bot { .. } => "bot",
                    Mode::User { .. } => "user",
                },
            )
            .finish_non_exhaustive()
    }
}

/// What the channel can do in `mode`, as the engine and the conformance suite read it.
fn capabilities(mode: &Mode, max_chars: u32) -> MessageCapabilities {
    let text = TextCapabilities::default()
        .with_max_length(max_chars)
        .with_chunking(true);
    match mode {
        Mode::Bot { .. } => MessageCapabilities::default()
            .with_text(text)
            // No id back, no history, no edit: an unknown send stays unknown.
            .with_delivery(
                DeliveryCapabilities::default()
                    .with_idempotency_key(false)
                    .with_receipt_required(true)
                    .with_reconcile_unknown_send(false)
                    .with_duplicates_acceptable(false),
            ),
        Mode::User { .. } => MessageCapabilities::default()
            .with_text(text)
            // Edits within 24 h, deletes within 6 h (EDIT_WINDOW, DELETE_WINDOW): a preview
            // lives minutes.
            .with_live(
                LiveCapabilities::default()
                    .with_edit(true)
                    .with_delete(true)
                    .with_max_edits_per_second(1),
            )
            // referenceId is not enforced unique (no dedupe), but history shows it: a lost
            // answer is looked up.
            .with_delivery(
                DeliveryCapabilities::default()
                    .with_idempotency_key(false)
                    .with_receipt_required(true)
                    .with_reconcile_unknown_send(true)
                    .with_duplicates_acceptable(false),
            ),
    }
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

fn text_of(unit: &RenderedMessageUnit, max_chars: u32) -> Result<&str, SendError> {
    // A preview unit is text too (user mode shows it, then edits it into the final).
    if !matches!(unit.kind, MessagePartKind::Text | MessagePartKind::Preview) {
        return Err(invalid(
            "Nextcloud Talk: this channel sends text only (files are shared through Files, \
             which it does not use)",
        ));
    }
    let text = unit
        .payload
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a Talk unit needs a `text` string"))?;
    if text.trim().is_empty() {
        return Err(invalid("Nextcloud Talk refuses an empty message"));
    }
    if text.chars().count() > max_chars as usize {
        return Err(invalid(format!(
            "a Talk message holds at most {max_chars} characters"
        )));
    }
    Ok(text)
}

/// The receipt part of a chat message the server returned.
fn chat_part(message: &ChatMessage, unit: &RenderedMessageUnit) -> MessageReceiptPart {
    let mut part = MessageReceiptPart::new(message.id.to_string(), unit.kind, unit.index);
    part.raw = Some(json!({
        "mode": "user",
        "token": message.token,
        "referenceId": message.reference_id,
        "timestamp": message.timestamp,
    }));
    part
}

impl TalkAdapter {
    pub(crate) fn new(
        name: &str,
        api: TalkApi,
        mode: Mode,
        max_chars: u32,
        clock: Arc<dyn Clock>,
    ) -> TalkAdapter {
        let max_chars = max_chars.clamp(1, MAX_MESSAGE_CHARS);
        TalkAdapter {
            name: name.to_owned(),
            capabilities: capabilities(&mode, max_chars),
            api,
            mode,
            max_chars,
            clock,
        }
    }

    fn chat_path(token: &str) -> String {
        format!("{SPREED}/v1/chat/{token}")
    }

    fn user_only(&self, what: &str) -> Result<(&str, u32, Duration), SendError> {
        match &self.mode {
            Mode::User {
                user,
                history_pages,
                clock_slack,
                ..
            } => Ok((user, *history_pages, *clock_slack)),
            Mode::Bot { .. } => Err(SendError::before_io(
                DeliveryFailureKind::InvalidPayload,
                format!("Nextcloud Talk bots cannot {what} (the bot API has no such call)"),
            )),
        }
    }

    async fn send_bot(
        &self,
        secret: &Secret,
        token: &str,
        text: &str,
        reference: &str,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let random = sign::random(reference);
        let signature = sign::signature(secret.expose(), &random, text.as_bytes());
        self.api
            .call(
                Method::POST,
                &format!("{SPREED}/v1/bot/{token}/message"),
                &[],
                Some(&json!({ "message": text, "referenceId": reference })),
                &[
                    ("X-Nextcloud-Talk-Bot-Random", random),
                    ("X-Nextcloud-Talk-Bot-Signature", signature),
                ],
                None,
            )
            .await
            .map_err(|e| e.into_send_error("bot message"))?;
        // 201 and no id: the referenceId is the receipt.
        let mut part = MessageReceiptPart::new(format!("ref:{reference}"), unit.kind, unit.index);
        part.raw = Some(json!({ "mode": "bot", "token": token, "referenceId": reference }));
        Ok(part)
    }

    async fn send_user(
        &self,
        journal: &Journal,
        token: &str,
        text: &str,
        reference: &str,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        // Journaled before any request: no entry means the unit never left.
        let now = self.clock.now_ms();
        journal.record(reference, token, now).await.map_err(|e| {
            SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("Nextcloud Talk: the attempt journal cannot be written: {e}"),
            )
        })?;
        let answer = self
            .api
            .call(
                Method::POST,
                &Self::chat_path(token),
                &[],
                Some(&json!({ "message": text, "referenceId": reference })),
                &[],
                None,
            )
            .await
            .map_err(|e| e.into_send_error("chat message"))?;
        let message: ChatMessage = serde_json::from_value(answer.data).map_err(|e| {
            SendError::after_io(
                DeliveryFailureKind::Unknown,
                format!("Nextcloud Talk answered the send without a message ({e})"),
            )
        })?;
        Ok(chat_part(&message, unit))
    }

    /// Reads the conversation's history backwards for `reference` by `user`.
    async fn look_up(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let Mode::User {
            user,
            journal,
            clock_slack,
            history_pages,
        } = &self.mode
        else {
            return Ok(Reconciliation::Undecidable);
        };
        let reference = sign::reference_id(&ctx.unit_key(unit));
        // From the store: the attempt may be another gateway's.
        let attempt = journal.get(&reference).await.map_err(|e| {
            SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("Nextcloud Talk: the attempt journal cannot be read: {e}"),
            )
        })?;
        let Some(attempt) = attempt else {
            // The journal entry is written before the request: none, no request.
            return Ok(Reconciliation::NotSent);
        };
        let token = &ctx.message.target.id;
        let slack = i64::try_from(clock_slack.as_millis()).unwrap_or(i64::MAX);
        // Only once the request cannot still be in the server's hands does absence count.
        let settled = self.clock.now_ms() - attempt.at_ms
            > i64::try_from(self.api.timeout().as_millis()).unwrap_or(i64::MAX);
        let absent = if settled {
            Reconciliation::NotSent
        } else {
            Reconciliation::Unresolved
        };
        let mut before: Option<i64> = None;
        for _ in 0..*history_pages {
            let mut query = vec![
                ("lookIntoFuture", "0".to_owned()),
                ("limit", HISTORY_PAGE.to_string()),
                ("setReadMarker", "0".to_owned()),
            ];
            if let Some(before) = before {
                query.push(("lastKnownMessageId", before.to_string()));
            }
            let answer = self
                .api
                .call(
                    Method::GET,
                    &Self::chat_path(token),
                    &query,
                    None,
                    &[],
                    None,
                )
                .await
                .map_err(|e| {
                    let mut error = e.into_send_error("history read");
                    // A read posts nothing.
                    error.side_effect = SideEffect::None;
                    if error.kind == DeliveryFailureKind::Unknown {
                        error.kind = DeliveryFailureKind::Transient;
                    }
                    error
                })?;
            let messages: Vec<ChatMessage> = if answer.status == 304 {
                Vec::new()
            } else {
                serde_json::from_value(answer.data).map_err(|e| {
                    SendError::before_io(
                        DeliveryFailureKind::Transient,
                        format!("Nextcloud Talk history is not a message list: {e}"),
                    )
                })?
            };
            if let Some(found) = messages.iter().find(|m| {
                m.reference_id.as_deref() == Some(reference.as_str())
                    && m.actor_type == "users"
                    && m.actor_id == *user
            }) {
                return Ok(Reconciliation::Sent(Box::new(chat_part(found, unit))));
            }
            let Some(oldest) = messages.iter().min_by_key(|m| m.id) else {
                // The beginning of the conversation.
                return Ok(absent);
            };
            if oldest.timestamp.saturating_mul(1_000) < attempt.at_ms - slack {
                // History reaches back past the attempt's start.
                return Ok(absent);
            }
            if messages.len() < HISTORY_PAGE as usize {
                return Ok(absent);
            }
            before = Some(answer.last_given.unwrap_or(oldest.id).min(oldest.id));
        }
        warn!(channel = %self.name, "a lost Talk send was not found within the history read; asked again later");
        Ok(Reconciliation::Unresolved)
    }

    fn message_id(part: &MessageReceiptPart) -> Result<i64, SendError> {
        part.platform_message_id
            .parse()
            .map_err(|_| invalid("not a Talk chat message id (bot receipts cannot be edited)"))
    }

    /// Refuses, before any request, a change Talk would refuse for the message's age.
    fn within(
        &self,
        part: &MessageReceiptPart,
        window: Duration,
        what: &str,
    ) -> Result<(), SendError> {
        let sent_s = part
            .raw
            .as_ref()
            .and_then(|r| r.get("timestamp"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let age_ms = self.clock.now_ms() - sent_s.saturating_mul(1_000);
        if sent_s > 0 && age_ms > i64::try_from(window.as_millis()).unwrap_or(i64::MAX) {
            return Err(SendError::before_io(
                DeliveryFailureKind::InvalidPayload,
                format!(
                    "Nextcloud Talk allows {what} for {} h after sending; this message is older",
                    window.as_secs() / 3_600
                ),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl ChannelMessageAdapter for TalkAdapter {
    fn channel(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> &MessageCapabilities {
        &self.capabilities
    }

    /// A bot cannot edit or delete: a preview would stay behind as a message of its own, so a
    /// bot's reply is sent once, complete. A user previews by editing.
    fn previews(&self, _message: &clawgate_types::ChannelMessage) -> bool {
        matches!(self.mode, Mode::User { .. })
    }

    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit, self.max_chars)?;
        let token = &ctx.message.target.id;
        if token.is_empty() {
            return Err(invalid("a Talk target is a conversation token"));
        }
        let reference = sign::reference_id(&ctx.unit_key(unit));
        match &self.mode {
            Mode::Bot { secret } => self.send_bot(secret, token, text, &reference, unit).await,
            Mode::User { journal, .. } => {
                self.send_user(journal, token, text, &reference, unit).await
            }
        }
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.user_only("edit messages")?;
        let text = text_of(unit, self.max_chars)?;
        let id = Self::message_id(part)?;
        self.within(part, EDIT_WINDOW, "edits")?;
        let token = &ctx.message.target.id;
        self.api
            .call(
                Method::PUT,
                &format!("{}/{id}", Self::chat_path(token)),
                &[],
                Some(&json!({ "message": text })),
                &[],
                None,
            )
            .await
            .map_err(|e| e.into_send_error("edit"))?;
        Ok(part.clone())
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        self.user_only("delete messages")?;
        let id = Self::message_id(part)?;
        self.within(part, DELETE_WINDOW, "deletes")?;
        let token = &ctx.message.target.id;
        self.api
            .call(
                Method::DELETE,
                &format!("{}/{id}", Self::chat_path(token)),
                &[],
                None,
                &[],
                None,
            )
            .await
            .map_err(|e| e.into_send_error("delete"))?;
        Ok(())
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        if matches!(self.mode, Mode::Bot { .. }) {
            warn!(channel = %self.name, unit = %ctx.unit_key(unit), "a Talk bot message's outcome is unknown and cannot be settled (no id, no history for bots): parked for an operator");
            return Ok(Reconciliation::Undecidable);
        }
        let _ = self.user_only("read history")?;
        self.look_up(ctx, unit).await
    }
}
