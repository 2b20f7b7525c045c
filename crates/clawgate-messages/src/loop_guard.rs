//! Bot-loop protection: origin markers cannot cover every platform (or every other bot), so a
//! pair of bots answering each other in a room is cut off after too many messages in a window,
//! for a cooldown. The pairs kept are bounded: a flood of distinct bots cannot grow the map
//! without limit, and cannot push a pair in its cooldown out to let it loop again.

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
    /// Most (room, bot) pairs remembered. Past it, idle pairs are forgotten first (nothing in
    /// the window, no cooldown: forgetting them changes no answer), then the quietest of the
    /// counting ones, and pairs in their cooldown last (those whose cooldown ends soonest).
    pub max_pairs: usize,
}

impl Default for BotLoopLimits {
    fn default() -> Self {
        BotLoopLimits {
            max_messages: 10,
            window_ms: 60_000,
            cooldown_ms: 5 * 60_000,
            max_pairs: 10_000,
        }
    }
}

#[derive(Debug, Default)]
struct PairState {
    recent: VecDeque<UnixMillis>,
    cooldown_until: Option<UnixMillis>,
}

impl PairState {
    /// The order in which pairs are forgotten when the map is full, lowest first: idle pairs,
    /// then counting pairs by their last message, then cooling pairs by the end of their
    /// cooldown.
    fn keep_rank(&self, now: UnixMillis, window_ms: i64) -> (u8, UnixMillis) {
        match (self.cooldown_until, self.recent.back()) {
            (Some(until), _) if now < until => (2, until),
            (_, Some(last)) if now.saturating_sub(*last) < window_ms => (1, *last),
            _ => (0, 0),
        }
    }
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

    /// How many (room, bot) pairs are remembered.
    pub fn pairs(&self) -> usize {
        self.pairs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether a message from bot `author` in `room` at `now` may be processed.
    pub fn admit(&self, room: &str, author: &str, now: UnixMillis) -> bool {
        let mut pairs = self
            .pairs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (room.to_owned(), author.to_owned());
        if !pairs.contains_key(&key) && pairs.len() >= self.limits.max_pairs.max(1) {
            self.make_room(&mut pairs, now);
        }
        let pair = pairs.entry(key).or_default();
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

    /// Forgets pairs until a quarter of the bound is free (so a flood pays for one sweep per
    /// quarter of new pairs, not one per message), in the order of [`PairState::keep_rank`].
    fn make_room(&self, pairs: &mut HashMap<(String, String), PairState>, now: UnixMillis) {
        let max = self.limits.max_pairs.max(1);
        let keep = max - max.div_ceil(4).max(1);
        let mut ranked: Vec<((u8, UnixMillis), (String, String))> = pairs
            .iter()
            .map(|(key, pair)| (pair.keep_rank(now, self.limits.window_ms), key.clone()))
            .collect();
        let forget = ranked.len().saturating_sub(keep);
        if forget == 0 {
            return;
        }
        ranked.select_nth_unstable_by_key(forget - 1, |(rank, _)| *rank);
        for (_, key) in ranked.into_iter().take(forget) {
            pairs.remove(&key);
        }
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
            max_pairs: 100,
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

    /// 100,000 distinct bots in one room: the map stays within its bound, and the looping pair
    /// cut off before the flood is still cut off after it.
    #[test]
    fn a_flood_of_distinct_bots_stays_bounded_and_keeps_a_cooldown() {
        let limits = BotLoopLimits {
            max_messages: 2,
            window_ms: 1_000,
            cooldown_ms: 60_000,
            max_pairs: 1_000,
        };
        let guard = BotLoopGuard::new(limits);
        assert!(guard.admit("room", "looping-bot", 0));
        assert!(guard.admit("room", "looping-bot", 1));
        assert!(!guard.admit("room", "looping-bot", 2), "cut off");
        let mut most = 0;
        for n in 0..100_000 {
            assert!(guard.admit("room", &format!("bot-{n}"), 10 + n / 100));
            most = most.max(guard.pairs());
        }
        assert!(most <= limits.max_pairs, "at most {most} pairs");
        assert!(
            !guard.admit("room", "looping-bot", 2_000),
            "the flood did not end the looping pair's cooldown"
        );
    }

    /// When the map is full, idle pairs go first, counting pairs keep their count, and a pair
    /// in its cooldown stays cut off.
    #[test]
    fn idle_pairs_are_forgotten_before_counting_and_cooling_ones() {
        let guard = BotLoopGuard::new(BotLoopLimits {
            max_messages: 2,
            window_ms: 1_000,
            cooldown_ms: 60_000,
            max_pairs: 4,
        });
        assert!(guard.admit("room", "cool", 0));
        assert!(guard.admit("room", "cool", 1));
        assert!(!guard.admit("room", "cool", 2), "cooling until 60,002");
        assert!(guard.admit("room", "idle-1", 100));
        assert!(guard.admit("room", "idle-2", 200));
        assert!(
            guard.admit("room", "count", 5_000),
            "one of two in its window"
        );
        assert_eq!(guard.pairs(), 4);
        // Two new pairs: each forgets one idle pair, nothing else.
        assert!(guard.admit("room", "new-1", 5_001));
        assert!(guard.admit("room", "new-2", 5_002));
        assert_eq!(guard.pairs(), 4);
        assert!(guard.admit("room", "count", 5_003), "its second message");
        assert!(
            !guard.admit("room", "count", 5_004),
            "its count was kept: cut off"
        );
        assert!(!guard.admit("room", "cool", 5_005), "still cooling");
    }
}
