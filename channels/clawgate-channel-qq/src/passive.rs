//! The passive-reply pair `(msg_id, msg_seq)`: which inbound message a send answers, and the
//! sequence number that makes every attempt of one unit the same request to QQ. The adapter
//! sends with it; the renderer reads which message a send answers (to pick its reply target).

use clawgate_types::{ChannelMessage, MessageRelation};
use sha2::{Digest, Sha256};

use clawgate_channel_sdk::SendContext;

/// The `msg_seq` of a unit: 31 bits of SHA-256 of its durable key (never 0), the same on every
/// attempt and after a restart. Two units answering the same message collide with a
/// probability of about n²/2³² (n units); a collision would make the second one look
/// deduplicated.
pub fn msg_seq_of(unit_key: &str) -> u64 {
    let digest = Sha256::digest(unit_key.as_bytes());
    let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) & 0x7fff_ffff;
    u64::from(n.max(1))
}

/// The inbound message a send answers: the relation's reply-to (or inbound id), else the
/// event named by the send's key (`<channel>:reply:<msg_id>:<n>`, `<channel>:failure:<msg_id>`).
pub fn answered_of(message: &ChannelMessage, key: &str) -> Option<String> {
    if let Some(MessageRelation::Reply {
        reply_to_id,
        inbound_message_id,
        ..
    }) = &message.relation
        && let Some(id) = reply_to_id.as_ref().or(inbound_message_id.as_ref())
    {
        return Some(id.clone());
    }
    // A preview's or streamed media's key carries a suffix after the reply key.
    let key = key.split('~').next().unwrap_or(key);
    if let Some((_, rest)) = key.split_once(":reply:") {
        return rest.rsplit_once(':').map(|(event, _)| event.to_owned());
    }
    key.split_once(":failure:")
        .map(|(_, event)| event.to_owned())
}

/// The inbound message a send of `ctx` answers (see [`answered_of`]).
pub fn answered_msg_id(ctx: &SendContext) -> Option<String> {
    answered_of(&ctx.message, &ctx.idempotency_key)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use clawgate_types::MessageTarget;

    fn ctx(key: &str, relation: Option<MessageRelation>) -> SendContext {
        let mut message = ChannelMessage::outbound("m", "qq", MessageTarget::direct("U"), "hi");
        message.relation = relation;
        SendContext::new(message, key)
    }

    #[test]
    fn the_answered_message_comes_from_the_relation_or_the_reply_key() {
        let cases = [
            ("qq:reply:ROBOT1.0_a.b!!:0", None, Some("ROBOT1.0_a.b!!")),
            (
                "qq:reply:ROBOT1.0_a:b:3~preview",
                None,
                Some("ROBOT1.0_a:b"),
            ),
            ("qq:failure:M9", None, Some("M9")),
            ("qq:relay:x", None, None),
            (
                "qq:relay:x",
                Some(MessageRelation::reply_to("R1")),
                Some("R1"),
            ),
        ];
        for (key, relation, want) in cases {
            assert_eq!(
                answered_msg_id(&ctx(key, relation)).as_deref(),
                want,
                "{key}"
            );
        }
    }

    #[test]
    fn msg_seq_is_stable_per_unit_and_differs_between_units() {
        let a = msg_seq_of("qq:reply:M:0#0");
        assert_eq!(a, msg_seq_of("qq:reply:M:0#0"));
        assert_ne!(a, msg_seq_of("qq:reply:M:0#1"));
        assert_ne!(a, msg_seq_of("qq:reply:M:0~preview#0"));
        assert!((1..=0x7fff_ffff).contains(&a));
    }
}
