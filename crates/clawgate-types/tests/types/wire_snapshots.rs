//! JSON snapshots of every public wire type: the camelCase shapes peers in other languages read.
//!
//! Every snapshotted value is also round-tripped through the crate's `to_json`/`from_json`, so a
//! snapshot can only show a shape the decoder accepts.

use clawgate_types::{
    ALL_INTENT_STATUSES, IntentStatus, LiveMessageUpdate, MessageOrigin, ReceiveAckPolicy,
    SessionKey, StateVersion,
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

use crate::fixtures;
use crate::helpers::{wire_round_trip, wire_value};
use crate::variants::*;

/// Snapshots JSON with object keys sorted: `serde_json::Value` maps keep insertion order when
/// another crate in the build enables serde_json's `preserve_order`, sorted order otherwise.
macro_rules! json_snapshot {
    ($($arg:tt)*) => {
        insta::with_settings!({ sort_maps => true }, { insta::assert_json_snapshot!($($arg)*) })
    };
}

/// Asserts that the value survives the wire, then snapshots it.
macro_rules! wire_snapshot {
    ($name:literal, $value:expr) => {{
        let value = $value;
        assert_round_trips(&value);
        json_snapshot!($name, value);
    }};
}

fn assert_round_trips<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) {
    assert_eq!(&wire_round_trip(value), value);
}

#[test]
fn channel_message_full() {
    wire_snapshot!("channel_message_full", fixtures::channel_message());
}

#[test]
fn message_target_full() {
    wire_snapshot!("message_target_full", fixtures::target());
}

#[test]
fn message_actor() {
    wire_snapshot!("message_actor", fixtures::actor());
}

#[test]
fn message_body() {
    wire_snapshot!("message_body", fixtures::body());
}

#[test]
fn message_attachment() {
    wire_snapshot!("message_attachment", fixtures::attachment());
}

#[test]
fn message_quote() {
    wire_snapshot!("message_quote", fixtures::quote());
}

#[test]
fn relation_reply() {
    wire_snapshot!("relation_reply", fixtures::relation_reply());
}

#[test]
fn relation_followup() {
    wire_snapshot!("relation_followup", fixtures::relation_followup());
}

#[test]
fn relation_broadcast() {
    wire_snapshot!("relation_broadcast", fixtures::relation_broadcast());
}

#[test]
fn relation_system() {
    wire_snapshot!("relation_system", fixtures::relation_system());
}

#[test]
fn origin_gateway_failure() {
    wire_snapshot!("origin_gateway_failure", fixtures::gateway_failure_origin());
}

#[test]
fn origin_gateway_failure_every_code() {
    let origins: Vec<MessageOrigin> = GATEWAY_FAILURE_CODES
        .iter()
        .map(|&c| MessageOrigin::gateway_failure(c))
        .collect();
    wire_snapshot!("origin_gateway_failure_every_code", origins);
}

#[test]
fn origin_plain_sources() {
    wire_snapshot!(
        "origin_plain_sources",
        vec![
            MessageOrigin::User,
            MessageOrigin::ExternalBot,
            MessageOrigin::Platform,
            MessageOrigin::Unknown
        ]
    );
}

#[test]
fn message_receipt() {
    wire_snapshot!("message_receipt", fixtures::receipt());
}

#[test]
fn message_receipt_part() {
    wire_snapshot!("message_receipt_part", fixtures::receipt_part_full());
}

#[test]
fn rendered_message_batch() {
    wire_snapshot!("rendered_message_batch", fixtures::batch());
}

#[test]
fn rendered_message_unit() {
    wire_snapshot!("rendered_message_unit", fixtures::batch_unit(3));
}

#[test]
fn durable_send_intent_full() {
    wire_snapshot!("durable_send_intent_full", fixtures::durable_send_intent());
}

#[test]
fn delivery_failure() {
    wire_snapshot!("delivery_failure", fixtures::delivery_failure());
}

#[test]
fn delivery_failure_kinds() {
    wire_snapshot!("delivery_failure_kinds", FAILURE_KINDS.to_vec());
}

#[test]
fn failure_reasons() {
    wire_snapshot!("failure_reasons", FAILURE_REASONS.to_vec());
}

#[test]
fn durability_policies() {
    wire_snapshot!("durability_policies", DURABILITY_POLICIES.to_vec());
}

#[test]
fn receive_ack_policies() {
    wire_snapshot!(
        "receive_ack_policies",
        vec![
            ReceiveAckPolicy::Immediate {
                reason: clawgate_types::ImmediateAckReason::WebhookTimeout
            },
            ReceiveAckPolicy::Immediate {
                reason: clawgate_types::ImmediateAckReason::PlatformContract
            },
            ReceiveAckPolicy::AfterRecord,
            ReceiveAckPolicy::AfterDurableSend,
            ReceiveAckPolicy::Manual,
        ]
    );
}

#[test]
fn delivery_statuses() {
    wire_snapshot!("delivery_statuses", DELIVERY_STATUSES.to_vec());
}

#[test]
fn live_message_state() {
    wire_snapshot!("live_message_state", fixtures::live_state());
}

#[test]
fn live_update_partial() {
    wire_snapshot!(
        "live_update_partial",
        LiveMessageUpdate::Partial {
            text: "Working on".into()
        }
    );
}

#[test]
fn live_update_block() {
    wire_snapshot!(
        "live_update_block",
        LiveMessageUpdate::Block {
            index: 2,
            text: "Done.".into()
        }
    );
}

