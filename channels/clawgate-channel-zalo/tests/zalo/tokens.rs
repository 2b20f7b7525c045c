//! Access tokens: refreshed with the rotating refresh token, the new pair persisted before it
//! is used (a restart reads the rotated token, the spent one in the environment notwithstanding),
//! a refused access token refreshed once, and a refresh whose answer is lost (a crash between
//! Zalo rotating and our write) reported with what to do, while the access token in hand keeps
//! working; a re-authorization recovers.

use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_zalo::TOKEN_FILE;
use clawgate_channel_zalo::simulator::{SimulatorConfig, ZaloSimulator};
use serde_json::json;

use crate::peer::{build, quick, settings};
use crate::send::reply;

fn refreshes(sim: &ZaloSimulator) -> usize {
    sim.calls()
        .iter()
        .filter(|c| c.path == "/v4/oa/access_token")
        .count()
}

async fn send(
    plugin: &ChannelPlugin,
    user: &str,
    key: &str,
) -> Result<MessageReceiptPart, SendError> {
    let ctx = SendContext::new(reply(&MessageTarget::direct(user), key, ""), key);
    plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, key))
        .await
}

#[tokio::test]
async fn an_expired_access_token_is_refreshed_once_and_the_rotated_token_survives_a_restart() {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let configured = sim.authorize();
    let config = settings(
        &sim,
        clawgate_conformance::ports::reserve_loopback_port(),
        &json!({}),
    );
    let plugin = build(&sim, state.path(), config.clone(), &configured)
        .await
        .unwrap();
    assert_eq!(refreshes(&sim), 1, "the start refreshed once");
    let user = "8111";
    sim.open_window(user);
    send(&plugin, user, "before").await.unwrap();
    assert_eq!(refreshes(&sim), 1, "a live token is reused");
    // Zalo stops taking the token (-216): one refresh, the send tried once more, once landed.
    sim.expire_access_tokens();
    send(&plugin, user, "after-expiry").await.unwrap();
    assert_eq!(refreshes(&sim), 2);
    let sends: Vec<_> = sim
        .calls()
        .into_iter()
        .filter(|c| c.path == "/v3.0/oa/message/cs")
        .map(|c| c.error)
        .collect();
    assert_eq!(sends, vec![0, -216, 0]);
    assert_eq!(sim.sent(user).len(), 2);
    // The configured token is spent; the stored chain is the live one.
    assert_eq!(sim.live_refresh_tokens(), 1);
    let file = std::fs::read_to_string(state.path().join(TOKEN_FILE)).unwrap();
    assert!(
        !file.contains(&configured),
        "the spent token is no longer stored"
    );
    drop(plugin);
    // A restart with the same (spent) value in the environment reads the file and works.
    sim.expire_access_tokens();
    let again = build(&sim, state.path(), config, &configured)
        .await
        .unwrap();
    send(&again, user, "after-restart").await.unwrap();
    assert_eq!(sim.sent(user).len(), 3);
    // The spent token itself is refused by Zalo: the file was what saved the restart.
    let fresh_state = tempfile::tempdir().unwrap();
    let error = build(
        &sim,
        fresh_state.path(),
        settings(
            &sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            &json!({}),
        ),
        &configured,
    )
    .await
    .err()
    .unwrap();
    let text = error.to_string();
    assert!(text.contains("refresh_token_env"), "{text}");
    assert!(text.contains("re-authorize"), "{text}");
    assert!(
        !text.contains(&configured),
        "never prints the token: {text}"
    );
}

fn texts(sim: &ZaloSimulator, user: &str) -> Vec<String> {
    sim.sent(user).into_iter().map(|m| m.text).collect()
}

