//! The sent-echo cache: how the channel recognises its own messages when the server hands them
//! back as `new-message` events (platform-apis-wave2 §3.3).
//!
//! BlueBubbles emits every row that appears in chat.db, ours included: a few seconds after a
//! send, our own text comes back with `isFromMe: true`, under the real guid (which we may not
//! know yet: the send's answer can come later, or be lost), carrying our `tempGuid` only when
//! the server's outgoing matcher found it, its text possibly altered. The adapter writes each
//! unit it sends here **before** the request goes out (the durable path, recovery sends after
//! a restart and every chunk alike: all of them are `send_unit`), and adds the real guid once
//! the answer names it. An event is our echo when:
//!
//! 1. its guid is one we sent (answered, or matched before), or
//! 2. it carries a `tempGuid` we sent, or
//! 3. an unused entry of the same chat has the same [normalised](normalise) text, written at
//!    most `ttl` ago (and not more than [`CLOCK_SKEW_MS`] after the event's own time). Each
//!    entry matches one echo (by any of these): the echo's guid is then remembered, so a
//!    second copy of the same event matches by guid, and the same words later do not match.
//!
//! Only events with `isFromMe: true` are ever looked up: a person typing the same words as
//! our reply (`isFromMe: false`) is never taken for an echo.
//!
//! Bounds: entries older than `ttl` are dropped, and at most `capacity` are kept (the oldest go
//! first). An echo later than that is not recognised: it degrades to an own-account message,
//! which the `isFromMe` guard still keeps from being answered (unless the account answers its
//! own messages, `from_me_is_inbound`: then it is a duplicate turn, never a lost one).
//!
//! Restarts and other gateways: the entries come from the send journal's attempts, in the
//! gateway's store, written before each request. The cache is fed the attempts younger than
//! `ttl` when the channel opens, and the ones appended since (by any gateway sharing the store)
//! whenever an own-account message matches nothing; so an echo arriving after a crash, or of a
//! send another gateway made, is still recognised.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// How much later than its event's own time an entry may have been written (the Mac's clock
/// against ours).
pub const CLOCK_SKEW_MS: u64 = 30_000;

/// The text as the cache compares it: letters and digits only, lowercased (the server's own
/// outgoing matcher compares alphanumeric-normalised text; Messages may swap quotes, trim
/// whitespace or add object-replacement characters).
pub fn normalise(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

#[derive(Debug, Clone)]
struct Entry {
    chat: String,
    text: String,
    temp_guid: String,
    at_ms: u64,
    guids: Vec<String>,
    /// Matched an echo by text already.
    used: bool,
}

#[derive(Debug)]
struct Cache {
    entries: VecDeque<Entry>,
    ttl_ms: u64,
    capacity: usize,
}

impl Cache {
    fn prune(&mut self, now_ms: u64) {
        let ttl = self.ttl_ms;
        self.entries
            .retain(|e| e.at_ms.saturating_add(ttl) >= now_ms);
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
        }
    }
}

/// The sent-echo cache (cheap to clone; one per account).
#[derive(Debug, Clone)]
pub struct EchoCache {
    inner: Arc<Mutex<Cache>>,
}

/// Why an event was taken for our echo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EchoMatch {
    /// Its guid is one of our sends.
    Guid,
    /// It carries the `tempGuid` of one of our sends.
    TempGuid,
    /// Same chat, same normalised text, within the TTL.
    Text,
}

