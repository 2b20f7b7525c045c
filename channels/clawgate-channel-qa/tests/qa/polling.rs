//! The adapter's long poll: an idle wait is an empty answer, never a timeout of its own call.

use std::time::Duration;

use clawgate_channel_qa::{QaAdapter, QaPlatform, QaPlatformConfig};

#[tokio::test]
async fn an_idle_long_poll_longer_than_the_call_timeout_answers_empty() {
    let platform = QaPlatform::start(QaPlatformConfig::default())
        .await
        .unwrap();
    // Calls time out after 300 ms; the poll asks the platform to wait 900 ms for an update.
    let adapter = QaAdapter::new(&platform.base_url(), platform.token())
        .with_timeout(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let updates = adapter
        .get_updates(0, 900)
        .await
        .expect("an idle long poll answers, it does not time out");
    assert!(updates.is_empty(), "nothing was written: {updates:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "the platform held the poll for its wait ({:?})",
        started.elapsed()
    );
}
