//! The event sender: each queued event is encrypted, signed and POSTed to the request URL. An
//! answer other than 200 within the callback timeout (or no connection) is a failed push; the
//! event goes out again after the next redelivery delay (Feishu: 15 s, 5 min, 1 h, 6 h), the
//! same `event_id`, freshly encrypted and signed, and is given up after the last one. A
//! timed-out push is not cancelled: the re-push goes out even if the slow one later succeeds.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::DeliveryRecord;
use super::state::{Inner, QUEUE_TICK};
use crate::crypto::{NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(2))
        .build()
        .unwrap_or_default()
}

pub(crate) async fn run(inner: Arc<Inner>) {
    let http = client();
    let mut shutdown = inner.shutdown_tx.subscribe();
    loop {
        if *shutdown.borrow() {
            return;
        }
        for (index, url) in due(&inner) {
            tokio::spawn(attempt(inner.clone(), http.clone(), index, url));
        }
        tokio::select! {
            () = inner.changed.notified() => {}
            () = tokio::time::sleep(QUEUE_TICK) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// The events due now (marked in flight); none while no request URL is set.
fn due(inner: &Inner) -> Vec<(usize, String)> {
    let mut world = inner.world();
    let Some(url) = world.callback_url.clone() else {
        return Vec::new();
    };
    let now = Instant::now();
    world
        .events
        .iter_mut()
        .enumerate()
        .filter(|(_, e)| !e.acked && !e.given_up && !e.in_flight && e.next_at <= now)
        .map(|(i, e)| {
            e.in_flight = true;
            (i, url.clone())
        })
        .collect()
}

/// One signed POST; its status, `None` for no answer in time.
async fn push(
    inner: &Inner,
    http: &reqwest::Client,
    url: &str,
    plain: &Value,
    signed: bool,
) -> (Option<u16>, Option<Value>, (String, String, String, String)) {
    let sealed = inner.world().sealed(plain);
    let (body, timestamp, nonce, signature) = sealed.clone();
    let mut request = http
        .post(url)
        .header("content-type", "application/json; charset=utf-8")
        .header("user-agent", "Go-http-client/1.1")
        .body(body);
    if signed {
        request = request
            .header(TIMESTAMP_HEADER, &timestamp)
            .header(NONCE_HEADER, &nonce)
            .header(SIGNATURE_HEADER, &signature);
    }
    let cut = std::mem::take(&mut inner.world().cut_next_delivery);
    let sent = tokio::spawn(async move {
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        let answer = response.json::<Value>().await.ok();
        Some((status, answer))
    });
    match tokio::time::timeout(inner.config.callback_timeout, sent).await {
        // The request reached the URL; its answer is dropped unread.
        _ if cut => (None, None, sealed),
        Ok(Ok(Some((status, answer)))) => (Some(status), answer, sealed),
        _ => (None, None, sealed),
    }
}

async fn attempt(inner: Arc<Inner>, http: reqwest::Client, index: usize, url: String) {
    let Some((plain, id, pushes)) = inner
        .world()
        .events
        .get(index)
        .map(|e| (e.plain.clone(), e.id.clone(), e.pushes))
    else {
        return;
    };
    let (status, _, (body, timestamp, nonce, signature)) =
        push(&inner, &http, &url, &plain, true).await;
    let mut world = inner.world();
    let delays = inner.config.redelivery_delays.clone();
    let Some(event) = world.events.get_mut(index) else {
        return;
    };
    event.in_flight = false;
    event.pushes += 1;
    if status == Some(200) {
        event.acked = true;
    } else {
        // The first push plus one per delay.
        match delays.get(pushes as usize) {
            Some(delay) => event.next_at = Instant::now() + *delay,
            None => event.given_up = true,
        }
    }
    if std::mem::take(&mut event.again) {
        event.acked = false;
        event.given_up = false;
        event.next_at = Instant::now();
    }
    world.deliveries.push(DeliveryRecord {
        event_id: id,
        attempt: pushes + 1,
        status,
        body,
        timestamp,
        nonce,
        signature,
    });
    drop(world);
    inner.changed.notify_one();
}

/// The URL verification request (encrypted, unsigned); the challenge answered.
pub(crate) async fn verify_url(inner: &Arc<Inner>) -> Option<String> {
    let url = inner.world().callback_url.clone()?;
    let challenge = crate::simulator::state::hex_of(&inner.addr.to_string(), "challenge", 24);
    let plain = json!({ "challenge": challenge, "token": inner.config.verification_token,
        "type": "url_verification" });
    let (status, answer, (body, timestamp, nonce, signature)) =
        push(inner, &client(), &url, &plain, false).await;
    inner.world().deliveries.push(DeliveryRecord {
        event_id: challenge,
        attempt: 1,
        status,
        body,
        timestamp,
        nonce,
        signature,
    });
    answer?.get("challenge")?.as_str().map(str::to_owned)
}
