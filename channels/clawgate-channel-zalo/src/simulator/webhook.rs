//! The webhook sender: each queued event is posted to the webhook URL, signed with
//! `X-ZEvent-Signature` over the exact bytes, and posted again on the configured schedule
//! until a 200 arrives within the answer deadline, or the schedule is used up and it is given
//! up (platform-apis-wave2 §9.1). Attempts of different deliveries run concurrently, so
//! events can arrive out of order, as Zalo's do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::state::Inner;
use crate::signature;

/// How long the sender waits between looks at the queue when nothing wakes it.
const TICK: Duration = Duration::from_millis(20);

pub(crate) async fn run(inner: Arc<Inner>) {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_default();
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        if *shutdown.borrow() {
            return;
        }
        for (id, url, bytes, timestamp) in due(&inner) {
            tokio::spawn(attempt(
                inner.clone(),
                http.clone(),
                id,
                url,
                bytes,
                timestamp,
            ));
        }
        tokio::select! {
            _ = inner.wake.notified() => {}
            _ = tokio::time::sleep(TICK) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// The attempts due now (marked in flight); none while no webhook URL is set.
fn due(inner: &Inner) -> Vec<(usize, String, String, String)> {
    let mut world = inner.world();
    let Some(url) = world.webhook_url.clone() else {
        return Vec::new();
    };
    let now = Instant::now();
    let mut due = Vec::new();
    for delivery in world.deliveries.iter_mut() {
        if delivery.acked || delivery.given_up || delivery.in_flight || delivery.next_at > now {
            continue;
        }
        delivery.in_flight = true;
        due.push((
            delivery.id,
            url.clone(),
            delivery.bytes.clone(),
            delivery.timestamp.clone(),
        ));
    }
    due
}

async fn attempt(
    inner: Arc<Inner>,
    http: reqwest::Client,
    id: usize,
    url: String,
    bytes: String,
    timestamp: String,
) {
    let config = &inner.config;
    let mac = signature::sign(
        &config.app_id,
        bytes.as_bytes(),
        &timestamp,
        &config.oa_secret_key,
    );
    let sent = http
        .post(&url)
        .header("content-type", "application/json")
        .header("x-zevent-signature", mac)
        .header("user-agent", "ZaloWebhook/1.0")
        .body(bytes)
        .timeout(config.answer_deadline)
        .send()
        .await;
    let mut status = sent.map_or(0, |r| r.status().as_u16());
    let mut world = inner.world();
    if world.cut_deliveries > 0 {
        world.cut_deliveries -= 1;
        status = 0;
    }
    let Some(delivery) = world.deliveries.get_mut(id) else {
        return;
    };
    delivery.in_flight = false;
    delivery.attempts.push(status);
    // Only 200 counts: Zalo wants exactly that.
    if status == 200 {
        delivery.acked = true;
        return;
    }
    match config.retry_delays.get(delivery.attempts.len() - 1) {
        Some(wait) => delivery.next_at = Instant::now() + *wait,
        None => delivery.given_up = true,
    }
}
