//! Sending: one text message per unit, to a person (`/api/message/sms`) or a group
//! (`/api/group/sendmsg`). Zalo Web has no idempotency key, no edit and no lookup: finals are
//! plain durable sends. Each request carries a fresh `clientId`, recorded in the [`SendBook`]
//! before it goes out, and a send whose answer was lost is settled by the echo of that id on
//! the listener ([`ChannelMessageAdapter::reconcile_unknown_send`]).
//!
//! A taken-over session sends nothing (the other session owns the account now): sends fail
//! before any I/O with an `Auth` error saying what to do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{ChannelMessageAdapter, Reconciliation, SendContext, SendError};
use clawgate_types::{
    DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities, MessagePartKind,
    MessageReceiptPart, RenderedMessageUnit, TargetKind, TextCapabilities,
};
use serde_json::Value;
use tracing::warn;

use crate::account::Account;
use crate::book::{BookError, Evidence, SendBook};
use crate::client::{LoginError, ThreadKind};

/// Longest text of one message this channel sends (zca-js checks none; Zalo's own limit is
/// not published, and longer texts are split).
pub const MAX_TEXT_CHARS: u32 = 2_000;

/// The Zalo Personal sender.
pub struct ZaloPersonalAdapter {
    name: String,
    account: Account,
    book: SendBook,
    echo_window: Duration,
    last_client_id: AtomicU64,
    capabilities: MessageCapabilities,
}

impl std::fmt::Debug for ZaloPersonalAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZaloPersonalAdapter")
            .field("name", &self.name)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

/// Text chunked at [`MAX_TEXT_CHARS`]; no live previews (no edits), no replies; unknown sends
/// reconciled from their echoes.
fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
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
        )
}

/// A book that cannot be read or written: nothing was sent or settled; tried again later.
fn book_failed(error: BookError) -> SendError {
    SendError::before_io(DeliveryFailureKind::Transient, error.to_string())
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

impl ZaloPersonalAdapter {
    pub(crate) fn new(name: &str, account: Account, book: SendBook, echo_window: Duration) -> Self {
        ZaloPersonalAdapter {
            name: name.to_owned(),
            account,
            book,
            echo_window,
            last_client_id: AtomicU64::new(0),
            capabilities: capabilities(),
        }
    }

    /// A `clientId` like zca-js's (`Date.now()`), unique within this process.
    fn client_id(&self) -> u64 {
        let now = self.account.client().now_ms();
        let mut last = self.last_client_id.load(Ordering::SeqCst);
        loop {
            let next = now.max(last + 1);
            match self.last_client_id.compare_exchange(
                last,
                next,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }
}

#[async_trait]
impl ChannelMessageAdapter for ZaloPersonalAdapter {
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
        if unit.kind != MessagePartKind::Text {
            return Err(invalid("this Zalo Personal channel sends text only"));
        }
        let text = unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a Zalo text unit needs a `text` string"))?;
        if text.trim().is_empty() {
            return Err(invalid(
                "zca-js refuses an empty message (Missing message content)",
            ));
        }
        if text.chars().count() > MAX_TEXT_CHARS as usize {
            return Err(invalid(format!(
                "this channel sends at most {MAX_TEXT_CHARS} characters per message"
            )));
        }
        let target = &ctx.message.target;
        let kind = match target.kind {
            TargetKind::Direct => ThreadKind::User,
            TargetKind::Group => ThreadKind::Group,
            other => {
                return Err(invalid(format!(
                    "a Zalo thread is a person or a group, not {other:?}"
                )));
            }
        };
        if let Some(takeover) = self.account.taken_over() {
            return Err(SendError::before_io(
                DeliveryFailureKind::Auth,
                takeover.describe(),
            ));
        }
        let session = self.account.session().await.map_err(|e| match e {
            LoginError::Refused(_) => {
                SendError::before_io(DeliveryFailureKind::Auth, e.to_string())
            }
            LoginError::Unreachable(_) => {
                SendError::before_io(DeliveryFailureKind::Transient, e.to_string())
            }
        })?;
        let key = ctx.unit_key(unit);
        let client_id = self.client_id();
        // Before any I/O: a key without this record provably never went out.
        self.book
            .attempted(&key, client_id, self.account.client().now_ms())
            .await
            .map_err(book_failed)?;
        let msg_id = self
            .account
            .client()
            .send_text(&session, kind, &target.id, text, client_id)
            .await
            .map_err(crate::client::CallError::into_send_error)?;
        if let Err(error) = self.book.answered(&key, &msg_id).await {
            // The engine records the receipt itself; the book only backs reconciliation.
            warn!(channel = %self.name, %error, "the answer was not written to the send book");
        }
        Ok(MessageReceiptPart::new(msg_id, unit.kind, unit.index))
    }

    /// Settled from the [`SendBook`]: no attempt record proves it never went out; an answer
    /// or the listener's echo of one of its `clientId`s proves Zalo has it (its `msgId`).
    /// Otherwise it stays unknown while its echo may still come (`echo_window_ms` after the
    /// attempt); after that nothing can tell (the echo was pushed while the listener was
    /// down, or the message never landed: Zalo has no catch-up and no lookup), and the send is
    /// undecidable: parked for an operator, never sent twice.
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        // From the store: the attempt, its answer or its echo may be another gateway's.
        let evidence = self
            .book
            .evidence(&ctx.unit_key(unit))
            .await
            .map_err(book_failed)?;
        Ok(match evidence {
            Evidence::NeverSent => Reconciliation::NotSent,
            Evidence::Landed(msg_id) => Reconciliation::Sent(Box::new(MessageReceiptPart::new(
                msg_id, unit.kind, unit.index,
            ))),
            Evidence::Pending { at_ms } => {
                let window = u64::try_from(self.echo_window.as_millis()).unwrap_or(u64::MAX);
                if self.account.client().now_ms() < at_ms.saturating_add(window) {
                    Reconciliation::Unresolved
                } else {
                    Reconciliation::Undecidable
                }
            }
        })
    }
}
