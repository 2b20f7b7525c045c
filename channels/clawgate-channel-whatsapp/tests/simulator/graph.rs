//! The Graph API as the Cloud API answers: success shapes, the error envelope and its codes,
//! the 24-hour window, limits, mark-as-read, and injected faults.

use std::time::Duration;

use clawgate_channel_whatsapp::simulator::{Fault, FaultKind, WhatsAppSimulator};
use serde_json::json;

use crate::{graph, quick, send_text};

const PERSON: &str = "4915112345678";

#[tokio::test]
async fn a_send_answers_contacts_and_a_wamid_and_lands_in_the_record() {
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    let inbound = sim.person_writes(PERSON, "Ada", "hi");
    let (status, answer) = send_text(
        &sim,
        &format!("+{PERSON}"),
        "hello",
        json!({ "context": { "message_id": inbound }, "biz_opaque_callback_data": "k#0" }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["messaging_product"], "whatsapp");
    assert_eq!(answer["contacts"][0]["input"], format!("+{PERSON}"));
    assert_eq!(answer["contacts"][0]["wa_id"], PERSON);
    let wamid = answer["messages"][0]["id"].as_str().unwrap();
    assert!(wamid.starts_with("wamid."), "{wamid}");
    let landed = sim.sent(PERSON);
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].wamid, wamid);
    assert_eq!(landed[0].context.as_deref(), Some(inbound.as_str()));
    assert_eq!(landed[0].callback_data.as_deref(), Some("k#0"));
    // Media by link.
    let path = format!("/v23.0/{}/messages", sim.phone_number_id());
    let (status, _) = graph(
        &sim,
        "POST",
        &path,
        Some(
            json!({ "messaging_product": "whatsapp", "to": PERSON, "type": "image",
            "image": { "link": "https://example.org/a.png", "caption": "a picture" } }),
        ),
        Some(&sim.token()),
    )
    .await;
    assert_eq!(status, 200);
    let media = sim.sent(PERSON).pop().unwrap();
    assert_eq!(
        (media.kind.as_str(), media.link.as_deref()),
        ("image", Some("https://example.org/a.png"))
    );
    // The number itself.
    let (status, number) = graph(
        &sim,
        "GET",
        &format!("/v23.0/{}", sim.phone_number_id()),
        None,
        Some(&sim.token()),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(number["id"], sim.phone_number_id());
}

#[tokio::test]
async fn refusals_carry_graphs_envelope_and_send_nothing() {
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    sim.person_writes(PERSON, "Ada", "hi");
    let path = format!("/v23.0/{}/messages", sim.phone_number_id());
    let text = |body: &str| json!({ "messaging_product": "whatsapp", "to": PERSON, "type": "text", "text": { "body": body } });
    let long = "x".repeat(4_097);
    let cases = [
        (
            "no token",
            graph(&sim, "POST", &path, Some(text("a")), None).await,
            401,
            190,
        ),
        (
            "wrong token",
            graph(&sim, "POST", &path, Some(text("a")), Some("EAAG-x")).await,
            401,
            190,
        ),
        (
            "no messaging_product",
            graph(
                &sim,
                "POST",
                &path,
                Some(json!({ "to": PERSON, "text": { "body": "a" } })),
                Some(&sim.token()),
            )
            .await,
            400,
            100,
        ),
        (
            "over 4096",
            graph(&sim, "POST", &path, Some(text(&long)), Some(&sim.token())).await,
            400,
            100,
        ),
        (
            "empty body",
            graph(&sim, "POST", &path, Some(text(" ")), Some(&sim.token())).await,
            400,
            100,
        ),
        (
            "callback data over 512",
            send_text(
                &sim,
                PERSON,
                "a",
                json!({ "biz_opaque_callback_data": "k".repeat(513) }),
            )
            .await,
            400,
            100,
        ),
        (
            "outside the window",
            send_text(&sim, "4915100000000", "a", json!({})).await,
            400,
            131_047,
        ),
        (
            "unknown number",
            graph(
                &sim,
                "POST",
                "/v23.0/1234/messages",
                Some(text("a")),
                Some(&sim.token()),
            )
            .await,
            400,
            100,
        ),
        (
            "unknown version",
            graph(
                &sim,
                "POST",
                "/latest/x",
                Some(text("a")),
                Some(&sim.token()),
            )
            .await,
            400,
            2500,
        ),
    ];
    for (case, (status, answer), want_status, want_code) in cases {
        assert_eq!(status, want_status, "{case}: {answer}");
        let error = &answer["error"];
        assert_eq!(error["code"], want_code, "{case}: {answer}");
        assert!(error["message"].is_string(), "{case}");
        assert_eq!(error["type"], "OAuthException", "{case}");
        assert!(
            error["fbtrace_id"].as_str().is_some_and(|t| !t.is_empty()),
            "{case}"
        );
    }
    let (_, window) = send_text(&sim, "4915100000000", "a", json!({})).await;
    assert!(
        window["error"]["error_data"]["details"]
            .as_str()
            .unwrap()
            .contains("24 hours")
    );
    assert_eq!(
        window["error"]["message"],
        "(#131047) Re-engagement message"
    );
    assert!(sim.all_sent().is_empty(), "no refusal sent anything");
    sim.revoke_token();
    let (status, revoked) = send_text(&sim, PERSON, "a", json!({})).await;
    assert_eq!(
        (
            status,
            revoked["error"]["code"].as_i64(),
            revoked["error"]["error_subcode"].as_i64()
        ),
        (401, Some(190), Some(463))
    );
}

