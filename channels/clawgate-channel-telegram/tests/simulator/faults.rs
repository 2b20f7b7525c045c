//! Injected faults: each kind does exactly what it says, matched in arrival order.

use std::time::{Duration, Instant};

use clawgate_channel_telegram::simulator::{Fault, FaultKind};
use serde_json::json;

use crate::{Harness, alice};

#[tokio::test]
async fn lose_answer_takes_effect_but_the_client_gets_nothing() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    h.sim
        .inject(Fault::on("sendmessage", FaultKind::LoseAnswer));
    let outcome = h
        .http
        .post(h.url("sendMessage"))
        .json(&json!({"chat_id": chat, "text": "did it land?"}))
        .send()
        .await;
    assert!(outcome.is_err(), "no HTTP answer: {outcome:?}");
    let messages = h.sim.messages(chat);
    assert_eq!(messages.len(), 1, "the effect happened");
    assert_eq!(messages[0].text.as_deref(), Some("did it land?"));
    let record = h.sim.log().pop().expect("logged");
    assert_eq!(
        (record.method.as_str(), record.status, record.answered),
        ("sendMessage", 200, false)
    );
    // The fault was used up: the next call is answered.
    assert_eq!(h.send(chat, "again").await.status, 200);
    h.sim.stop().await;
}

#[tokio::test]
async fn unreachable_has_no_effect() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    h.sim.inject(Fault::once(FaultKind::Unreachable));
    let outcome = h
        .http
        .post(h.url("sendMessage"))
        .json(&json!({"chat_id": chat, "text": "lost"}))
        .send()
        .await;
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(h.sim.messages(chat).is_empty());
    let record = h.sim.log().pop().expect("logged");
    assert_eq!((record.status, record.answered), (0, false));
    h.sim.stop().await;
}

#[tokio::test]
async fn error_faults_answer_and_change_nothing() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    h.sim.inject(
        Fault::on("sendMessage", FaultKind::too_many_requests(7))
            .after(1)
            .times(2),
    );
    let codes: Vec<(u16, Option<String>)> = {
        let mut codes = Vec::new();
        for i in 0..4 {
            let answer = h.send(chat, &format!("m{i}")).await;
            codes.push((answer.status, answer.retry_after_header.clone()));
        }
        codes
    };
    assert_eq!(
        codes,
        [
            (200, None),
            (429, Some("7".to_owned())),
            (429, Some("7".to_owned())),
            (200, None)
        ]
    );
    let texts: Vec<String> = h
        .sim
        .messages(chat)
        .into_iter()
        .filter_map(|m| m.text)
        .collect();
    assert_eq!(texts, ["m0", "m3"]);
    // Other methods are not matched by a method-specific fault.
    h.sim.inject(Fault::on(
        "editMessageText",
        FaultKind::error(500, "Internal Server Error: boom"),
    ));
    assert_eq!(h.call("getMe", json!({})).await.status, 200);
    let edit = h
        .call(
            "editMessageText",
            json!({"chat_id": chat, "message_id": 1, "text": "edited"}),
        )
        .await;
    assert_eq!(
        (edit.status, edit.description()),
        (500, "Internal Server Error: boom")
    );
    assert_eq!(h.sim.messages(chat)[0].text.as_deref(), Some("m0"));
    h.sim.stop().await;
}

#[tokio::test]
async fn delay_answers_late_after_the_effect() {
    let h = Harness::start().await;
    let chat = h.sim.private_chat(&alice());
    h.sim
        .inject(Fault::once(FaultKind::Delay(Duration::from_millis(400))));
    let started = Instant::now();
    let call = {
        let http = h.http.clone();
        let url = h.url("sendMessage");
        tokio::spawn(async move {
            crate::answer(
                http.post(url)
                    .json(&json!({"chat_id": chat, "text": "slow"}))
                    .send()
                    .await
                    .expect("answer"),
            )
            .await
        })
    };
    // The effect is visible before the answer arrives.
    let deadline = Instant::now() + Duration::from_secs(2);
    while h.sim.messages(chat).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the delayed call never took effect"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!call.is_finished() || started.elapsed() >= Duration::from_millis(400));
    let answer = call.await.expect("task");
    assert_eq!(answer.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(400));
    h.sim.stop().await;
}
