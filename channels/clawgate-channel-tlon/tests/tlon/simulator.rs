//! The simulator against the platforms doc (§15), by raw HTTP: the login and its cookie, the
//! channel PUT's 204 with the poke's real result on the event stream, cumulative acks,
//! replay of unacked events on every GET, `Last-Event-ID`, 404 for a channel that is gone,
//! clogging, client-chosen DM ids taken once, host-assigned post ids, and the scries.

use std::time::Duration;

use clawgate_channel_sdk::Secret;
use clawgate_channel_tlon::simulator::{Fault, Ship, ShipConfig};
use clawgate_channel_tlon::{Eyre, EyreError, aura, story};
use serde_json::{Value, json};

use crate::peer::{NEST, config};

const T: Duration = Duration::from_secs(5);

async fn eyre(ship: &Ship) -> Eyre {
    let eyre = Eyre::new(ship.url(), ship.our(), Secret::new(ship.code()), T);
    eyre.login(T).await.unwrap();
    eyre
}

fn dm_poke(id: u64, to: &str, writ: &str, text: &str) -> Value {
    json!({
        "id": id, "action": "poke", "ship": "zod", "app": "chat", "mark": "chat-dm-action",
        "json": { "ship": to, "diff": { "id": writ, "delta": { "add": {
            "memo": { "content": story::from_text(text), "author": "~zod", "sent": 1_700_000_000_000_u64 },
            "kind": null, "time": null,
        }}}},
    })
}

/// Reads events until `n` came (or panics after a while).
async fn events(stream: &mut clawgate_channel_tlon::EventStream, n: usize) -> Vec<(u64, Value)> {
    let mut out = Vec::new();
    while out.len() < n {
        let event = tokio::time::timeout(T, stream.next())
            .await
            .expect("an event in time")
            .unwrap()
            .expect("the stream stays open");
        out.push((event.id, event.data));
    }
    out
}

#[tokio::test]
async fn login_answers_204_with_the_urbauth_cookie_and_refuses_a_wrong_code() {
    let ship = Ship::start(config()).await.unwrap();
    let client = reqwest::Client::new();
    let ok = client
        .post(format!("{}/~/login", ship.url()))
        .body(format!("password={}", ship.code()))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 204);
    let cookie = ok.headers()["set-cookie"].to_str().unwrap();
    assert!(cookie.starts_with("urbauth-~zod=0v"), "{cookie}");
    let bad = client
        .post(format!("{}/~/login", ship.url()))
        .body("password=not-it")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    assert!(bad.headers().get("set-cookie").is_none());
    let wrong = Eyre::new(ship.url(), "~zod", Secret::new("nope"), T);
    assert!(matches!(
        wrong.login(T).await,
        Err(EyreError::LoginRefused { status: 400, .. })
    ));
}

#[tokio::test]
async fn a_poke_is_204_on_put_and_its_result_comes_as_an_event() {
    let ship = Ship::start(config()).await.unwrap();
    let eyre = eyre(&ship).await;
    let writ = format!(
        "~zod/{}",
        aura::format_ud(aura::da_from_unix_ms(1_700_000_000_000))
    );
    eyre.put("c1", &json!([dm_poke(1, "~nec", &writ, "hi")]), T)
        .await
        .unwrap();
    ship.inject(0, Fault::Nack("%chat: no".into()));
    eyre.put("c1", &json!([dm_poke(2, "~nec", "~zod/1.000", "no")]), T)
        .await
        .unwrap();
    // The same writ id again: taken, nothing new.
    eyre.put("c1", &json!([dm_poke(3, "~nec", &writ, "hi")]), T)
        .await
        .unwrap();
    // A poke of an agent the ship lacks.
    eyre.put("c1", &json!([{ "id": 4, "action": "poke", "ship": "zod", "app": "nope", "mark": "x", "json": {} }]), T).await.unwrap();
    let mut stream = eyre.stream("c1", T).await.unwrap();
    let got = events(&mut stream, 4).await;
    assert_eq!(
        got[0],
        (1, json!({ "id": 1, "response": "poke", "ok": "ok" }))
    );
    assert_eq!(
        got[1],
        (
            2,
            json!({ "id": 2, "response": "poke", "err": "%chat: no" })
        )
    );
    assert_eq!(got[2].1["ok"], "ok");
    assert!(got[3].1["err"].as_str().unwrap().contains("nope"));
    assert_eq!(
        ship.our_dm_texts("~nec"),
        vec!["hi"],
        "one message for the id"
    );
    // A writ written as someone else is refused by the agent.
    eyre.put("c1", &json!([{ "id": 5, "action": "poke", "ship": "zod", "app": "chat", "mark": "chat-dm-action",
        "json": { "ship": "~nec", "diff": { "id": "~nec/1.000", "delta": { "add": { "memo": {
            "content": story::from_text("forged"), "author": "~nec", "sent": 1 }, "kind": null, "time": null } } } } }]), T)
        .await
        .unwrap();
    assert!(events(&mut stream, 1).await[0].1["err"].is_string());
}

