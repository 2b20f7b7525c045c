//! Webhook delivery: JSON POSTs with the secret header, retries with backoff, confirmation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use clawgate_channel_telegram::simulator::{SimUser, SimulatorConfig, WriteOptions};
use serde_json::{Value, json};

use crate::{Harness, alice};

/// What the receiver saw: the update, the secret header, when.
type Seen = Arc<Mutex<Vec<(Value, Option<String>, Instant)>>>;

/// A webhook receiver on loopback answering with the scripted (status, Retry-After), then
/// 200, each after `delay`; it counts the most requests it had in flight at once.
struct Receiver {
    url: String,
    seen: Seen,
    max_in_flight: Arc<AtomicUsize>,
}

async fn receiver(script: Vec<u16>) -> Receiver {
    receiver_with(
        script.into_iter().map(|s| (s, None)).collect(),
        Duration::ZERO,
    )
    .await
}

async fn receiver_with(script: Vec<(u16, Option<u64>)>, delay: Duration) -> Receiver {
    let seen: Seen = Arc::default();
    let max_in_flight = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let script = Arc::new(Mutex::new(script.into_iter()));
    let app = {
        let seen = seen.clone();
        let max_in_flight = max_in_flight.clone();
        axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let seen = seen.clone();
                let script = script.clone();
                let in_flight = in_flight.clone();
                let max_in_flight = max_in_flight.clone();
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    max_in_flight.fetch_max(now, Ordering::SeqCst);
                    let update: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let secret = headers
                        .get("x-telegram-bot-api-secret-token")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    seen.lock()
                        .expect("lock")
                        .push((update, secret, Instant::now()));
                    let (status, retry_after) =
                        script.lock().expect("lock").next().unwrap_or((200, None));
                    tokio::time::sleep(delay).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    let mut response = axum::response::Response::new(axum::body::Body::empty());
                    *response.status_mut() = StatusCode::from_u16(status).expect("status");
                    if let Some(secs) = retry_after {
                        response.headers_mut().insert(
                            "retry-after",
                            secs.to_string().parse().expect("header value"),
                        );
                    }
                    response
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Receiver {
        url,
        seen,
        max_in_flight,
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn config() -> SimulatorConfig {
    SimulatorConfig {
        rate_limits: false,
        webhook_retry_base: Duration::from_millis(50),
        ..SimulatorConfig::default()
    }
}

#[tokio::test]
async fn delivers_in_order_with_the_secret_and_confirms() {
    let h = Harness::with(config()).await;
    let hook = receiver(Vec::new()).await;
    let chat = h.sim.private_chat(&alice());
    h.call(
        "setWebhook",
        json!({"url": hook.url, "secret_token": "s3cr3t_token-1"}),
    )
    .await
    .result();
    let sent: Vec<i64> = ["a", "b", "c"]
        .iter()
        .map(|t| {
            h.sim
                .user_writes(chat, &alice(), t, WriteOptions::default())["update_id"]
                .as_i64()
                .expect("id")
        })
        .collect();
    until("three deliveries", || {
        hook.seen.lock().expect("lock").len() == 3
    })
    .await;
    until("confirmation", || h.sim.pending_updates() == 0).await;
    let seen = hook.seen.lock().expect("lock").clone();
    let got: Vec<i64> = seen
        .iter()
        .filter_map(|(u, _, _)| u["update_id"].as_i64())
        .collect();
    assert_eq!(got, sent);
    assert!(
        seen.iter()
            .all(|(_, secret, _)| secret.as_deref() == Some("s3cr3t_token-1"))
    );
    assert_eq!(seen[0].0["message"]["text"], json!("a"));
    let info = h.call("getWebhookInfo", json!({})).await;
    assert_eq!(info.result()["url"], json!(hook.url));
    assert_eq!(info.result()["pending_update_count"], json!(0));
    h.sim.stop().await;
}

#[tokio::test]
async fn failures_are_retried_with_doubling_delays() {
    let h = Harness::with(config()).await;
    let hook = receiver(vec![500, 502, 503]).await;
    let chat = h.sim.private_chat(&alice());
    h.call("setWebhook", json!({"url": hook.url}))
        .await
        .result();
    let update_id = h
        .sim
        .user_writes(chat, &alice(), "retry me", WriteOptions::default())["update_id"]
        .as_i64()
        .expect("id");
    until("a 2xx after three failures", || {
        h.sim
            .webhook_deliveries()
            .iter()
            .any(|d| d.status == Ok(200))
    })
    .await;
    let deliveries = h.sim.webhook_deliveries();
    let attempts: Vec<(i64, u32, Result<u16, String>)> = deliveries
        .iter()
        .map(|d| (d.update_id, d.attempt, d.status.clone()))
        .collect();
    assert_eq!(
        attempts,
        [
            (update_id, 1, Ok(500)),
            (update_id, 2, Ok(502)),
            (update_id, 3, Ok(503)),
            (update_id, 4, Ok(200))
        ]
    );
    let times: Vec<Instant> = hook
        .seen
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, _, t)| *t)
        .collect();
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, minimum) in gaps.iter().zip([50u64, 100, 200]) {
        assert!(*gap >= Duration::from_millis(minimum), "gaps {gaps:?}");
    }
    until("confirmation", || h.sim.pending_updates() == 0).await;
    let info = h.call("getWebhookInfo", json!({})).await;
    assert!(
        info.result()["last_error_message"]
            .as_str()
            .is_some_and(|m| m.contains("503"))
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn an_unreachable_webhook_is_a_transport_error_and_drop_pending_clears() {
    let h = Harness::with(config()).await;
    let chat = h.sim.private_chat(&alice());
    // Port 9 (discard) on loopback: nothing listens there.
    h.call("setWebhook", json!({"url": "http://127.0.0.1:9/hook"}))
        .await
        .result();
    h.sim
        .user_writes(chat, &alice(), "nobody home", WriteOptions::default());
    until("two failed attempts", || {
        h.sim.webhook_deliveries().len() >= 2
    })
    .await;
    assert!(h.sim.webhook_deliveries().iter().all(|d| d.status.is_err()));
    assert_eq!(h.sim.pending_updates(), 1);
    h.call("deleteWebhook", json!({"drop_pending_updates": true}))
        .await
        .result();
    assert_eq!(h.sim.pending_updates(), 0);
    h.sim.stop().await;
}

#[tokio::test]
async fn retry_after_from_the_webhook_is_honoured() {
    let h = Harness::with(config()).await;
    let hook = receiver_with(vec![(429, Some(1))], Duration::ZERO).await;
    let chat = h.sim.private_chat(&alice());
    h.call("setWebhook", json!({"url": hook.url}))
        .await
        .result();
    h.sim
        .user_writes(chat, &alice(), "later please", WriteOptions::default());
    until("the retry", || hook.seen.lock().expect("lock").len() == 2).await;
    let times: Vec<Instant> = hook
        .seen
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, _, t)| *t)
        .collect();
    // 1 s, not the 50 ms backoff.
    assert!(
        times[1] - times[0] >= Duration::from_millis(950),
        "{:?}",
        times[1] - times[0]
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn one_chat_in_order_many_chats_in_parallel_up_to_max_connections() {
    let h = Harness::with(config()).await;
    let hook = receiver_with(Vec::new(), Duration::from_millis(150)).await;
    let chats: Vec<i64> = (0..4)
        .map(|i| h.sim.private_chat(&SimUser::person(3000 + i, "U")))
        .collect();
    h.call("setWebhook", json!({"url": hook.url, "max_connections": 2}))
        .await
        .result();
    for chat in &chats {
        for text in ["first", "second"] {
            h.sim.user_writes(
                *chat,
                &SimUser::person(*chat, "U"),
                text,
                WriteOptions::default(),
            );
        }
    }
    until("eight deliveries", || {
        hook.seen.lock().expect("lock").len() == 8
    })
    .await;
    until("confirmation", || h.sim.pending_updates() == 0).await;
    assert_eq!(
        hook.max_in_flight.load(Ordering::SeqCst),
        2,
        "max_connections bounds the parallelism"
    );
    let seen = hook.seen.lock().expect("lock").clone();
    for chat in &chats {
        let texts: Vec<&Value> = seen
            .iter()
            .filter(|(u, _, _)| u["message"]["chat"]["id"] == json!(chat))
            .map(|(u, _, _)| &u["message"]["text"])
            .collect();
        assert_eq!(
            texts,
            [&json!("first"), &json!("second")],
            "chat {chat} in order"
        );
    }
    h.sim.stop().await;
}

#[tokio::test]
async fn set_webhook_answers_like_the_server_and_ends_a_held_poll() {
    let h = Harness::with(config()).await;
    let poll = {
        let http = h.http.clone();
        let url = h.url("getUpdates");
        tokio::spawn(async move {
            crate::answer(
                http.post(url)
                    .json(&json!({"timeout": 30}))
                    .send()
                    .await
                    .expect("answer"),
            )
            .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !h.sim.holding_long_poll() {
        assert!(Instant::now() < deadline, "the poll was never held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let set = h
        .call("setWebhook", json!({"url": "http://127.0.0.1:9/a"}))
        .await;
    assert_eq!(set.body["description"], json!("Webhook was set"));
    let ended = poll.await.expect("poll");
    assert_eq!(ended.status, 409);
    assert_eq!(
        ended.description(),
        "Conflict: terminated by setWebhook request"
    );
    // A second setWebhook within a second: flood control.
    let again = h
        .call("setWebhook", json!({"url": "http://127.0.0.1:9/b"}))
        .await;
    assert_eq!(
        (again.status, again.description()),
        (429, "Too Many Requests: retry after 1")
    );
    let info = h.call("getWebhookInfo", json!({})).await;
    assert_eq!(info.result()["url"], json!("http://127.0.0.1:9/a"));
    let deleted = h.call("deleteWebhook", json!({})).await;
    assert_eq!(deleted.body["description"], json!("Webhook was deleted"));
    let deleted = h.call("deleteWebhook", json!({})).await;
    assert_eq!(
        deleted.body["description"],
        json!("Webhook is already deleted")
    );
    h.sim.stop().await;
}

#[tokio::test]
async fn a_failing_update_holds_back_its_own_chat_only() {
    let h = Harness::with(SimulatorConfig {
        webhook_retry_base: Duration::from_millis(300),
        ..config()
    })
    .await;
    let hook = receiver(vec![500]).await;
    let a = h.sim.private_chat(&alice());
    let b = h.sim.private_chat(&SimUser::person(4242, "Bea"));
    h.call("setWebhook", json!({"url": hook.url}))
        .await
        .result();
    h.sim
        .user_writes(a, &alice(), "a1", WriteOptions::default());
    h.sim
        .user_writes(a, &alice(), "a2", WriteOptions::default());
    until("the first attempt", || {
        hook.seen.lock().expect("lock").len() == 1
    })
    .await;
    h.sim.user_writes(
        b,
        &SimUser::person(4242, "Bea"),
        "b1",
        WriteOptions::default(),
    );
    until("all delivered", || {
        hook.seen.lock().expect("lock").len() == 4
    })
    .await;
    let texts: Vec<String> = hook
        .seen
        .lock()
        .expect("lock")
        .iter()
        .map(|(u, _, _)| u["message"]["text"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        texts,
        ["a1", "b1", "a1", "a2"],
        "a2 waits for a1; b1 does not"
    );
    h.sim.stop().await;
}