#[tokio::test]
async fn a_refresh_lost_between_rotation_and_the_write_is_reported_and_a_reauthorization_recovers()
{
    // Every call refreshes ahead (the margin is longer than a token's life), so the lost
    // refresh happens while the access token in hand still works, as it does on Zalo with
    // the default margin of 12 of the token's 25 hours.
    let sim = ZaloSimulator::start(SimulatorConfig {
        access_lifetime: Duration::from_secs(3_600),
        ..quick()
    })
    .await
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let config = settings(
        &sim,
        clawgate_conformance::ports::reserve_loopback_port(),
        &json!({ "refresh_ahead_ms": 7_200_000 }),
    );
    let configured = sim.authorize();
    let plugin = build(&sim, state.path(), config.clone(), &configured)
        .await
        .unwrap();
    let user = "8222";
    sim.open_window(user);
    // Zalo rotates, the answer never arrives: the state a crash right before the write leaves.
    sim.lose_next_token_answer();
    send(&plugin, user, "one").await.unwrap();
    let file = std::fs::read_to_string(state.path().join(TOKEN_FILE)).unwrap();
    assert!(
        file.contains("\"refreshing_since_ms\": 1"),
        "the marker stays: {file}"
    );
    // The crash itself: a restart with the environment unchanged starts, and still sends with
    // the access token in hand (each refresh ahead is refused: the stored token is spent).
    drop(plugin);
    let plugin = build(&sim, state.path(), config.clone(), &configured)
        .await
        .unwrap();
    send(&plugin, user, "two").await.unwrap();
    // Once that token expires, the send fails before any I/O, naming what happened and the fix.
    sim.expire_access_tokens();
    let error = send(&plugin, user, "three").await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth);
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(
        error
            .message
            .contains("ended without its answer being saved"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("ZALO_REFRESH_TOKEN"),
        "{}",
        error.message
    );
    assert_eq!(texts(&sim, user), vec!["one", "two"]);
    // The operator re-authorizes and configures the new refresh token: the channel adopts it.
    drop(plugin);
    let reauthorized = sim.authorize();
    let plugin = build(&sim, state.path(), config, &reauthorized)
        .await
        .unwrap();
    send(&plugin, user, "four").await.unwrap();
    assert_eq!(texts(&sim, user), vec!["one", "two", "four"]);
}

#[tokio::test]
async fn a_start_after_the_access_token_was_revoked_refreshes_instead_of_failing() {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let configured = sim.authorize();
    let config = settings(
        &sim,
        clawgate_conformance::ports::reserve_loopback_port(),
        &json!({}),
    );
    drop(
        build(&sim, state.path(), config.clone(), &configured)
            .await
            .unwrap(),
    );
    // The stored access token still has hours left by its own clock, but Zalo refuses it.
    sim.expire_access_tokens();
    let plugin = build(&sim, state.path(), config, &configured)
        .await
        .unwrap();
    assert_eq!(refreshes(&sim), 2);
    let oa_checks: Vec<_> = sim
        .calls()
        .into_iter()
        .filter(|c| c.path == "/v2.0/oa/getoa")
        .map(|c| c.error)
        .collect();
    assert_eq!(oa_checks, vec![0, -216, 0]);
    assert!(
        plugin.description.contains("Clawgate Simulated OA"),
        "{}",
        plugin.description
    );
}

#[tokio::test]
async fn a_refused_refresh_spends_nothing_and_is_never_mistaken_for_a_lost_one() {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let configured = sim.authorize();
    let config = settings(
        &sim,
        clawgate_conformance::ports::reserve_loopback_port(),
        &json!({}),
    );
    for _ in 0..2 {
        let setup =
            clawgate_conformance::channel_setup(0, "zalo", "default", config.clone(), state.path());
        let error = clawgate_channel_zalo::ZaloFactory
            .build_with_secrets(
                &setup,
                Secret::new("not-the-app-secret"),
                Secret::new(sim.oa_secret_key()),
                Secret::new(configured.clone()),
            )
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("app_secret_env"), "{error}");
        assert!(!error.contains("without its answer"), "{error}");
    }
    // The configured token was never spent: with the right secret the start succeeds.
    build(&sim, state.path(), config.clone(), &configured)
        .await
        .unwrap();
}
