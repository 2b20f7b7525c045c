//! Property targets for a channel's inbound normalizer, on [`clawgate_fuzz`]'s inputs.
//!
//! In the channel crate's receive tests, with real payloads the platform sends:
//! `clawgate_conformance::fuzz::normalizer_never_panics(&receiver, vec![payload, …])`.

use clawgate_channel_sdk::MessageReceiveAdapter;
use clawgate_fuzz::proptest::prelude::*;
use clawgate_types::MessageDirection;
use serde_json::Value;

pub use clawgate_fuzz::*;

/// Feeds `receiver` mutations of `valid` (real payloads of its platform, each of which it
/// normalizes) and arbitrary JSON, [`cases()`] inputs: every answer is a message or a typed
/// error, never a panic; a message is inbound and has an event id to dedupe redeliveries by;
/// no input makes it hold more than [`meter::allowance`] of the input's size.
pub fn normalizer_never_panics(receiver: &dyn MessageReceiveAdapter, valid: Vec<Value>) {
    for payload in &valid {
        if let Err(e) = receiver.normalize(payload) {
            panic!("a payload to mutate must normalize: {e}\n{payload:#}");
        }
    }
    clawgate_fuzz::run("normalize", json_values(valid), |payload| {
        let size = serde_json::to_vec(&payload).map_or(0, |b| b.len());
        let (outcome, peak) = meter::measure(|| receiver.normalize(&payload));
        prop_assert!(
            peak <= meter::allowance(size),
            "normalize held {peak} bytes for a {size}-byte payload"
        );
        if let Ok(inbound) = outcome {
            prop_assert!(!inbound.event_id.is_empty(), "no event id: {inbound:?}");
            prop_assert_eq!(inbound.message.direction, MessageDirection::Inbound);
        }
        Ok(())
    });
}
