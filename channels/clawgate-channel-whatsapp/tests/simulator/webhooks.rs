//! Webhooks as Meta sends them: the notification shapes, `X-Hub-Signature-256` over the exact
//! bytes, redelivery until a 2xx, replays, statuses with `biz_opaque_callback_data`, and the
//! verification handshake.

use std::time::Duration;

use clawgate_channel_whatsapp::signature;
use clawgate_channel_whatsapp::simulator::{Fault, FaultKind, WhatsAppSimulator};
use serde_json::{Value, json};

use crate::{quick, receiver, send_text};

const PERSON: &str = "4915112345678";

#[tokio::test]
async fn notifications_are_signed_and_shaped_as_meta_sends_them() {
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    let (url, got) = receiver(vec![]).await;
    sim.set_webhook_url(Some(&url));
    let wamid = sim.person_writes(PERSON, "Ada", "hello");
    let (_, answer) = send_text(
        &sim,
        PERSON,
        "hi Ada",
        json!({ "biz_opaque_callback_data": "key-1" }),
    )
    .await;
    let sent = answer["messages"][0]["id"].as_str().unwrap().to_owned();
    assert!(sim.person_reads(&sent));
    assert!(sim.deliveries_settled(Duration::from_secs(20)).await);
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 4, "the message, sent, delivered, read");
    for request in &got {
        let header = request.signature.as_deref();
        assert_eq!(
            signature::verify(sim.app_secret().as_bytes(), header, request.body.as_bytes()),
            Ok(()),
            "signed over the exact bytes"
        );
    }
    let bodies: Vec<Value> = got
        .iter()
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect();
    let message = bodies
        .iter()
        .find(|b| b.pointer("/entry/0/changes/0/value/messages").is_some())
        .unwrap();
    assert_eq!(message["object"], "whatsapp_business_account");
    let value = &message["entry"][0]["changes"][0]["value"];
    assert_eq!(message["entry"][0]["changes"][0]["field"], "messages");
    assert_eq!(value["metadata"]["phone_number_id"], sim.phone_number_id());
    assert_eq!(value["contacts"][0]["profile"], json!({ "name": "Ada" }));
    assert_eq!(value["contacts"][0]["wa_id"], PERSON);
    assert!(
        value["contacts"][0]["user_id"]
            .as_str()
            .unwrap()
            .starts_with("DE.")
    );
    assert_eq!(value["messages"][0]["id"], wamid);
    assert_eq!(value["messages"][0]["text"]["body"], "hello");
    assert!(
        value["messages"][0]["timestamp"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .is_ok()
    );
    let mut statuses: Vec<(String, Value)> = bodies
        .iter()
        .filter_map(|b| b.pointer("/entry/0/changes/0/value/statuses/0").cloned())
        .map(|s| (s["status"].as_str().unwrap().to_owned(), s))
        .collect();
    statuses.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        statuses.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
        vec!["delivered", "read", "sent"]
    );
    for (_, status) in &statuses {
        assert_eq!(status["id"], sent.as_str());
        assert_eq!(status["recipient_id"], PERSON);
        assert_eq!(status["biz_opaque_callback_data"], "key-1");
    }
}

#[tokio::test]
async fn an_unanswered_delivery_is_retried_until_a_2xx_and_can_be_replayed() {
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    let (url, got) = receiver(vec![500, 503]).await;
    sim.set_webhook_url(Some(&url));
    sim.person_writes(PERSON, "Ada", "again and again");
    assert!(sim.deliveries_settled(Duration::from_secs(20)).await);
    let delivery = sim.deliveries().remove(0);
    assert_eq!(delivery.attempts, vec![500, 503, 200]);
    let bodies: Vec<String> = got.lock().unwrap().iter().map(|r| r.body.clone()).collect();
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every attempt posts the same bytes"
    );
    // No callback URL reachable: the delivery waits, and arrives once there is one.
    sim.set_webhook_url(Some("http://127.0.0.1:9/hook"));
    sim.person_writes(PERSON, "Ada", "while down");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(sim.deliveries()[1].attempts.iter().all(|s| *s == 0));
    sim.set_webhook_url(Some(&url));
    assert!(sim.deliveries_settled(Duration::from_secs(20)).await);
    let replay = sim.replay(1).unwrap();
    assert!(sim.deliveries_settled(Duration::from_secs(20)).await);
    let deliveries = sim.deliveries();
    assert_eq!(deliveries[replay].body, deliveries[1].body);
    assert!(deliveries.iter().all(|d| d.acked));
}

#[tokio::test]
async fn an_async_failure_is_a_failed_status_with_its_error() {
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    let (url, got) = receiver(vec![]).await;
    sim.set_webhook_url(Some(&url));
    sim.open_window(PERSON);
    sim.inject(Fault::new(FaultKind::FailAsync(131_026)));
    let (status, _) = send_text(
        &sim,
        PERSON,
        "nobody home",
        json!({ "biz_opaque_callback_data": "k-9" }),
    )
    .await;
    assert_eq!(status, 200);
    assert!(sim.deliveries_settled(Duration::from_secs(20)).await);
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    let body: Value = serde_json::from_str(&got[0].body).unwrap();
    let failed = &body["entry"][0]["changes"][0]["value"]["statuses"][0];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["errors"][0]["code"], 131_026);
    assert_eq!(failed["biz_opaque_callback_data"], "k-9");
}

#[tokio::test]
async fn the_callback_url_is_verified_before_it_is_used() {
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    let (url, _got) = receiver(vec![]).await;
    // The test receiver answers no GET: Meta refuses to subscribe it.
    let refused = sim.subscribe(&url, "token").await.unwrap_err();
    assert!(refused.contains("couldn't be validated"), "{refused}");
    sim.person_writes(PERSON, "Ada", "held");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        sim.deliveries()[0].attempts.is_empty(),
        "nothing posted to an unverified URL"
    );
}
