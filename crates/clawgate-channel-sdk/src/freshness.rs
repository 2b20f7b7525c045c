//! Replay protection for signed callbacks: the timestamp a signature covers must lie within a
//! window around the gateway's clock, in either direction. A signature proves who sent a
//! request, not when; without this check a captured request replayed once the engine's inbound
//! dedupe record is gone would drive a new turn.
//!
//! Every channel whose platform signs a timestamp checks it here, with a window it may widen
//! where the platform signs the event's time rather than the request's (a redelivery then
//! carries the first attempt's time).

use std::time::Duration;

/// The default window, either way: five minutes, Slack's documented rule and the common one.
pub const DEFAULT_MAX_SIGNATURE_AGE_SECS: u64 = 300;
/// The widest window a setting may ask for: a day, well inside the engine's inbound retention
/// (`retention.inbound_days`), so a replay is either refused here or deduplicated there.
pub const MAX_SIGNATURE_AGE_LIMIT_SECS: u64 = 24 * 60 * 60;

/// Why a signed timestamp was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FreshnessError {
    /// The signed timestamp is not a whole number (of the unit the platform uses).
    #[error("the signed timestamp {0:?} is not a Unix time")]
    NotATime(String),
    /// The signed timestamp is further from the gateway's clock than the window allows.
    #[error(
        "the signed timestamp is {skew_ms} ms away from the gateway's clock (at most \
         {max_ms} ms): a replayed request, or a wrong clock on either side"
    )]
    Stale {
        /// How far the timestamp is from now, either way.
        skew_ms: u64,
        /// The window.
        max_ms: u64,
    },
}

/// The window a `max_signature_age_secs` setting asks for, or why it cannot be one.
pub fn window(setting_secs: u64) -> Result<Duration, String> {
    if (1..=MAX_SIGNATURE_AGE_LIMIT_SECS).contains(&setting_secs) {
        Ok(Duration::from_secs(setting_secs))
    } else {
        Err(format!(
            "{setting_secs} is not between 1 and {MAX_SIGNATURE_AGE_LIMIT_SECS} seconds: 0 \
             would refuse nearly every request, and a longer window lets a captured request be \
             replayed after the engine forgot it"
        ))
    }
}

fn whole(text: &str) -> Result<i64, FreshnessError> {
    text.trim().parse().map_err(|_| {
        // The value came from the caller: kept short in the log.
        FreshnessError::NotATime(text.chars().take(24).collect())
    })
}

/// A timestamp in whole seconds (Feishu's `X-Lark-Request-Timestamp`, QQ's
/// `X-Signature-Timestamp`), in milliseconds.
pub fn seconds(text: &str) -> Result<i64, FreshnessError> {
    Ok(whole(text)?.saturating_mul(1_000))
}

/// A timestamp in milliseconds (Zalo's body `timestamp`).
pub fn millis(text: &str) -> Result<i64, FreshnessError> {
    whole(text)
}

/// Checks that `signed_at_ms` is at most `max_age` away from `now_ms`, in either direction
/// (a timestamp from the future is as much a sign of a forged or mis-clocked sender).
pub fn check(signed_at_ms: i64, now_ms: i64, max_age: Duration) -> Result<(), FreshnessError> {
    let skew_ms = now_ms.abs_diff(signed_at_ms);
    let max_ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
    if skew_ms > max_ms {
        Err(FreshnessError::Stale { skew_ms, max_ms })
    } else {
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn the_window_holds_both_ways_and_its_edge_is_inside() {
        let max = Duration::from_secs(300);
        let now = 1_700_000_000_000;
        for at in [now, now - 300_000, now + 300_000, now - 60_000] {
            assert_eq!(check(at, now, max), Ok(()), "{at}");
        }
        assert_eq!(
            check(now - 300_001, now, max),
            Err(FreshnessError::Stale {
                skew_ms: 300_001,
                max_ms: 300_000
            })
        );
        assert!(check(now + 600_000, now, max).is_err());
        // Extremes do not overflow.
        assert!(check(i64::MIN, i64::MAX, max).is_err());
        assert!(check(i64::MAX, 0, Duration::MAX).is_ok());
    }

    #[test]
    fn timestamps_parse_in_their_unit_and_garbage_is_refused_briefly() {
        assert_eq!(seconds("1700000000"), Ok(1_700_000_000_000));
        assert_eq!(seconds(" 1700000000 "), Ok(1_700_000_000_000));
        assert_eq!(millis("1700000000123"), Ok(1_700_000_000_123));
        assert_eq!(seconds(""), Err(FreshnessError::NotATime(String::new())));
        assert_eq!(
            seconds(&"9".repeat(100)),
            Err(FreshnessError::NotATime("9".repeat(24)))
        );
        assert!(millis("1.5e12").is_err());
    }

    #[test]
    fn a_setting_is_between_a_second_and_a_day() {
        assert_eq!(
            window(DEFAULT_MAX_SIGNATURE_AGE_SECS),
            Ok(Duration::from_secs(300))
        );
        assert!(window(1).is_ok());
        assert!(window(MAX_SIGNATURE_AGE_LIMIT_SECS).is_ok());
        assert!(window(0).is_err());
        assert!(window(MAX_SIGNATURE_AGE_LIMIT_SECS + 1).is_err());
    }
}
