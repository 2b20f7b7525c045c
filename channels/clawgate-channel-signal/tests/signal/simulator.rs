//! The simulator's JSON-RPC surface, spoken raw over its TCP socket and HTTP endpoint: error
//! codes, results, timestamps, the 2000-byte body rule, and manual receive.

use std::time::Duration;

use clawgate_channel_signal::simulator::{
    Fault, FaultKind, MAX_BODY_BYTES, ReceiveMode, SignalSimulator, SimulatorConfig,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// One JSON-RPC connection to the daemon's TCP socket.
struct Line {
    read: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Line {
    async fn open(sim: &SignalSimulator) -> Line {
        let (read, write) = TcpStream::connect(sim.tcp_addr())
            .await
            .unwrap()
            .into_split();
        Line {
            read: BufReader::new(read).lines(),
            write,
        }
    }

    async fn send_raw(&mut self, text: &str) {
        self.write
            .write_all(format!("{text}\n").as_bytes())
            .await
            .unwrap();
    }

    /// The next line, as JSON (`None` when the daemon closed the connection).
    async fn next(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(Duration::from_secs(10), self.read.next_line())
            .await
            .expect("the daemon answers")
            .unwrap()?;
        Some(serde_json::from_str(&line).unwrap())
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.send_raw(
            &json!({ "jsonrpc": "2.0", "method": method, "params": params, "id": 1 }).to_string(),
        )
        .await;
        self.next().await.expect("an answer")
    }
}

#[tokio::test]
async fn errors_carry_signal_clis_codes() {
    let sim = SignalSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let me = sim.account();
    let mut line = Line::open(&sim).await;
    line.send_raw("{not json").await;
    assert_eq!(line.next().await.unwrap()["error"]["code"], -32700);
    line.send_raw(r#"{"id":1,"method":"send"}"#).await;
    assert_eq!(line.next().await.unwrap()["error"]["code"], -32600);
    let cases = [
        (
            "no such method",
            "frobnicate",
            json!({ "account": me }),
            -32601,
            "Method not implemented",
        ),
        (
            "no account",
            "send",
            json!({ "recipient": ["+491"], "message": "x" }),
            -32602,
            "Method requires valid account parameter",
        ),
        (
            "unknown account",
            "send",
            json!({ "account": "+1999", "recipient": ["+491"], "message": "x" }),
            -32602,
            "Specified account does not exist",
        ),
        (
            "no recipient",
            "send",
            json!({ "account": me, "message": "x" }),
            -1,
            "No recipients given",
        ),
        (
            "no message",
            "send",
            json!({ "account": me, "recipient": "+491" }),
            -1,
            "No message given",
        ),
        (
            "bad mention",
            "send",
            json!({ "account": me, "recipient": "+491", "message": "x", "mentions": ["0:x"] }),
            -1,
            "Invalid mention syntax",
        ),
        (
            "unknown group",
            "send",
            json!({ "account": me, "groupId": "Tm8=", "message": "x" }),
            -1,
            "Group not found",
        ),
        (
            "half a quote",
            "send",
            json!({ "account": me, "recipient": "+491", "message": "x", "quoteTimestamp": 5 }),
            -1,
            "Quote",
        ),
        (
            "bad type",
            "send",
            json!({ "account": me, "recipient": "+491", "message": 5 }),
            -32602,
            "Invalid params",
        ),
    ];
    for (name, method, params, code, message) in cases {
        let answer = line.call(method, params).await;
        assert_eq!(answer["error"]["code"], code, "{name}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains(message),
            "{name}: {answer}"
        );
    }
    assert!(sim.landed().is_empty(), "no refused call had an effect");
}

#[tokio::test]
async fn sends_answer_per_recipient_results_and_fail_as_a_whole_only_when_nobody_took_it() {
    let sim = SignalSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let me = sim.account();
    let mut line = Line::open(&sim).await;
    let answer = line
        .call(
            "send",
            json!({ "account": me, "recipient": ["+4915100000001"], "message": "hi" }),
        )
        .await;
    let result = &answer["result"];
    assert!(result["timestamp"].as_u64().unwrap() > 1_600_000_000_000);
    assert_eq!(result["results"][0]["type"], "SUCCESS");
    assert_eq!(
        result["results"][0]["recipientAddress"]["number"],
        "+4915100000001"
    );
    assert_eq!(
        result["results"][0]["recipientAddress"]["uuid"],
        sim.uuid_of("+4915100000001")
    );
    sim.create_group("R3A=", "G", &["+4915100000001", "+4915100000002"]);
    sim.untrust("+4915100000002");
    let answer = line
        .call(
            "send",
            json!({ "account": me, "groupId": "R3A=", "message": "all" }),
        )
        .await;
    let types: Vec<&str> = answer["result"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, vec!["SUCCESS", "IDENTITY_FAILURE"]);
    assert_eq!(answer["result"]["results"][1]["groupId"], "R3A=");
    let table = [
        (
            FaultKind::RateLimit {
                retry_after_seconds: 9,
            },
            -5,
            "RATE_LIMIT_FAILURE",
        ),
        (FaultKind::UntrustedIdentity, -4, "IDENTITY_FAILURE"),
        (FaultKind::NetworkFailure, -3, "NETWORK_FAILURE"),
        (FaultKind::Unregistered, -1, "UNREGISTERED_FAILURE"),
    ];
    for (fault, code, kind) in table {
        sim.inject(Fault::new(fault));
        let answer = line
            .call(
                "send",
                json!({ "account": me, "recipient": "+4915100000003", "message": "x" }),
            )
            .await;
        assert_eq!(answer["error"]["code"], code, "{answer}");
        let results = &answer["error"]["data"]["response"]["results"];
        assert_eq!(results[0]["type"], kind, "{answer}");
        if code == -5 {
            assert_eq!(results[0]["retryAfterSeconds"], 9);
        }
    }
    assert_eq!(sim.landed().len(), 2, "failed sends leave no record");
}

#[tokio::test]
async fn timestamps_are_chosen_by_the_daemon_and_never_repeat() {
    let sim = SignalSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let me = sim.account();
    let mut line = Line::open(&sim).await;
    let mut stamps = Vec::new();
    for n in 0..50 {
        // A timestamp in the request is not how a send is identified: the daemon picks one.
        let answer = line
            .call(
                "send",
                json!({ "account": me, "recipient": "+491", "message": format!("m{n}"),
                "timestamp": 1 }),
            )
            .await;
        stamps.push(answer["result"]["timestamp"].as_u64().unwrap());
    }
    assert!(stamps.windows(2).all(|w| w[1] > w[0]), "{stamps:?}");
    assert!(stamps[0] > 1);
}

#[tokio::test]
async fn bodies_over_2000_bytes_go_out_cut_with_the_long_text_beside_them() {
    let sim = SignalSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let me = sim.account();
    let mut line = Line::open(&sim).await;
    let text = "é".repeat(1_001); // 2002 bytes
    line.call(
        "send",
        json!({ "account": me, "recipient": "+491", "message": text }),
    )
    .await;
    let fits = "a".repeat(MAX_BODY_BYTES);
    line.call(
        "send",
        json!({ "account": me, "recipient": "+491", "message": fits }),
    )
    .await;
    let landed = sim.landed();
    assert_eq!(landed[0].body.len(), 2_000);
    assert_eq!(landed[0].long_text.as_deref(), Some(text.as_str()));
    assert_eq!(landed[0].text(), text);
    assert_eq!(landed[1].long_text, None);
}

#[tokio::test]
async fn a_lost_answer_closes_the_connection_after_the_send_landed() {
    let sim = SignalSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let me = sim.account();
    sim.inject(Fault::new(FaultKind::LoseAnswer));
    let mut line = Line::open(&sim).await;
    line.send_raw(
        &json!({ "jsonrpc": "2.0", "method": "send", "id": 3,
        "params": { "account": me, "recipient": "+491", "message": "landed" } })
        .to_string(),
    )
    .await;
    assert_eq!(line.next().await, None, "closed without an answer");
    assert_eq!(sim.landed()[0].body, "landed");
    // Over HTTP the answer is cut short.
    sim.inject(Fault::new(FaultKind::LoseAnswer));
    let url = sim.rpc_url();
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let body = json!({ "jsonrpc": "2.0", "method": "send", "id": 4,
        "params": { "account": me, "recipient": "+491", "message": "landed too" } })
    .to_string();
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(
            format!(
                "POST /api/v1/rpc HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(!answer.contains("\"result\""), "{answer}");
    assert_eq!(sim.landed()[1].body, "landed too");
}

#[tokio::test]
async fn manual_receive_answers_the_subscription_before_the_queued_messages() {
    let sim = SignalSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let me = sim.account();
    sim.set_name("+491", "Ada");
    let written = sim.person_writes(&me, "+491", "queued");
    let mut line = Line::open(&sim).await;
    let answer = line
        .call("subscribeReceive", json!({ "account": me }))
        .await;
    let subscription = answer["result"].as_u64().expect("the subscription id");
    let note = line.next().await.unwrap();
    assert_eq!(note["method"], "receive");
    assert!(note.get("id").is_none(), "a notification");
    assert_eq!(note["params"]["subscription"], subscription);
    assert_eq!(note["params"]["result"], written);
    let envelope = &note["params"]["result"]["envelope"];
    assert_eq!(envelope["sourceNumber"], "+491");
    assert_eq!(envelope["sourceName"], "Ada");
    assert_eq!(envelope["dataMessage"]["message"], "queued");
    assert_eq!(envelope["timestamp"], envelope["dataMessage"]["timestamp"]);
    assert_eq!(note["params"]["result"]["account"], me);
    // Handed over once: gone from the queue; after unsubscribing, messages wait again.
    assert_eq!(sim.queued(&me), 0);
    assert_eq!(
        line.call("unsubscribeReceive", json!({ "account": me }))
            .await["result"],
        Value::Null
    );
    sim.person_writes(&me, "+491", "later");
    assert_eq!(sim.queued(&me), 1);
    // The default on-start mode refuses subscriptions and pushes bare items to every connection.
    let http = SignalSimulator::start(SimulatorConfig {
        receive_mode: ReceiveMode::OnStart,
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    let mut on_start = Line::open(&http).await;
    let refused = on_start
        .call("subscribeReceive", json!({ "account": http.account() }))
        .await;
    assert_eq!(refused["error"]["code"], -1, "{refused}");
    let pushed = http.person_writes(&http.account(), "+491", "pushed");
    let note = on_start.next().await.unwrap();
    assert_eq!(
        note["params"], pushed,
        "on-start notifications are not wrapped"
    );
}
