//! Sending: one `POST /api/v1/message/text` per text unit into the chat the target names (its
//! chat guid: `iMessage;-;+15551234567`, `iMessage;+;chat123…`, `SMS;-;…`).
//!
//! - `tempGuid` is derived from the unit key, so every attempt of a unit (a retry, a send by
//!   recovery after a restart) carries the same one: while one is in flight the server refuses
//!   another with 400 "Message is already queued to be sent!", and the echo cache and the
//!   reconciliation recognise it.
//! - Before the request: the attempt is written to the [`SendJournal`] (durably, in the gateway's
//!   store) and the unit to
//!   the [`EchoCache`] (the seed's requirement: durable finals populate the sent-echo cache).
//! - The server answers only once the message's chat.db row exists (up to 2 minutes), with the
//!   serialized message: its real `guid` is the receipt.
//! - Failures: a 500 "Message Send Error" is a message iMessage could not send (its row stays
//!   on the Mac marked failed, nobody received it): a transient failure, sent again. A lost
//!   answer, a 504 (the server stopped waiting for the row: the message may still appear), a
//!   400 "already queued" (an earlier request of this very unit is still being sent) and any
//!   other 5xx may have sent it: unknown, settled by [`reconcile_unknown_send`](ImessageAdapter).
//! - Edits (`/message/:guid/edit`) and unsends (`/message/:guid/unsend`) exist only with the
//!   Private API, not for SMS chats, within Apple's windows ([`EDIT_WINDOW_MS`], [`MAX_EDITS`],
//!   [`UNSEND_WINDOW_MS`]); the capabilities declare them only when the settings say the server
//!   has the Private API. Previews (iMessage chats with the Private API only) spend at most
//!   four edits on updates and keep the fifth for the final in place; otherwise finals are
//!   plain sends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageLiveAdapter, Reconciliation, SendContext, SendError,
};
use clawgate_types::clock::Clock;
use clawgate_types::{
    ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, LiveCancelReason, LiveCapabilities,
    MessageCapabilities, MessagePartKind, MessageReceiptPart, RenderedMessageUnit,
    TextCapabilities,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::warn;

use crate::client::{BlueBubbles, CallError};
use crate::echoes::{CLOCK_SKEW_MS, EchoCache, normalise};
use crate::journal::{JournalError, SendJournal};

/// The longest text of one message this channel sends (iMessage documents no limit; longer
/// replies are chunked).
pub const MAX_TEXT_CHARS: u32 = 4_000;
/// A message can be edited this long after it was sent (Apple's rule, \[obs\]).
pub const EDIT_WINDOW_MS: u64 = 15 * 60 * 1000;
/// A message can be edited at most this many times.
pub const MAX_EDITS: u64 = 5;
/// A message can be unsent this long after it was sent.
pub const UNSEND_WINDOW_MS: u64 = 2 * 60 * 1000;
/// How many rows one reconciliation query reads at most.
const QUERY_LIMIT: u32 = 200;

/// The iMessage sender.
pub struct ImessageAdapter {
    name: String,
    api: BlueBubbles,
    journal: SendJournal,
    echoes: EchoCache,
    /// The gateway's clock.
    clock: Arc<dyn Clock>,
    private_api: bool,
    capabilities: MessageCapabilities,
    /// Edits made per message guid by this process (the server counts them too).
    edits: Mutex<HashMap<String, u64>>,
}

impl std::fmt::Debug for ImessageAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImessageAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("private_api", &self.private_api)
            .finish_non_exhaustive()
    }
}

/// What the channel can do: text chunked at [`MAX_TEXT_CHARS`]; edits and unsends only with
/// the Private API; unknown sends reconciled from the chat's own rows.
fn capabilities(private_api: bool) -> MessageCapabilities {
    let capabilities = MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(false)
                .with_retry_after(false)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(true)
                .with_duplicates_acceptable(false),
        );
    if private_api {
        capabilities.with_live(
            LiveCapabilities::default()
                .with_edit(true)
                .with_delete(true)
                .with_max_edits_per_second(1),
        )
    } else {
        capabilities
    }
}

/// `clock`'s now, as the unsigned milliseconds BlueBubbles times are in.
pub(crate) fn now_ms(clock: &dyn Clock) -> u64 {
    u64::try_from(clock.now_ms()).unwrap_or(0)
}

