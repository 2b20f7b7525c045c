//! Sending: a DM is a poke of the `chat` agent (mark `chat-dm-action`), a group channel post
//! or thread reply a poke of the `channels` agent (mark `channel-action-1`); the content is a
//! story rendered from the unit's text. A poke is sent only on its `ok` (the `PUT`'s 204 says
//! nothing), refused on its `err`.
//!
//! - **DMs**: the client chooses the writ id, `~author/<@ud of an @da>`. The `@da` comes from
//!   the durable intent — its UUID v7 id holds the creation time in milliseconds (the memo's
//!   `sent`), and 36 of its random bits plus the unit's index fill sub-millisecond bits — so a resend
//!   after a restart uses the same id. The simulator treats a second `add` with a known id as
//!   done already; that a real ship does the same is \[likely, unverified\]. A lost answer is
//!   settled by scrying the DM for that id: there → `Sent`; absent once the settle window
//!   after `sent` has passed → `NotSent` (Eyre runs a PUT's pokes before answering it, so an
//!   absent writ was not taken); absent before → `Unresolved`.
//! - **Group posts** (nest `chat/~host/name`; a thread reply when the target has a
//!   `thread_id`, the parent post's `@ud` id): the host assigns the post id, so after `ok` the
//!   channel is scried for our post (author, `sent` and text) to get it, and a lost answer is
//!   settled the same way (\[unverified\] scry paths; a post pushed out of the newest
//!   [`SCAN_POSTS`] counts as absent).
//! - A thread reply that landed records its thread as one we take part in
//!   ([`ParticipatedThreads`]), on the `ok`, on a recovery that finds it, and after the
//!   receipt's commit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageRenderAdapter, Reconciliation, SendContext, SendError,
    classify_http_status,
};
use clawgate_types::clock::Clock;
use clawgate_types::{
    DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities, MessagePartKind,
    MessageReceipt, MessageReceiptPart, RenderedMessageUnit, TargetKind, TextCapabilities,
};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::airlock::{Airlock, PokeError, PokeOutcome};
use crate::aura::{da_from_unix_ms, format_ud, parse_ud, ship, unix_ms_from_da};
use crate::eyre::{Eyre, EyreError};
use crate::render::TlonRenderer;
use crate::story;
use crate::threads::ParticipatedThreads;

/// The longest text of one post this channel sends; longer replies are chunked. Tlon
/// documents no limit (\[unverified\]); its clients send posts of this size.
pub const MAX_TEXT_CHARS: u32 = 5_000;

/// How many of a channel's newest posts a settle scry looks through.
pub const SCAN_POSTS: u32 = 100;

/// What the channel can do.
pub(crate) fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(true)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(true)
                .with_duplicates_acceptable(false),
        )
}

/// Where a unit goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    /// A DM with `ship`.
    Dm { ship: String },
    /// A post in channel `nest`, in thread `parent` when set.
    Post {
        nest: String,
        parent: Option<String>,
    },
}

/// The tuning of a [`TlonAdapter`].
#[derive(Debug, Clone)]
pub struct SendTuning {
    /// One HTTP call's timeout.
    pub request_timeout: Duration,
    /// How long a poke's result may take on the event stream.
    pub poke_timeout: Duration,
    /// How long after a unit's `sent` time an absent message counts as never sent.
    pub settle_window: Duration,
}

impl Default for SendTuning {
    fn default() -> SendTuning {
        SendTuning {
            request_timeout: Duration::from_secs(10),
            poke_timeout: Duration::from_secs(15),
            settle_window: Duration::from_secs(30),
        }
    }
}

/// The Tlon sender.
pub struct TlonAdapter {
    name: String,
    our: String,
    eyre: Arc<Eyre>,
    airlock: Airlock,
    capabilities: MessageCapabilities,
    renderer: TlonRenderer,
    threads: Arc<ParticipatedThreads>,
    tuning: SendTuning,
    clock: Arc<dyn Clock>,
    /// Unit key → `sent` of units sent outside a durable intent (no UUID v7 to derive it from).
    direct_sent: Mutex<HashMap<String, u64>>,
    /// The last `sent` given to such a unit.
    last_direct: Mutex<u64>,
}

