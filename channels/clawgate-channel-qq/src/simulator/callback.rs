//! The callback sender: each queued dispatch is posted to the callback URL, signed with
//! `X-Signature-Ed25519` over `X-Signature-Timestamp` + the exact bytes, and posted again on
//! the configured schedule until it is acknowledged (`{"op": 12, "d": 0}`) within the answer
//! deadline, or the schedule is used up and it is given up. Attempts of different dispatches
//! run concurrently, so events can arrive out of order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::state::{Inner, now_ms};
use crate::signature;

/// How long the sender waits between looks at the queue when nothing wakes it.
const TICK: Duration = Duration::from_millis(20);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_default()
}

pub(crate) async fn run(inner: Arc<Inner>) {
    let http = client();
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
    let Some(url) = world.callback_url.clone() else {
        return Vec::new();
    };
    let now = Instant::now();
    let mut due = Vec::new();
    for delivery in world.deliveries.iter_mut() {
        if delivery.acked || delivery.given_up || delivery.in_flight || delivery.next_at > now {
            continue;
        }
        delivery.in_flight = true;
        due.push((delivery.id, url.clone(), delivery.bytes.clone()));
    }
    due
}

/// Posts `bytes` signed; the status and the answer.
async fn post(
    inner: &Inner,
    http: &reqwest::Client,
    url: &str,
    bytes: String,
) -> (u16, Option<Value>) {
    let config = &inner.config;
    let timestamp = (now_ms() / 1_000).to_string();
    let Ok(sig) = signature::sign(&config.secret, &timestamp, bytes.as_bytes()) else {
        return (0, None);
    };
    let sent = http
        .post(url)
        .header("content-type", "application/json")
        .header("x-signature-ed25519", sig)
        .header("x-signature-timestamp", timestamp)
        .header("x-bot-appid", &config.app_id)
        .header("user-agent", "QQBot-Callback")
        .body(bytes)
        .timeout(config.answer_deadline)
        .send()
        .await;
    match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            let body = response.json::<Value>().await.ok();
            (status, body)
        }
        Err(_) => (0, None),
    }
}

async fn attempt(inner: Arc<Inner>, http: reqwest::Client, id: usize, url: String, bytes: String) {
    let (status, answer) = post(&inner, &http, &url, bytes).await;
    let acked = status == 200
        && answer
            .as_ref()
            .is_some_and(|a| a["op"] == 12 && a["d"] == 0);
    let mut world = inner.world();
    let cut = world.cut_deliveries > 0;
    if cut {
        world.cut_deliveries -= 1;
    }
    let Some(delivery) = world.deliveries.get_mut(id) else {
        return;
    };
    delivery.in_flight = false;
    delivery
        .attempts
        .push(if acked && !cut { status } else { 0 });
    if acked && !cut {
        delivery.acked = true;
        return;
    }
    match inner.config.retry_delays.get(delivery.attempts.len() - 1) {
        Some(wait) => delivery.next_at = Instant::now() + *wait,
        None => delivery.given_up = true,
    }
}

/// The op 13 URL validation: posts `{plain_token, event_ts}` and checks the answer.
pub(crate) async fn validate(inner: &Arc<Inner>, url: &str) -> Result<(), String> {
    let plain_token = format!("Arq0D5A61EgUu4OxUvOp{}", now_ms() % 1_000);
    let event_ts = (now_ms() / 1_000).to_string();
    let body = serde_json::json!({ "op": 13,
        "d": { "plain_token": plain_token, "event_ts": event_ts } });
    let (status, answer) = post(inner, &client(), url, body.to_string()).await;
    let answer = answer.ok_or_else(|| format!("HTTP {status} without a JSON answer"))?;
    if answer["plain_token"] != plain_token.as_str() {
        return Err(format!("the answer's plain_token is wrong: {answer}"));
    }
    let signature = answer["signature"].as_str();
    signature::verify(
        &inner.config.secret,
        signature,
        Some(&event_ts),
        plain_token.as_bytes(),
    )
    .map_err(|e| format!("the answer's signature does not verify: {e}"))
}
