//! The Slack simulator against platform-apis §2, over real HTTP on loopback: the Web API's
//! envelope, errors, limits, ts values, metadata, history and streams; the Events API sender's
//! signatures and retries; and the cross-check with the official Python SDK.
#![allow(clippy::unwrap_used)]

mod events;
mod slack_sdk;
mod web_api;

use clawgate_channel_slack::simulator::{ConversationKind, SimulatorConfig, SlackSimulator};
use serde_json::{Value, json};

pub(crate) struct Harness {
    pub(crate) sim: SlackSimulator,
    pub(crate) http: reqwest::Client,
    pub(crate) channel: String,
    pub(crate) person: String,
}

impl Harness {
    pub(crate) async fn start() -> Harness {
        Harness::with(SimulatorConfig::default()).await
    }

    pub(crate) async fn with(config: SimulatorConfig) -> Harness {
        let sim = SlackSimulator::start(config).await.unwrap();
        let channel = sim.create_conversation("general", ConversationKind::Public, true);
        let person = sim.person("ada");
        Harness {
            sim,
            http: reqwest::Client::new(),
            channel,
            person,
        }
    }

    /// A JSON-body call with the bot token; the status and the body.
    pub(crate) async fn call(&self, method: &str, args: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{method}", self.sim.api_url()))
            .bearer_auth(self.sim.token())
            .json(&args)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The `error` of a refused call.
    pub(crate) async fn error(&self, method: &str, args: Value) -> String {
        let (_, body) = self.call(method, args).await;
        assert_eq!(
            body["ok"],
            json!(false),
            "{method} should be refused: {body}"
        );
        body["error"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn post(&self, channel: &str, text: &str) -> Value {
        let (status, body) = self
            .call(
                "chat.postMessage",
                json!({ "channel": channel, "text": text }),
            )
            .await;
        assert_eq!((status, &body["ok"]), (200, &json!(true)), "{body}");
        body
    }
}