/// A journal that cannot be read or written: settles nothing, sends nothing; tried again later.
fn journal_failed(error: JournalError) -> SendError {
    SendError::before_io(DeliveryFailureKind::Transient, error.to_string())
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

/// The `tempGuid` of a unit: stable across its attempts and restarts.
pub fn temp_guid_for(unit_key: &str) -> String {
    let digest = Sha256::digest(unit_key.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("clawgate-{hex}")
}

/// Whether a chat is an SMS (or RCS) chat: no edits, no unsends.
fn is_sms(chat_guid: &str) -> bool {
    !chat_guid.starts_with("iMessage;") && !chat_guid.starts_with("any;")
}

/// A failed call as a send failure of `what`.
fn send_error(what: &str, error: CallError) -> SendError {
    let text = format!("BlueBubbles {what}: {}", error.describe());
    match &error {
        CallError::Unreachable(_) => SendError::before_io(DeliveryFailureKind::Transient, text),
        CallError::Lost(_) => SendError::after_io(DeliveryFailureKind::Unknown, text),
        _ if error.already_queued() => SendError::after_io(
            DeliveryFailureKind::Unknown,
            format!("{text}: an earlier request of this unit is still being sent"),
        ),
        CallError::Refused {
            status, message, ..
        } => {
            let code = status.to_string();
            let error = match *status {
                500 if message == "Message Send Error" => SendError::before_io(
                    DeliveryFailureKind::Transient,
                    format!(
                        "{text}: iMessage could not send it (the failed message stays on the \
                         Mac, marked failed; nobody received it)"
                    ),
                ),
                401 => SendError::before_io(
                    DeliveryFailureKind::Auth,
                    format!("{text}: check the server password (password_env)"),
                ),
                403 => SendError::before_io(DeliveryFailureKind::Permission, text),
                404 => SendError::before_io(DeliveryFailureKind::NotFound, text),
                429 => SendError::before_io(DeliveryFailureKind::RateLimit, text),
                400 | 413 | 422 => SendError::before_io(DeliveryFailureKind::InvalidPayload, text),
                // 504: the server stopped waiting for the row; the message may still appear.
                _ => SendError::after_io(DeliveryFailureKind::Unknown, text),
            };
            error.with_platform_code(code)
        }
    }
}

/// An edit or unsend failure: nothing new can appear, so a lost answer is only unknown
/// in the sense that the change may have been made.
fn change_error(what: &str, error: CallError) -> SendError {
    match error {
        CallError::Refused { status: 500, .. } => SendError::before_io(
            DeliveryFailureKind::InvalidPayload,
            format!("BlueBubbles {what}: {}", error.describe()),
        )
        .with_platform_code("500"),
        other => send_error(what, other),
    }
}

fn field_u64(raw: Option<&Value>, key: &str) -> Option<u64> {
    raw?.get(key)?.as_u64()
}

impl ImessageAdapter {
    pub(crate) fn new(
        name: &str,
        api: BlueBubbles,
        journal: SendJournal,
        echoes: EchoCache,
        clock: Arc<dyn Clock>,
        private_api: bool,
    ) -> ImessageAdapter {
        ImessageAdapter {
            name: name.to_owned(),
            api,
            journal,
            echoes,
            clock,
            private_api,
            capabilities: capabilities(private_api),
            edits: Mutex::new(HashMap::new()),
        }
    }

    /// Edits made to `part`'s message so far.
    fn edits_of(&self, part: &MessageReceiptPart) -> u64 {
        let known = self
            .edits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&part.platform_message_id)
            .copied()
            .unwrap_or(0);
        known.max(field_u64(part.raw.as_ref(), "edits").unwrap_or(0))
    }

    fn now(&self) -> u64 {
        now_ms(self.clock.as_ref())
    }

    fn method(&self) -> &'static str {
        if self.private_api {
            "private-api"
        } else {
            "apple-script"
        }
    }

    /// Edits and unsends (`what`, `done`: "edit", "edited") need the Private API and an
    /// iMessage chat.
    fn check_private(&self, chat: &str, what: &str, done: &str) -> Result<(), SendError> {
        if !self.private_api {
            return Err(SendError::unsupported(&self.name, what));
        }
        if is_sms(chat) {
            return Err(invalid(format!("an SMS message cannot be {done}")));
        }
        Ok(())
    }
}

fn text_of(unit: &RenderedMessageUnit) -> Result<&str, SendError> {
    if !matches!(unit.kind, MessagePartKind::Text | MessagePartKind::Preview) {
        return Err(invalid("this iMessage channel sends text only"));
    }
    let text = unit
        .payload
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("an iMessage text unit needs a `text` string"))?;
    if text.trim().is_empty() {
        return Err(invalid("BlueBubbles refuses an empty message"));
    }
    if text.chars().count() > MAX_TEXT_CHARS as usize {
        return Err(invalid(format!(
            "one message of this channel holds at most {MAX_TEXT_CHARS} characters"
        )));
    }
    Ok(text)
}

