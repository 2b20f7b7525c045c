//! Twitch's chat rules on our side: the drop reasons (Helix `drop_reason.code`, IRC `NOTICE`
//! `msg-id`) as failure classes, the local rate limit by user type, and the duplicate rule.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use clawgate_channel_sdk::SendError;
use clawgate_types::DeliveryFailureKind;

/// Both rate limits count over 30 s.
pub const RATE_WINDOW: Duration = Duration::from_secs(30);
/// Messages per window for a normal user.
pub const NORMAL_LIMIT: usize = 20;
/// Messages per window where the bot is broadcaster, moderator or VIP.
pub const ELEVATED_LIMIT: usize = 100;
/// Twitch refuses a message identical to our previous one within this.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(30);
/// Appended to a text identical to our previous one: U+E0000 (a tag character every Twitch
/// client renders as nothing), after a space, so the message differs and shows the same.
pub const DUPLICATE_SUFFIX: &str = " \u{E0000}";

/// The failure class of a dropped message. `message` is Twitch's text (it carries the seconds
/// to wait for slow mode and timeouts).
pub fn drop_error(code: &str, message: &str, via: &str) -> SendError {
    let seconds = || {
        message
            .split_whitespace()
            .filter_map(|w| w.parse::<u64>().ok())
            .next()
    };
    let (kind, retry_after_s) = match code {
        // Twitch's rules expire: wait and the same text lands.
        "msg_ratelimit" => (DeliveryFailureKind::RateLimit, Some(RATE_WINDOW.as_secs())),
        "msg_duplicate" => (
            DeliveryFailureKind::RateLimit,
            Some(DUPLICATE_WINDOW.as_secs()),
        ),
        "msg_slowmode" => (
            DeliveryFailureKind::RateLimit,
            Some(seconds().unwrap_or(30)),
        ),
        // A moderator's decision or the channel's settings: only a person changes them.
        "msg_banned"
        | "msg_timedout"
        | "msg_channel_suspended"
        | "msg_channel_blocked"
        | "msg_followersonly"
        | "msg_followersonly_followed"
        | "msg_followersonly_zero"
        | "msg_subsonly"
        | "msg_emoteonly"
        | "msg_r9k"
        | "msg_verified_email"
        | "msg_requires_verified_phone_number"
        | "msg_suspended"
        | "msg_banned_email_alias" => (DeliveryFailureKind::Permission, None),
        // AutoMod, a bad reply parent, and anything Twitch adds later: the content was refused.
        _ => (DeliveryFailureKind::InvalidPayload, None),
    };
    SendError::before_io(
        kind,
        format!("Twitch dropped the message ({via}, {code}): {message}"),
    )
    .with_retry_after_ms(retry_after_s.map(|s| s * 1_000))
    .with_platform_code(code.to_owned())
}

/// The local send window: what went out in the last 30 s, and how many may.
#[derive(Debug, Default)]
pub struct RateWindow {
    sent: VecDeque<Instant>,
}

impl RateWindow {
    /// How long until one more message may go out at `now` under `limit`; zero: now.
    pub fn wait(&mut self, limit: usize, now: Instant) -> Duration {
        while self.sent.front().is_some_and(|t| *t + RATE_WINDOW <= now) {
            self.sent.pop_front();
        }
        if self.sent.len() < limit {
            return Duration::ZERO;
        }
        // The message that frees a slot is the one `limit` places from the end.
        let index = self.sent.len() - limit;
        (self.sent[index] + RATE_WINDOW).saturating_duration_since(now)
    }

    /// Counts a message going out at `now`.
    pub fn take(&mut self, now: Instant) {
        self.sent.push_back(now);
    }
}

/// The text to send after `previous` (our last accepted text in the channel and when): an
/// identical text within the window gets [`DUPLICATE_SUFFIX`], so identical consecutive
/// chunks are not refused as duplicates.
pub fn avoid_duplicate(text: &str, previous: Option<&(String, Instant)>, now: Instant) -> String {
    match previous {
        Some((last, at)) if last == text && *at + DUPLICATE_WINDOW > now => {
            format!("{text}{DUPLICATE_SUFFIX}")
        }
        _ => text.to_owned(),
    }
}

/// The text as the person meant it: without a [`DUPLICATE_SUFFIX`].
pub fn without_suffix(text: &str) -> &str {
    text.strip_suffix(DUPLICATE_SUFFIX).unwrap_or(text)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clawgate_channel_sdk::SideEffect;

    use super::*;

    #[test]
    fn every_drop_reason_is_a_definite_refusal_of_its_class() {
        use DeliveryFailureKind::*;
        let cases = [
            ("msg_ratelimit", "too quickly", RateLimit, Some(30_000)),
            ("msg_duplicate", "identical", RateLimit, Some(30_000)),
            (
                "msg_slowmode",
                "You will be able to talk again in 7 seconds.",
                RateLimit,
                Some(7_000),
            ),
            ("msg_banned", "You are permanently banned", Permission, None),
            (
                "msg_timedout",
                "You are timed out for 60 more seconds.",
                Permission,
                None,
            ),
            ("msg_followersonly", "followers only", Permission, None),
            (
                "msg_rejected",
                "being checked by mods",
                InvalidPayload,
                None,
            ),
            (
                "msg_rejected_mandatory",
                "moderation settings",
                InvalidPayload,
                None,
            ),
            ("automod_held", "AutoMod", InvalidPayload, None),
        ];
        for (code, message, kind, retry) in cases {
            let error = drop_error(code, message, "Helix");
            assert_eq!(error.kind, kind, "{code}");
            assert_eq!(error.retry_after_ms, retry, "{code}");
            assert_eq!(
                error.side_effect,
                SideEffect::None,
                "{code}: nothing was sent"
            );
            assert_eq!(error.platform_code.as_deref(), Some(code));
        }
    }

    #[test]
    fn the_window_holds_the_limit_and_frees_the_oldest_slot_first() {
        let start = Instant::now();
        let mut window = RateWindow::default();
        for n in 0..20 {
            assert_eq!(window.wait(NORMAL_LIMIT, start), Duration::ZERO);
            window.take(start + Duration::from_secs(n));
        }
        let now = start + Duration::from_secs(20);
        assert_eq!(window.wait(NORMAL_LIMIT, now), Duration::from_secs(10));
        assert_eq!(window.wait(ELEVATED_LIMIT, now), Duration::ZERO);
        let later = start + Duration::from_secs(30);
        assert_eq!(window.wait(NORMAL_LIMIT, later), Duration::ZERO);
    }

    #[test]
    fn an_identical_text_within_30_s_gets_the_suffix_and_only_then() {
        let now = Instant::now();
        let last = ("same".to_owned(), now);
        let again = avoid_duplicate("same", Some(&last), now + Duration::from_secs(29));
        assert_eq!(again, "same \u{E0000}");
        assert_eq!(without_suffix(&again), "same");
        assert_eq!(
            avoid_duplicate("same", Some(&last), now + Duration::from_secs(30)),
            "same"
        );
        assert_eq!(avoid_duplicate("other", Some(&last), now), "other");
        // A suffixed text sent last: the plain one differs from it and goes as it is.
        let suffixed = (again.clone(), now);
        assert_eq!(avoid_duplicate("same", Some(&suffixed), now), "same");
    }
}
