//! The single session: a second login that opens its listener (another gateway, a browser)
//! takes the account over; the first channel reports it and stays down, never fighting for
//! the session. A plain network drop is not that: the listener connects again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_zalo_personal::SessionState;
use clawgate_channel_zalo_personal::simulator::{SimulatorConfig, ZaloWebSimulator};
use serde_json::json;

use crate::peer::{Peer, account, build, run_feed, settings, user_for};

/// Collects what a feed hands over.
#[derive(Default)]
struct Collect(Mutex<Vec<String>>);

#[async_trait]
impl EventSink for Collect {
    async fn deliver(&self, event: PushedEvent) {
        if let Some(text) = event.raw["message"]["content"].as_str() {
            self.0.lock().unwrap().push(text.to_owned());
        }
        event.ack.ack();
    }

    async fn stopped(&self) {
        std::future::pending::<()>().await;
    }
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_second_login_takes_the_session_over_and_the_first_reports_it_and_stays_down() {
    let sim = ZaloWebSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let (state_a, state_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = build(&sim, state_a.path(), settings(&sim, &json!({})))
        .await
        .unwrap();
    let heard_a = Arc::new(Collect::default());
    let feed_a = run_feed(&first, heard_a.clone());
    assert!(sim.opened(1, Duration::from_secs(20)).await);
    let person = user_for("takeover");
    sim.person_writes(&person, "to the first");
    until("the first hears", || heard_a.0.lock().unwrap().len() == 1).await;

    // A second gateway on the same account logs in and opens its listener.
    let second = build(&sim, state_b.path(), settings(&sim, &json!({})))
        .await
        .unwrap();
    let heard_b = Arc::new(Collect::default());
    let feed_b = run_feed(&second, heard_b.clone());
    let first_account = account(&first);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let SessionState::TakenOver(takeover) = first_account.state().await {
            assert_eq!(takeover.code, 3000);
            assert!(takeover.describe().contains("Close the other session"));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the takeover was never reported"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Stays down: over a few of the engine's restart pauses, no new connection from the
    // first, so the second keeps the session.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let stats = sim.socket_stats();
    assert_eq!(
        (stats.opened, stats.kicked, stats.open),
        (2, 1, 1),
        "exactly one takeover, no fight: {stats:?}"
    );
    sim.person_writes(&person, "to the second");
    until("the second hears", || heard_b.0.lock().unwrap().len() == 1).await;
    assert_eq!(heard_a.0.lock().unwrap().clone(), vec!["to the first"]);
    // The first sends nothing either, before any I/O, saying why.
    let target = MessageTarget::direct(&person);
    let message = ChannelMessage::outbound("after-takeover", "zalo-personal", target, "hi");
    let ctx = SendContext::new(message, "after-takeover");
    let error = first
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "hi"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth);
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(sim.landed().is_empty());
    // The second still sends.
    let ctx = SendContext::new(
        ChannelMessage::outbound("b", "zalo-personal", MessageTarget::direct(&person), "hi"),
        "b",
    );
    second
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "hi"))
        .await
        .unwrap();
    feed_a.abort();
    feed_b.abort();
    sim.stop();
}

#[tokio::test]
async fn a_browser_kicking_the_session_is_reported_the_same_way() {
    let peer = Peer::start().await;
    peer.sim.kick();
    let acc = account(&peer.plugin);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !matches!(acc.state().await, SessionState::TakenOver(_)) {
        assert!(std::time::Instant::now() < deadline, "never reported");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(
        peer.sim.socket_stats().opened,
        1,
        "no reconnect after a takeover"
    );
}

#[tokio::test]
async fn a_network_drop_reconnects_and_messages_flow_again() {
    let peer = Peer::start().await;
    let person = user_for("drop");
    let before = peer.sim.person_writes(&person, "before");
    until("before is read", || peer.seen(&before)).await;
    assert_eq!(peer.sim.drop_sockets(), 1);
    assert!(
        peer.sim.opened(2, Duration::from_secs(20)).await,
        "the listener connects again after a drop"
    );
    let after = peer.sim.person_writes(&person, "after");
    until("after is read", || peer.seen(&after)).await;
    assert!(matches!(
        account(&peer.plugin).state().await,
        SessionState::LoggedIn { .. }
    ));
    let stats = peer.sim.socket_stats();
    assert_eq!((stats.kicked, stats.open), (0, 1), "{stats:?}");
}

#[tokio::test]
async fn the_listener_pings_at_the_server_interval() {
    let peer = Peer::with(
        SimulatorConfig {
            ping_interval: Duration::from_millis(100),
            ..SimulatorConfig::default()
        },
        json!({}),
    )
    .await;
    until("three pings", || peer.sim.socket_stats().pings >= 3).await;
}
