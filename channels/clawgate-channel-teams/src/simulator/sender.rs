//! The activity sender: each queued activity is POSTed to the bot's endpoint with
//! `Authorization: Bearer <JWT>` (RS256 by the simulator's key; `iss`
//! `https://api.botframework.com`, `aud` the app id, `serviceurl` the service URL).
//!
//! An attempt not answered 2xx within `answer_deadline` is made again after each of
//! `retry_delays`, then given up. A timed-out attempt is not cancelled, so a slow first answer
//! can race its retry.

use std::sync::Arc;
use std::time::Instant;

use super::DeliveryRecord;
use super::keys;
use super::state::{Inner, QUEUE_TICK};

enum Outcome {
    Status(u16),
    NoAnswer,
}

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
        for (index, url, body, attempt_no) in due_attempts(&inner) {
            tokio::spawn(attempt(
                inner.clone(),
                http.clone(),
                index,
                url,
                body,
                attempt_no,
            ));
        }
        tokio::select! {
            () = inner.events_changed.notified() => {}
            () = tokio::time::sleep(QUEUE_TICK) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// The attempts due now, marked in flight; none while no endpoint is set.
fn due_attempts(inner: &Inner) -> Vec<(usize, String, String, u32)> {
    let mut world = inner.world();
    let Some(url) = world.endpoint_url.clone() else {
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
            (i, url.clone(), e.body.to_string(), e.attempts)
        })
        .collect()
}

async fn attempt(
    inner: Arc<Inner>,
    http: reqwest::Client,
    index: usize,
    url: String,
    body: String,
    attempt_no: u32,
) {
    let token = keys::sign(&keys::activity_claims(
        &inner.config.app_id,
        &inner.service_url(),
    ));
    let request = http
        .post(&url)
        .header("content-type", "application/json; charset=utf-8")
        .header(
            "user-agent",
            "Microsoft-SkypeBotApi (Microsoft-BotFramework/3.0)",
        )
        .bearer_auth(token)
        .body(body);
    let cut = std::mem::take(&mut inner.world().cut_next_delivery);
    let sent = tokio::spawn(request.send());
    let outcome = match tokio::time::timeout(inner.config.answer_deadline, sent).await {
        Ok(Ok(Ok(response))) => Outcome::Status(response.status().as_u16()),
        _ => Outcome::NoAnswer,
    };
    // The request reached the bot; its answer is dropped unread.
    let outcome = if cut { Outcome::NoAnswer } else { outcome };
    let mut world = inner.world();
    let Some(event) = world.events.get_mut(index) else {
        return;
    };
    event.in_flight = false;
    event.attempts += 1;
    let status = match outcome {
        Outcome::Status(status) => {
            if (200..300).contains(&status) {
                event.acked = true;
            }
            Some(status)
        }
        Outcome::NoAnswer => None,
    };
    if std::mem::take(&mut event.redeliver) {
        // Asked for while this attempt was out: it comes after it, whatever it answered.
        event.acked = false;
        event.given_up = false;
        event.next_at = Instant::now();
    } else if !event.acked {
        match inner.config.retry_delays.get(attempt_no as usize) {
            Some(delay) => event.next_at = Instant::now() + *delay,
            None => event.given_up = true,
        }
    }
    let event_id = event.id.clone();
    world.deliveries.push(DeliveryRecord {
        event_id,
        attempt: attempt_no,
        status,
    });
    drop(world);
    inner.events_changed.notify_one();
}