#[async_trait]
impl ChannelMessageAdapter for ImessageAdapter {
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
        let text = text_of(unit)?;
        let chat = ctx.message.target.id.as_str();
        let key = ctx.unit_key(unit);
        let now = self.now();
        // Before any I/O: a key without this record provably never went out.
        let attempt = self
            .journal
            .attempted(&key, chat, text, &temp_guid_for(&key), now)
            .await
            .map_err(journal_failed)?;
        // The echo of this send may come back before its answer does.
        self.echoes
            .remember(chat, text, &attempt.temp_guid, now, now);
        let sent = self
            .api
            .send_text(chat, &attempt.temp_guid, text, self.method())
            .await
            .map_err(|e| send_error("send", e))?;
        let guid = sent
            .get("guid")
            .and_then(Value::as_str)
            .filter(|g| !g.is_empty())
            .ok_or_else(|| {
                SendError::after_io(
                    DeliveryFailureKind::Unknown,
                    "BlueBubbles answered the send without the message's guid",
                )
            })?;
        self.echoes.learn_guid(&attempt.temp_guid, guid);
        if let Err(error) = self.journal.answered(&key, guid, &attempt.temp_guid).await {
            // The engine records the receipt itself; the journal only backs reconciliation.
            warn!(channel = %self.name, %error, "the answer was not written to the send journal");
        }
        let mut part = MessageReceiptPart::new(guid, unit.kind, unit.index);
        part.raw = Some(json!({
            "chatGuid": chat,
            "tempGuid": attempt.temp_guid,
            "dateCreated": sent.get("dateCreated").and_then(Value::as_u64).unwrap_or(now),
            "edits": 0,
        }));
        Ok(part)
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        self.check_private(&ctx.message.target.id, "edit", "edited")?;
        let raw = part.raw.as_ref();
        let edits = self.edits_of(part);
        if edits >= MAX_EDITS {
            return Err(invalid(format!(
                "an iMessage can be edited at most {MAX_EDITS} times"
            )));
        }
        if let Some(sent) = field_u64(raw, "dateCreated")
            && self.now().saturating_sub(sent) > EDIT_WINDOW_MS
        {
            return Err(invalid("an iMessage can be edited only within 15 minutes"));
        }
        self.api
            .edit(&part.platform_message_id, text)
            .await
            .map_err(|e| change_error("edit", e))?;
        self.edits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(part.platform_message_id.clone(), edits + 1);
        let mut edited = part.clone();
        let mut raw = raw.cloned().unwrap_or_else(|| json!({}));
        raw["edits"] = json!(edits + 1);
        edited.raw = Some(raw);
        Ok(edited)
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        self.check_private(&ctx.message.target.id, "unsend", "unsent")?;
        if let Some(sent) = field_u64(part.raw.as_ref(), "dateCreated")
            && self.now().saturating_sub(sent) > UNSEND_WINDOW_MS
        {
            return Err(invalid("an iMessage can be unsent only within 2 minutes"));
        }
        self.api
            .unsend(&part.platform_message_id)
            .await
            .map(|_| ())
            .map_err(|e| change_error("unsend", e))
    }

    /// Settled from the send journal (read from the store: another gateway may have made the
    /// attempt) and the chat's own rows:
    ///
    /// - no attempt for the unit key: the request never left (the attempt is durable before
    ///   it is made) → `NotSent`, and resending is safe;
    /// - an answer or an earlier claim recorded → `Sent` with that guid;
    /// - otherwise `POST /message/query` over the chat from the attempt's time (less
    ///   [`CLOCK_SKEW_MS`]): the oldest row that is ours (`isFromMe`), not failed (`error` 0),
    ///   not given to another send, and carries our `tempGuid` or, failing that, the same
    ///   normalised text → claimed durably (a row another unit claimed first, on any gateway,
    ///   is passed over), then `Sent` with its guid;
    /// - no such row → `Unresolved`: the server may still be waiting for the row (it waits up
    ///   to 2 minutes), or the request may never have reached it, and nothing here can tell
    ///   which. The engine asks again within its reconciliation window, then parks it for an
    ///   operator. It is never sent twice: only `NotSent` leads to a resend, and that needs
    ///   proof that no request left.
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let key = ctx.unit_key(unit);
        let Some(attempt) = self.journal.attempt(&key).await.map_err(journal_failed)? else {
            return Ok(Reconciliation::NotSent);
        };
        let part = |guid: &str| {
            let mut part = MessageReceiptPart::new(guid, unit.kind, unit.index);
            part.raw = Some(json!({
                "chatGuid": attempt.chat,
                "tempGuid": attempt.temp_guid,
                "dateCreated": attempt.at_ms,
                "edits": 0,
            }));
            Reconciliation::Sent(Box::new(part))
        };
        if let Some(guid) = &attempt.guid {
            return Ok(part(guid.as_str()));
        }
        let rows = self
            .api
            .messages_since(
                &attempt.chat,
                attempt.at_ms.saturating_sub(CLOCK_SKEW_MS),
                QUERY_LIMIT,
            )
            .await
            .map_err(|e| {
                // A failed lookup settles nothing: asked again later.
                SendError::before_io(
                    DeliveryFailureKind::Transient,
                    format!("BlueBubbles message query: {}", e.describe()),
                )
            })?;
        let ours = |row: &&Value| {
            row.get("isFromMe").and_then(Value::as_bool) == Some(true)
                && row.get("error").and_then(Value::as_i64).unwrap_or(0) == 0
        };
        let guid_of = |row: &Value| {
            row.get("guid")
                .and_then(Value::as_str)
                .filter(|g| !g.is_empty())
                .map(str::to_owned)
        };
        let wanted = normalise(&attempt.text);
        // Rows carrying our tempGuid first, then rows with the same words; oldest first.
        let by_temp_guid = rows.iter().filter(ours).filter(|row| {
            row.get("tempGuid").and_then(Value::as_str) == Some(attempt.temp_guid.as_str())
        });
        let by_text = rows.iter().filter(ours).filter(|row| {
            row.get("text")
                .and_then(Value::as_str)
                .is_some_and(|t| normalise(t) == wanted)
        });
        for guid in by_temp_guid.chain(by_text).filter_map(guid_of) {
            if self
                .journal
                .claim(&key, &guid, &attempt.temp_guid)
                .await
                .map_err(journal_failed)?
            {
                self.echoes.learn_guid(&attempt.temp_guid, &guid);
                return Ok(part(&guid));
            }
        }
        Ok(Reconciliation::Unresolved)
    }

    /// Previews only where edits exist: the Private API, an iMessage chat.
    fn previews(&self, message: &ChannelMessage) -> bool {
        self.private_api && !is_sms(&message.target.id)
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        self.private_api.then_some(self as &dyn MessageLiveAdapter)
    }
}