#[tokio::test]
async fn the_window_follows_the_persons_last_message() {
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    let (status, _) = send_text(&sim, PERSON, "first contact", json!({})).await;
    assert_eq!(status, 400, "nobody wrote: closed");
    sim.person_writes(PERSON, "Ada", "hi");
    assert_eq!(send_text(&sim, PERSON, "now", json!({})).await.0, 200);
    sim.close_window(PERSON);
    assert_eq!(
        send_text(&sim, PERSON, "a day later", json!({})).await.0,
        400
    );
    sim.person_writes(PERSON, "Ada", "again");
    assert_eq!(send_text(&sim, PERSON, "reopened", json!({})).await.0, 200);
}

#[tokio::test]
async fn mark_as_read_marks_the_message_and_the_earlier_ones() {
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    sim.person_writes(PERSON, "Ada", "one");
    let second = sim.person_writes(PERSON, "Ada", "two");
    sim.person_writes(PERSON, "Ada", "three");
    let path = format!("/v23.0/{}/messages", sim.phone_number_id());
    let (status, answer) = graph(
        &sim,
        "POST",
        &path,
        Some(json!({ "messaging_product": "whatsapp", "status": "read", "message_id": second })),
        Some(&sim.token()),
    )
    .await;
    assert_eq!((status, answer), (200, json!({ "success": true })));
    let read: Vec<bool> = sim.inbound().iter().map(|m| m.read).collect();
    assert_eq!(read, vec![true, true, false]);
}

#[tokio::test]
async fn faults_refuse_lose_answers_and_fail_later_as_injected() {
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    sim.person_writes(PERSON, "Ada", "hi");
    sim.inject(Fault::code(130_429).after(1));
    assert_eq!(send_text(&sim, PERSON, "through", json!({})).await.0, 200);
    let (status, answer) = send_text(&sim, PERSON, "throttled", json!({})).await;
    assert_eq!(
        (status, answer["error"]["code"].as_i64()),
        (400, Some(130_429))
    );
    // A lost answer: the connection closes, the message is sent.
    sim.inject(Fault::new(FaultKind::LoseAnswer));
    let url = format!("{}/v23.0/{}/messages", sim.api_url(), sim.phone_number_id());
    let lost = reqwest::Client::new()
        .post(url)
        .bearer_auth(sim.token())
        .json(&json!({ "messaging_product": "whatsapp", "to": PERSON, "type": "text", "text": { "body": "lost" } }))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(lost.is_err(), "no answer: {lost:?}");
    sim.inject(Fault::new(FaultKind::ServerError(502)));
    let (status, answer) = send_text(&sim, PERSON, "proxy", json!({})).await;
    assert_eq!(
        (status, answer),
        (502, serde_json::Value::Null),
        "not a Graph answer"
    );
    sim.inject(Fault::new(FaultKind::FailAsync(131_026)));
    assert_eq!(
        send_text(&sim, PERSON, "fails later", json!({})).await.0,
        200
    );
    let texts: Vec<_> = sim
        .sent(PERSON)
        .into_iter()
        .map(|m| (m.text.unwrap(), m.status))
        .collect();
    assert_eq!(
        texts,
        vec![
            ("through".to_owned(), "delivered".to_owned()),
            ("lost".to_owned(), "delivered".to_owned()),
            ("fails later".to_owned(), "failed".to_owned()),
        ]
    );
}
