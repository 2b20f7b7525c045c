//! Gateway origin markers and the echo-suppression predicate.

use clawgate_types::{
    EchoFacts, EchoPolicy, GATEWAY_ORIGIN_SCHEMA_VERSION, GatewayFailureCode, GatewayOrigin,
    GatewayOriginKind, MessageOrigin, should_drop_gateway_echo,
};
use serde_json::json;

use crate::helpers::wire_value;
use crate::variants::GATEWAY_FAILURE_CODES;

fn marked() -> MessageOrigin {
    MessageOrigin::gateway_failure(GatewayFailureCode::AgentFailedBeforeReply)
}

fn with_version(schema_version: u32) -> MessageOrigin {
    MessageOrigin::Clawgate(GatewayOrigin {
        schema_version,
        kind: GatewayOriginKind::GatewayFailure,
        code: GatewayFailureCode::AgentFailedBeforeReply,
        echo_policy: EchoPolicy::DropBotRoomEcho,
    })
}

#[derive(Debug)]
struct EchoCase {
    name: &'static str,
    bot: bool,
    roomish: bool,
    origin: Option<MessageOrigin>,
    drop: bool,
}

fn case(
    name: &'static str,
    bot: bool,
    roomish: bool,
    origin: Option<MessageOrigin>,
    drop: bool,
) -> EchoCase {
    EchoCase {
        name,
        bot,
        roomish,
        origin,
        drop,
    }
}

#[test]
fn echo_table() {
    use GatewayFailureCode::{AgentsBusy, MissingApiKey, ModelLoginExpired};
    let failure = MessageOrigin::gateway_failure;
    #[rustfmt::skip]
    let cases = [
        // The one dropping shape: a marked gateway failure posted back by a bot into a room.
        case("marked, bot, room: drop",                true,  true,  Some(marked()), true),
        case("marked missing_api_key: drop",           true,  true,  Some(failure(MissingApiKey)), true),
        case("marked model_login_expired: drop",       true,  true,  Some(failure(ModelLoginExpired)), true),
        case("marked agents_busy: drop",               true,  true,  Some(failure(AgentsBusy)), true),
        // Marked, but not both a bot author and a room.
        case("marked, bot, direct chat",               true,  false, Some(marked()), false),
        case("marked, human, room",                    false, true,  Some(marked()), false),
        case("marked, human, direct chat",             false, false, Some(marked()), false),
        // Bot in a room, but no gateway marker: normal bot authorization decides.
        case("no origin, bot, room",                   true,  true,  None, false),
        case("user origin, bot, room",                 true,  true,  Some(MessageOrigin::User), false),
        case("external bot origin, bot, room",         true,  true,  Some(MessageOrigin::ExternalBot), false),
        case("platform origin, bot, room",             true,  true,  Some(MessageOrigin::Platform), false),
        case("unknown origin, bot, room",              true,  true,  Some(MessageOrigin::Unknown), false),
        // Markers of a version this reader does not know are ignored.
        case("schema version 0, bot, room",            true,  true,  Some(with_version(0)), false),
        case("schema version 2, bot, room",            true,  true,  Some(with_version(2)), false),
        case("schema version max, bot, room",          true,  true,  Some(with_version(u32::MAX)), false),
        case("no origin, human, direct chat",          false, false, None, false),
        case("user origin, human, room",               false, true,  Some(MessageOrigin::User), false),
    ];
    for EchoCase {
        name,
        bot,
        roomish,
        origin,
        drop,
    } in &cases
    {
        let facts = EchoFacts {
            is_bot_author: *bot,
            is_roomish: *roomish,
        };
        assert_eq!(
            should_drop_gateway_echo(origin.as_ref(), facts),
            *drop,
            "case: {name}"
        );
    }
    // Every bot × room combination appears for the marked origin.
    for bot in [false, true] {
        for roomish in [false, true] {
            assert!(
                cases
                    .iter()
                    .any(|c| (c.bot, c.roomish, c.origin.as_ref())
                        == (bot, roomish, Some(&marked()))),
                "missing marked case bot={bot} roomish={roomish}"
            );
        }
    }
}

/// Channels decode the marker from transport metadata: the decoded JSON must drive the decision.
#[test]
fn echo_decision_from_decoded_markers() {
    let facts = EchoFacts {
        is_bot_author: true,
        is_roomish: true,
    };
    let decode = |value: serde_json::Value| -> MessageOrigin {
        clawgate_types::from_json_value(value).unwrap()
    };
    let v1 = decode(json!({
        "source": "clawgate", "schemaVersion": 1, "kind": "gateway_failure",
        "code": "missing_api_key", "echoPolicy": "drop_bot_room_echo"
    }));
    assert!(should_drop_gateway_echo(Some(&v1), facts));
    let v2 = decode(json!({
        "source": "clawgate", "schemaVersion": 2, "kind": "gateway_failure",
        "code": "missing_api_key", "echoPolicy": "drop_bot_room_echo"
    }));
    assert!(!should_drop_gateway_echo(Some(&v2), facts));
    let user = decode(json!({ "source": "user" }));
    assert!(!should_drop_gateway_echo(Some(&user), facts));
}

#[test]
fn gateway_failure_factory() {
    assert_eq!(GATEWAY_ORIGIN_SCHEMA_VERSION, 1);
    let spellings = [
        (
            GatewayFailureCode::AgentFailedBeforeReply,
            "agent_failed_before_reply",
        ),
        (GatewayFailureCode::MissingApiKey, "missing_api_key"),
        (GatewayFailureCode::ModelLoginExpired, "model_login_expired"),
        (GatewayFailureCode::AgentsBusy, "agents_busy"),
        (GatewayFailureCode::AgentStillWorking, "agent_still_working"),
    ];
    assert_eq!(spellings.map(|(c, _)| c).as_slice(), GATEWAY_FAILURE_CODES);
    for (code, spelling) in spellings {
        let origin = MessageOrigin::gateway_failure(code);
        assert_eq!(
            origin,
            MessageOrigin::Clawgate(GatewayOrigin {
                schema_version: 1,
                kind: GatewayOriginKind::GatewayFailure,
                code,
                echo_policy: EchoPolicy::DropBotRoomEcho,
            })
        );
        assert_eq!(
            wire_value(&origin),
            json!({
                "source": "clawgate",
                "schemaVersion": 1,
                "kind": "gateway_failure",
                "code": spelling,
                "echoPolicy": "drop_bot_room_echo",
            })
        );
        // The factory's own output is what the echo check drops.
        let facts = EchoFacts {
            is_bot_author: true,
            is_roomish: true,
        };
        assert!(should_drop_gateway_echo(Some(&origin), facts), "{code:?}");
    }
}

#[test]
fn default_facts_never_drop() {
    assert_eq!(
        EchoFacts::default(),
        EchoFacts {
            is_bot_author: false,
            is_roomish: false
        }
    );
    assert!(!should_drop_gateway_echo(
        Some(&marked()),
        EchoFacts::default()
    ));
}
