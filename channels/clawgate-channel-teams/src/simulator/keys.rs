//! The simulator's Bot Framework signing key: every activity POSTed to the bot carries an RS256
//! JWT signed with it, and its public half is served as the Bot Framework serves its own: an
//! OpenID configuration naming a JWKS whose keys carry `endorsements` (the channels a key may
//! sign for; Bot Builder checks the activity's `channelId` against them).
//!
//! The key is a fixed test key made for this simulator (it signs nothing outside tests).

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

/// Where the OpenID configuration is served (the path of
/// `https://login.botframework.com/v1/.well-known/openidconfiguration`).
pub(crate) const OPENID_PATH: &str = "/v1/.well-known/openidconfiguration";
/// Where the JWKS is served.
pub(crate) const JWKS_PATH: &str = "/v1/.well-known/keys";
/// The issuer of every token the Bot Framework sends a bot.
pub const ISSUER: &str = "https://api.botframework.com";
/// The key id in every token's header.
pub const KEY_ID: &str = "clawgate-simulator-botframework-key-1";

/// PKCS#1 DER of the private key.
const PRIVATE_KEY_DER: &[u8] = include_bytes!("signing-key.der");
/// The modulus and exponent, base64url (the JWKS members `n` and `e`).
const MODULUS: &str = "-LTvO4dA6LjbCDdxVcPEJR3g_1VaMz2bXscGPEy8wY5VkML84AeXpz8UwA9J6DUi7L9QDDbwLGnY7bfg3GTgwhx1F6E2oIvcMGqiFNLg2VFtl9oub7bBqfSGSim-dJFwqpDfbH6cYexXrSWZDJCvmG7FMJkQFLEyF-HcINfcf40v1tOLhif2Mlk0WDztgUVK3wN6cUnxl0GGGXimVy5XbxVIAF2rsgcDUGDKBLeaX66AhQm_PsF18j8x3x6_kIQXSCJfBBjeFuw1FMp_Yr544oRkZk5KQE5tQoMq31BIFWRXY9M-ft03ere1g4avU5fnTF_qL0ddMenl0WpUWxgI-w";
const EXPONENT: &str = "AQAB";

pub(crate) fn openid_configuration(origin: &str) -> Value {
    json!({
        "issuer": ISSUER,
        "authorization_endpoint": "https://invalid.botframework.com",
        "jwks_uri": format!("{origin}{JWKS_PATH}"),
        "id_token_signing_alg_values_supported": ["RS256"],
        "token_endpoint_auth_methods_supported": ["private_key_jwt"],
    })
}

pub(crate) fn jwks() -> Value {
    json!({ "keys": [{
        "kty": "RSA", "use": "sig", "kid": KEY_ID, "n": MODULUS, "e": EXPONENT,
        "endorsements": ["msteams"],
    }] })
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// `claims` signed RS256 with the simulator's key, `kid` in the header.
pub fn sign(claims: &Value) -> String {
    sign_as(claims, KEY_ID)
}

/// `claims` signed with the simulator's key but naming key `kid` (one the JWKS may not list).
pub fn sign_as(claims: &Value, kid: &str) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_owned());
    header.typ = Some("JWT".into());
    // The key is a constant of this crate: a failure here is a broken build, not a runtime case.
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_der(PRIVATE_KEY_DER))
        .unwrap_or_default()
}

/// The claims of a token for an activity to bot `app_id` from `service_url`, valid for an hour.
pub fn activity_claims(app_id: &str, service_url: &str) -> Value {
    let now = now_s();
    json!({
        "serviceurl": service_url, "nbf": now - 5, "exp": now + 3_600, "iat": now,
        "iss": ISSUER, "aud": app_id,
    })
}
