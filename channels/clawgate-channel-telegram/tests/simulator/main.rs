//! Black-box tests of the Bot API simulator over real HTTP on 127.0.0.1.

mod aiogram;
mod control;
mod errors;
mod faults;
mod messages;
mod updates;
mod webhook;

use std::time::Duration;

use clawgate_channel_telegram::simulator::{BotApiSimulator, SimUser, SimulatorConfig};
use serde_json::{Value, json};

/// A started simulator plus an HTTP client pointed at it.
#[derive(Debug)]
pub struct Harness {
    pub sim: BotApiSimulator,
    pub http: reqwest::Client,
}

/// One Bot API answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub retry_after_header: Option<String>,
}

impl Answer {
    pub fn result(&self) -> &Value {
        assert_eq!(
            self.body["ok"],
            json!(true),
            "expected success, got {:?}",
            self
        );
        &self.body["result"]
    }

    pub fn description(&self) -> &str {
        self.body["description"].as_str().unwrap_or("")
    }
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::with(SimulatorConfig {
            rate_limits: false,
            ..SimulatorConfig::default()
        })
        .await
    }

    pub async fn with(config: SimulatorConfig) -> Harness {
        let sim = BotApiSimulator::start(config)
            .await
            .expect("simulator starts");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(70))
            .build()
            .expect("client");
        Harness { sim, http }
    }

    pub fn url(&self, method: &str) -> String {
        format!("{}/bot{}/{method}", self.sim.base_url(), self.sim.token())
    }

    /// POST with a JSON body.
    pub async fn call(&self, method: &str, params: Value) -> Answer {
        let response = self
            .http
            .post(self.url(method))
            .json(&params)
            .send()
            .await
            .expect("the simulator answers");
        answer(response).await
    }

    /// POST with a raw body and content type.
    pub async fn call_raw(&self, url: &str, content_type: &str, body: String) -> Answer {
        let response = self
            .http
            .post(url)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .expect("the simulator answers");
        answer(response).await
    }

    pub async fn send(&self, chat_id: i64, text: &str) -> Answer {
        self.call("sendMessage", json!({"chat_id": chat_id, "text": text}))
            .await
    }
}

pub async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let retry_after_header = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.json().await.expect("a JSON body");
    Answer {
        status,
        body,
        retry_after_header,
    }
}

pub fn alice() -> SimUser {
    SimUser::person(1001, "Alice").with_username("alice")
}

pub fn bob() -> SimUser {
    SimUser::person(1002, "Bob")
}
