//! The simulator's own rules on the wire, with a bare TCP client and plain HTTP: what a client
//! written against Twitch's documentation meets.

use std::time::Duration;

use clawgate_channel_twitch::simulator::{SimulatorConfig, TwitchSimulator};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::peer::CHANNEL;

struct Raw {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Raw {
    async fn connect(sim: &TwitchSimulator) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", sim.irc_port()))
            .await
            .unwrap();
        let (read, write) = stream.into_split();
        Raw {
            lines: BufReader::new(read).lines(),
            write,
        }
    }

    async fn send(&mut self, line: &str) {
        self.write
            .write_all(format!("{line}\r\n").as_bytes())
            .await
            .unwrap();
    }

    /// Lines up to and including the first containing `needle`; `None` if the link closes.
    async fn until(&mut self, needle: &str) -> Option<Vec<String>> {
        let mut seen = Vec::new();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("no {needle:?} within 10 s; saw {seen:#?}"))
                .ok()??;
            let done = line.contains(needle);
            seen.push(line);
            if done {
                return Some(seen);
            }
        }
    }
}

#[tokio::test]
async fn login_join_and_the_tags_only_for_connections_that_asked() {
    let sim = TwitchSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let ada = sim.person("ada");
    let mut tagged = Raw::connect(&sim).await;
    tagged
        .send("CAP REQ :twitch.tv/tags twitch.tv/commands")
        .await;
    tagged.send(&format!("PASS oauth:{}", ada.token)).await;
    tagged.send("NICK ada").await;
    let login = tagged.until(" 376 ").await.unwrap();
    assert_eq!(
        login[0],
        ":tmi.twitch.tv CAP * ACK :twitch.tv/tags twitch.tv/commands"
    );
    assert!(
        login
            .iter()
            .any(|l| l == ":tmi.twitch.tv 001 ada :Welcome, GLHF!")
    );
    tagged.send(&format!("JOIN #{CHANNEL}")).await;
    let joined = tagged.until(" ROOMSTATE ").await.unwrap();
    assert!(
        joined
            .iter()
            .any(|l| l == &format!(":ada!ada@ada.tmi.twitch.tv JOIN #{CHANNEL}"))
    );
    assert!(joined.iter().any(|l| l.contains(" USERSTATE #")));
    let room = joined.last().unwrap();
    assert!(
        room.contains(&format!("room-id={}", sim.room_id(CHANNEL).unwrap())),
        "{room}"
    );

    // A second viewer without capabilities: plain lines, no USERSTATE.
    let bob = sim.person("bob");
    let mut plain = Raw::connect(&sim).await;
    plain.send(&format!("PASS oauth:{}", bob.token)).await;
    plain.send("NICK bob").await;
    plain.until(" 376 ").await.unwrap();
    plain.send(&format!("JOIN #{CHANNEL}")).await;
    let joined = plain.until(" 366 ").await.unwrap();
    assert!(joined.iter().all(|l| !l.starts_with('@')));

    // ada speaks: bob sees it untagged, ada gets no echo but a USERSTATE with the id.
    tagged
        .send(&format!("PRIVMSG #{CHANNEL} :hello there"))
        .await;
    let state = tagged.until(" USERSTATE ").await.unwrap();
    let id = sim.messages(CHANNEL)[0].id.clone();
    assert!(
        state.last().unwrap().contains(&format!(";id={id};")),
        "{state:?}"
    );
    assert!(
        state.iter().all(|l| !l.contains("PRIVMSG")),
        "no echo: {state:?}"
    );
    let relayed = plain.until("PRIVMSG").await.unwrap();
    assert_eq!(
        relayed.last().unwrap(),
        &format!(":ada!ada@ada.tmi.twitch.tv PRIVMSG #{CHANNEL} :hello there")
    );
    // bob's own message reaches ada with Twitch's tags.
    plain.send(&format!("PRIVMSG #{CHANNEL} :hi ada")).await;
    let tagged_line = tagged.until("PRIVMSG").await.unwrap().pop().unwrap();
    for tag in [
        "id=",
        "user-id=",
        "display-name=bob",
        "tmi-sent-ts=",
        "room-id=",
    ] {
        assert!(tagged_line.contains(tag), "{tag} in {tagged_line}");
    }
    // The limit, an unknown command, PING.
    tagged
        .send(&format!("PRIVMSG #{CHANNEL} :{}", "x".repeat(501)))
        .await;
    let notice = tagged.until("NOTICE").await.unwrap().pop().unwrap();
    assert!(notice.starts_with("@msg-id=msg_rejected "), "{notice}");
    tagged.send("WHO #clawchan").await;
    assert!(
        tagged
            .until(" 421 ")
            .await
            .unwrap()
            .pop()
            .unwrap()
            .contains("WHO :Unknown command")
    );
    tagged.send("PING :abc").await;
    assert_eq!(
        tagged.until("PONG").await.unwrap().pop().unwrap(),
        ":tmi.twitch.tv PONG tmi.twitch.tv :abc"
    );
    assert_eq!(sim.messages(CHANNEL).len(), 2, "the long line did not land");
}

