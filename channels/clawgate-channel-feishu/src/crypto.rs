//! The event callback's protection (platform-apis-wave2 §13.3): `X-Lark-Signature` is hex
//! SHA-256 of `timestamp + nonce + encrypt_key + raw body`, and with an Encrypt Key the body is
//! `{"encrypt": base64(iv ‖ AES-256-CBC(SHA-256(encrypt_key), iv, json))}` with PKCS#7 padding.
//! The signature is checked on the raw bytes before anything is decrypted or parsed, compared
//! in constant time. Decryption tells a bad padding from bad JSON ([`CallbackError`]), so its
//! outcome must never reach an unauthenticated caller: the listener decrypts only signed
//! requests (and, rate limited, the unsigned URL verification) and answers every failure alike.

use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "x-lark-signature";
/// The header carrying the request's timestamp (seconds).
pub const TIMESTAMP_HEADER: &str = "x-lark-request-timestamp";
/// The header carrying the request's nonce.
pub const NONCE_HEADER: &str = "x-lark-request-nonce";

/// Why a callback was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallbackError {
    /// A signature, timestamp or nonce header is missing.
    #[error(
        "the callback has no {0} header: it did not come from Feishu (or the app has no \
         Encrypt Key set while this channel expects one)"
    )]
    Missing(&'static str),
    /// The signature does not match.
    #[error(
        "x-lark-signature does not match the body (check that encrypt_key_env holds the app's \
         Encrypt Key: Developer Console → Events & Callbacks → Encryption strategy)"
    )]
    Mismatch,
    /// The `encrypt` field is not base64 of an IV and whole AES blocks.
    #[error("the encrypted body is not base64 of an AES-256-CBC ciphertext")]
    Malformed,
    /// Decryption produced no valid padding or no JSON: the wrong Encrypt Key.
    #[error("the encrypted body does not decrypt with this Encrypt Key (check encrypt_key_env)")]
    Undecryptable,
}

/// `X-Lark-Signature` of a callback.
pub fn sign(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(timestamp.as_bytes());
    hasher.update(nonce.as_bytes());
    hasher.update(encrypt_key.as_bytes());
    hasher.update(body);
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Checks a callback's signature against its raw body.
pub fn verify(
    timestamp: Option<&str>,
    nonce: Option<&str>,
    signature: Option<&str>,
    encrypt_key: &str,
    body: &[u8],
) -> Result<(), CallbackError> {
    let timestamp = timestamp.ok_or(CallbackError::Missing(TIMESTAMP_HEADER))?;
    let nonce = nonce.ok_or(CallbackError::Missing(NONCE_HEADER))?;
    let given = signature.ok_or(CallbackError::Missing(SIGNATURE_HEADER))?;
    let expected = sign(timestamp, nonce, encrypt_key, body);
    let given = given.trim().to_ascii_lowercase();
    if clawgate_channel_sdk::same_secret(expected.as_bytes(), given.as_bytes()) {
        Ok(())
    } else {
        Err(CallbackError::Mismatch)
    }
}

fn key_of(encrypt_key: &str) -> [u8; 32] {
    Sha256::digest(encrypt_key.as_bytes()).into()
}

/// The plaintext of an `encrypt` field.
pub fn decrypt(encrypted: &str, encrypt_key: &str) -> Result<Vec<u8>, CallbackError> {
    let data = STANDARD
        .decode(encrypted.trim())
        .map_err(|_| CallbackError::Malformed)?;
    if data.len() < 32 || data.len() % 16 != 0 {
        return Err(CallbackError::Malformed);
    }
    let (iv, ciphertext) = data.split_at(16);
    let key = key_of(encrypt_key);
    cbc::Decryptor::<aes::Aes256>::new(&key.into(), iv.into())
        .decrypt_padded_vec_mut::<Pkcs7>(ciphertext)
        .map_err(|_| CallbackError::Undecryptable)
}

/// The `encrypt` field of `plaintext` under `iv` (the platform's side; tests and the simulator).
pub fn encrypt(plaintext: &[u8], encrypt_key: &str, iv: [u8; 16]) -> String {
    let key = key_of(encrypt_key);
    let ciphertext = cbc::Encryptor::<aes::Aes256>::new(&key.into(), &iv.into())
        .encrypt_padded_vec_mut::<Pkcs7>(plaintext);
    let mut data = iv.to_vec();
    data.extend_from_slice(&ciphertext);
    STANDARD.encode(data)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn a_known_signature_verifies_and_tampering_does_not() {
        // Computed independently:
        //   printf '%s' '1700000000nonce1key{"encrypt":"x"}' | sha256sum
        let body = br#"{"encrypt":"x"}"#;
        let signature = sign("1700000000", "nonce1", "key", body);
        assert_eq!(signature, KNOWN_SIGNATURE);
        let ok = |ts, nonce, sig: &str, key, body: &[u8]| {
            verify(Some(ts), Some(nonce), Some(sig), key, body)
        };
        assert_eq!(ok("1700000000", "nonce1", &signature, "key", body), Ok(()));
        assert_eq!(
            ok(
                "1700000000",
                "nonce1",
                &signature.to_uppercase(),
                "key",
                body
            ),
            Ok(())
        );
        for (ts, nonce, key, body) in [
            ("1700000001", "nonce1", "key", &body[..]),
            ("1700000000", "nonce2", "key", &body[..]),
            ("1700000000", "nonce1", "other", &body[..]),
            ("1700000000", "nonce1", "key", &br#"{"encrypt":"y"}"#[..]),
        ] {
            assert_eq!(
                ok(ts, nonce, &signature, key, body),
                Err(CallbackError::Mismatch)
            );
        }
        assert_eq!(
            verify(Some("1"), Some("n"), None, "key", body),
            Err(CallbackError::Missing(SIGNATURE_HEADER))
        );
        assert_eq!(
            verify(None, Some("n"), Some(&signature), "key", body),
            Err(CallbackError::Missing(TIMESTAMP_HEADER))
        );
    }

    #[test]
    fn a_known_ciphertext_decrypts_and_round_trips() {
        // Computed independently with OpenSSL:
        //   key=$(printf '%s' 'test key' | sha256sum | cut -c1-64)
        //   printf '%s' '{"challenge":"abc"}' | openssl enc -aes-256-cbc -K $key \
        //     -iv 000102030405060708090a0b0c0d0e0f, the IV bytes in front, base64
        let plain = decrypt(KNOWN_CIPHERTEXT, "test key").unwrap();
        assert_eq!(plain, br#"{"challenge":"abc"}"#);
        let iv: [u8; 16] = core::array::from_fn(|i| i as u8);
        assert_eq!(
            encrypt(br#"{"challenge":"abc"}"#, "test key", iv),
            KNOWN_CIPHERTEXT
        );
        assert_eq!(
            decrypt(KNOWN_CIPHERTEXT, "wrong key"),
            Err(CallbackError::Undecryptable)
        );
        assert_eq!(decrypt("not base64!", "k"), Err(CallbackError::Malformed));
        assert_eq!(decrypt("AAAA", "k"), Err(CallbackError::Malformed));
    }

    const KNOWN_SIGNATURE: &str =
        "b051c3b674c7b464ec981b917d61d438114626bed539aef9be8b4b0c2d991dbd";
    const KNOWN_CIPHERTEXT: &str =
        "AAECAwQFBgcICQoLDA0OD6alpwIsMFbSsWTHppjb1mEbsoR02u7satqjGlhBepBb";
}
