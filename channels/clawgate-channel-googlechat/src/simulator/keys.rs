//! The simulator's signing key: every event's bearer token is an RS256 JWT signed with it, and
//! its public half is served as Google serves the Chat service account's: a JWKS
//! (`service_accounts/v1/jwk/…`) and an x509 certificate map (`service_accounts/v1/metadata/x509/…`).
//!
//! The key is a fixed test key made for this simulator (it signs nothing outside tests); a
//! fixed key keeps the x509 certificate a constant and needs no RSA key generation here.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

/// Where the JWKS is served.
pub(crate) const JWKS_PATH: &str = "/service_accounts/v1/jwk/chat@system.gserviceaccount.com";
/// Where the x509 certificates are served.
pub(crate) const X509_PATH: &str =
    "/service_accounts/v1/metadata/x509/chat@system.gserviceaccount.com";
/// The issuer of every event token.
pub const ISSUER: &str = "chat@system.gserviceaccount.com";
/// The key id in every token's header.
pub const KEY_ID: &str = "clawgate-simulator-chat-key-1";

/// PKCS#1 DER of the private key.
const PRIVATE_KEY_DER: &[u8] = include_bytes!("signing-key.der");
/// The self-signed certificate of the same key (subject `chat@system.gserviceaccount.com`).
const CERTIFICATE_PEM: &str = include_str!("signing-cert.pem");
/// The modulus and exponent, base64url (the JWKS members `n` and `e`).
const MODULUS: &str = "ub7swav44th5HFqD5TDsHgHL5Z_dIKuFBqPvbDTfunLegWLBbv5aI5pk1vHXw4ZDLudLKXkQ445yLzUe5SVmc2M2yYwMXFnZKej5sG8pvtOyLNuKPpfq5k1s_ocmrjfTS2NodYM3WOmtOFcVCyya_ZUTj18BCj4L-2-jN3Fo6aCjc7ewNLEcZpkaDEfCQI37HPAW12m2_GvcOe1wf_aSlOG5BpQ3-ps9UIBMkisIrqQqcU1_da-MDy1v6zMLEPUpGOTY8kpzN7EcpzxN-E4nNOaKLCx3hldboM9iQspcq0I40YV7PLzBhBDjy9jB7ct8amhvr5veVFeDMR_-8dw7FQ";
const EXPONENT: &str = "AQAB";

pub(crate) fn jwks() -> Value {
    json!({ "keys": [{
        "kty": "RSA", "alg": "RS256", "use": "sig", "kid": KEY_ID, "n": MODULUS, "e": EXPONENT,
    }] })
}

pub(crate) fn x509() -> Value {
    json!({ KEY_ID: CERTIFICATE_PEM })
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `claims` signed RS256 with the simulator's key, `kid` in the header.
pub fn sign(claims: &Value) -> String {
    sign_as(claims, KEY_ID)
}

/// `claims` signed with the simulator's key but naming key `kid` (one a JWKS may not list).
pub fn sign_as(claims: &Value, kid: &str) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_owned());
    // The key is a constant of this crate: a failure here is a broken build, not a runtime case.
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_der(PRIVATE_KEY_DER))
        .unwrap_or_default()
}

/// The claims of an event token for `audience`, issued now and valid for an hour.
pub fn event_claims(audience: &str) -> Value {
    let now = now_s();
    json!({ "iss": ISSUER, "aud": audience, "iat": now, "exp": now + 3_600 })
}