#[tokio::test]
async fn bad_logins_are_noticed_and_closed() {
    let sim = TwitchSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    sim.person("ada");
    for (pass, notice) in [
        (
            "PASS oauth:wrong",
            ":tmi.twitch.tv NOTICE * :Login authentication failed",
        ),
        (
            "PASS wrong",
            ":tmi.twitch.tv NOTICE * :Improperly formatted auth",
        ),
    ] {
        let mut raw = Raw::connect(&sim).await;
        raw.send(pass).await;
        raw.send("NICK ada").await;
        let lines = raw.until("NOTICE").await.unwrap();
        assert_eq!(lines.last().unwrap(), notice);
        assert!(raw.until("never").await.is_none(), "the link closes");
    }
    // Anonymous logins read but cannot send.
    let mut anon = Raw::connect(&sim).await;
    anon.send("NICK justinfan12345").await;
    anon.until(" 376 ").await.unwrap();
    anon.send(&format!("JOIN #{CHANNEL}")).await;
    anon.until(" 366 ").await.unwrap();
    anon.send(&format!("PRIVMSG #{CHANNEL} :spam")).await;
    anon.send("PING :fence").await;
    anon.until("PONG").await.unwrap();
    assert!(sim.messages(CHANNEL).is_empty());
}

async fn helix(
    sim: &TwitchSimulator,
    token: Option<&str>,
    client_id: Option<&str>,
    body: Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/chat/messages", sim.helix_base()))
        .json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(id) = client_id {
        request = request.header("Client-Id", id);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.json().await.unwrap())
}

#[tokio::test]
async fn helix_answers_with_its_error_bodies_headers_and_drop_reasons() {
    let config = SimulatorConfig::default();
    let sim = TwitchSimulator::start(config.clone()).await.unwrap();
    let room = sim.room_id(CHANNEL).unwrap();
    let body = json!({ "broadcaster_id": room, "sender_id": config.bot_user_id, "message": "hi" });
    let (token, cid) = (
        Some(config.bot_token.as_str()),
        Some(config.client_id.as_str()),
    );

    let (status, headers, answer) = helix(&sim, token, cid, body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(answer["data"][0]["is_sent"], true);
    let id = answer["data"][0]["message_id"].as_str().unwrap().to_owned();
    assert_eq!(sim.messages(CHANNEL)[0].id, id);
    for header in ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"] {
        assert!(headers.contains_key(header), "{header}");
    }
    assert_eq!(headers["ratelimit-limit"], "800");
    assert_eq!(headers["ratelimit-remaining"], "799");

    // The same text again within 30 s: 200, not sent, with the reason.
    let (status, _, answer) = helix(&sim, token, cid, body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(answer["data"][0]["is_sent"], false);
    assert_eq!(answer["data"][0]["drop_reason"]["code"], "msg_duplicate");
    assert_eq!(sim.messages(CHANNEL).len(), 1);

    for (token, cid, body, status, message) in [
        (None, cid, body.clone(), 401, "OAuth token is missing"),
        (Some("nope"), cid, body.clone(), 401, "Invalid OAuth token"),
        (token, None, body.clone(), 401, "Client-Id header required"),
        (
            token,
            Some("other"),
            body.clone(),
            401,
            "Client ID and OAuth token do not match",
        ),
        (
            token,
            cid,
            json!({ "broadcaster_id": room, "sender_id": "1", "message": "x" }),
            403,
            "The sender_id in the body must match the user ID in the access token",
        ),
        (
            token,
            cid,
            json!({ "sender_id": config.bot_user_id, "message": "x" }),
            400,
            "Missing required parameter \"broadcaster_id\"",
        ),
        (
            token,
            cid,
            json!({ "broadcaster_id": room, "sender_id": config.bot_user_id, "message": "y".repeat(501) }),
            400,
            "The parameter \"message\" must be between 1 and 500 characters",
        ),
    ] {
        let (got, _, answer) = helix(&sim, token, cid, body).await;
        assert_eq!(got, status, "{answer}");
        assert_eq!(answer["status"], status);
        assert_eq!(answer["message"], message);
        assert!(answer["error"].is_string());
    }
    assert_eq!(sim.messages(CHANNEL).len(), 1, "no refused call landed");
}