impl std::fmt::Debug for TlonAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlonAdapter")
            .field("name", &self.name)
            .field("our", &self.our)
            .field("eyre", &self.eyre)
            .finish_non_exhaustive()
    }
}

/// The creation time (ms) and 36 random bits (`rand_a` and the first 24 bits of `rand_b`'s
/// hex digits) of a UUID v7, if `id` is one.
fn uuid_v7(id: &str) -> Option<(u64, u64)> {
    let hex: String = id.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) || &hex[12..13] != "7" {
        return None;
    }
    let ms = u64::from_str_radix(&hex[..12], 16).ok()?;
    let rand_a = u64::from_str_radix(&hex[13..16], 16).ok()?;
    let rand_b = u64::from_str_radix(&hex[18..24], 16).ok()?;
    Some((ms, rand_a << 24 | rand_b))
}

/// Where a writ id's random part sits in its `@da`: above the unit index (16 bits), and the
/// whole of it (52 bits) below half a millisecond (2⁵³), so the `@da` still reads as `sent`.
const RAND_SHIFT: u32 = 16;

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

fn text_of(unit: &RenderedMessageUnit) -> Result<&str, SendError> {
    if unit.kind != MessagePartKind::Text {
        return Err(invalid("this Tlon channel sends text only"));
    }
    let text = unit
        .payload
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a Tlon unit needs a `text` string"))?;
    if text.trim().is_empty() {
        return Err(invalid("Tlon does not take an empty post"));
    }
    if text.chars().count() > MAX_TEXT_CHARS as usize {
        return Err(invalid(format!(
            "a Tlon post holds at most {MAX_TEXT_CHARS} characters here"
        )));
    }
    Ok(text)
}

fn eyre_send_error(error: EyreError) -> SendError {
    match error {
        EyreError::LoginRefused { .. } => {
            SendError::before_io(DeliveryFailureKind::Auth, error.to_string())
        }
        EyreError::Refused { status, .. } => {
            SendError::before_io(classify_http_status(status), error.to_string())
                .with_platform_code(status.to_string())
        }
        EyreError::Unreachable { .. } | EyreError::Reaped { .. } => {
            SendError::before_io(DeliveryFailureKind::Transient, error.to_string())
        }
        EyreError::Lost { .. } | EyreError::Malformed { .. } => {
            SendError::after_io(DeliveryFailureKind::Unknown, error.to_string())
        }
    }
}

/// A read failed: nothing was posted by it, so it is never an unknown outcome.
fn read_error(error: EyreError) -> SendError {
    let mut error = eyre_send_error(error);
    error.side_effect = clawgate_channel_sdk::SideEffect::None;
    if error.kind == DeliveryFailureKind::Unknown {
        error.kind = DeliveryFailureKind::Transient;
    }
    error
}

impl TlonAdapter {
    /// The sender of channel `name` for ship `our`.
    pub(crate) fn new(
        name: &str,
        our: &str,
        eyre: Arc<Eyre>,
        renderer: TlonRenderer,
        threads: Arc<ParticipatedThreads>,
        tuning: SendTuning,
        clock: Arc<dyn Clock>,
    ) -> TlonAdapter {
        let our = ship(our);
        TlonAdapter {
            airlock: Airlock::new(
                eyre.clone(),
                &our,
                &format!(
                    "{}-send",
                    name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
                ),
                tuning.request_timeout,
                tuning.poke_timeout,
                clock.clone(),
            ),
            name: name.to_owned(),
            our,
            eyre,
            capabilities: capabilities(),
            renderer,
            threads,
            tuning,
            clock,
            direct_sent: Mutex::new(HashMap::new()),
            last_direct: Mutex::new(0),
        }
    }

