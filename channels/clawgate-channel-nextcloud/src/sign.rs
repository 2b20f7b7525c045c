//! Talk's signatures: hex HMAC-SHA256 keyed with the bot's shared secret, over `random` followed
//! by the signed data — the raw webhook body for events Talk sends, the `message` text (not the
//! JSON body) for messages a bot sends (platform-apis-wave2 §6.2).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    out
}

/// hex(HMAC-SHA256(secret, random ‖ data)).
pub fn signature(secret: &str, random: &str, data: &[u8]) -> String {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    mac.update(random.as_bytes());
    mac.update(data);
    hex(&mac.finalize().into_bytes())
}

/// Whether `given` (hex, any case) is the signature of `random ‖ data`; compared in constant
/// time (the expected length is public: 64 hex digits).
pub fn verify(secret: &str, random: &str, data: &[u8], given: &str) -> bool {
    let expected = signature(secret, random, data);
    let given = given.trim().to_ascii_lowercase();
    clawgate_channel_sdk::same_secret(expected.as_bytes(), given.as_bytes())
}

/// The `referenceId` a unit is sent with: hex SHA-256 of its idempotency key (64 characters, what
/// Talk's own clients send), the same on every attempt.
pub fn reference_id(unit_key: &str) -> String {
    hex(&Sha256::digest(unit_key.as_bytes()))
}

/// A fresh `X-Nextcloud-Talk-Bot-Random` (64 hex characters; Talk asks for at least 32). It is a
/// nonce, not a secret: the signature's strength is the shared secret. Its freshness comes from
/// the standard library's randomly seeded hasher keys and a counter, not from a clock.
pub(crate) fn random(seed: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let entropy = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut hasher = Sha256::new();
    hasher.update(seed.as_bytes());
    hasher.update(entropy.to_le_bytes());
    hasher.update(n.to_le_bytes());
    hasher.update(std::process::id().to_le_bytes());
    hex(&hasher.finalize())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_rfc_4231_vector_and_verify_only_their_data() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            signature("Jefe", "what do ya want ", b"for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let sig = signature("s3cret", "r4nd", b"{\"type\":\"Create\"}");
        assert!(verify("s3cret", "r4nd", b"{\"type\":\"Create\"}", &sig));
        assert!(verify(
            "s3cret",
            "r4nd",
            b"{\"type\":\"Create\"}",
            &sig.to_uppercase()
        ));
        assert!(!verify("s3cret", "r4nd", b"{\"type\":\"Create\"} ", &sig));
        assert!(!verify("s3cret", "r4ne", b"{\"type\":\"Create\"}", &sig));
        assert!(!verify("other", "r4nd", b"{\"type\":\"Create\"}", &sig));
        assert!(!verify(
            "s3cret",
            "r4nd",
            b"{\"type\":\"Create\"}",
            &sig[..63]
        ));
        assert!(!verify("s3cret", "r4nd", b"{\"type\":\"Create\"}", ""));
    }

    #[test]
    fn reference_ids_are_stable_and_randoms_are_fresh() {
        assert_eq!(reference_id("k:0"), reference_id("k:0"));
        assert_ne!(reference_id("k:0"), reference_id("k:1"));
        assert_eq!(reference_id("k:0").len(), 64);
        assert_ne!(random("x"), random("x"));
        assert!(random("x").len() >= 32);
    }
}
