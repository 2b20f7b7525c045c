//! Slack's request signatures (platform-apis §2.5): `v0=` + hex(HMAC-SHA256(signing secret,
//! `v0:<timestamp>:<raw body>`)), refused when the timestamp is more than five minutes away.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "x-slack-signature";
/// The header carrying the request's Unix timestamp (seconds).
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
/// How far a request's timestamp may be from now: older ones are replays.
pub const MAX_AGE_S: u64 = 5 * 60;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A header is missing or not readable.
    #[error("the request has no {0} header")]
    Missing(&'static str),
    /// The timestamp is not a number of seconds.
    #[error("X-Slack-Request-Timestamp {0:?} is not a Unix time")]
    BadTimestamp(String),
    /// The timestamp is more than five minutes from now (a replay, or a wrong clock).
    #[error(
        "the request is {0} s away from now (at most {MAX_AGE_S} s): a replay or a wrong clock"
    )]
    Stale(u64),
    /// The signature does not match the body and the signing secret.
    #[error(
        "the signature does not match (check signing_secret_env holds the app's Signing Secret)"
    )]
    Mismatch,
}

fn mac(secret: &[u8], timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac
}

/// The `X-Slack-Signature` of `body` sent at `timestamp`.
pub fn sign(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    let digest = mac(secret, timestamp, body).finalize().into_bytes();
    let mut out = String::with_capacity(3 + digest.len() * 2);
    out.push_str("v0=");
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Checks a request: the timestamp within five minutes of `now_s`, and the signature, compared
/// in constant time (`hmac`'s `verify_slice`).
pub fn verify(
    secret: &[u8],
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_s: u64,
) -> Result<(), SignatureError> {
    let timestamp = timestamp.ok_or(SignatureError::Missing("X-Slack-Request-Timestamp"))?;
    let signature = signature.ok_or(SignatureError::Missing("X-Slack-Signature"))?;
    let at: u64 = timestamp
        .trim()
        .parse()
        .map_err(|_| SignatureError::BadTimestamp(timestamp.to_owned()))?;
    let skew = now_s.abs_diff(at);
    if skew > MAX_AGE_S {
        return Err(SignatureError::Stale(skew));
    }
    let given = signature
        .strip_prefix("v0=")
        .and_then(unhex)
        .ok_or(SignatureError::Mismatch)?;
    mac(secret, timestamp.trim(), body)
        .verify_slice(&given)
        .map_err(|_| SignatureError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slacks_documented_example_signs_as_documented() {
        // api.slack.com/authentication/verifying-requests-from-slack, the worked example.
        let secret = b"8f742231b10e8888abcd99yyyzzz85a5";
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        assert_eq!(
            sign(secret, "1531420618", body),
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
        assert_eq!(
            verify(
                secret,
                Some("1531420618"),
                Some("v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"),
                body,
                1_531_420_618 + 10
            ),
            Ok(())
        );
    }

    #[test]
    fn tampering_staleness_and_missing_headers_are_refused() {
        let secret = b"s3cret";
        let good = sign(secret, "1000", b"{}");
        assert_eq!(
            verify(secret, Some("1000"), Some(&good), b"{ }", 1000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"other", Some("1000"), Some(&good), b"{}", 1000),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(
                secret,
                Some("1000"),
                Some(&good),
                b"{}",
                1000 + MAX_AGE_S + 1
            ),
            Err(SignatureError::Stale(MAX_AGE_S + 1))
        );
        assert_eq!(
            verify(secret, Some("1000"), Some(&good), b"{}", 1000 + MAX_AGE_S),
            Ok(())
        );
        assert!(matches!(
            verify(secret, None, Some(&good), b"{}", 1000),
            Err(SignatureError::Missing(_))
        ));
        assert!(matches!(
            verify(secret, Some("x"), Some(&good), b"{}", 1000),
            Err(SignatureError::BadTimestamp(_))
        ));
        assert_eq!(
            verify(secret, Some("1000"), Some("v0=zz"), b"{}", 1000),
            Err(SignatureError::Mismatch)
        );
    }
}