#[tokio::test]
async fn acks_are_cumulative_and_unacked_events_replay_on_every_get() {
    let ship = Ship::start(config()).await.unwrap();
    let eyre = eyre(&ship).await;
    let subscribe = json!([
        { "id": 1, "action": "subscribe", "ship": "zod", "app": "chat", "path": "/v3" },
    ]);
    eyre.put("c2", &subscribe, T).await.unwrap();
    ship.dm_from("~nec", "one");
    ship.dm_from("~nec", "two");
    ship.dm_from("~nec", "three");
    let mut stream = eyre.stream("c2", T).await.unwrap();
    let got = events(&mut stream, 4).await;
    assert_eq!(
        got[0].1,
        json!({ "id": 1, "response": "subscribe", "ok": "ok" })
    );
    assert_eq!(got[1].1["response"], "diff");
    assert_eq!(got[1].1["json"]["whom"], "~nec");
    assert_eq!(
        got[1].1["json"]["response"]["add"]["essay"]["author"],
        "~nec"
    );
    // Ack 3: events 1..=3 are gone, 4 stays and comes again on the next GET.
    eyre.put("c2", &json!([{ "action": "ack", "event-id": 3 }]), T)
        .await
        .unwrap();
    assert_eq!(ship.unacked(), 1);
    drop(stream);
    let mut again = eyre.stream("c2", T).await.unwrap();
    let replay = events(&mut again, 1).await;
    assert_eq!(replay[0].0, 4);
    // A GET with Last-Event-ID: 4 counts everything up to 4 as seen.
    drop(again);
    let client = reqwest::Client::new();
    let login = client
        .post(format!("{}/~/login", ship.url()))
        .body(format!("password={}", ship.code()))
        .send()
        .await
        .unwrap();
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let response = client
        .get(format!("{}/~/channel/c2", ship.url()))
        .header("cookie", &cookie)
        .header("last-event-id", "4")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(ship.unacked(), 0);
    // A channel that never existed, or was deleted, is 404.
    assert!(matches!(
        eyre.stream("never-made", T).await,
        Err(EyreError::Reaped { .. })
    ));
    eyre.put("c2", &json!([{ "id": 9, "action": "delete" }]), T)
        .await
        .unwrap();
    assert!(matches!(
        eyre.stream("c2", T).await,
        Err(EyreError::Reaped { .. })
    ));
    // Without the cookie: 403; not an array of actions, or an unknown action: 400.
    let put = |body: &'static str, cookie: Option<&str>| {
        let mut request = client
            .put(format!("{}/~/channel/c3", ship.url()))
            .body(body);
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie.to_owned());
        }
        request.send()
    };
    assert_eq!(put("[]", None).await.unwrap().status().as_u16(), 403);
    assert_eq!(
        put("{}", Some(&cookie)).await.unwrap().status().as_u16(),
        400
    );
    assert_eq!(
        put(r#"[{"id":1,"action":"dance"}]"#, Some(&cookie))
            .await
            .unwrap()
            .status()
            .as_u16(),
        400
    );
}

#[tokio::test]
async fn an_unacked_backlog_clogs_the_channel_and_its_subscriptions_are_kicked() {
    let ship = Ship::start(ShipConfig {
        clog_threshold: 2,
        clog_timeout: Duration::ZERO,
        ..config()
    })
    .await
    .unwrap();
    let eyre = eyre(&ship).await;
    eyre.put(
        "c4",
        &json!([{ "id": 1, "action": "subscribe", "ship": "zod", "app": "chat", "path": "/v3" }]),
        T,
    )
    .await
    .unwrap();
    ship.dm_from("~nec", "a");
    ship.dm_from("~nec", "b");
    assert!(ship.subscriptions().is_empty(), "kicked");
    let mut stream = eyre.stream("c4", T).await.unwrap();
    let got = events(&mut stream, 4).await;
    assert_eq!(got[3].1, json!({ "id": 1, "response": "quit" }));
    assert_eq!(ship.acks_and_kicks().1, 1);
}

#[tokio::test]
async fn group_posts_get_host_ids_and_the_scries_find_them() {
    let ship = Ship::start(config()).await.unwrap();
    let eyre = eyre(&ship).await;
    let parent = ship.post_from(NEST, "~nec", "question", true);
    assert!(aura::parse_ud(&parent).is_some(), "an @ud id: {parent}");
    let post = |id: u64, action: Value| {
        json!({ "id": id, "action": "poke", "ship": "zod", "app": "channels",
        "mark": "channel-action-1", "json": { "channel": { "nest": NEST, "action": { "post": action } } } })
    };
    let add = json!({ "content": story::from_text("answer"), "author": "~zod", "sent": 42 });
    eyre.put(
        "c5",
        &json!([post(
            1,
            json!({ "reply": { "id": parent, "action": { "add": add } } })
        )]),
        T,
    )
    .await
    .unwrap();
    eyre.put(
        "c5",
        &json!([post(
            2,
            json!({ "reply": { "id": "9.999", "action": { "add": add } } })
        )]),
        T,
    )
    .await
    .unwrap();
    let mut stream = eyre.stream("c5", T).await.unwrap();
    let got = events(&mut stream, 2).await;
    assert_eq!(got[0].1["ok"], "ok");
    assert!(
        got[1].1["err"].as_str().unwrap().contains("no post"),
        "{}",
        got[1].1
    );
    let outline = eyre
        .scry(
            "channels",
            &format!("/v4/{NEST}/posts/newest/10/outline"),
            T,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outline["posts"][&parent]["essay"]["author"], "~nec");
    let thread = eyre
        .scry("channels", &format!("/v4/{NEST}/posts/post/{parent}"), T)
        .await
        .unwrap()
        .unwrap();
    let replies = thread["seal"]["replies"].as_object().unwrap();
    assert_eq!(replies.len(), 1);
    let reply = replies.values().next().unwrap();
    assert_eq!(reply["memo"]["sent"], 42);
    assert_eq!(reply["seal"]["parent-id"], parent.as_str());
    assert_eq!(
        eyre.scry("chat", "/dm/~nec/writs/writ/id/~zod/1.000", T)
            .await
            .unwrap(),
        None
    );
}
