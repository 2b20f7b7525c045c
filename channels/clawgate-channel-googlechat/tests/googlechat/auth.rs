//! Service-account authentication against the simulator's token endpoint: a token minted on
//! first use and cached, renewed ahead of its expiry, a 401 answered by one fresh token and one
//! retry, one mint under concurrency, token-endpoint refusals as failure classes, and the
//! start-up checks of the key.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_googlechat::simulator::{
    GoogleChatSimulator, Op, SimulatorConfig, TEST_SERVICE_ACCOUNT_KEY_ID, TokenFault,
};
use clawgate_channel_googlechat::{GoogleChatCredentials, GoogleChatFactory};
use clawgate_channel_sdk::prelude::*;
use clawgate_types::clock::{Clock, ManualClock, SystemClock};
use serde_json::{Value, json};

use crate::peer::{KEY_ENV, Peer, SERVICE_ACCOUNT, quiet};
use crate::send::{ctx, text};

async fn send(
    peer: &Peer,
    space: &str,
    key: &str,
    body: &str,
) -> Result<MessageReceiptPart, SendError> {
    peer.plugin
        .sender
        .send_unit(&ctx(&MessageTarget::group(space), key), &text(body))
        .await
}

fn unauthenticated_calls(peer: &Peer) -> usize {
    peer.sim.calls().iter().filter(|c| c.status == 401).count()
}

fn minted(peer: &Peer) -> usize {
    peer.sim
        .token_requests()
        .iter()
        .filter(|r| r.status == 200)
        .count()
}

#[tokio::test]
async fn a_token_is_minted_on_first_use_and_reused() {
    let peer = Peer::with_service_account(quiet(), json!({})).await;
    let space = peer.room("mint");
    assert!(peer.sim.token_requests().is_empty(), "minted before use");
    for n in 0..3 {
        send(&peer, &space, &format!("mint-{n}"), "hi")
            .await
            .unwrap();
    }
    let requests = peer.sim.token_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].status, 200);
    assert_eq!(requests[0].client_email.as_deref(), Some(SERVICE_ACCOUNT));
    assert_eq!(peer.texts(&space), ["hi", "hi", "hi"]);
    assert_eq!(unauthenticated_calls(&peer), 0);
}

#[tokio::test]
async fn a_short_lived_token_is_renewed_before_it_expires_so_no_send_meets_a_401() {
    // A 60 s token is due for renewal after 30 s (half its lifetime), counted on the gateway's
    // clock: no wall-clock time has to pass.
    let config = SimulatorConfig {
        token_lifetime: Duration::from_secs(60),
        ..quiet()
    };
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let peer = Peer::with_service_account_on(config, json!({}), Some(clock.clone())).await;
    let space = peer.room("renew");
    send(&peer, &space, "renew-1", "first").await.unwrap();
    clock.advance(29_000);
    send(&peer, &space, "renew-2", "second").await.unwrap();
    assert_eq!(
        minted(&peer),
        1,
        "still fresh: {:?}",
        peer.sim.token_requests()
    );
    // Past the renewal point, before the first token expires: a send now mints a new token
    // instead of using the old one to its end.
    clock.advance(2_000);
    send(&peer, &space, "renew-3", "third").await.unwrap();
    assert_eq!(minted(&peer), 2, "{:?}", peer.sim.token_requests());
    assert_eq!(unauthenticated_calls(&peer), 0, "{:?}", peer.sim.calls());
    assert_eq!(peer.texts(&space), ["first", "second", "third"]);
}

