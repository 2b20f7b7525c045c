//! Decoding outside input, for every wire type: valid documents mutated at random places (wrong
//! types, missing and unknown fields, huge numbers, long and odd strings, deep nesting),
//! arbitrary JSON and corrupted JSON text decode to a value or a typed error, never a panic; a
//! value that decodes re-encodes and decodes to the same value. `CLAWGATE_FUZZ_CASES` cases per
//! type (`cargo xtask soak` sets it high).

use std::fmt::Debug;

use clawgate_fuzz::proptest::prelude::*;
use clawgate_types::{from_json, from_json_value, to_json};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::strategies::{self as s, one_of};
use crate::variants::*;

/// The decoded value's own encoding decodes to it again.
fn round_trips<T>(decoded: &T) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let text = to_json(decoded).map_err(|e| TestCaseError::fail(format!("re-encoding: {e}")))?;
    let back: T = from_json(&text)
        .map_err(|e| TestCaseError::fail(format!("decoding its own encoding {text}: {e}")))?;
    prop_assert_eq!(&back, decoded, "through {}", text);
    Ok(())
}

/// Mutations of valid values of `T` (and arbitrary trees) as parsed JSON, then as text.
fn decodes_or_refuses<T>(name: &str, valid: impl Strategy<Value = T> + 'static)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let seeds = valid
        .prop_map(|v| serde_json::to_value(&v).unwrap())
        .boxed();
    clawgate_fuzz::run(
        name,
        clawgate_fuzz::json_values_from(seeds.clone()),
        |tree| match from_json_value::<T>(tree) {
            Ok(decoded) => round_trips(&decoded),
            Err(_) => Ok(()),
        },
    );
    clawgate_fuzz::run(
        name,
        clawgate_fuzz::json_texts_from(seeds),
        |bytes| match from_json::<T>(&String::from_utf8_lossy(&bytes)) {
            Ok(decoded) => round_trips(&decoded),
            Err(_) => Ok(()),
        },
    );
}

macro_rules! fuzz_targets {
    ($($name:ident: $ty:ty = $strategy:expr;)*) => {
        $(
            #[test]
            fn $name() {
                decodes_or_refuses::<$ty>(stringify!($name), $strategy);
            }
        )*
    };
}

fuzz_targets! {
    channel_message: clawgate_types::ChannelMessage = s::channel_message();
    message_target: clawgate_types::MessageTarget = s::target();
    message_attachment: clawgate_types::MessageAttachment = s::attachment();
    message_relation: clawgate_types::MessageRelation = s::relation();
    message_origin: clawgate_types::MessageOrigin = s::origin();
    message_receipt: clawgate_types::MessageReceipt = s::receipt();
    rendered_message_batch: clawgate_types::RenderedMessageBatch = s::batch();
    durable_send_intent: clawgate_types::DurableSendIntent = s::durable_send_intent();
    delivery_failure: clawgate_types::DeliveryFailure = s::delivery_failure();
    receive_ack_policy: clawgate_types::ReceiveAckPolicy = s::receive_ack_policy();
    live_message_state: clawgate_types::LiveMessageState = s::live_state();
    live_message_update: clawgate_types::LiveMessageUpdate = s::live_update();
    message_capabilities: clawgate_types::MessageCapabilities = s::capabilities();
    session_key: clawgate_types::SessionKey = s::session_key();
    session_state_event: clawgate_types::SessionStateEvent = s::session_state_event();
    state_version: clawgate_types::StateVersion = s::state_version();
    acp_session_owner: clawgate_types::AcpSessionOwner = s::acp_session_owner();
    acpx_process_lease: clawgate_types::AcpxProcessLease = s::acpx_lease();
    agent_to_agent_policy: clawgate_types::AgentToAgentPolicy = s::a2a_policy();
    visibility_row: clawgate_types::VisibilityRow = s::visibility_row();
    session_visibility_input: clawgate_types::SessionVisibilityInput = s::visibility_input();
    intent_id: clawgate_types::IntentId = s::intent_id();
    lease_id: clawgate_types::LeaseId = s::lease_id();
    gateway_instance_id: clawgate_types::GatewayInstanceId = s::gateway_instance_id();
    intent_status: clawgate_types::IntentStatus = one_of(&clawgate_types::ALL_INTENT_STATUSES);
    gateway_failure_code: clawgate_types::GatewayFailureCode = one_of(GATEWAY_FAILURE_CODES);
    delivery_failure_kind: clawgate_types::DeliveryFailureKind = one_of(FAILURE_KINDS);
}
