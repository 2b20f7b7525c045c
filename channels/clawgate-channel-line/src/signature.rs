//! LINE's webhook signature (platform-apis-wave2 §5.3): `x-line-signature` is
//! base64(HMAC-SHA256(channel secret, raw body)). Checked before the body is parsed, compared
//! in constant time (`hmac`'s `verify_slice`). LINE signs no timestamp, so there is no replay
//! window to check: a replayed delivery is a duplicate `webhookEventId` the engine drops.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "x-line-signature";

/// Why a delivery was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `x-line-signature` header (or not readable text).
    #[error("the request has no x-line-signature header: it did not come from LINE")]
    Missing,
    /// The header is not base64 of 32 bytes.
    #[error("x-line-signature is not a base64 HMAC-SHA256")]
    Malformed,
    /// The signature does not match the body and the channel secret.
    #[error(
        "x-line-signature does not match the body (check that channel_secret_env holds the \
         channel secret of this LINE channel: LINE Developers console → Basic settings)"
    )]
    Mismatch,
}

fn mac(secret: &[u8], body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(body);
    mac
}

/// The `x-line-signature` of `body`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    STANDARD.encode(mac(secret, body).finalize().into_bytes())
}

/// Checks a delivery's signature against its raw body.
pub fn verify(secret: &[u8], signature: Option<&str>, body: &[u8]) -> Result<(), SignatureError> {
    let signature = signature.ok_or(SignatureError::Missing)?;
    let given = STANDARD
        .decode(signature.trim())
        .map_err(|_| SignatureError::Malformed)?;
    if given.len() != 32 {
        return Err(SignatureError::Malformed);
    }
    mac(secret, body)
        .verify_slice(&given)
        .map_err(|_| SignatureError::Mismatch)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn a_known_signature_verifies_and_tampering_does_not() {
        // Computed independently: printf '%s' '{"destination":"U1","events":[]}' |
        //   openssl dgst -sha256 -hmac 'secret' -binary | base64
        let body = br#"{"destination":"U1","events":[]}"#;
        let signature = sign(b"secret", body);
        assert_eq!(signature, KNOWN);
        assert_eq!(verify(b"secret", Some(&signature), body), Ok(()));
        assert_eq!(
            verify(
                b"secret",
                Some(&signature),
                br#"{"destination":"U1","events":[ ]}"#
            ),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"other", Some(&signature), body),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(verify(b"secret", None, body), Err(SignatureError::Missing));
        assert_eq!(
            verify(b"secret", Some("not base64!"), body),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            verify(b"secret", Some("c2hvcnQ="), body),
            Err(SignatureError::Malformed)
        );
    }

    const KNOWN: &str = "9a6kxZ9i5nWMf5b8hc6KEcGGkvVpRrwtLnjZ/UIHOrM=";
}