#[tokio::test]
async fn the_assertion_is_dated_by_the_gateways_clock() {
    // A gateway clock two hours behind Google's: its assertion expired an hour ago as Google
    // reads it, and the grant is refused (the advice names the clock).
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms() - 7_200_000));
    let peer = Peer::with_service_account_on(quiet(), json!({}), Some(clock.clone())).await;
    let space = peer.room("skewed");
    let error = send(&peer, &space, "skewed-1", "x").await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth, "{}", error.message);
    assert!(error.message.contains("clock"), "{}", error.message);
    assert_eq!(
        peer.sim.token_requests()[0].error.as_deref(),
        Some("invalid_grant")
    );
    // Set right, the same channel mints and sends.
    clock.set(SystemClock.now_ms());
    send(&peer, &space, "skewed-2", "x").await.unwrap();
    assert_eq!(minted(&peer), 1);
    assert_eq!(peer.texts(&space), ["x"]);
}

#[tokio::test]
async fn a_revoked_token_meets_one_401_then_a_fresh_token_sends_the_message_once() {
    let peer = Peer::with_service_account(quiet(), json!({})).await;
    let space = peer.room("revoked");
    send(&peer, &space, "revoked-1", "before").await.unwrap();
    assert_eq!(peer.sim.revoke_tokens(), 1);
    send(&peer, &space, "revoked-2", "after").await.unwrap();
    assert_eq!(unauthenticated_calls(&peer), 1, "{:?}", peer.sim.calls());
    assert_eq!(minted(&peer), 2);
    let after: Vec<_> = peer
        .sim
        .all_messages(&space)
        .into_iter()
        .filter(|m| m.text == "after")
        .collect();
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(peer.texts(&space), ["before", "after"]);
}

#[tokio::test]
async fn a_401_to_a_fresh_token_too_is_an_auth_failure_after_one_retry() {
    let peer = Peer::with_service_account(quiet(), json!({})).await;
    let space = peer.room("still-401");
    let refusal = clawgate_channel_googlechat::simulator::FaultKind::error(
        401,
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials.",
    );
    peer.sim
        .inject(clawgate_channel_googlechat::simulator::Fault::on(Op::Create, refusal).times(5));
    let error = send(&peer, &space, "still-1", "x").await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth);
    assert_eq!(error.side_effect, SideEffect::None);
    // The first try and one retry, each with its own token.
    assert_eq!(unauthenticated_calls(&peer), 2);
    assert_eq!(minted(&peer), 2);
    assert!(peer.texts(&space).is_empty());
}

#[tokio::test]
async fn concurrent_sends_wait_for_one_mint() {
    let peer = Peer::with_service_account(quiet(), json!({})).await;
    let space = peer.room("stampede");
    let sends: Vec<_> = (0..16)
        .map(|n| {
            let sender = peer.plugin.sender.clone();
            let target = MessageTarget::group(&space);
            tokio::spawn(async move {
                sender
                    .send_unit(&ctx(&target, &format!("stampede-{n}")), &text("hi"))
                    .await
            })
        })
        .collect();
    for send in sends {
        send.await.unwrap().unwrap();
    }
    assert_eq!(peer.sim.token_requests().len(), 1);
    assert_eq!(peer.texts(&space).len(), 16);
}

#[tokio::test]
async fn a_deleted_key_is_an_auth_failure_naming_the_variable_and_nothing_is_sent() {
    let peer = Peer::with_service_account(quiet(), json!({})).await;
    let space = peer.room("deleted-key");
    assert!(
        peer.sim
            .delete_service_account_key(SERVICE_ACCOUNT, TEST_SERVICE_ACCOUNT_KEY_ID)
    );
    let error = send(&peer, &space, "deleted-1", "x").await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth, "{}", error.message);
    assert_eq!(error.side_effect, SideEffect::None);
    assert_eq!(error.platform_code.as_deref(), Some("invalid_grant"));
    assert!(error.message.contains(KEY_ENV), "{}", error.message);
    assert!(
        error.message.contains("Invalid JWT Signature"),
        "{}",
        error.message
    );
    assert!(peer.sim.calls().is_empty(), "the Chat API was called");
}

