//! Webhooks: setWebhook / deleteWebhook / getWebhookInfo and the worker that POSTs each
//! update as JSON. Updates of one chat go one at a time in update order; different chats run
//! in parallel up to `max_connections`. A 2xx confirms; anything else is retried after a
//! doubling delay from `webhook_retry_base` (capped at a minute), or after the webhook's own
//! `Retry-After` (capped at an hour).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::WebhookDelivery;
use super::http::Params;
use super::state::{ApiError, Inner, State, Success, Webhook};

const SECRET_HEADER: &str = "X-Telegram-Bot-Api-Secret-Token";
const MAX_BACKOFF: Duration = Duration::from_secs(60);
const MAX_RETRY_AFTER_SECS: u64 = 3600;

fn allowed_updates_param(s: &mut State, params: &Params) {
    if let Some(raw) = params.get("allowed_updates")
        && let Ok(Value::Array(list)) = serde_json::from_str::<Value>(raw)
    {
        s.allowed_updates = Some(
            list.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        );
    }
}

fn drop_pending(s: &mut State, params: &Params) {
    if params
        .get("drop_pending_updates")
        .is_some_and(|v| matches!(v.trim(), "true" | "True" | "1"))
    {
        s.updates.clear();
    }
}

pub(crate) fn set(inner: &Arc<Inner>, params: &Params) -> Result<Success, ApiError> {
    let url = params
        .get("url")
        .map(|u| u.trim().to_owned())
        .unwrap_or_default();
    if url.is_empty() {
        return delete(inner, params);
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ApiError::bad_request("bad webhook: invalid URL"));
    }
    let secret = params
        .get("secret_token")
        .filter(|t| !t.is_empty())
        .cloned();
    if let Some(secret) = &secret
        && (secret.len() > 256
            || !secret
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
    {
        return Err(ApiError::bad_request(
            "secret token contains unallowed characters",
        ));
    }
    let max_connections = params
        .get("max_connections")
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(40)
        .clamp(1, 100);
    let drop_requested = params
        .get("drop_pending_updates")
        .is_some_and(|v| matches!(v.trim(), "true" | "True" | "1"));
    let description = inner.with_state(|s| {
        let now = Instant::now();
        // The server takes one setWebhook with a URL per second.
        if s.next_set_webhook_at.is_some_and(|at| now < at) {
            return Err(ApiError::too_many_requests(1));
        }
        s.next_set_webhook_at = Some(now + Duration::from_secs(1));
        allowed_updates_param(s, params);
        let unchanged = s.webhook.as_ref().is_some_and(|w| {
            w.url == url && w.secret_token == secret && w.max_connections == max_connections
        });
        if unchanged && !drop_requested {
            return Ok("Webhook is already set");
        }
        drop_pending(s, params);
        if let Some(poll) = s.long_poll.take() {
            let _ = poll.end.send("terminated by setWebhook request");
        }
        s.webhook_generation += 1;
        s.webhook = Some(Webhook {
            url,
            secret_token: secret,
            max_connections,
            last_error: None,
            generation: s.webhook_generation,
        });
        for update in &mut s.updates {
            update.next_attempt = None;
        }
        Ok("Webhook was set")
    })?;
    inner.updates_changed();
    Ok(Success {
        result: json!(true),
        description: Some(description),
    })
}

pub(crate) fn delete(inner: &Arc<Inner>, params: &Params) -> Result<Success, ApiError> {
    let was_set = inner.with_state(|s| {
        drop_pending(s, params);
        s.webhook_generation += 1;
        s.webhook.take().is_some()
    });
    Ok(Success {
        result: json!(true),
        description: Some(if was_set {
            "Webhook was deleted"
        } else {
            "Webhook is already deleted"
        }),
    })
}

pub(crate) fn info(inner: &Arc<Inner>) -> Value {
    inner.with_state(|s| {
        let pending = s.pending_updates();
        let mut info =
            json!({"url": "", "has_custom_certificate": false, "pending_update_count": pending});
        if let Some(webhook) = &s.webhook {
            info["url"] = json!(webhook.url);
            info["max_connections"] = json!(webhook.max_connections);
            if let Some((date, message)) = &webhook.last_error {
                info["last_error_date"] = json!(date);
                info["last_error_message"] = json!(message);
            }
            if let Some(allowed) = &s.allowed_updates {
                info["allowed_updates"] = json!(allowed);
            }
        }
        info
    })
}

struct Job {
    update_id: i64,
    attempt: u32,
    body: Value,
    url: String,
    secret: Option<String>,
    generation: u64,
}