#[test]
fn live_update_progress() {
    wire_snapshot!(
        "live_update_progress",
        vec![
            LiveMessageUpdate::Progress {
                label: "Indexing".into(),
                fraction: Some(0.25)
            },
            LiveMessageUpdate::Progress {
                label: "Thinking".into(),
                fraction: None
            },
        ]
    );
}

#[test]
fn live_update_native() {
    wire_snapshot!(
        "live_update_native",
        LiveMessageUpdate::Native {
            payload: json!({ "chunk": "he", "seq": 1 })
        }
    );
}

#[test]
fn live_cancel_reasons() {
    wire_snapshot!("live_cancel_reasons", LIVE_CANCEL_REASONS.to_vec());
}

#[test]
fn message_capabilities_full() {
    wire_snapshot!("message_capabilities_full", fixtures::capabilities());
}

#[test]
fn session_keys() {
    wire_snapshot!(
        "session_keys",
        vec![
            fixtures::key("agent:main:subagent:child"),
            SessionKey::global(),
            fixtures::key("main")
        ]
    );
}

#[test]
fn session_state_event_run_failed() {
    wire_snapshot!(
        "session_state_event_run_failed",
        fixtures::event_run_failed()
    );
}

#[test]
fn session_state_event_child_spawned() {
    wire_snapshot!(
        "session_state_event_child_spawned",
        fixtures::event_child_spawned()
    );
}

#[test]
fn state_version() {
    wire_snapshot!("state_version", StateVersion(17));
}

#[test]
fn acp_session_owner() {
    wire_snapshot!("acp_session_owner", fixtures::acp_session_owner());
}

#[test]
fn acpx_process_lease() {
    wire_snapshot!("acpx_process_lease", fixtures::acpx_lease());
}

#[test]
fn lease_states() {
    wire_snapshot!("lease_states", LEASE_STATES.to_vec());
}

#[test]
fn session_visibilities() {
    wire_snapshot!("session_visibilities", SESSION_VISIBILITIES.to_vec());
}

#[test]
fn agent_to_agent_policy() {
    wire_snapshot!("agent_to_agent_policy", fixtures::a2a_policy());
}

#[test]
fn session_visibility_input() {
    wire_snapshot!("session_visibility_input", fixtures::visibility_input());
}

#[test]
fn opaque_ids() {
    assert_round_trips(&fixtures::gateway_instance_id());
    assert_round_trips(&fixtures::lease_id());
    assert_round_trips(&fixtures::intent_id());
    json_snapshot!(
        "opaque_ids",
        json!({
            "gatewayInstanceId": fixtures::gateway_instance_id(),
            "leaseId": fixtures::lease_id(),
            "intentId": fixtures::intent_id(),
        })
    );
}

/// The spellings of the remaining field-less enums, by type.
#[test]
fn other_enum_spellings() {
    let statuses: Vec<IntentStatus> = ALL_INTENT_STATUSES.to_vec();
    assert_round_trips(&statuses);
    json_snapshot!(
        "other_enum_spellings",
        json!({
            "IntentStatus": statuses,
            "MessageDirection": MESSAGE_DIRECTIONS,
            "TargetKind": TARGET_KINDS,
            "SystemReason": SYSTEM_REASONS,
            "MessagePartKind": PART_KINDS,
            "BatchAtomicity": BATCH_ATOMICITIES,
            "ImmediateAckReason": IMMEDIATE_ACK_REASONS,
            "LiveMode": LIVE_MODES,
            "SessionStateEventKind": SESSION_EVENT_KINDS,
            "ActorType": ACTOR_TYPES,
            "RunOutcome": RUN_OUTCOMES,
            "AcpBackend": ACP_BACKENDS,
            "GatewayOriginKind": GATEWAY_ORIGIN_KINDS,
            "GatewayFailureCode": GATEWAY_FAILURE_CODES,
            "EchoPolicy": ECHO_POLICIES,
        })
    );
}

/// Every object key of every fully populated fixture is camelCase (opaque `raw`/`payload`
/// subtrees excluded: their keys belong to the platform; so are the keys of `streamedMedia`,
/// which are attachment identities, though its values are checked).
#[test]
fn every_field_name_is_camel_case() {
    fn check(value: &Value, path: &str, seen: &mut usize) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let camel = key.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                        && key.chars().all(|c| c.is_ascii_alphanumeric());
                    assert!(camel, "field {key:?} at {path} is not camelCase");
                    *seen += 1;
                    if let ("streamedMedia", Value::Object(media)) = (key.as_str(), child) {
                        let inner = format!("{path}.{key}.*");
                        media.values().for_each(|part| check(part, &inner, seen));
                    } else if key != "raw" && key != "payload" {
                        check(child, &format!("{path}.{key}"), seen);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| check(item, path, seen)),
            _ => {}
        }
    }
    let documents = [
        wire_value(&fixtures::durable_send_intent()),
        wire_value(&fixtures::capabilities()),
        wire_value(&fixtures::event_run_failed()),
        wire_value(&fixtures::event_child_spawned()),
        wire_value(&fixtures::acp_session_owner()),
        wire_value(&fixtures::acpx_lease()),
        wire_value(&fixtures::visibility_input()),
        wire_value(&fixtures::relation_followup()),
        wire_value(&LiveMessageUpdate::Native {
            payload: json!({ "snake_case": 1 }),
        }),
    ];
    let mut seen = 0;
    for document in &documents {
        check(document, "$", &mut seen);
    }
    // Guard against a vacuous pass: the fixtures have well over a hundred fields.
    assert!(seen > 100, "only {seen} fields checked");
}
