//! The Events API sender: each queued event is posted to the request URL, signed, and retried
//! up to three times with `X-Slack-Retry-Num` / `X-Slack-Retry-Reason` when the answer is not a
//! 2xx within the deadline (platform-apis §2.5). A timed-out attempt is not cancelled: like
//! Slack, the retry goes out even if the slow first request later succeeds.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::DeliveryRecord;
use super::state::{Inner, QUEUE_TICK};
use crate::signature;

/// How one attempt ended.
enum Answer {
    Status(u16, bool),
    TimedOut,
    NoConnection,
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
        let due = due_attempts(&inner);
        for (index, url, body, retry_num, reason) in due {
            tokio::spawn(attempt(
                inner.clone(),
                http.clone(),
                index,
                url,
                body,
                retry_num,
                reason,
            ));
        }
        wait(&inner, &mut shutdown).await;
    }
}

type Due = (usize, String, String, u32, Option<String>);

/// The attempts due now (marked in flight), none while no request URL is set.
fn due_attempts(inner: &Inner) -> Vec<Due> {
    let mut world = inner.world();
    let Some(url) = world.request_url.clone() else {
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
            (
                i,
                url.clone(),
                e.body.to_string(),
                e.retry_num,
                e.retry_reason.clone(),
            )
        })
        .collect()
}

async fn wait(inner: &Inner, shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    tokio::select! {
        () = inner.events_changed.notified() => {}
        () = tokio::time::sleep(QUEUE_TICK) => {}
        _ = shutdown.changed() => {}
    }
}

async fn attempt(
    inner: Arc<Inner>,
    http: reqwest::Client,
    index: usize,
    url: String,
    body: String,
    retry_num: u32,
    reason: Option<String>,
) {
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string();
    let mut request = http
        .post(&url)
        .header("content-type", "application/json")
        .header(signature::TIMESTAMP_HEADER, &timestamp)
        .header(
            signature::SIGNATURE_HEADER,
            signature::sign(
                inner.config.signing_secret.as_bytes(),
                &timestamp,
                body.as_bytes(),
            ),
        )
        .body(body);
    if retry_num > 0 {
        request = request
            .header("x-slack-retry-num", retry_num.to_string())
            .header("x-slack-retry-reason", reason.clone().unwrap_or_default());
    }
    let cut = std::mem::take(&mut inner.world().cut_next_delivery);
    let sent = tokio::spawn(request.send());
    let answer = match tokio::time::timeout(inner.config.ack_deadline, sent).await {
        Ok(Ok(Ok(response))) => Answer::Status(
            response.status().as_u16(),
            response
                .headers()
                .get("x-slack-no-retry")
                .is_some_and(|v| v.as_bytes() == b"1"),
        ),
        Ok(Ok(Err(error))) if error.is_connect() => Answer::NoConnection,
        Ok(_) => Answer::Status(0, false),
        // The request keeps going on its own; the retry is due regardless.
        Err(_) => Answer::TimedOut,
    };
    // The request reached the URL; its answer is dropped unread.
    let answer = if cut { Answer::TimedOut } else { answer };
    let mut world = inner.world();
    let Some(event) = world.events.get_mut(index) else {
        return;
    };
    event.in_flight = false;
    let (status, next_reason, no_retry) = match answer {
        Answer::Status(status, no_retry) if (200..300).contains(&status) => {
            event.acked = true;
            (Some(status), None, no_retry)
        }
        Answer::Status(0, _) => (None, Some("unknown_error"), false),
        Answer::Status(status, no_retry) => (Some(status), Some("http_error"), no_retry),
        Answer::TimedOut => (None, Some("http_timeout"), false),
        Answer::NoConnection => (None, Some("connection_failed"), false),
    };
    let event_id = event.id.clone();
    if let Some(next_reason) = next_reason {
        if no_retry || event.retry_num >= 3 {
            event.given_up = true;
        } else {
            event.retry_num += 1;
            event.retry_reason = Some(next_reason.to_owned());
            event.next_at =
                Instant::now() + inner.config.retry_delays[(event.retry_num - 1) as usize];
        }
    }
    world.deliveries.push(DeliveryRecord {
        event_id,
        retry_num,
        retry_reason: reason,
        status,
    });
    drop(world);
    inner.events_changed.notify_one();
}
