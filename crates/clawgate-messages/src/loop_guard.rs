//! Bot-loop protection: origin markers cannot cover every platform (or every other bot), so a
//! pair of bots answering each other in a room is cut off after too many messages in a window,
//! for a cooldown.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use clawgate_types::UnixMillis;

/// How much bot-to-bot traffic a room tolerates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BotLoopLimits {
    /// Messages from one bot to us in one room within `window_ms` before the pair is cut off.
    pub max_messages: u32,
    pub window_ms: i64,
    /// How long a cut-off pair stays cut off.
    pub cooldown_ms: i64,
}

impl Default for BotLoopLimits {
    fn default() -> Self {
        BotLoopLimits {
            max_messages: 10,
            window_ms: 60_000,
            cooldown_ms: 5 * 60_000,
        }
    }
}

#[derive(Debug, Default)]
struct PairState {
    recent: VecDeque<UnixMillis>,
    cooldown_until: Option<UnixMillis>,
}

/// Counts bot messages per (room, bot) pair for one gateway account.
#[derive(Debug)]
pub struct BotLoopGuard {
    limits: BotLoopLimits,
    pairs: Mutex<HashMap<(String, String), PairState>>,
}

impl BotLoopGuard {
    pub fn new(limits: BotLoopLimits) -> BotLoopGuard {
        BotLoopGuard {
            limits,
            pairs: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a message from bot `author` in `room` at `now` may be processed.
    pub fn admit(&self, room: &str, author: &str, now: UnixMillis) -> bool {
        let mut pairs = self
            .pairs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let pair = pairs
            .entry((room.to_owned(), author.to_owned()))
            .or_default();
        if let Some(until) = pair.cooldown_until {
            if now < until {
                return false;
            }
            pair.cooldown_until = None;
            pair.recent.clear();
        }
        while pair
            .recent
            .front()
            .is_some_and(|t| now.saturating_sub(*t) >= self.limits.window_ms)
        {
            pair.recent.pop_front();
        }
        if pair.recent.len() >= self.limits.max_messages as usize {
            pair.cooldown_until = Some(now.saturating_add(self.limits.cooldown_ms));
            return false;
        }
        pair.recent.push_back(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chatty_pair_is_cut_off_for_the_cooldown_and_others_are_not() {
        let guard = BotLoopGuard::new(BotLoopLimits {
            max_messages: 3,
            window_ms: 1_000,
            cooldown_ms: 10_000,
        });
        // (case, room, author, at, admitted)
        let steps: &[(&str, &str, &str, i64, bool)] = &[
            ("first", "room", "bot-b", 0, true),
            ("second", "room", "bot-b", 100, true),
            ("third", "room", "bot-b", 200, true),
            (
                "fourth in the window trips the guard",
                "room",
                "bot-b",
                300,
                false,
            ),
            (
                "another bot in the room is counted apart",
                "room",
                "bot-c",
                300,
                true,
            ),
            (
                "the same bot in another room too",
                "other",
                "bot-b",
                300,
                true,
            ),
            (
                "still cooling down after the window passed",
                "room",
                "bot-b",
                5_000,
                false,
            ),
            (
                "after the cooldown the pair starts over",
                "room",
                "bot-b",
                10_300,
                true,
            ),
            ("slow traffic never trips it", "slow", "bot-b", 0, true),
            ("slow 2", "slow", "bot-b", 1_000, true),
            ("slow 3", "slow", "bot-b", 2_000, true),
            ("slow 4", "slow", "bot-b", 3_000, true),
        ];
        for (case, room, author, at, admitted) in steps {
            assert_eq!(guard.admit(room, author, *at), *admitted, "{case}");
        }
    }
}