    /// Our ship.
    pub fn our(&self) -> &str {
        &self.our
    }

    /// The participated threads this sender records.
    pub fn threads(&self) -> &Arc<ParticipatedThreads> {
        &self.threads
    }

    fn route(&self, ctx: &SendContext) -> Result<Route, SendError> {
        let target = &ctx.message.target;
        match target.kind {
            TargetKind::Direct => {
                let to = ship(&target.id);
                if to.len() < 2 || to[1..].contains(|c: char| !(c.is_ascii_lowercase() || c == '-'))
                {
                    return Err(invalid(format!("{:?} is not a ship name", target.id)));
                }
                Ok(Route::Dm { ship: to })
            }
            _ => {
                let nest = target.id.clone();
                let mut parts = nest.splitn(3, '/');
                let (Some(kind), Some(host), Some(name)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    return Err(invalid(format!(
                        "{nest:?} is not a channel nest (chat/~host/name)"
                    )));
                };
                if kind != "chat" || !host.starts_with('~') || name.is_empty() {
                    return Err(invalid(format!(
                        "{nest:?} is not a chat channel nest (chat/~host/name)"
                    )));
                }
                let parent = target.thread_id.clone().filter(|t| parse_ud(t).is_some());
                Ok(Route::Post { nest, parent })
            }
        }
    }

    /// The unit's `sent` (ms) and `@da`: from the durable intent's UUID v7 when there is one,
    /// else the time of this process's first attempt.
    fn sent(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        first_attempt: bool,
    ) -> Option<(u64, u128)> {
        if let Some((ms, rand)) = ctx.intent_id.as_ref().and_then(|id| uuid_v7(id.as_str())) {
            let sent = ms + u64::from(unit.index);
            let da = da_from_unix_ms(sent)
                + (u128::from(rand) << RAND_SHIFT)
                + u128::from(unit.index & 0xffff);
            return Some((sent, da));
        }
        let key = ctx.unit_key(unit);
        let mut direct = self
            .direct_sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sent = match direct.get(&key) {
            Some(sent) => *sent,
            None if first_attempt => {
                // Distinct per unit of this process: two units of one millisecond would
                // otherwise share a writ id, and the second would be taken as the first.
                let mut last = self
                    .last_direct
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let sent = self.now_ms().max(*last + 1);
                *last = sent;
                direct.insert(key, sent);
                sent
            }
            None => return None,
        };
        Some((sent, da_from_unix_ms(sent) + u128::from(unit.index)))
    }

    fn writ_id(&self, da: u128) -> String {
        format!("{}/{}", self.our, format_ud(da))
    }

