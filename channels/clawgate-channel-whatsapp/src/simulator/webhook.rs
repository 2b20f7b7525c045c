//! The webhook sender: each queued notification is posted to the callback URL, signed with
//! `X-Hub-Signature-256` over the exact bytes, and posted again on the configured schedule
//! until a 2xx arrives or it is given up (platform-apis-wave2 §1.3). Attempts of different
//! deliveries run concurrently, so statuses can arrive out of order, as Meta's do.

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
        for (id, url, bytes) in due(&inner) {
            tokio::spawn(attempt(inner.clone(), http.clone(), id, url, bytes));
        }
        tokio::select! {
            _ = inner.wake.notified() => {}
            _ = tokio::time::sleep(TICK) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// The attempts due now (marked in flight); none while no callback URL is set.
fn due(inner: &Inner) -> Vec<(usize, String, String)> {
    let mut world = inner.world();
    let Some(url) = world.webhook_url.clone() else {
        return Vec::new();
    };
    let now = Instant::now();
    let give_up_after = inner.config.give_up_after;
    let mut due = Vec::new();
    for delivery in world.deliveries.iter_mut() {
        if delivery.acked || delivery.given_up || delivery.in_flight || delivery.next_at > now {
            continue;
        }
        if now.duration_since(delivery.first_due) > give_up_after {
            delivery.given_up = true;
            continue;
        }
        delivery.in_flight = true;
        due.push((delivery.id, url.clone(), delivery.bytes.clone()));
    }
    due
}

async fn attempt(inner: Arc<Inner>, http: reqwest::Client, id: usize, url: String, bytes: String) {
    let signature = signature::sign(inner.config.app_secret.as_bytes(), bytes.as_bytes());
    let sent = http
        .post(&url)
        .header("content-type", "application/json")
        .header("x-hub-signature-256", signature)
        .header("user-agent", "facebookexternalua")
        .body(bytes)
        .timeout(inner.config.answer_deadline)
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
    if (200..300).contains(&status) {
        delivery.acked = true;
    } else {
        let retries = delivery.attempts.len() - 1;
        let delays = &inner.config.retry_delays;
        let wait = delays
            .get(retries)
            .or(delays.last())
            .copied()
            .unwrap_or(Duration::from_secs(60));
        delivery.next_at = Instant::now() + wait;
    }
}

/// Meta's verification request: `GET url?hub.mode=subscribe&hub.verify_token=…&
/// hub.challenge=…`, answered 200 with the challenge.
pub(crate) async fn verify(inner: &Inner, url: &str, verify_token: &str) -> Result<(), String> {
    let challenge = format!("{}", inner.world().next() * 7_919 + 1_158_201_444);
    let http = reqwest::Client::new();
    let response = http
        .get(url)
        .query(&[
            ("hub.mode", "subscribe"),
            ("hub.verify_token", verify_token),
            ("hub.challenge", challenge.as_str()),
        ])
        .timeout(inner.config.answer_deadline)
        .send()
        .await
        .map_err(|e| format!("the callback URL could not be reached: {e}"))?;
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    if status == 200 && body == challenge {
        Ok(())
    } else {
        Err(format!(
            "the callback URL or verify token couldn't be validated: HTTP {status}, body {body:?}"
        ))
    }
}
