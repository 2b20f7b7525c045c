//! The clawgate message lifecycle engine (layer 2): send contexts, recovery and receive
//! contexts.
//!
//! Invariants:
//! * with durability `required`, the intent (with the whole rendered batch) is committed before
//!   any platform I/O, or nothing is sent;
//! * a unit with a receipt part is never sent again;
//! * a failure after possible platform I/O, before the receipt commit, is `unknown_after_send`
//!   and is reconciled through the adapter before any replay — never replayed blindly unless the
//!   adapter declares duplicates acceptable;
//! * post-send hooks run once per committed send, after the commit, on the recovery path too;
//! * an intent is worked on by one claim holder at a time (two processes never send it twice).

pub mod channel_turn;
mod engine;
mod error;
mod live;
mod liveness;
mod loop_guard;
mod outcome;
mod policy;
mod polling;
mod receive;
mod recovery;
mod source;
mod sparse;

// The engine's modules name the one clock `crate::Clock`.
pub(crate) use clawgate_types::clock::Clock;
pub use engine::{Boundary, LifecycleProbe, Messenger, OutboundContext, SendOptions};
pub use error::MessagesError;
pub use live::{
    LiveOptions, LivePreview, MEDIA_KEY_SUFFIX, PREVIEW_KEY_SUFFIX, intent_key_of_unit,
    previews_possible,
};
pub use loop_guard::{BotLoopGuard, BotLoopLimits};
pub use outcome::{RecoveryReport, SendOutcome, SendReport};
pub use policy::{Disposition, RetryPolicy, disposition};
pub use polling::PollingWatermark;
pub use receive::{
    AckController, AckState, DispatchError, ReceiveOptions, ReceiveOutcome, Receiver,
};
pub use recovery::RecoveryPace;
pub use source::{EventHandler, SourceRunner, SourceStores};