    /// Now by the gateway's clock (ms; 0 for a clock before 1970).
    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.now_ms()).unwrap_or(0)
    }

    async fn record_thread(&self, nest: &str, parent: &str) {
        match self.threads.record(nest, parent).await {
            Ok(true) => {
                info!(channel = %self.name, %nest, %parent, "now taking part in this thread")
            }
            Ok(false) => {}
            Err(error) => {
                warn!(channel = %self.name, %nest, %parent, %error, "could not record the participated thread")
            }
        }
    }

    async fn poke(&self, app: &str, mark: &str, body: Value) -> Result<(), SendError> {
        match self.airlock.poke(app, mark, body).await {
            Ok(PokeOutcome::Done) => Ok(()),
            Ok(PokeOutcome::Refused(err)) => {
                let kind = if err.contains("permission") || err.contains("not allowed") {
                    DeliveryFailureKind::Permission
                } else {
                    DeliveryFailureKind::InvalidPayload
                };
                Err(SendError::before_io(
                    kind,
                    format!("the ship's {app} agent refused the poke ({mark}): {err}"),
                )
                .with_platform_code("poke-nack"))
            }
            Err(PokeError::NotSent(error)) => Err(eyre_send_error(error)),
            Err(PokeError::Unknown(reason)) => Err(SendError::after_io(
                DeliveryFailureKind::Unknown,
                format!("a poke of the ship's {app} agent has no known outcome: {reason}"),
            )),
        }
    }

    /// Our post in `nest` (in thread `parent`) with `sent` and `text`, if the ship has it.
    async fn find_post(
        &self,
        nest: &str,
        parent: Option<&str>,
        sent: u64,
        text: &str,
    ) -> Result<Option<String>, SendError> {
        let ours = |essay: &Value| {
            essay
                .get("author")
                .and_then(Value::as_str)
                .map(ship)
                .as_deref()
                == Some(self.our.as_str())
                && essay.get("sent").and_then(Value::as_u64) == Some(sent)
                && essay.get("content").and_then(story::to_text).as_deref() == Some(text)
        };
        match parent {
            None => {
                let posts = self
                    .eyre
                    .scry(
                        "channels",
                        &format!("/v4/{nest}/posts/newest/{SCAN_POSTS}/outline"),
                        self.tuning.request_timeout,
                    )
                    .await
                    .map_err(read_error)?;
                let found = posts
                    .as_ref()
                    .and_then(|p| p.get("posts"))
                    .and_then(Value::as_object)
                    .and_then(|posts| {
                        posts.iter().find_map(|(id, post)| {
                            post.get("essay").filter(|e| ours(e)).map(|_| id.clone())
                        })
                    });
                Ok(found)
            }
            Some(parent) => {
                let post = self
                    .eyre
                    .scry(
                        "channels",
                        &format!("/v4/{nest}/posts/post/{parent}"),
                        self.tuning.request_timeout,
                    )
                    .await
                    .map_err(read_error)?;
                let found = post
                    .as_ref()
                    .and_then(|p| p.pointer("/seal/replies"))
                    .and_then(Value::as_object)
                    .and_then(|replies| {
                        replies.iter().find_map(|(id, reply)| {
                            reply
                                .get("memo")
                                .or_else(|| reply.get("reply-essay"))
                                .filter(|e| ours(e))
                                .map(|_| id.clone())
                        })
                    });
                Ok(found)
            }
        }
    }

    fn dm_part(
        &self,
        unit: &RenderedMessageUnit,
        to: &str,
        id: &str,
        sent: u64,
    ) -> MessageReceiptPart {
        let mut part = MessageReceiptPart::new(id.to_owned(), unit.kind, unit.index);
        part.raw = Some(json!({ "whom": to, "sent": sent }));
        part
    }

    fn post_part(
        &self,
        unit: &RenderedMessageUnit,
        nest: &str,
        parent: Option<&str>,
        id: &str,
        sent: u64,
    ) -> MessageReceiptPart {
        let mut part = MessageReceiptPart::new(id.to_owned(), unit.kind, unit.index);
        part.thread_id = parent.map(str::to_owned);
        part.raw = Some(json!({ "nest": nest, "parent": parent, "sent": sent }));
        part
    }

    fn settle_absent(&self, sent: u64, what: &str) -> Reconciliation {
        let age = self.now_ms().saturating_sub(sent);
        if u128::from(age) >= self.tuning.settle_window.as_millis() {
            info!(channel = %self.name, %what, "absent from the ship past the settle window: not sent");
            Reconciliation::NotSent
        } else {
            Reconciliation::Unresolved
        }
    }
}

