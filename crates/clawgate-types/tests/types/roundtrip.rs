//! value -> `to_json` -> `from_json` -> the same value, for every wire type.

use clawgate_types::{
    AcpSessionOwner, AcpxProcessLease, AgentToAgentPolicy, ChannelMessage, DeliveryFailure,
    DurableSendIntent, GatewayInstanceId, GatewayOrigin, IntentId, IntentStatus, LeaseId,
    LiveMessageState, LiveMessageUpdate, MessageActor, MessageAttachment, MessageBody,
    MessageCapabilities, MessageOrigin, MessageQuote, MessageReceipt, MessageReceiptPart,
    MessageRelation, MessageTarget, ReceiveAckPolicy, RenderedMessageBatch, RenderedMessageUnit,
    SessionKey, SessionStateEvent, SessionVisibilityInput, StateVersion, VisibilityRow, from_json,
    from_json_value, to_json,
};
use proptest::prelude::*;

use crate::fixtures;
use crate::strategies::{self as s, one_of};
use crate::variants::*;

/// One proptest per type: the JSON text decodes to an equal value, decoding from a parsed JSON
/// tree agrees, and re-encoding the decoded value gives the same text (stable encoding).
macro_rules! round_trips {
    ($($name:ident: $ty:ty = $strategy:expr;)*) => {
        proptest! {
            $(
                #[test]
                fn $name(value in $strategy) {
                    let text = to_json(&value).unwrap();
                    let back: $ty = from_json(&text).unwrap();
                    prop_assert_eq!(&back, &value, "text: {}", text);
                    let tree: serde_json::Value = serde_json::from_str(&text).unwrap();
                    let from_tree: $ty = from_json_value(tree).unwrap();
                    prop_assert_eq!(&from_tree, &value);
                    prop_assert_eq!(to_json(&back).unwrap(), text);
                }
            )*
        }
    };
}

round_trips! {
    channel_message: ChannelMessage = s::channel_message();
    message_target: MessageTarget = s::target();
    message_actor: MessageActor = s::actor();
    message_body: MessageBody = s::body();
    message_attachment: MessageAttachment = s::attachment();
    message_quote: MessageQuote = s::quote();
    message_relation: MessageRelation = s::relation();
    message_origin: MessageOrigin = s::origin();
    gateway_origin: GatewayOrigin = s::gateway_origin();
    message_receipt: MessageReceipt = s::receipt();
    message_receipt_part: MessageReceiptPart = s::receipt_part();
    rendered_message_batch: RenderedMessageBatch = s::batch();
    rendered_message_unit: RenderedMessageUnit = s::batch_unit();
    durable_send_intent: DurableSendIntent = s::durable_send_intent();
    delivery_failure: DeliveryFailure = s::delivery_failure();
    receive_ack_policy: ReceiveAckPolicy = s::receive_ack_policy();
    live_message_state: LiveMessageState = s::live_state();
    live_message_update: LiveMessageUpdate = s::live_update();
    message_capabilities: MessageCapabilities = s::capabilities();
    session_key: SessionKey = s::session_key();
    session_state_event: SessionStateEvent = s::session_state_event();
    state_version: StateVersion = s::state_version();
    acp_session_owner: AcpSessionOwner = s::acp_session_owner();
    acpx_process_lease: AcpxProcessLease = s::acpx_lease();
    agent_to_agent_policy: AgentToAgentPolicy = s::a2a_policy();
    visibility_row: VisibilityRow = s::visibility_row();
    session_visibility_input: SessionVisibilityInput = s::visibility_input();
    intent_id: IntentId = s::intent_id();
    lease_id: LeaseId = s::lease_id();
    gateway_instance_id: GatewayInstanceId = s::gateway_instance_id();
    intent_status: IntentStatus = one_of(&clawgate_types::ALL_INTENT_STATUSES);
    message_direction: clawgate_types::MessageDirection = one_of(MESSAGE_DIRECTIONS);
    target_kind: clawgate_types::TargetKind = one_of(TARGET_KINDS);
    system_reason: clawgate_types::SystemReason = one_of(SYSTEM_REASONS);
    message_part_kind: clawgate_types::MessagePartKind = one_of(PART_KINDS);
    batch_atomicity: clawgate_types::BatchAtomicity = one_of(BATCH_ATOMICITIES);
    gateway_failure_code: clawgate_types::GatewayFailureCode = one_of(GATEWAY_FAILURE_CODES);
    delivery_failure_kind: clawgate_types::DeliveryFailureKind = one_of(FAILURE_KINDS);
    failure_reason: clawgate_types::FailureReason = one_of(FAILURE_REASONS);
    durability_policy: clawgate_types::MessageDurabilityPolicy = one_of(DURABILITY_POLICIES);
    immediate_ack_reason: clawgate_types::ImmediateAckReason = one_of(IMMEDIATE_ACK_REASONS);
    delivery_status: clawgate_types::DeliveryStatus = one_of(DELIVERY_STATUSES);
    live_mode: clawgate_types::LiveMode = one_of(LIVE_MODES);
    live_cancel_reason: clawgate_types::LiveCancelReason = one_of(LIVE_CANCEL_REASONS);
    session_event_kind: clawgate_types::SessionStateEventKind = one_of(SESSION_EVENT_KINDS);
    actor_type: clawgate_types::ActorType = one_of(ACTOR_TYPES);
    run_outcome: clawgate_types::RunOutcome = one_of(RUN_OUTCOMES);
    lease_state: clawgate_types::LeaseState = one_of(LEASE_STATES);
    session_visibility: clawgate_types::SessionVisibility = one_of(SESSION_VISIBILITIES);
}

