//! Who produced a message, and how the gateway treats echoes of it.
//!
//! Origin is separate from relation: a message can answer a user and still be operational output
//! produced by the gateway. The core owns what an origin means; channels only encode it into (and
//! decode it from) their transport metadata. Echo suppression is marker based, never text based.

use serde::{Deserialize, Serialize};

/// Producer of a message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "source", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MessageOrigin {
    /// Output the gateway itself produced (structured, versioned marker).
    Clawgate(GatewayOrigin),
    /// A person wrote it.
    User,
    /// A bot other than this gateway wrote it.
    ExternalBot,
    /// The platform itself produced it (joins, pins, service notices).
    Platform,
    /// Nothing says who produced it.
    Unknown,
}

/// The structured marker carried by gateway-produced output.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GatewayOrigin {
    /// Version of this marker's shape; readers ignore markers of versions they do not know.
    pub schema_version: u32,
    /// What kind of gateway output it is.
    pub kind: GatewayOriginKind,
    /// Why the gateway produced it.
    pub code: GatewayFailureCode,
    /// What to do when it comes back in as input.
    pub echo_policy: EchoPolicy,
}

/// What kind of gateway output this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum GatewayOriginKind {
    /// A notice that something failed.
    GatewayFailure,
}

/// Why the gateway had to tell a human that something failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum GatewayFailureCode {
    /// The agent failed before it produced a reply.
    AgentFailedBeforeReply,
    /// The model provider's API key is not configured.
    MissingApiKey,
    /// The model provider's login has expired.
    ModelLoginExpired,
    /// Every agent session is busy: the message waits for one (a delay, nothing lost). Beyond
    /// the design's three codes, so a bot in a shared room drops this notice's echo too.
    AgentsBusy,
    /// The agent works on the message without visible output yet: a delay, nothing lost.
    AgentStillWorking,
}

/// What to do when a marked message comes back in as input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EchoPolicy {
    /// Drop the echo when a bot posts it back into a shared room.
    DropBotRoomEcho,
}

/// The current version of [`GatewayOrigin`].
pub const GATEWAY_ORIGIN_SCHEMA_VERSION: u32 = 1;

impl MessageOrigin {
    /// The origin every gateway-failure notice carries: visible to humans, dropped as a bot echo.
    pub fn gateway_failure(code: GatewayFailureCode) -> Self {
        MessageOrigin::Clawgate(GatewayOrigin {
            schema_version: GATEWAY_ORIGIN_SCHEMA_VERSION,
            kind: GatewayOriginKind::GatewayFailure,
            code,
            echo_policy: EchoPolicy::DropBotRoomEcho,
        })
    }
}

/// Platform facts about an inbound message that the echo decision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EchoFacts {
    /// The platform says a bot account wrote it.
    pub is_bot_author: bool,
    /// It was posted in a room shared by several participants (not a direct chat).
    pub is_roomish: bool,
}

/// Whether an inbound message is an echo of the gateway's own failure output that must be dropped
/// before bot authorization.
///
/// Drops only bot-authored, room-like messages whose decoded origin marks a gateway failure with
/// the `drop_bot_room_echo` policy. A bot message with the same visible text but no marker is
/// *not* dropped: it still goes through normal bot authorization.
pub fn should_drop_gateway_echo(origin: Option<&MessageOrigin>, facts: EchoFacts) -> bool {
    facts.is_bot_author
        && facts.is_roomish
        && matches!(
            origin,
            Some(MessageOrigin::Clawgate(GatewayOrigin {
                schema_version: GATEWAY_ORIGIN_SCHEMA_VERSION,
                kind: GatewayOriginKind::GatewayFailure,
                echo_policy: EchoPolicy::DropBotRoomEcho,
                ..
            }))
        )
}
