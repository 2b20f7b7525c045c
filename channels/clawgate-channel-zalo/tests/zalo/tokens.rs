//! Access tokens: refreshed with the rotating refresh token, the new pair stored before it is
//! used (a restart reads the rotated token, the spent one in the environment notwithstanding),
//! a refused access token refreshed once, and a refresh whose answer is lost (a crash between
//! Zalo rotating and our write) reported with what to do, while the access token in hand keeps
//! working; a re-authorization recovers. Gateways sharing a store spend each refresh token
//! once, and two OAs on one store keep their tokens apart.

use std::collections::HashSet;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_zalo::simulator::{SimulatorConfig, ZaloSimulator};
use serde_json::json;

use crate::peer::{build, build_account, quick, settings, stored_tokens};
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
    let stored = stored_tokens(state.path(), "default").await;
    assert_ne!(
        stored["refresh_token"], configured,
        "the spent token is no longer stored"
    );
    assert!(stored["refreshing_since_ms"].is_null());
    drop(plugin);
    // A restart with the same (spent) value in the environment reads the file and works.
    sim.expire_access_tokens();
    let again = build(&sim, state.path(), config, &configured)
        .await
        .unwrap();
    send(&again, user, "after-restart").await.unwrap();
    assert_eq!(sim.sent(user).len(), 3);
    // The spent token itself is refused by Zalo: the store was what saved the restart.
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
    let stored = stored_tokens(state.path(), "default").await;
    assert!(
        stored["refreshing_since_ms"].is_u64(),
        "the marker stays: {:?}",
        stored.get("refreshing_since_ms")
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

fn token_calls(sim: &ZaloSimulator) -> Vec<(String, i64)> {
    sim.calls()
        .into_iter()
        .filter(|c| c.path == "/v4/oa/access_token")
        .map(|c| {
            let token = c.body["refresh_token"].as_str().unwrap_or_default();
            (token.to_owned(), c.error)
        })
        .collect()
}

#[tokio::test]
async fn gateways_sharing_a_store_refreshing_at_once_spend_each_refresh_token_once() {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let configured = sim.authorize();
    let gateway = || {
        build(
            &sim,
            state.path(),
            settings(
                &sim,
                clawgate_conformance::ports::reserve_loopback_port(),
                &json!({}),
            ),
            &configured,
        )
    };
    // Three gateways on one store: the first start refreshes, the others use its token.
    let gateways = [
        gateway().await.unwrap(),
        gateway().await.unwrap(),
        gateway().await.unwrap(),
    ];
    assert_eq!(refreshes(&sim), 1);
    let user = "8555";
    sim.open_window(user);
    for round in 0..3 {
        // Zalo stops taking the access token: every gateway's send is refused at once, and
        // each needs a new token at the same moment.
        sim.expire_access_tokens();
        let keys: Vec<_> = (0..gateways.len())
            .map(|g| format!("round-{round}-gateway-{g}"))
            .collect();
        let (one, two, three) = tokio::join!(
            send(&gateways[0], user, &keys[0]),
            send(&gateways[1], user, &keys[1]),
            send(&gateways[2], user, &keys[2]),
        );
        for sent in [one, two, three] {
            sent.unwrap();
        }
    }
    // One refresh per expiry, each spending the token the one before it answered.
    let calls = token_calls(&sim);
    assert_eq!(calls.len(), 4, "one at the start, one per expiry");
    assert!(calls.iter().all(|(_, error)| *error == 0), "none refused");
    let spent: HashSet<_> = calls.iter().map(|(token, _)| token.clone()).collect();
    assert_eq!(spent.len(), calls.len(), "no refresh token was sent twice");
    assert_eq!(sim.live_refresh_tokens(), 1);
    assert_eq!(texts(&sim, user).len(), 9);
}

#[tokio::test]
async fn two_oas_on_one_store_keep_their_tokens_and_books_apart() {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let (first, second) = (sim.authorize(), sim.authorize());
    let config = || {
        settings(
            &sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            &json!({}),
        )
    };
    let oa1 = build_account(&sim, state.path(), "oa1", config(), &first, None)
        .await
        .unwrap();
    let oa2 = build_account(&sim, state.path(), "oa2", config(), &second, None)
        .await
        .unwrap();
    // A send of oa1 whose answer is lost is oa1's evidence only.
    let user = "8666";
    sim.open_window(user);
    sim.inject(clawgate_channel_zalo::simulator::Fault::new(
        clawgate_channel_zalo::simulator::FaultKind::LoseAnswer,
    ));
    let error = send(&oa1, user, "lost").await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    let ctx = SendContext::new(reply(&MessageTarget::direct(user), "lost", ""), "lost");
    let unit = RenderedMessageUnit::text(0, "lost");
    assert_eq!(
        oa2.sender
            .reconcile_unknown_send(&ctx, &unit)
            .await
            .unwrap(),
        Reconciliation::NotSent,
        "oa2 never attempted it"
    );
    assert_eq!(
        oa1.sender
            .reconcile_unknown_send(&ctx, &unit)
            .await
            .unwrap(),
        Reconciliation::Unresolved,
        "oa1 attempted it; no echo reached it (no webhook URL)"
    );
    // Restarts in either order find each OA's own chain (the spent seeds notwithstanding).
    drop((oa1, oa2));
    sim.expire_access_tokens();
    let oa2 = build_account(&sim, state.path(), "oa2", config(), &second, None)
        .await
        .unwrap();
    let oa1 = build_account(&sim, state.path(), "oa1", config(), &first, None)
        .await
        .unwrap();
    send(&oa1, user, "from-oa1").await.unwrap();
    send(&oa2, user, "from-oa2").await.unwrap();
    let calls = token_calls(&sim);
    assert!(calls.iter().all(|(_, error)| *error == 0), "none refused");
    assert_eq!(sim.live_refresh_tokens(), 2, "one chain per OA");
    let (one, two) = (
        stored_tokens(state.path(), "oa1").await,
        stored_tokens(state.path(), "oa2").await,
    );
    assert_ne!(one["refresh_token"], two["refresh_token"]);
    assert_ne!(one["seeded_from"], two["seeded_from"]);
}
