//! The token endpoint as Google's answers it: the JWT-bearer grant with a signed assertion,
//! its claims checked (`aud`, `scope`, at most an hour, not expired), OAuth error shapes, and
//! the tokens it issues accepted by the Chat API until they expire or are revoked.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clawgate_channel_googlechat::simulator::{
    GOOGLE_TOKEN_URI, GoogleChatSimulator, SimulatorConfig, SpaceKind, TEST_SERVICE_ACCOUNT_KEY_ID,
    TEST_SERVICE_ACCOUNT_PRIVATE_KEY, keys,
};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const EMAIL: &str = "app@clawgate-simulator.iam.gserviceaccount.com";
const SCOPE: &str = "https://www.googleapis.com/auth/chat.bot";

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn assertion(claims: &Value) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(TEST_SERVICE_ACCOUNT_KEY_ID.to_owned());
    let key = EncodingKey::from_rsa_pem(TEST_SERVICE_ACCOUNT_PRIVATE_KEY.as_bytes()).unwrap();
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

fn claims(sim: &GoogleChatSimulator) -> Value {
    let iat = now();
    json!({ "iss": EMAIL, "scope": SCOPE, "aud": sim.token_uri(), "iat": iat, "exp": iat + 3600 })
}

async fn grant(sim: &GoogleChatSimulator, grant_type: &str, assertion: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(sim.token_uri())
        .form(&[("grant_type", grant_type), ("assertion", assertion)])
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

const GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

async fn started(config: SimulatorConfig) -> GoogleChatSimulator {
    let sim = GoogleChatSimulator::start(config).await.unwrap();
    sim.add_test_service_account(EMAIL);
    sim
}

async fn create(sim: &GoogleChatSimulator, space: &str, token: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}v1/{space}/messages", sim.api_url()))
        .bearer_auth(token)
        .json(&json!({ "text": "hi" }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn a_signed_assertion_is_granted_a_bearer_token_the_api_accepts() {
    let sim = started(SimulatorConfig::default()).await;
    let (status, body) = grant(&sim, GRANT, &assertion(&claims(&sim))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 3600);
    // Google's own endpoint as the audience (what google-auth always writes) is accepted too.
    let mut google_aud = claims(&sim);
    google_aud["aud"] = json!(GOOGLE_TOKEN_URI);
    assert_eq!(grant(&sim, GRANT, &assertion(&google_aud)).await.0, 200);
    let ada = sim.person("ada");
    let space = sim.create_space("room", SpaceKind::Room, Some(&ada));
    let token = body["access_token"].as_str().unwrap();
    assert_eq!(create(&sim, &space, token).await.0, 200);
    assert_eq!(sim.revoke_tokens(), 2);
    let (status, body) = create(&sim, &space, token).await;
    assert_eq!(
        (status, body["error"]["status"].as_str()),
        (401, Some("UNAUTHENTICATED"))
    );
    sim.stop().await;
}

#[tokio::test]
async fn assertions_are_refused_in_googles_oauth_shapes() {
    let sim = started(SimulatorConfig::default()).await;
    let base = claims(&sim);
    let with = |key: &str, value: Value| {
        let mut c = base.clone();
        c[key] = value;
        c
    };
    let long = with("exp", json!(base["iat"].as_i64().unwrap() + 7200));
    let expired = {
        let mut c = with("iat", json!(now() - 4000));
        c["exp"] = json!(now() - 400);
        c
    };
    let cases = [
        (
            GRANT,
            assertion(&with("aud", json!("https://example.com/token"))),
            "invalid_grant",
            "Failed audience check",
        ),
        (
            GRANT,
            assertion(&long),
            "invalid_grant",
            "short-lived token",
        ),
        (
            GRANT,
            assertion(&expired),
            "invalid_grant",
            "short-lived token",
        ),
        (
            GRANT,
            assertion(&with("scope", json!(""))),
            "invalid_scope",
            "Invalid OAuth scope",
        ),
        (
            GRANT,
            assertion(&with("iss", json!("nobody@x.iam.gserviceaccount.com"))),
            "invalid_grant",
            "account not found",
        ),
        (
            GRANT,
            keys::sign_as(&base, TEST_SERVICE_ACCOUNT_KEY_ID),
            "invalid_grant",
            "Invalid JWT Signature.",
        ),
        (
            GRANT,
            "not-a-jwt".to_owned(),
            "invalid_grant",
            "Invalid JWT",
        ),
        (
            "client_credentials",
            assertion(&base),
            "unsupported_grant_type",
            "Invalid grant_type",
        ),
    ];
    for (grant_type, jwt, error, description) in cases {
        let (status, body) = grant(&sim, grant_type, &jwt).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"], error, "{body}");
        assert!(
            body["error_description"]
                .as_str()
                .unwrap()
                .contains(description),
            "{body}"
        );
        assert!(body.get("access_token").is_none());
    }
    assert_eq!(sim.tokens_issued(EMAIL), 0);
    sim.stop().await;
}

#[tokio::test]
async fn issued_tokens_expire_and_a_token_without_the_chat_scope_is_not_enough() {
    let sim = started(SimulatorConfig {
        token_lifetime: Duration::from_secs(1),
        ..SimulatorConfig::default()
    })
    .await;
    let ada = sim.person("ada");
    let space = sim.create_space("room", SpaceKind::Room, Some(&ada));
    let (_, body) = grant(&sim, GRANT, &assertion(&claims(&sim))).await;
    assert_eq!(body["expires_in"], 1);
    let token = body["access_token"].as_str().unwrap().to_owned();
    let mut other = claims(&sim);
    other["scope"] = json!("https://www.googleapis.com/auth/chat.spaces.readonly");
    let (_, body) = grant(&sim, GRANT, &assertion(&other)).await;
    let (status, body) = create(&sim, &space, body["access_token"].as_str().unwrap()).await;
    assert_eq!(
        (status, body["error"]["status"].as_str()),
        (403, Some("PERMISSION_DENIED"))
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (status, body) = create(&sim, &space, &token).await;
    assert_eq!(
        (status, body["error"]["status"].as_str()),
        (401, Some("UNAUTHENTICATED"))
    );
    assert!(sim.messages(&space).is_empty());
    sim.stop().await;
}
