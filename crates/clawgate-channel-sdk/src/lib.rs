//! The surface a clawgate channel author implements (layer 1; depends on `clawgate-types` and
//! the storage ports of `clawgate-store` only).
//!
//! A channel crate hands the gateway one [`ChannelPlugin`], built by its [`ChannelFactory`] from
//! the account's `settings` table: a [`ChannelMessageAdapter`] that sends, a
//! [`MessageReceiveAdapter`] that normalizes inbound events, and the [`InboundSource`] they come
//! from (a [`PollingFeed`] the engine polls from its durable watermark, or a [`PushedFeed`] —
//! webhook or socket — that hands events over with their [`TransportAck`]). `docs/channels.md` in
//! the repository walks through a whole channel crate; the `testing` feature has
//! [`testing::MemoryChannel`], an in-memory platform and channel that passes the conformance suite.
//!
//! The [`ChannelMessageAdapter`] sends rendered units,
//! optionally edits and deletes them, classifies its failures into [`SendError`]s, and — when the
//! platform allows — answers "did this send land?" for an unknown outcome
//! ([`ChannelMessageAdapter::reconcile_unknown_send`]). Optional adapters render messages
//! ([`MessageRenderAdapter`]), run live previews ([`MessageLiveAdapter`]), map origin markers to
//! platform metadata ([`MessageOriginAdapter`]) and normalize inbound events
//! ([`MessageReceiveAdapter`]). The adapter declares what it can do in
//! [`MessageCapabilities`](types::MessageCapabilities); the engine trusts the declaration and the conformance suite checks it.
//!
//! The engine (`clawgate-messages`) owns durability: it records the intent before calling the
//! adapter, records each unit's receipt part, and commits. What a channel itself must remember
//! between runs (send journals, echo books, cursors, rotating tokens) goes through the
//! [`ChannelState`] its [`ChannelSetup`] carries — into the gateway's store, scoped to the
//! account — never into files of its own.
//!
//! # Example
//!
//! ```
//! use std::sync::Mutex;
//! use clawgate_channel_sdk::prelude::*;
//!
//! /// A "platform" that keeps messages in memory.
//! struct Notebook {
//!     capabilities: MessageCapabilities,
//!     pages: Mutex<Vec<String>>,
//! }
//!
//! #[async_trait]
//! impl ChannelMessageAdapter for Notebook {
//!     fn channel(&self) -> &str {
//!         "notebook"
//!     }
//!
//!     fn capabilities(&self) -> &MessageCapabilities {
//!         &self.capabilities
//!     }
//!
//!     async fn send_unit(
//!         &self,
//!         _ctx: &SendContext,
//!         unit: &RenderedMessageUnit,
//!     ) -> Result<MessageReceiptPart, SendError> {
//!         let text = unit.payload["text"].as_str().ok_or_else(|| {
//!             SendError::before_io(DeliveryFailureKind::InvalidPayload, "unit has no text")
//!         })?;
//!         let mut pages = self.pages.lock().map_err(|_| {
//!             SendError::before_io(DeliveryFailureKind::Transient, "notebook lock poisoned")
//!         })?;
//!         pages.push(text.to_owned());
//!         Ok(MessageReceiptPart::new(
//!             format!("page-{}", pages.len()),
//!             MessagePartKind::Text,
//!             unit.index,
//!         ))
//!     }
//! }
//!
//! let adapter: Box<dyn ChannelMessageAdapter> = Box::new(Notebook {
//!     capabilities: MessageCapabilities::default(),
//!     pages: Mutex::new(Vec::new()),
//! });
//! assert_eq!(adapter.channel(), "notebook");
//! ```

#![warn(missing_docs)]

// The README's example is compiled and run as a doctest, so the packaged README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

mod adapter;
mod error;
pub mod freshness;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "listener")]
pub mod listener;
pub mod loopback;
mod plugin;
mod receive;
mod render;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;

pub use adapter::{
    ChannelMessageAdapter, MessageLiveAdapter, MessageOriginAdapter, MessageRenderAdapter,
    Reconciliation, SendContext,
};
pub use error::{ReceiveError, RenderError, SendError, SideEffect, classify_http_status};
pub use plugin::{
    ChannelFactory, ChannelPlugin, ChannelRegistry, ChannelSetup, Secret, SetupError, same_secret,
};
pub use receive::{MessageReceiveAdapter, NormalizedInbound};
pub use render::{DefaultRenderer, chunk_text};
pub use source::{
    AckAnswer, AckSignal, EventSink, InboundSource, NoTransportAck, PollFrom, PollWait,
    PolledEvent, PollingFeed, PushedEvent, PushedFeed, SourceError, TransportAck,
};
pub use state::{
    Book, ChannelState, ImportError, Imported, LegacyFiles, StateError, StateErrorKind,
};

/// The async-trait macro the SDK's traits are written with (implement them with
/// `#[async_trait]`).
pub use async_trait::async_trait;
/// The vocabulary crate: messages, receipts, capabilities.
pub use clawgate_types as types;

/// Everything an adapter usually needs, in one import: `use clawgate_channel_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::{
        AckSignal, ChannelFactory, ChannelMessageAdapter, ChannelPlugin, ChannelSetup,
        ChannelState, DefaultRenderer, EventSink, InboundSource, MessageLiveAdapter,
        MessageOriginAdapter, MessageReceiveAdapter, MessageRenderAdapter, NormalizedInbound,
        PollFrom, PollWait, PolledEvent, PollingFeed, PushedEvent, PushedFeed, ReceiveError,
        Reconciliation, RenderError, Secret, SendContext, SendError, SetupError, SideEffect,
        SourceError, TransportAck, async_trait, classify_http_status,
    };
    pub use clawgate_types::{
        ChannelMessage, DeliveryFailureKind, LiveCancelReason, MessageActor, MessageAttachment,
        MessageBody, MessageCapabilities, MessageDirection, MessageOrigin, MessagePartKind,
        MessageReceipt, MessageReceiptPart, MessageTarget, ReceiveAckPolicy, RenderedMessageBatch,
        RenderedMessageUnit, TargetKind,
    };
}
