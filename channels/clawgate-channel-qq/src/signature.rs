//! HTTP callback signatures (platform-apis-wave2 §14.4): QQ signs every callback with Ed25519.
//! The key pair is derived from the bot secret: the secret repeated until it is 32 bytes long
//! (cut at 32) is the private key's seed. The signed content is the `X-Signature-Timestamp`
//! header followed by the raw body, and `X-Signature-Ed25519` carries the 64-byte signature in
//! hex. The URL validation (op 13) is answered with our own signature of `event_ts` followed by
//! `plain_token`, which proves we hold the same secret.
//!
//! Nothing of a body is read before its signature holds.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};

/// The header carrying the signature (hex).
pub const SIGNATURE_HEADER: &str = "x-signature-ed25519";
/// The header carrying the timestamp the signature covers.
pub const TIMESTAMP_HEADER: &str = "x-signature-timestamp";

/// Why a callback was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `X-Signature-Ed25519` or `X-Signature-Timestamp` header.
    #[error("the request has no X-Signature-Ed25519 / X-Signature-Timestamp header")]
    Missing,
    /// The signature is not 128 hex digits (64 bytes).
    #[error("X-Signature-Ed25519 is not 128 hex digits")]
    Malformed,
    /// The signature does not verify.
    #[error(
        "the Ed25519 signature does not match the body (check that secret_env holds this bot's \
         AppSecret: QQ open platform → your bot → development settings)"
    )]
    Mismatch,
    /// An empty secret derives no key.
    #[error("the bot secret is empty")]
    EmptySecret,
}

/// The signing key QQ derives from `secret` (its seed: the secret repeated to 32 bytes).
pub fn signing_key(secret: &str) -> Result<SigningKey, SignatureError> {
    if secret.is_empty() {
        return Err(SignatureError::EmptySecret);
    }
    let mut seed = [0u8; 32];
    for (slot, byte) in seed.iter_mut().zip(secret.bytes().cycle()) {
        *slot = byte;
    }
    Ok(SigningKey::from_bytes(&seed))
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
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

/// The hex signature of `timestamp` followed by `body` with the key of `secret`.
pub fn sign(secret: &str, timestamp: &str, body: &[u8]) -> Result<String, SignatureError> {
    let key = signing_key(secret)?;
    let mut message = Vec::with_capacity(timestamp.len() + body.len());
    message.extend_from_slice(timestamp.as_bytes());
    message.extend_from_slice(body);
    Ok(hex(&key.sign(&message).to_bytes()))
}

/// Checks a callback: `signature` (hex) over `timestamp` followed by `body`.
pub fn verify(
    secret: &str,
    signature: Option<&str>,
    timestamp: Option<&str>,
    body: &[u8],
) -> Result<(), SignatureError> {
    let (Some(signature), Some(timestamp)) = (signature, timestamp) else {
        return Err(SignatureError::Missing);
    };
    let bytes = unhex(signature.trim()).ok_or(SignatureError::Malformed)?;
    let bytes: [u8; 64] = bytes.try_into().map_err(|_| SignatureError::Malformed)?;
    let key = signing_key(secret)?.verifying_key();
    let mut message = Vec::with_capacity(timestamp.len() + body.len());
    message.extend_from_slice(timestamp.as_bytes());
    message.extend_from_slice(body);
    key.verify(&message, &Signature::from_bytes(&bytes))
        .map_err(|_| SignatureError::Mismatch)
}

/// The answer to a URL validation (op 13): `{plain_token, signature}`, the signature over
/// `event_ts` followed by `plain_token`.
pub fn validation_answer(
    secret: &str,
    plain_token: &str,
    event_ts: &str,
) -> Result<serde_json::Value, SignatureError> {
    let signature = sign(secret, event_ts, plain_token.as_bytes())?;
    Ok(serde_json::json!({ "plain_token": plain_token, "signature": signature }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    /// The vector of tencent-connect/botgo's own signature test
    /// (`interaction/signature/interaction_test.go`): a real callback body and its header.
    #[test]
    fn the_vector_of_tencents_own_sdk_verifies() {
        let body = r#"{"id":"ROBOT1.0_veoihSEXDc8Q.g-6eLpNIa11bH8MisOjn-m-LKxCPntMk6exUXgcWCGpVO7L2QKTNZzjZzFFDSbiOFcqAPWyVA!!","content":"哦一下","timestamp":"2024-10-15T16:33:15+08:00","author":{"id":"675860273","user_openid":"675860273"}}"#;
        let signature = "e949b5b94ef4103df903fb031d1d16e358db3db83e79e117edd404c8508be3ce8a76d7bad1bed353194c126a1a5915b4ad8b5288c1191cc53a12acffccd82004";
        let secret = "123456abcdef";
        verify(secret, Some(signature), Some("1728981195"), body.as_bytes()).unwrap();
        assert_eq!(
            sign(secret, "1728981195", body.as_bytes()).unwrap(),
            signature
        );
        let cases = [
            (
                "another secret",
                "123456abcdeg",
                Some(signature),
                "1728981195",
                body,
                SignatureError::Mismatch,
            ),
            (
                "another timestamp",
                secret,
                Some(signature),
                "1728981196",
                body,
                SignatureError::Mismatch,
            ),
            (
                "a changed body",
                secret,
                Some(signature),
                "1728981195",
                &body.replace("哦", "嗯"),
                SignatureError::Mismatch,
            ),
            (
                "no signature",
                secret,
                None,
                "1728981195",
                body,
                SignatureError::Missing,
            ),
            (
                "short hex",
                secret,
                Some("e949"),
                "1728981195",
                body,
                SignatureError::Malformed,
            ),
            (
                "not hex",
                secret,
                Some(&"zz".repeat(64)),
                "1728981195",
                body,
                SignatureError::Malformed,
            ),
        ];
        for (case, secret, signature, timestamp, body, want) in cases {
            assert_eq!(
                verify(secret, signature, Some(timestamp), body.as_bytes()),
                Err(want),
                "{case}"
            );
        }
    }

    #[test]
    fn a_short_secret_is_repeated_to_the_seed_and_validation_signs_ts_then_token() {
        let short = signing_key("abc").unwrap();
        let long = signing_key("abcabcabcabcabcabcabcabcabcabcab").unwrap();
        assert_eq!(short.to_bytes(), long.to_bytes());
        assert!(signing_key("").is_err());
        let answer = validation_answer("abc", "Arq0D5A61EgUu4OxUvOp", "1725442341").unwrap();
        assert_eq!(answer["plain_token"], "Arq0D5A61EgUu4OxUvOp");
        let signature = answer["signature"].as_str().unwrap();
        verify(
            "abc",
            Some(signature),
            Some("1725442341"),
            b"Arq0D5A61EgUu4OxUvOp",
        )
        .unwrap();
    }
}
