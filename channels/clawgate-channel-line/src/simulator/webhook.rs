//! The webhook sender: each queued event is posted to the webhook URL, signed with the channel
//! secret, one event per delivery. An answer that is not 2xx in time (or no connection) is a
//! failed delivery; with redelivery on, the event goes out again after the next delay with
//! `deliveryContext.isRedelivery: true` and the same `webhookEventId`, and its reply token
//! works for another minute from then. A timed-out attempt is not cancelled: the redelivery
//! goes out even if the slow first request later succeeds.

use std::sync::Arc;
use std::time::Instant;

use super::DeliveryRecord;
use super::state::{Inner, QUEUE_TICK};
use crate::signature;

pub(crate) async fn run(inner: Arc<Inner>) {
    let http = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(2))
        .build()
        .unwrap_or_default();
    let mut shutdown = inner.shutdown_tx.subscribe();
    loop {
        if *shutdown.borrow() {
            return;
        }
        for (index, url) in due(&inner) {
            tokio::spawn(attempt(inner.clone(), http.clone(), index, url));
        }
        tokio::select! {
            () = inner.events_changed.notified() => {}
            () = tokio::time::sleep(QUEUE_TICK) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// The events due now (marked in flight); none while no webhook URL is set.
fn due(inner: &Inner) -> Vec<(usize, String)> {
    let mut world = inner.world();
    let Some(url) = world.webhook_url.clone() else {
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

async fn attempt(inner: Arc<Inner>, http: reqwest::Client, index: usize, url: String) {
    let Some((body, event_ids, is_redelivery)) = inner.world().delivery_body(index) else {
        return;
    };
    let signature = signature::sign(inner.config.channel_secret.as_bytes(), body.as_bytes());
    let request = http
        .post(&url)
        .header("content-type", "application/json; charset=utf-8")
        .header(signature::SIGNATURE_HEADER, &signature)
        .header("user-agent", "LineBotWebhook/2.0")
        .body(body.clone());
    let cut = std::mem::take(&mut inner.world().cut_next_delivery);
    let sent = tokio::spawn(request.send());
    let status = match tokio::time::timeout(inner.config.webhook_timeout, sent).await {
        // The request reached the URL; its answer is dropped unread.
        _ if cut => None,
        Ok(Ok(Ok(response))) => Some(response.status().as_u16()),
        _ => None,
    };
    let mut world = inner.world();
    let redelivery = world.redelivery;
    let delays = world.redelivery_delays.clone();
    let Some(event) = world.events.get_mut(index) else {
        return;
    };
    event.in_flight = false;
    match status {
        Some(status) if (200..300).contains(&status) => event.acked = true,
        _ => {
            let n = event.redeliveries as usize;
            match delays.get(n).filter(|_| redelivery) {
                Some(delay) => {
                    event.redeliveries += 1;
                    event.next_at = Instant::now() + *delay;
                }
                None => event.given_up = true,
            }
        }
    }
    if std::mem::take(&mut event.again) {
        event.acked = false;
        event.given_up = false;
        event.redeliveries += 1;
        event.next_at = Instant::now();
    }
    world.deliveries.push(DeliveryRecord {
        event_ids,
        is_redelivery,
        status,
        body,
        signature,
    });
    drop(world);
    inner.events_changed.notify_one();
}
