//! Decoding failures: malformed text, unknown enum spellings, missing fields, invalid ids and
//! session keys; and decoding arbitrary or mutated input never panics.

use clawgate_types::{
    AcpSessionOwner, AcpxProcessLease, AgentToAgentPolicy, ChannelMessage, DeliveryFailure,
    DeliveryStatus, DurableSendIntent, GatewayInstanceId, IntentId, IntentStatus, LeaseId,
    LeaseState, LiveMessageState, LiveMessageUpdate, MessageCapabilities, MessageOrigin,
    MessageReceipt, MessageRelation, ParseIdError, ReceiveAckPolicy, RenderedMessageBatch,
    SessionKey, SessionStateEvent, SessionVisibility, SessionVisibilityInput, StateVersion,
    WireError, from_json, from_json_value, to_json,
};
use proptest::prelude::*;
use proptest::{collection::vec, sample::Index};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

use crate::fixtures;
use crate::helpers::{expect_invalid, expect_malformed, wire_value};
use crate::strategies as s;

#[test]
fn malformed_json_is_malformed() {
    let full = to_json(&fixtures::channel_message()).unwrap();
    let truncated = &full[..full.len() / 2];
    let trailing = format!("{full} x");
    let cases = [
        ("empty input", ""),
        ("only whitespace", "  \n "),
        ("not JSON at all", "hello there"),
        ("truncated object", truncated),
        ("unclosed object", "{"),
        ("dangling key", r#"{"id":"#),
        ("trailing garbage after a valid document", &trailing),
        ("single quotes", "{'id':'m'}"),
        ("trailing comma", r#"{"id":"m",}"#),
        ("bare NaN", r#"{"id":NaN}"#),
    ];
    for (name, text) in cases {
        let message = expect_malformed::<ChannelMessage>(text);
        assert!(!message.is_empty(), "{name}: empty message");
    }
    // The same malformed text is Malformed whatever the target type.
    expect_malformed::<DurableSendIntent>(truncated);
    expect_malformed::<SessionKey>(r#""agent:main:x"#);
    expect_malformed::<IntentStatus>("pending");
}

#[test]
fn errors_name_the_type_and_position() {
    let error =
        from_json::<ChannelMessage>("{\n  \"id\": \"m\",\n  \"direction\": \"sideways\"\n}")
            .unwrap_err();
    match &error {
        WireError::Invalid {
            type_name,
            line,
            message,
            ..
        } => {
            assert_eq!(*type_name, "ChannelMessage");
            assert_eq!(*line, 3, "the bad value is on line 3");
            assert!(message.contains("sideways"), "{message}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let shown = error.to_string();
    assert!(shown.starts_with("invalid ChannelMessage: "), "{shown}");
    assert!(shown.contains("line 3"), "{shown}");

    let error = from_json::<DurableSendIntent>("{").unwrap_err();
    assert!(matches!(
        error,
        WireError::Malformed {
            type_name: "DurableSendIntent",
            ..
        }
    ));
    assert!(
        error
            .to_string()
            .starts_with("malformed JSON for DurableSendIntent"),
        "{error}"
    );

    // Decoding from an already parsed tree classifies the same way.
    let error = from_json_value::<IntentStatus>(json!("exploded")).unwrap_err();
    assert!(
        matches!(
            error,
            WireError::Invalid {
                type_name: "IntentStatus",
                ..
            }
        ),
        "{error:?}"
    );
}

/// Replaces the value at a JSON pointer inside `doc` and returns the text.
fn with(mut doc: Value, pointer: &str, value: Value) -> String {
    *doc.pointer_mut(pointer)
        .unwrap_or_else(|| panic!("no {pointer} in fixture")) = value;
    doc.to_string()
}

/// Decodes a document as one type, expecting `Invalid`; returns the error message.
type ExpectInvalid = fn(&str) -> String;

#[test]
fn unknown_enum_values_are_invalid_and_named() {
    let intent = wire_value(&fixtures::durable_send_intent());
    let message = wire_value(&fixtures::channel_message());
    let cases: Vec<(&str, String, ExpectInvalid)> = vec![
        (
            "intent status",
            with(intent.clone(), "/status", json!("exploded")),
            |t| expect_invalid::<DurableSendIntent>(t),
        ),
        ("bare intent status", json!("exploded").to_string(), |t| {
            expect_invalid::<IntentStatus>(t)
        }),
        ("delivery status", json!("exploded").to_string(), |t| {
            expect_invalid::<DeliveryStatus>(t)
        }),
        (
            "relation kind",
            json!({ "kind": "poke" }).to_string(),
            |t| expect_invalid::<MessageRelation>(t),
        ),
        (
            "nested relation kind",
            with(message.clone(), "/relation/kind", json!("poke")),
            |t| expect_invalid::<ChannelMessage>(t),
        ),
        (
            "system reason",
            json!({ "kind": "system", "reason": "whim" }).to_string(),
            |t| expect_invalid::<MessageRelation>(t),
        ),
        (
            "ack policy kind",
            json!({ "kind": "later" }).to_string(),
            |t| expect_invalid::<ReceiveAckPolicy>(t),
        ),
        (
            "ack reason",
            json!({ "kind": "immediate", "reason": "impatience" }).to_string(),
            |t| expect_invalid::<ReceiveAckPolicy>(t),
        ),
        // snake_case is not the ack policy spelling: only kebab-case is accepted.
        (
            "ack policy snake_case",
            json!({ "kind": "after_record" }).to_string(),
            |t| expect_invalid::<ReceiveAckPolicy>(t),
        ),
        (
            "origin source",
            json!({ "source": "martian" }).to_string(),
            |t| expect_invalid::<MessageOrigin>(t),
        ),
        (
            "nested origin source",
            with(message.clone(), "/origin/source", json!("martian")),
            |t| expect_invalid::<ChannelMessage>(t),
        ),
        (
            "origin code",
            with(message, "/origin/code", json!("gremlins")),
            |t| expect_invalid::<ChannelMessage>(t),
        ),
        (
            "target kind",
            with(intent.clone(), "/message/target/kind", json!("plaza")),
            |t| expect_invalid::<DurableSendIntent>(t),
        ),
        (
            "failure kind",
            with(intent, "/failure/kind", json!("cosmic_ray")),
            |t| expect_invalid::<DurableSendIntent>(t),
        ),
        (
            "live update mode",
            json!({ "mode": "teleport", "text": "x" }).to_string(),
            |t| expect_invalid::<LiveMessageUpdate>(t),
        ),
        ("lease state", json!("zombie").to_string(), |t| {
            expect_invalid::<LeaseState>(t)
        }),
        // The Rust variant name is not the wire spelling of visibility `self`.
        ("visibility", json!("own_session").to_string(), |t| {
            expect_invalid::<SessionVisibility>(t)
        }),
    ];
    let bad_values = [
        "exploded",
        "poke",
        "whim",
        "later",
        "impatience",
        "after_record",
        "martian",
        "gremlins",
        "plaza",
        "cosmic_ray",
        "teleport",
        "zombie",
        "own_session",
    ];
    for (name, text, decode) in cases {
        let message = decode(&text);
        assert!(
            bad_values
                .iter()
                .any(|bad| message.contains(&format!("`{bad}`"))),
            "{name}: message does not name the bad value: {message}"
        );
        assert!(message.contains("unknown variant"), "{name}: {message}");
    }
}

/// Every required field of a document, removed in turn, makes it Invalid, naming the field.
fn assert_required<T: Serialize + DeserializeOwned + std::fmt::Debug>(
    value: &T,
    object_pointer: &str,
    required: &[&str],
) {
    let doc = wire_value(value);
    let object = doc
        .pointer(object_pointer)
        .and_then(Value::as_object)
        .unwrap();
    for field in required {
        assert!(
            object.contains_key(*field),
            "fixture lacks {object_pointer}/{field}"
        );
        let mut broken = doc.clone();
        broken
            .pointer_mut(object_pointer)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove(*field);
        let message = expect_invalid::<T>(&broken.to_string());
        assert!(
            message.contains(&format!("missing field `{field}`")),
            "{field}: {message}"
        );
    }
}

#[test]
fn missing_required_fields_are_invalid() {
    let intent = fixtures::durable_send_intent();
    assert_required(
        &intent,
        "",
        &[
            "id",
            "idempotencyKey",
            "channel",
            "message",
            "status",
            "attempt",
            "createdAt",
            "updatedAt",
        ],
    );
    assert_required(
        &intent,
        "/message",
        &["id", "channel", "direction", "target"],
    );
    assert_required(&intent, "/message/target", &["kind", "id"]);
    assert_required(&intent, "/message/sender", &["id"]);
    assert_required(&intent, "/message/body", &["text"]);
    assert_required(&intent, "/message/attachments/0", &["kind"]);
    assert_required(&intent, "/message/relation/quote", &["text"]);
    assert_required(
        &intent,
        "/message/origin",
        &["schemaVersion", "kind", "code", "echoPolicy"],
    );
    assert_required(&intent, "/batch", &["units", "atomicity", "idempotencyKey"]);
    assert_required(
        &intent,
        "/batch/units/0",
        &["index", "kind", "payload", "required"],
    );
    assert_required(&intent, "/liveState", &["mode", "canFinalizeInPlace"]);
    assert_required(
        &intent,
        "/receipt",
        &["platformMessageIds", "parts", "sentAt"],
    );
    assert_required(
        &intent,
        "/receipt/parts/0",
        &["platformMessageId", "kind", "index"],
    );
    assert_required(&intent, "/failure", &["kind", "message", "at"]);
    assert_required(&fixtures::relation_system(), "", &["reason"]);
    assert_required(
        &ReceiveAckPolicy::Immediate {
            reason: clawgate_types::ImmediateAckReason::WebhookTimeout,
        },
        "",
        &["reason"],
    );
    assert_required(
        &LiveMessageUpdate::Block {
            index: 1,
            text: "t".into(),
        },
        "",
        &["index", "text"],
    );
    assert_required(
        &LiveMessageUpdate::Progress {
            label: "l".into(),
            fraction: None,
        },
        "",
        &["label"],
    );
    assert_required(
        &LiveMessageUpdate::Native { payload: json!(1) },
        "",
        &["payload"],
    );
    assert_required(&fixtures::capabilities(), "", &["text"]);
    assert_required(
        &fixtures::capabilities(),
        "/attachments",
        &["upload", "remoteUrl"],
    );
    assert_required(&fixtures::capabilities(), "/threads", &["reply"]);
    assert_required(&fixtures::capabilities(), "/live", &["edit", "delete"]);
    assert_required(
        &fixtures::event_run_failed(),
        "",
        &["sequence", "kind", "actorType", "summary"],
    );
    assert_required(
        &fixtures::acp_session_owner(),
        "",
        &[
            "sessionKey",
            "ownerSessionKey",
            "agentId",
            "backend",
            "gatewayInstanceId",
            "createdAt",
        ],
    );
    assert_required(
        &fixtures::acpx_lease(),
        "",
        &[
            "leaseId",
            "gatewayInstanceId",
            "sessionKey",
            "wrapperRoot",
            "wrapperPath",
            "commandHash",
            "startedAt",
            "state",
        ],
    );
    assert_required(&fixtures::a2a_policy(), "", &["enabled"]);
    assert_required(
        &fixtures::visibility_input(),
        "",
        &["requesterSessionKey", "row", "visibility", "a2aPolicy"],
    );
    assert_required(&fixtures::visibility_input(), "/row", &["key", "agentId"]);
}

#[test]
fn wrong_json_types_are_invalid() {
    let intent = wire_value(&fixtures::durable_send_intent());
    expect_invalid::<DurableSendIntent>(&with(intent.clone(), "/attempt", json!(-1)));
    expect_invalid::<DurableSendIntent>(&with(intent.clone(), "/attempt", json!("3")));
    expect_invalid::<DurableSendIntent>(&with(intent.clone(), "/attempt", json!(4_294_967_296u64)));
    expect_invalid::<DurableSendIntent>(&with(intent.clone(), "/createdAt", json!(1.5)));
    expect_invalid::<DurableSendIntent>(&with(intent.clone(), "/message/attachments", json!({})));
    expect_invalid::<DurableSendIntent>(&with(intent, "/message/sender/isBot", json!("yes")));
    expect_invalid::<StateVersion>("-1");
    expect_invalid::<ChannelMessage>("[]");
    expect_invalid::<ChannelMessage>("null");
}

#[test]
fn invalid_ids_are_rejected() {
    let too_long = "a".repeat(129);
    let cases: [(&str, &str); 7] = [
        ("", "must not be empty"),
        ("has space", "may contain only"),
        ("tab\there", "may contain only"),
        ("slash/inside", "may contain only"),
        ("ünïcode", "may contain only"),
        ("new\nline", "may contain only"),
        (&too_long, "at most 128 bytes"),
    ];
    for (text, reason) in cases {
        let json = json!(text).to_string();
        for message in [
            expect_invalid::<IntentId>(&json),
            expect_invalid::<LeaseId>(&json),
            expect_invalid::<GatewayInstanceId>(&json),
        ] {
            assert!(message.contains(reason), "{text:?}: {message}");
        }
        let error: ParseIdError = IntentId::parse(text).unwrap_err();
        assert_eq!((error.kind, error.value.as_str()), ("intent id", text));
        assert!(error.reason.contains(reason), "{error}");
        assert_eq!(LeaseId::parse(text).unwrap_err().kind, "lease id");
        assert_eq!(
            GatewayInstanceId::parse(text).unwrap_err().kind,
            "gateway instance id"
        );
    }
    // Ids nested in documents are validated too.
    let intent = wire_value(&fixtures::durable_send_intent());
    let message = expect_invalid::<DurableSendIntent>(&with(intent, "/id", json!("bad id")));
    assert!(message.contains("invalid intent id"), "{message}");
    let lease = wire_value(&fixtures::acpx_lease());
    expect_invalid::<AcpxProcessLease>(&with(lease.clone(), "/leaseId", json!("")));
    expect_invalid::<AcpxProcessLease>(&with(lease, "/gatewayInstanceId", json!("a b")));
    // Non-strings are not ids.
    expect_invalid::<IntentId>("42");
}

#[test]
fn valid_id_edges_are_accepted() {
    let longest = "z".repeat(128);
    for text in [
        "a",
        "0",
        "-",
        "A-z_0.9:x",
        "01970c3e-7d2a-7b3c-9f00-5a1b2c3d4e5f",
        &longest,
    ] {
        let id: IntentId = from_json(&json!(text).to_string()).unwrap();
        assert_eq!(id.as_str(), text);
        assert_eq!(id.to_string(), text);
        assert_eq!(text.parse::<LeaseId>().unwrap().as_str(), text);
        assert_eq!(GatewayInstanceId::parse(text).unwrap().as_str(), text);
    }
}

#[test]
fn invalid_session_keys_are_rejected_when_decoding() {
    let too_long = "k".repeat(513);
    for bad in [
        "",
        "agent:main",
        "agent::x",
        "a b",
        "x::y",
        ":x",
        "x:",
        too_long.as_str(),
    ] {
        let message = expect_invalid::<SessionKey>(&json!(bad).to_string());
        assert!(message.contains("session key"), "{bad:?}: {message}");
    }
    let owner = wire_value(&fixtures::acp_session_owner());
    expect_invalid::<AcpSessionOwner>(&with(
        owner.clone(),
        "/ownerSessionKey",
        json!("agent:main"),
    ));
    expect_invalid::<AcpSessionOwner>(&with(owner, "/spawnedBy", json!("a b")));
    let event = wire_value(&fixtures::event_child_spawned());
    expect_invalid::<SessionStateEvent>(&with(event, "/childSessionKey", json!("x::y")));
    let input = wire_value(&fixtures::visibility_input());
    expect_invalid::<SessionVisibilityInput>(&with(input, "/row/key", json!("")));
}

/// Decodes `text` as `T`; an accepted document must re-encode to one that decodes equal.
fn decode_checked<T>(text: &str) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    match from_json::<T>(text) {
        Ok(value) => {
            let again: T = from_json(&to_json(&value).unwrap()).unwrap();
            prop_assert_eq!(again, value);
        }
        Err(WireError::Encode { .. }) => prop_assert!(false, "decoding reported an encode error"),
        Err(_) => {}
    }
    Ok(())
}

/// Runs every wire type's decoder over the text.
fn decode_as_everything(text: &str) -> Result<(), TestCaseError> {
    decode_checked::<DurableSendIntent>(text)?;
    decode_checked::<ChannelMessage>(text)?;
    decode_checked::<MessageRelation>(text)?;
    decode_checked::<MessageOrigin>(text)?;
    decode_checked::<MessageReceipt>(text)?;
    decode_checked::<RenderedMessageBatch>(text)?;
    decode_checked::<DeliveryFailure>(text)?;
    decode_checked::<ReceiveAckPolicy>(text)?;
    decode_checked::<LiveMessageState>(text)?;
    decode_checked::<LiveMessageUpdate>(text)?;
    decode_checked::<MessageCapabilities>(text)?;
    decode_checked::<SessionKey>(text)?;
    decode_checked::<SessionStateEvent>(text)?;
    decode_checked::<StateVersion>(text)?;
    decode_checked::<AcpSessionOwner>(text)?;
    decode_checked::<AcpxProcessLease>(text)?;
    decode_checked::<AgentToAgentPolicy>(text)?;
    decode_checked::<SessionVisibilityInput>(text)?;
    decode_checked::<IntentId>(text)?;
    decode_checked::<IntentStatus>(text)?;
    Ok(())
}

/// A valid document of some wire type, as a JSON tree.
///
/// Each arm is boxed: unboxed, the union's value tree holds all eight composite trees inline,
/// which overflows a test thread's stack in debug builds.
fn valid_document() -> impl Strategy<Value = Value> {
    prop_oneof![
        s::durable_send_intent()
            .prop_map(|v| wire_value(&v))
            .boxed(),
        s::live_update().prop_map(|v| wire_value(&v)).boxed(),
        s::receive_ack_policy().prop_map(|v| wire_value(&v)).boxed(),
        s::acpx_lease().prop_map(|v| wire_value(&v)).boxed(),
        s::session_state_event()
            .prop_map(|v| wire_value(&v))
            .boxed(),
        s::visibility_input().prop_map(|v| wire_value(&v)).boxed(),
        s::capabilities().prop_map(|v| wire_value(&v)).boxed(),
        s::acp_session_owner().prop_map(|v| wire_value(&v)).boxed(),
    ]
}

#[derive(Debug, Clone)]
enum Edit {
    Delete(Index, usize),
    Insert(Index, char),
    Replace(Index, char),
    Truncate(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    let ch = prop_oneof![
        proptest::sample::select(vec![
            '{', '}', '[', ']', '"', ':', ',', '\\', '-', '0', 'e', ' '
        ]),
        any::<char>(),
    ];
    prop_oneof![
        (any::<Index>(), 1usize..8).prop_map(|(at, len)| Edit::Delete(at, len)),
        (any::<Index>(), ch.clone()).prop_map(|(at, c)| Edit::Insert(at, c)),
        (any::<Index>(), ch).prop_map(|(at, c)| Edit::Replace(at, c)),
        any::<Index>().prop_map(Edit::Truncate),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for edit in edits {
        let len = chars.len();
        match *edit {
            Edit::Delete(at, n) if len > 0 => {
                let start = at.index(len);
                chars.drain(start..(start + n).min(len));
            }
            Edit::Insert(at, c) => chars.insert(at.index(len + 1), c),
            Edit::Replace(at, c) if len > 0 => chars[at.index(len)] = c,
            Edit::Truncate(at) => chars.truncate(at.index(len + 1)),
            _ => {}
        }
    }
    chars.into_iter().collect()
}

/// Replaces the `n`-th node (pre-order) of `tree` with `with`; true when it was found.
fn replace_node(tree: &mut Value, n: &mut usize, with: &Value) -> bool {
    if *n == 0 {
        *tree = with.clone();
        return true;
    }
    *n -= 1;
    match tree {
        Value::Array(items) => items.iter_mut().any(|item| replace_node(item, n, with)),
        Value::Object(map) => map.values_mut().any(|child| replace_node(child, n, with)),
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        decode_as_everything(&text)?;
    }

    #[test]
    fn json_shaped_text_never_panics(text in r#"[\[\]{}",:0-9a-zA-Z_ \-.]{0,64}"#) {
        decode_as_everything(&text)?;
    }

    #[test]
    fn edited_valid_json_never_panics(doc in valid_document(), edits in vec(edit(), 1..4)) {
        decode_as_everything(&apply(&doc.to_string(), &edits))?;
    }

    #[test]
    fn valid_json_with_a_node_replaced_never_panics(
        doc in valid_document(),
        node in any::<Index>(),
        replacement in s::json_value(),
    ) {
        let mut tree = doc;
        let mut count = 0;
        count_nodes(&tree, &mut count);
        let mut n = node.index(count);
        prop_assert!(replace_node(&mut tree, &mut n, &replacement));
        decode_as_everything(&tree.to_string())?;
        // Decoding from a parsed tree takes the other entry point; it must not panic either.
        let _ = from_json_value::<DurableSendIntent>(tree.clone());
        let _ = from_json_value::<SessionVisibilityInput>(tree);
    }
}

fn count_nodes(tree: &Value, count: &mut usize) {
    *count += 1;
    match tree {
        Value::Array(items) => items.iter().for_each(|item| count_nodes(item, count)),
        Value::Object(map) => map.values().for_each(|child| count_nodes(child, count)),
        _ => {}
    }
}