impl EchoCache {
    /// An empty cache keeping entries `ttl_ms` long, at most `capacity` of them.
    pub fn new(ttl_ms: u64, capacity: usize) -> EchoCache {
        EchoCache {
            inner: Arc::new(Mutex::new(Cache {
                entries: VecDeque::new(),
                ttl_ms,
                capacity: capacity.max(1),
            })),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long an entry is kept.
    pub fn ttl_ms(&self) -> u64 {
        self.cache().ttl_ms
    }

    /// A unit about to be sent to `chat` (at `at_ms`); `now_ms` prunes.
    pub fn remember(&self, chat: &str, text: &str, temp_guid: &str, at_ms: u64, now_ms: u64) {
        let mut cache = self.cache();
        if cache.entries.iter().any(|e| e.temp_guid == temp_guid) {
            return;
        }
        cache.entries.push_back(Entry {
            chat: chat.to_owned(),
            text: normalise(text),
            temp_guid: temp_guid.to_owned(),
            at_ms,
            guids: Vec::new(),
            used: false,
        });
        cache.prune(now_ms);
    }

    /// The server named the real guid of the send with `temp_guid`.
    pub fn learn_guid(&self, temp_guid: &str, guid: &str) {
        let mut cache = self.cache();
        if let Some(entry) = cache.entries.iter_mut().find(|e| e.temp_guid == temp_guid)
            && !entry.guids.iter().any(|g| g == guid)
        {
            entry.guids.push(guid.to_owned());
        }
    }

    /// Whether an `isFromMe` event of `chat` (its `guid`, `tempGuid` if any, text, and
    /// `dateCreated`) is the echo of one of our sends, looked up at `now_ms`.
    pub fn is_echo(
        &self,
        chat: &str,
        guid: &str,
        temp_guid: Option<&str>,
        text: &str,
        created_ms: u64,
        now_ms: u64,
    ) -> Option<EchoMatch> {
        let mut cache = self.cache();
        cache.prune(now_ms);
        // An entry that matched its echo by id is used up for text matches: the same words
        // later are someone else's.
        if let Some(entry) = cache
            .entries
            .iter_mut()
            .find(|e| e.guids.iter().any(|g| g == guid))
        {
            entry.used = true;
            return Some(EchoMatch::Guid);
        }
        if let Some(temp) = temp_guid
            && let Some(entry) = cache.entries.iter_mut().find(|e| e.temp_guid == temp)
        {
            entry.guids.push(guid.to_owned());
            entry.used = true;
            return Some(EchoMatch::TempGuid);
        }
        let text = normalise(text);
        if text.is_empty() {
            return None;
        }
        let entry = cache.entries.iter_mut().find(|e| {
            !e.used
                && e.chat == chat
                && e.text == text
                && e.at_ms <= created_ms.saturating_add(CLOCK_SKEW_MS)
        })?;
        entry.used = true;
        entry.guids.push(guid.to_owned());
        Some(EchoMatch::Text)
    }

    /// How many entries are kept now.
    pub fn len(&self) -> usize {
        self.cache().entries.len()
    }

    /// Whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: &str = "iMessage;-;+15550001111";

    #[test]
    fn echoes_match_by_guid_temp_guid_or_text_once_each() {
        let cache = EchoCache::new(60_000, 16);
        cache.remember(CHAT, "Hello, “world”!", "t1", 1_000, 1_000);
        cache.remember(CHAT, "again", "t2", 1_000, 1_000);
        cache.learn_guid("t2", "G2");
        // Text altered by Messages (quotes, spacing) still matches, once.
        assert_eq!(
            cache.is_echo(CHAT, "G1", None, "hello, \"world\" !", 2_000, 2_000),
            Some(EchoMatch::Text)
        );
        // A second copy of the same event matches by its guid now.
        assert_eq!(
            cache.is_echo(CHAT, "G1", None, "hello world", 2_000, 2_100),
            Some(EchoMatch::Guid)
        );
        // Another message with the same words is not ours: the entry was used.
        assert_eq!(
            cache.is_echo(CHAT, "G9", None, "hello world", 2_000, 2_200),
            None
        );
        assert_eq!(
            cache.is_echo(CHAT, "G2", None, "whatever", 2_000, 2_200),
            Some(EchoMatch::Guid)
        );
        cache.remember(CHAT, "third", "t3", 3_000, 3_000);
        assert_eq!(
            cache.is_echo(CHAT, "G3", Some("t3"), "edited text", 3_000, 3_100),
            Some(EchoMatch::TempGuid)
        );
        // Another chat never matches by text.
        cache.remember(CHAT, "scoped", "t4", 3_000, 3_000);
        assert_eq!(
            cache.is_echo("iMessage;-;+1999", "G4", None, "scoped", 3_000, 3_100),
            None
        );
    }

    #[test]
    fn the_cache_is_bounded_by_ttl_and_capacity() {
        let cache = EchoCache::new(10_000, 3);
        for n in 0..5u64 {
            cache.remember(
                CHAT,
                &format!("text {n}"),
                &format!("t{n}"),
                1_000 + n,
                1_000 + n,
            );
        }
        assert_eq!(cache.len(), 3, "the oldest go first");
        assert_eq!(
            cache.is_echo(CHAT, "G0", None, "text 0", 1_000, 1_010),
            None
        );
        assert_eq!(
            cache.is_echo(CHAT, "G4", None, "text 4", 1_004, 1_010),
            Some(EchoMatch::Text)
        );
        // Past the TTL nothing matches any more: the entries are gone.
        assert_eq!(
            cache.is_echo(CHAT, "G3", None, "text 3", 1_003, 20_000),
            None
        );
        assert!(cache.is_empty());
    }
}