/// Regression: serde_json's default float parser can be one ULP off, so a progress fraction
/// changed on a round trip until `float_roundtrip` was enabled. These values all failed.
#[test]
fn progress_fraction_survives_bit_for_bit() {
    for fraction in [
        0.9856906946328695,
        0.21291890726713458,
        0.1,
        1.0 / 3.0,
        0.0,
        1.0,
    ] {
        let update = LiveMessageUpdate::Progress {
            label: "l".into(),
            fraction: Some(fraction),
        };
        match crate::helpers::wire_round_trip(&update) {
            LiveMessageUpdate::Progress {
                fraction: Some(back),
                ..
            } => {
                assert_eq!(back.to_bits(), fraction.to_bits(), "fraction {fraction}");
            }
            other => panic!("decoded {other:?}"),
        }
    }
}

/// An opaque `raw` payload of JSON `null` is not distinguishable from no payload: it is written
/// as `"raw":null` and read back as absent. Pinned so a change of this normalization is noticed.
#[test]
fn raw_null_decodes_as_absent() {
    let message = fixtures::channel_message().with_raw(serde_json::Value::Null);
    let text = to_json(&message).unwrap();
    assert!(text.contains(r#""raw":null"#), "{text}");
    let back: ChannelMessage = from_json(&text).unwrap();
    assert_eq!(back.raw, None);
    let mut without_raw = message;
    without_raw.raw = None;
    assert_eq!(back, without_raw);
}

/// The smallest documents the wire accepts: optional fields absent, defaulted fields filled in.
#[test]
fn absent_optional_and_defaulted_fields_take_their_defaults() {
    let message: ChannelMessage = from_json(
        r#"{"id":"m","channel":"qa","direction":"inbound","target":{"kind":"direct","id":"d"}}"#,
    )
    .unwrap();
    assert_eq!(message.account_id, None);
    assert_eq!(message.sender, None);
    assert!(message.attachments.is_empty());
    assert_eq!(message.relation, None);
    assert_eq!(message.origin, None);
    assert_eq!(message.raw, None);
    // Absent optional fields are also left out when encoding.
    assert_eq!(
        to_json(&message).unwrap(),
        r#"{"id":"m","channel":"qa","direction":"inbound","target":{"kind":"direct","id":"d"}}"#
    );

    let actor: MessageActor = from_json(r#"{"id":"u"}"#).unwrap();
    assert!(!actor.is_bot);

    let policy: AgentToAgentPolicy = from_json(r#"{"enabled":true}"#).unwrap();
    assert_eq!(
        policy,
        AgentToAgentPolicy {
            enabled: true,
            allow: vec![]
        }
    );

    let caps: MessageCapabilities = from_json(r#"{"text":{}}"#).unwrap();
    assert_eq!(caps, MessageCapabilities::default());

    let input: SessionVisibilityInput = from_json(
        r#"{"requesterSessionKey":"agent:main:main",
            "row":{"key":"agent:main:other","agentId":"main"},
            "visibility":"tree","a2aPolicy":{"enabled":false}}"#,
    )
    .unwrap();
    assert!(!input.requester_sandboxed);
    assert_eq!(input.row.owner_session_key, None);

    let reply: MessageRelation = from_json(r#"{"kind":"reply"}"#).unwrap();
    assert_eq!(reply, MessageRelation::reply());
}

/// `DurableSendIntent::new` builds a fresh pending intent that survives the wire.
#[test]
fn new_intent_is_pending_and_round_trips() {
    let message = fixtures::channel_message();
    let intent = DurableSendIntent::new(fixtures::intent_id(), "k".into(), message.clone(), 77);
    assert_eq!(intent.status, IntentStatus::Pending);
    assert_eq!(intent.attempt, 0);
    assert_eq!(intent.channel, message.channel);
    assert_eq!(intent.account_id, message.account_id);
    assert_eq!((intent.created_at, intent.updated_at), (77, 77));
    assert_eq!(intent.receipt, None);
    assert_eq!(intent.failure, None);
    assert_eq!(crate::helpers::wire_round_trip(&intent), intent);
}

/// `depth` arrays inside each other around `null`.
fn nested(depth: usize) -> serde_json::Value {
    (0..depth).fold(serde_json::Value::Null, |inner, _| {
        serde_json::Value::Array(vec![inner])
    })
}

/// Regression (found by the `fuzz::message_receipt` target): a tree decoded with
/// `from_json_value` may nest deeper than text decoding allows; its encoding was written and
/// could never be read back (`recursion limit exceeded`). Both directions now stop at
/// `MAX_JSON_DEPTH`, so whatever is written decodes again.
#[test]
fn nesting_past_the_text_limit_is_refused_both_ways() {
    use clawgate_types::MAX_JSON_DEPTH;
    let limit = to_json(&nested(MAX_JSON_DEPTH)).unwrap();
    let _: serde_json::Value = from_json(&limit).expect("the limit itself decodes from text");
    let past = serde_json::to_string(&nested(MAX_JSON_DEPTH + 1)).unwrap();
    assert!(
        from_json::<serde_json::Value>(&past).is_err(),
        "text decoding stops past the limit"
    );

    // The raw payload sits one level inside the receipt: at the limit as a whole it decodes
    // and round-trips; one level more is refused from a tree and when encoding.
    let receipt = |raw_depth: usize| {
        let mut tree = serde_json::to_value(fixtures::receipt()).unwrap();
        tree["raw"] = nested(raw_depth);
        tree
    };
    let fits: MessageReceipt = from_json_value(receipt(MAX_JSON_DEPTH - 1)).unwrap();
    assert_eq!(crate::helpers::wire_round_trip(&fits), fits);
    let error = from_json_value::<MessageReceipt>(receipt(MAX_JSON_DEPTH)).unwrap_err();
    assert!(error.to_string().contains("nested deeper than"), "{error}");
    let mut deep = fits;
    deep.raw = Some(nested(MAX_JSON_DEPTH));
    let error = to_json(&deep).unwrap_err();
    assert!(error.to_string().contains("nested deeper than"), "{error}");

    // Brackets inside strings are text, not nesting.
    let brackets = serde_json::Value::String("[{\"[".repeat(500));
    assert_eq!(
        from_json::<serde_json::Value>(&to_json(&brackets).unwrap()).unwrap(),
        brackets
    );
}