#[async_trait]
impl ChannelMessageAdapter for TlonAdapter {
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
        let route = self.route(ctx)?;
        let (sent, da) = self
            .sent(ctx, unit, true)
            .ok_or_else(|| invalid("no sent time for this unit"))?;
        let content = story::from_text(text);
        match route {
            Route::Dm { ship: to } => {
                let id = self.writ_id(da);
                self.poke(
                    "chat",
                    "chat-dm-action",
                    json!({
                        "ship": to,
                        "diff": { "id": id, "delta": { "add": {
                            "memo": { "content": content, "author": self.our, "sent": sent },
                            "kind": null, "time": null,
                        }}},
                    }),
                )
                .await?;
                Ok(self.dm_part(unit, &to, &id, sent))
            }
            Route::Post { nest, parent } => {
                let action = match &parent {
                    None => json!({ "post": { "add": {
                        "content": content, "author": self.our, "sent": sent,
                        "kind": "/chat", "blob": null, "meta": null,
                    }}}),
                    Some(parent) => json!({ "post": { "reply": {
                        "id": parent,
                        "action": { "add": { "content": content, "author": self.our, "sent": sent } },
                    }}}),
                };
                self.poke(
                    "channels",
                    "channel-action-1",
                    json!({ "channel": { "nest": nest, "action": action } }),
                )
                .await?;
                if let Some(parent) = &parent {
                    self.record_thread(&nest, parent).await;
                }
                // The host chose the id: read it back (a failed read leaves a stand-in).
                let id = match self.find_post(&nest, parent.as_deref(), sent, text).await {
                    Ok(Some(id)) => id,
                    Ok(None) | Err(_) => {
                        warn!(channel = %self.name, %nest, "posted, but the post's id could not be read back; the receipt holds author/sent");
                        self.writ_id(da)
                    }
                };
                Ok(self.post_part(unit, &nest, parent.as_deref(), &id, sent))
            }
        }
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let text = text_of(unit)?;
        let route = self.route(ctx)?;
        let Some((sent, da)) = self.sent(ctx, unit, false) else {
            // Never poked by this process, and no durable intent another could have used.
            return Ok(Reconciliation::NotSent);
        };
        match route {
            Route::Dm { ship: to } => {
                let id = self.writ_id(da);
                let (author, ud) = id.split_once('/').unwrap_or_default();
                let found = self
                    .eyre
                    .scry(
                        "chat",
                        &format!("/dm/{to}/writs/writ/id/{author}/{ud}"),
                        self.tuning.request_timeout,
                    )
                    .await
                    .map_err(read_error)?;
                Ok(match found {
                    Some(_) => Reconciliation::Sent(Box::new(self.dm_part(unit, &to, &id, sent))),
                    None => self.settle_absent(sent, &id),
                })
            }
            Route::Post { nest, parent } => {
                match self.find_post(&nest, parent.as_deref(), sent, text).await? {
                    Some(id) => {
                        if let Some(parent) = &parent {
                            self.record_thread(&nest, parent).await;
                        }
                        Ok(Reconciliation::Sent(Box::new(self.post_part(
                            unit,
                            &nest,
                            parent.as_deref(),
                            &id,
                            sent,
                        ))))
                    }
                    None => Ok(self.settle_absent(sent, &nest)),
                }
            }
        }
    }

    async fn after_commit(&self, ctx: &SendContext, receipt: &MessageReceipt) {
        if let Ok(Route::Post {
            nest,
            parent: Some(parent),
        }) = self.route(ctx)
            && !receipt.parts.is_empty()
        {
            self.record_thread(&nest, &parent).await;
        }
    }

    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        Some(&self.renderer)
    }
}

/// The sub-millisecond-free `sent` of a writ id's `@da`, for tests and logs.
pub fn sent_of_writ_id(id: &str) -> Option<u64> {
    unix_ms_from_da(parse_ud(id.split_once('/')?.1)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_v7_ids_give_their_time() {
        let (ms, rand) = uuid_v7("0190a1b2-c3d4-7abc-8def-0123456789ab").expect("a v7 id");
        assert_eq!(ms, 0x0190_a1b2_c3d4);
        assert_eq!(rand, 0xabc_ef0123);
        assert!(
            u128::from(rand) << RAND_SHIFT < 1 << 53,
            "below half a millisecond"
        );
        assert_eq!(uuid_v7("0190a1b2-c3d4-4abc-8def-0123456789ab"), None, "v4");
        assert_eq!(uuid_v7("intent-1"), None);
    }
}