/// Previews by edit, within Apple's budget: an update is an edit only while it leaves one of
/// the five for the final; later updates wait for the final (no request). A preview that can
/// no longer be edited (the budget or the 15 minutes spent) is not finalized in place: the
/// engine sends the final fresh and unsends the preview (which works within 2 minutes).
#[async_trait]
impl MessageLiveAdapter for ImessageAdapter {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.send_unit(ctx, unit).await
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        if self.edits_of(preview) + 1 >= MAX_EDITS {
            // The last edit is the final's.
            return Ok(preview.clone());
        }
        self.edit(ctx, preview, unit).await
    }

    fn can_finalize_in_place(&self, preview: &MessageReceiptPart) -> bool {
        self.edits_of(preview) < MAX_EDITS
            && field_u64(preview.raw.as_ref(), "dateCreated")
                .is_none_or(|sent| self.now().saturating_sub(sent) <= EDIT_WINDOW_MS)
    }

    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.edit(ctx, preview, final_unit).await
    }

    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        _reason: LiveCancelReason,
    ) -> Result<(), SendError> {
        self.delete(ctx, preview).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawgate_channel_sdk::SideEffect;

    fn refused(status: u16, message: &str, detail: Option<&str>) -> CallError {
        CallError::Refused {
            status,
            message: message.into(),
            kind: None,
            detail: detail.map(str::to_owned),
            data: Value::Null,
        }
    }

    #[test]
    fn answers_are_classified_and_only_definite_ones_have_no_side_effect() {
        use DeliveryFailureKind::*;
        let cases = [
            (
                refused(500, "Message Send Error", None),
                Transient,
                SideEffect::None,
            ),
            (refused(401, "Unauthorized", None), Auth, SideEffect::None),
            (
                refused(400, "Bad Request", Some("chatGuid is required")),
                InvalidPayload,
                SideEffect::None,
            ),
            (refused(404, "Not Found", None), NotFound, SideEffect::None),
            (
                refused(
                    400,
                    "Bad Request",
                    Some("Message is already queued to be sent! (Temp GUID: x)"),
                ),
                Unknown,
                SideEffect::Possible,
            ),
            (
                refused(504, "Gateway Timeout", None),
                Unknown,
                SideEffect::Possible,
            ),
            (
                refused(500, "Server Error", None),
                Unknown,
                SideEffect::Possible,
            ),
            (CallError::Lost("cut".into()), Unknown, SideEffect::Possible),
            (
                CallError::Unreachable("refused".into()),
                Transient,
                SideEffect::None,
            ),
        ];
        for (error, kind, effect) in cases {
            let what = format!("{error:?}");
            let error = send_error("send", error);
            assert_eq!((error.kind, error.side_effect), (kind, effect), "{what}");
        }
    }

    #[test]
    fn temp_guids_are_stable_per_unit_and_distinct_between_units() {
        assert_eq!(temp_guid_for("k#0"), temp_guid_for("k#0"));
        assert_ne!(temp_guid_for("k#0"), temp_guid_for("k#1"));
        assert!(is_sms("SMS;-;+15550001111") && !is_sms("iMessage;-;+15550001111"));
    }
}
