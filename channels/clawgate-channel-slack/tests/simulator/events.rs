//! The Events API sender: signed deliveries, retries with their headers and reasons, resends
//! under a new `event_id`, and `X-Slack-No-Retry`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use clawgate_channel_slack::signature;
use clawgate_channel_slack::simulator::SimulatorConfig;

use crate::Harness;

/// One request the receiver got: its headers and raw body.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

/// What the receiver answers the n-th request with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answer {
    Status(u16),
    Late(u16, Duration),
    NoRetry(u16),
}

/// A request URL on loopback answering by `script` (then 200) and recording every request.
pub(crate) async fn receiver(script: Vec<Answer>) -> (String, Arc<Mutex<Vec<Received>>>) {
    let got: Arc<Mutex<Vec<Received>>> = Arc::default();
    let record = got.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/slack/events", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
        let record = record.clone();
        let script = script.clone();
        async move {
            let n = {
                let mut got = record.lock().unwrap();
                got.push(Received {
                    headers: headers.clone(),
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
                got.len() - 1
            };
            let status = |s: u16| StatusCode::from_u16(s).unwrap();
            match script.get(n).copied().unwrap_or(Answer::Status(200)) {
                Answer::Status(s) => (status(s), HeaderMap::new()),
                Answer::Late(s, delay) => {
                    tokio::time::sleep(delay).await;
                    (status(s), HeaderMap::new())
                }
                Answer::NoRetry(s) => {
                    let mut headers = HeaderMap::new();
                    headers.insert("x-slack-no-retry", "1".parse().unwrap());
                    (status(s), headers)
                }
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

pub(crate) fn quick() -> SimulatorConfig {
    SimulatorConfig {
        ack_deadline: Duration::from_millis(400),
        retry_delays: [Duration::from_millis(20); 3],
        ..SimulatorConfig::default()
    }
}

fn header(r: &Received, name: &str) -> Option<String> {
    r.headers.get(name).map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_refused_then_late_delivery_is_retried_with_its_number_and_reason() {
    let h = Harness::with(quick()).await;
    let (url, got) = receiver(vec![
        Answer::Status(500),
        Answer::Late(200, Duration::from_millis(900)),
    ])
    .await;
    h.sim.set_request_url(Some(&url));
    let message = h.sim.person_writes(&h.channel, &h.person, "hello", None);
    assert!(h.sim.events_settled(Duration::from_secs(10)).await);
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "{got:?}");
    let retries: Vec<(Option<String>, Option<String>)> = got
        .iter()
        .map(|r| {
            (
                header(r, "x-slack-retry-num"),
                header(r, "x-slack-retry-reason"),
            )
        })
        .collect();
    assert_eq!(
        retries,
        [
            (None, None),
            (Some("1".into()), Some("http_error".into())),
            (Some("2".into()), Some("http_timeout".into())),
        ]
    );
    // One event, the same body every time, each signed afresh and verifiable.
    for r in &got {
        assert_eq!(r.body, got[0].body);
        signature::verify(
            h.sim.signing_secret().as_bytes(),
            header(r, signature::TIMESTAMP_HEADER).as_deref(),
            header(r, signature::SIGNATURE_HEADER).as_deref(),
            r.body.as_bytes(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        )
        .unwrap();
    }
    let envelope: serde_json::Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(envelope["type"], "event_callback");
    assert_eq!(envelope["event"]["ts"], message.ts.as_str());
    assert_eq!(envelope["event"]["channel_type"], "channel");
    assert!(envelope["event"]["client_msg_id"].is_string());
    let statuses: Vec<Option<u16>> = h.sim.deliveries().iter().map(|d| d.status).collect();
    assert_eq!(statuses, [Some(500), None, Some(200)]);
    h.sim.stop().await;
}

#[tokio::test]
async fn an_unreachable_url_is_retried_three_times_then_given_up() {
    let h = Harness::with(quick()).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    h.sim
        .set_request_url(Some(&format!("http://127.0.0.1:{port}/slack/events")));
    h.sim.person_writes(&h.channel, &h.person, "hello", None);
    assert!(h.sim.events_settled(Duration::from_secs(10)).await);
    let deliveries = h.sim.deliveries();
    let reasons: Vec<(u32, Option<&str>)> = deliveries
        .iter()
        .map(|d| (d.retry_num, d.retry_reason.as_deref()))
        .collect();
    assert_eq!(
        reasons,
        [
            (0, None),
            (1, Some("connection_failed")),
            (2, Some("connection_failed")),
            (3, Some("connection_failed")),
        ]
    );
    assert_eq!(h.sim.given_up_events().len(), 1);
    h.sim.stop().await;
}

#[tokio::test]
async fn no_retry_is_honoured_and_a_resend_has_a_new_event_id_without_retry_headers() {
    let h = Harness::with(quick()).await;
    let (url, got) = receiver(vec![Answer::NoRetry(500)]).await;
    h.sim.set_request_url(Some(&url));
    h.sim.person_writes(&h.channel, &h.person, "hello", None);
    assert!(h.sim.events_settled(Duration::from_secs(10)).await);
    assert_eq!(
        got.lock().unwrap().len(),
        1,
        "X-Slack-No-Retry: 1 stops the retries"
    );
    let first = h.sim.event_ids()[0].clone();
    let second = h.sim.resend_event(&first).unwrap();
    assert_ne!(first, second);
    assert!(h.sim.events_settled(Duration::from_secs(10)).await);
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 2);
    assert!(header(&got[1], "x-slack-retry-num").is_none());
    let a: serde_json::Value = serde_json::from_str(&got[0].body).unwrap();
    let b: serde_json::Value = serde_json::from_str(&got[1].body).unwrap();
    assert_eq!(a["event"], b["event"], "the same message");
    assert_ne!(a["event_id"], b["event_id"]);
    h.sim.stop().await;
}

#[tokio::test]
async fn edits_deletes_and_other_bots_produce_their_events() {
    let h = Harness::with(quick()).await;
    let (url, got) = receiver(vec![]).await;
    h.sim.set_request_url(Some(&url));
    let message = h.sim.person_writes(&h.channel, &h.person, "hello", None);
    h.sim.person_edits(&h.channel, &message.ts, "hello again");
    h.sim.person_deletes(&h.channel, &message.ts);
    let bot = h.sim.other_bot("helper");
    h.sim.bot_writes(&h.channel, &bot, "beep", None, None);
    assert!(h.sim.events_settled(Duration::from_secs(10)).await);
    let mut events: Vec<serde_json::Value> = got
        .lock()
        .unwrap()
        .iter()
        .map(|r| serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["event"].clone())
        .collect();
    events.sort_by_key(|e| e["event_ts"].as_str().unwrap_or_default().to_owned());
    assert_eq!(events.len(), 4);
    assert_eq!(events[1]["subtype"], "message_changed");
    assert_eq!(events[1]["message"]["text"], "hello again");
    assert_eq!(events[2]["subtype"], "message_deleted");
    assert_eq!(events[2]["deleted_ts"], message.ts.as_str());
    assert_eq!(events[3]["subtype"], "bot_message");
    assert_eq!(events[3]["bot_id"], bot.bot_id.as_str());
    h.sim.stop().await;
}

#[tokio::test]
async fn the_apps_own_posts_come_back_as_events_with_its_bot_id() {
    let h = Harness::with(quick()).await;
    let (url, got) = receiver(vec![]).await;
    h.sim.set_request_url(Some(&url));
    let posted = h.post(&h.channel, "mine").await;
    assert!(h.sim.events_settled(Duration::from_secs(10)).await);
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    let envelope: serde_json::Value = serde_json::from_str(&got[0].body).unwrap();
    let bot = h.sim.bot();
    assert_eq!(envelope["event"]["ts"], posted["ts"]);
    assert_eq!(envelope["event"]["bot_id"], bot.bot_id.as_str());
    assert_eq!(envelope["event"]["user"], bot.user_id.as_str());
    assert_eq!(
        envelope["authorizations"][0]["user_id"],
        bot.user_id.as_str()
    );
    h.sim.stop().await;
}
