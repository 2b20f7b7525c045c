//! Webhook signatures (platform-apis-wave2 §9.1): `X-ZEvent-Signature: mac=<hex>`, the plain
//! SHA-256 (not an HMAC) of `app_id + raw_body + timestamp + OA secret key`, where `timestamp`
//! is the body's own `timestamp` field (milliseconds, as a string). Client libraries disagree
//! on details; this is the formula of Zalo's webhook documentation as most clients implement
//! it, and the header is accepted with or without its `mac=` prefix.
//!
//! The timestamp sits inside the body, so the check reads that one field first; nothing else
//! of the body is looked at before the signature holds.

use sha2::{Digest, Sha256};

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "x-zevent-signature";

/// Why a delivery was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `X-ZEvent-Signature` header (or not readable).
    #[error("the request has no X-ZEvent-Signature header")]
    Missing,
    /// The header is not (`mac=`) and 64 hex digits.
    #[error("X-ZEvent-Signature is not mac=<64 hex digits>")]
    Malformed,
    /// The body has no `timestamp` field to sign over.
    #[error("the body has no string or number `timestamp` field, which the signature covers")]
    NoTimestamp,
    /// The signature does not match.
    #[error(
        "the signature does not match the body (check app_id and that oa_secret_key_env holds \
         the OA secret key: Zalo for Developers → your app → Webhook → OA Secret Key)"
    )]
    Mismatch,
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// The hex digest of `app_id + body + timestamp + secret`.
pub fn digest(app_id: &str, body: &[u8], timestamp: &str, secret: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(app_id.as_bytes());
    hash.update(body);
    hash.update(timestamp.as_bytes());
    hash.update(secret.as_bytes());
    hex(&hash.finalize())
}

/// The `X-ZEvent-Signature` value of `body` (with its `mac=` prefix).
pub fn sign(app_id: &str, body: &[u8], timestamp: &str, secret: &str) -> String {
    format!("mac={}", digest(app_id, body, timestamp, secret))
}

/// The body's `timestamp` field, as the signature covers it.
pub fn timestamp_of(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Stamp {
        timestamp: serde_json::Value,
    }
    match serde_json::from_slice::<Stamp>(body).ok()?.timestamp {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Checks a delivery's signature over its raw `body`, in constant time.
pub fn verify(
    app_id: &str,
    secret: &str,
    header: Option<&str>,
    body: &[u8],
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?.trim();
    let given = header.strip_prefix("mac=").unwrap_or(header);
    if given.len() != 64 || !given.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(SignatureError::Malformed);
    }
    let timestamp = timestamp_of(body).ok_or(SignatureError::NoTimestamp)?;
    let expected = digest(app_id, body, &timestamp, secret);
    if clawgate_channel_sdk::same_secret(expected.as_bytes(), given.to_ascii_lowercase().as_bytes())
    {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_plain_sha256_of_the_concatenation() {
        // sha256("abc") from FIPS 180-2, split across the four parts.
        assert_eq!(
            digest("a", b"b", "c", ""),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn tampering_wrong_secrets_and_bad_headers_are_refused() {
        let body = br#"{"app_id":"1","timestamp":"1700000000000","event_name":"user_send_text"}"#;
        let good = sign("1", body, "1700000000000", "oa-secret");
        assert_eq!(verify("1", "oa-secret", Some(&good), body), Ok(()));
        // Without the prefix, and in upper case, it is the same signature.
        let bare = good.trim_start_matches("mac=").to_ascii_uppercase();
        assert_eq!(verify("1", "oa-secret", Some(&bare), body), Ok(()));
        let tampered =
            br#"{"app_id":"1","timestamp":"1700000000001","event_name":"user_send_text"}"#;
        assert_eq!(
            verify("1", "oa-secret", Some(&good), tampered),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify("1", "other", Some(&good), body),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify("2", "oa-secret", Some(&good), body),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify("1", "oa-secret", None, body),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            verify("1", "oa-secret", Some("mac=abc"), body),
            Err(SignatureError::Malformed)
        );
        let no_stamp = br#"{"app_id":"1"}"#;
        let signed = sign("1", no_stamp, "", "oa-secret");
        assert_eq!(
            verify("1", "oa-secret", Some(&signed), no_stamp),
            Err(SignatureError::NoTimestamp)
        );
    }
}