/// The next deliveries due now, and when the next retry falls due.
fn pick(s: &mut State, now: Instant) -> (Vec<Job>, Option<Instant>) {
    let Some(webhook) = s.webhook.clone() else {
        return (Vec::new(), None);
    };
    s.expire_updates();
    let in_flight = s.updates.iter().filter(|u| u.in_flight).count();
    let mut capacity = (webhook.max_connections as usize).saturating_sub(in_flight);
    let mut busy_chats = HashSet::new();
    let mut jobs = Vec::new();
    let mut next_wake: Option<Instant> = None;
    for update in &mut s.updates {
        // One chat's updates go in order: only its oldest is eligible.
        if !busy_chats.insert(update.chat_id) || update.in_flight {
            continue;
        }
        if let Some(at) = update.next_attempt
            && at > now
        {
            next_wake = Some(next_wake.map_or(at, |w| w.min(at)));
            continue;
        }
        if capacity == 0 {
            break;
        }
        capacity -= 1;
        update.in_flight = true;
        update.attempts += 1;
        jobs.push(Job {
            update_id: update.id,
            attempt: update.attempts,
            body: update.json.clone(),
            url: webhook.url.clone(),
            secret: webhook.secret_token.clone(),
            generation: webhook.generation,
        });
    }
    (jobs, next_wake)
}

pub(crate) async fn run(inner: Arc<Inner>) {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "simulator: no HTTP client for webhook delivery");
            return;
        }
    };
    let mut shutdown = inner.shutdown_tx.subscribe();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let notified = inner.webhook_wake.notified();
        let (jobs, next_wake) = inner.with_state(|s| pick(s, Instant::now()));
        for job in jobs {
            tokio::spawn(deliver(inner.clone(), client.clone(), job));
        }
        let wake = next_wake.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep_until(wake.into()) => {}
            _ = shutdown.changed() => {}
        }
    }
}

async fn deliver(inner: Arc<Inner>, client: reqwest::Client, job: Job) {
    let mut request = client.post(&job.url).json(&job.body);
    if let Some(secret) = &job.secret {
        request = request.header(SECRET_HEADER, secret);
    }
    let outcome = request.send().await;
    let cut = outcome.is_ok()
        && inner.with_state(|s| {
            let cut = s.webhook_cuts > 0;
            s.webhook_cuts = s.webhook_cuts.saturating_sub(1);
            cut
        });
    let (status, retry_after, error_text) = match &outcome {
        _ if cut => {
            let text = "Connection reset by peer".to_owned();
            (Err(text.clone()), None, text)
        }
        Ok(response) => {
            let status = response.status();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            (
                Ok(status.as_u16()),
                retry_after,
                format!("Wrong response from the webhook: {status}"),
            )
        }
        Err(error) => {
            let text = if error.is_timeout() {
                "Timeout expired".to_owned()
            } else if error.is_connect() {
                "Connection refused".to_owned()
            } else {
                error.to_string()
            };
            (Err(text.clone()), None, text)
        }
    };
    let base = inner.config.webhook_retry_base;
    inner.with_state(|s| {
        s.webhook_deliveries.push(WebhookDelivery {
            update_id: job.update_id,
            attempt: job.attempt,
            status: status.clone(),
        });
        let current = s.webhook.as_ref().map(|w| w.generation) == Some(job.generation);
        let now_unix = s.clock.unix();
        let confirmed = matches!(status, Ok(code) if (200..300).contains(&code));
        if confirmed && current {
            s.updates.retain(|u| u.id != job.update_id);
            return;
        }
        if !confirmed
            && current
            && let Some(webhook) = s.webhook.as_mut()
        {
            webhook.last_error = Some((now_unix, error_text));
        }
        if let Some(update) = s.updates.iter_mut().find(|u| u.id == job.update_id) {
            update.in_flight = false;
            if current {
                let delay = match retry_after {
                    Some(secs) => Duration::from_secs(secs.min(MAX_RETRY_AFTER_SECS)),
                    None => backoff(base, update.attempts),
                };
                update.next_attempt = Some(Instant::now() + delay);
            }
        }
    });
    inner.webhook_wake.notify_one();
}

/// base, 2·base, 4·base, … capped at a minute.
fn backoff(base: Duration, attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(20);
    base.saturating_mul(1 << doublings).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let base = Duration::from_millis(100);
        let got: Vec<u128> = (1..=4).map(|a| backoff(base, a).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800]);
        assert_eq!(backoff(base, 30), MAX_BACKOFF);
    }
}
