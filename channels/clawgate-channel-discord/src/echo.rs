//! The outbound echo registry. A Discord message cannot carry origin metadata, so the origin of
//! what a clawgate account sent (a gateway-failure notice, say) is remembered here, keyed by the
//! platform message id (and, until the answer comes, by the send's nonce: the `MESSAGE_CREATE`
//! may arrive before the REST answer). When another account in a shared room receives that
//! message from the Gateway, [`EchoRegistry::origin_of`] hands the engine its origin, and the
//! engine drops a marked echo before `allow_bots` is even asked.
//!
//! Bounded in size (oldest entries go first) and in time (entries older than the TTL are
//! forgotten); scoped by channel and account: an entry matches only a message in its channel
//! whose author is the bot account that registered it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clawgate_types::MessageOrigin;

use crate::wire::Message;

/// How many sends the registry remembers by default.
pub const DEFAULT_ECHO_CAPACITY: usize = 4096;
/// How long by default (an echo arrives within seconds; a resume may replay it minutes later).
pub const DEFAULT_ECHO_TTL: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Message(String),
    Nonce(String),
}

#[derive(Debug, Clone)]
struct Entry {
    /// The bot user id of the account that sent it.
    author: String,
    origin: MessageOrigin,
    at: Instant,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<(String, Key), Entry>,
    order: VecDeque<(String, Key)>,
}

/// Origins of recent outbound messages, shared by every Discord account of one gateway.
#[derive(Debug)]
pub struct EchoRegistry {
    entries: Mutex<Entries>,
    capacity: usize,
    ttl: Duration,
}

impl Default for EchoRegistry {
    fn default() -> Self {
        EchoRegistry::new(DEFAULT_ECHO_CAPACITY, DEFAULT_ECHO_TTL)
    }
}

impl EchoRegistry {
    /// A registry of at most `capacity` entries, each kept `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> EchoRegistry {
        EchoRegistry {
            entries: Mutex::new(Entries::default()),
            capacity: capacity.max(1),
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn insert(&self, channel: &str, key: Key, author: &str, origin: &MessageOrigin) {
        let now = Instant::now();
        let mut e = self.lock();
        let id = (channel.to_owned(), key);
        let fresh = e
            .map
            .insert(
                id.clone(),
                Entry {
                    author: author.to_owned(),
                    origin: origin.clone(),
                    at: now,
                },
            )
            .is_none();
        if fresh {
            e.order.push_back(id);
        }
        self.evict(&mut e, now);
    }

    fn evict(&self, e: &mut Entries, now: Instant) {
        while let Some(oldest) = e.order.front().cloned() {
            let expired = e
                .map
                .get(&oldest)
                .is_none_or(|x| now.duration_since(x.at) >= self.ttl);
            if e.order.len() > self.capacity || expired {
                e.order.pop_front();
                e.map.remove(&oldest);
            } else {
                break;
            }
        }
    }

    /// Before a send: the nonce it carries, in `channel`, by bot `author`.
    pub fn expect(&self, channel: &str, nonce: &str, author: &str, origin: &MessageOrigin) {
        self.insert(channel, Key::Nonce(nonce.to_owned()), author, origin);
    }

    /// After a send: the message id Discord gave it.
    pub fn sent(&self, channel: &str, message_id: &str, author: &str, origin: &MessageOrigin) {
        self.insert(channel, Key::Message(message_id.to_owned()), author, origin);
    }

    /// The origin of `message`, when an account of this gateway sent it (same channel, same
    /// author) within the TTL.
    pub fn origin_of(&self, message: &Message) -> Option<MessageOrigin> {
        let now = Instant::now();
        let mut e = self.lock();
        self.evict(&mut e, now);
        let mut keys = vec![Key::Message(message.id.clone())];
        keys.extend(message.nonce_text().map(Key::Nonce));
        keys.into_iter().find_map(|key| {
            e.map
                .get(&(message.channel_id.clone(), key))
                .filter(|x| x.author == message.author.id && now.duration_since(x.at) < self.ttl)
                .map(|x| x.origin.clone())
        })
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use clawgate_types::GatewayFailureCode;

    use super::*;
    use crate::wire::User;

    fn message(id: &str, channel: &str, author: &str, nonce: Option<&str>) -> Message {
        Message {
            id: id.into(),
            channel_id: channel.into(),
            guild_id: None,
            author: User {
                id: author.into(),
                username: "b".into(),
                bot: true,
            },
            content: "x".into(),
            nonce: nonce.map(|n| serde_json::json!(n)),
            message_reference: None,
            webhook_id: None,
            attachments: Vec::new(),
        }
    }

    fn marker() -> MessageOrigin {
        MessageOrigin::gateway_failure(GatewayFailureCode::AgentFailedBeforeReply)
    }

    #[test]
    fn entries_are_scoped_by_channel_and_author() {
        let registry = EchoRegistry::default();
        registry.sent("c1", "m1", "bot-a", &marker());
        assert_eq!(
            registry.origin_of(&message("m1", "c1", "bot-a", None)),
            Some(marker())
        );
        assert_eq!(
            registry.origin_of(&message("m1", "c2", "bot-a", None)),
            None
        );
        assert_eq!(
            registry.origin_of(&message("m1", "c1", "bot-b", None)),
            None
        );
        registry.expect("c1", "n1", "bot-a", &marker());
        assert_eq!(
            registry.origin_of(&message("m9", "c1", "bot-a", Some("n1"))),
            Some(marker())
        );
    }

    #[test]
    fn the_registry_is_bounded_in_size_and_time() {
        let registry = EchoRegistry::new(2, Duration::from_secs(60));
        for id in ["m1", "m2", "m3"] {
            registry.sent("c", id, "bot", &marker());
        }
        assert_eq!(registry.len(), 2);
        assert_eq!(registry.origin_of(&message("m1", "c", "bot", None)), None);
        assert!(
            registry
                .origin_of(&message("m3", "c", "bot", None))
                .is_some()
        );
        let short = EchoRegistry::new(10, Duration::ZERO);
        short.sent("c", "m1", "bot", &marker());
        assert_eq!(short.origin_of(&message("m1", "c", "bot", None)), None);
        assert!(short.is_empty());
    }
}