#[tokio::test]
async fn token_endpoint_outages_are_transient_and_the_next_send_mints() {
    let peer = Peer::with_service_account(quiet(), json!({})).await;
    let space = peer.room("outage");
    peer.sim
        .inject_token_faults([TokenFault::unavailable(), TokenFault::LoseAnswer]);
    for key in ["outage-1", "outage-2"] {
        let error = send(&peer, &space, key, "x").await.unwrap_err();
        assert_eq!(
            error.kind,
            DeliveryFailureKind::Transient,
            "{}",
            error.message
        );
        assert_eq!(error.side_effect, SideEffect::None, "{}", error.message);
    }
    assert!(peer.sim.calls().is_empty());
    send(&peer, &space, "outage-3", "landed").await.unwrap();
    assert_eq!(peer.texts(&space), ["landed"]);
}

fn setup_with(settings: Value, dir: &std::path::Path) -> ChannelSetup {
    let mut merged = json!({
        "api_base": "http://127.0.0.1:9/",
        "certs_url": "http://127.0.0.1:9/jwks",
        "audience": "123456789012",
        "events_listen": "127.0.0.1:0",
    });
    for (key, value) in settings.as_object().unwrap() {
        merged[key] = value.clone();
    }
    clawgate_conformance::channel_setup(0, "googlechat", "default", merged, dir)
}

async fn build_error(settings: Value, credentials: Option<GoogleChatCredentials>) -> SetupError {
    let dir = tempfile::tempdir().unwrap();
    let setup = setup_with(settings, dir.path());
    let built = match credentials {
        Some(credentials) => {
            GoogleChatFactory
                .build_with_secrets(&setup, credentials)
                .await
        }
        None => GoogleChatFactory.build(setup).await,
    };
    match built {
        Ok(_) => panic!("the channel was built"),
        Err(error) => error,
    }
}

#[tokio::test]
async fn exactly_one_credential_setting_is_required() {
    let both = build_error(
        json!({ "token_env": "A", "service_account_key_env": "B" }),
        None,
    )
    .await;
    assert_eq!(both.key, "channels[0].settings.token_env");
    assert!(both.to_string().contains("not both"), "{both}");
    let none = build_error(json!({}), None).await;
    assert_eq!(none.key, "channels[0].settings.service_account_key_env");
    assert!(
        none.to_string().contains("service account JSON key"),
        "{none}"
    );
}

#[tokio::test]
async fn a_bad_key_stops_the_start_naming_the_variable_never_the_key() {
    let sim = GoogleChatSimulator::start(quiet()).await.unwrap();
    let good: Value = serde_json::from_str(&sim.add_test_service_account(SERVICE_ACCOUNT)).unwrap();
    let mut wrong_type = good.clone();
    wrong_type["type"] = json!("authorized_user");
    let mut bad_pem = good.clone();
    bad_pem["private_key"] = json!(
        "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbA==\n-----END PRIVATE KEY-----\n"
    );
    let mut no_email = good.clone();
    no_email.as_object_mut().unwrap().remove("client_email");
    let settings = json!({ "service_account_key_env": KEY_ENV });
    for (text, expected) in [
        (
            "{\"type\": \"service_account\", ".to_owned(),
            "is not a JSON object",
        ),
        (wrong_type.to_string(), "\"authorized_user\""),
        (bad_pem.to_string(), "not an RSA private key"),
        (no_email.to_string(), "client_email"),
    ] {
        let credentials = GoogleChatCredentials::ServiceAccountKey(Secret::new(text));
        let error = build_error(settings.clone(), Some(credentials)).await;
        let shown = format!("{error} {error:?}");
        assert_eq!(error.key, "channels[0].settings.service_account_key_env");
        assert!(
            shown.contains(KEY_ENV) && shown.contains(expected),
            "{shown}"
        );
        assert!(
            !shown.contains("PRIVATE KEY") && !shown.contains("c2VjcmV0"),
            "the key shows: {shown}"
        );
    }
    sim.stop().await;
}
