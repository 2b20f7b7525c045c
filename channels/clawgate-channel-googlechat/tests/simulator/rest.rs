//! The REST rules as a plain HTTP client sees them.

use clawgate_channel_googlechat::simulator::{GoogleChatSimulator, SimulatorConfig, SpaceKind};
use serde_json::{Value, json};

pub(crate) struct Harness {
    pub(crate) sim: GoogleChatSimulator,
    pub(crate) space: String,
    http: reqwest::Client,
}

impl Harness {
    pub(crate) async fn start() -> Harness {
        let sim = GoogleChatSimulator::start(SimulatorConfig::default())
            .await
            .unwrap();
        let ada = sim.person("ada");
        let space = sim.create_space("room", SpaceKind::Room, Some(&ada));
        Harness {
            sim,
            space,
            http: reqwest::Client::new(),
        }
    }

    /// `method` on `v1/{path}` with the simulator's token; status and JSON body.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}v1/{path}", self.sim.api_url()))
            .bearer_auth(self.sim.access_token())
            .query(query);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn create(&self, query: &[(&str, &str)], body: Value) -> (u16, Value) {
        self.call(
            reqwest::Method::POST,
            &format!("{}/messages", self.space),
            query,
            Some(body),
        )
        .await
    }
}

fn error_status(body: &Value) -> &str {
    body["error"]["status"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_known_request_id_answers_the_first_message_instead_of_a_second() {
    let h = Harness::start().await;
    let (s1, first) = h
        .create(&[("requestId", "r-1")], json!({ "text": "once" }))
        .await;
    let (s2, again) = h
        .create(&[("requestId", "r-1")], json!({ "text": "once" }))
        .await;
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(first["name"], again["name"]);
    assert_eq!(h.sim.messages(&h.space).len(), 1);
    let (_, other) = h
        .create(&[("requestId", "r-2")], json!({ "text": "twice" }))
        .await;
    assert_ne!(other["name"], first["name"]);
    assert_eq!(h.sim.messages(&h.space).len(), 2);
}

#[tokio::test]
async fn client_assigned_ids_follow_their_rules_and_name_the_message() {
    let h = Harness::start().await;
    for bad in [
        "nope",
        "client-UPPER",
        "client-under_score",
        &format!("client-{}", "x".repeat(57)),
    ] {
        let (status, body) = h
            .create(&[("messageId", bad)], json!({ "text": "x" }))
            .await;
        assert_eq!(
            (status, error_status(&body)),
            (400, "INVALID_ARGUMENT"),
            "{bad}"
        );
    }
    let (status, created) = h
        .create(&[("messageId", "client-abc-1")], json!({ "text": "x" }))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        created["name"],
        json!(format!("{}/messages/client-abc-1", h.space))
    );
    assert_eq!(created["clientAssignedMessageId"], "client-abc-1");
    let (status, body) = h
        .create(&[("messageId", "client-abc-1")], json!({ "text": "y" }))
        .await;
    assert_eq!((status, error_status(&body)), (409, "ALREADY_EXISTS"));
    let path = format!("{}/messages/client-abc-1", h.space);
    let (status, got) = h.call(reqwest::Method::GET, &path, &[], None).await;
    assert_eq!((status, got["text"].as_str()), (200, Some("x")));
    let (status, body) = h
        .call(
            reqwest::Method::GET,
            &format!("{}/messages/client-none", h.space),
            &[],
            None,
        )
        .await;
    assert_eq!(
        body,
        json!({ "error": { "code": 404, "message": "Requested entity was not found.", "status": "NOT_FOUND" } })
    );
    assert_eq!(status, 404);
    assert_eq!(h.sim.messages(&h.space).len(), 1, "refusals had no effect");
}

#[tokio::test]
async fn reply_options_decide_where_a_threaded_message_lands() {
    let h = Harness::start().await;
    let ada = h.sim.person("ada");
    let question = h.sim.person_writes(&h.space, &ada, "q", None).unwrap();
    let thread = json!({ "name": question.thread });
    // The default ignores the thread fields.
    let (_, default) = h
        .create(&[], json!({ "text": "a", "thread": thread }))
        .await;
    assert_ne!(default["thread"]["name"], json!(question.thread));
    assert_eq!(default["threadReply"], false);
    let fallback = [("messageReplyOption", "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD")];
    let (_, reply) = h
        .create(&fallback, json!({ "text": "b", "thread": thread }))
        .await;
    assert_eq!(reply["thread"]["name"], json!(question.thread));
    assert_eq!(reply["threadReply"], true);
    let missing = json!({ "name": format!("{}/threads/none", h.space) });
    let (_, new) = h
        .create(&fallback, json!({ "text": "c", "thread": missing }))
        .await;
    assert_eq!(new["threadReply"], false);
    let or_fail = [("messageReplyOption", "REPLY_MESSAGE_OR_FAIL")];
    let (status, body) = h
        .create(&or_fail, json!({ "text": "d", "thread": missing }))
        .await;
    assert_eq!((status, error_status(&body)), (404, "NOT_FOUND"));
    let (status, _) = h
        .create(
            &[("messageReplyOption", "SOMETIMES")],
            json!({ "text": "e" }),
        )
        .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn patch_needs_an_update_mask_and_refusals_are_google_envelopes() {
    let h = Harness::start().await;
    let (_, created) = h
        .create(&[("messageId", "client-p")], json!({ "text": "a" }))
        .await;
    let name = created["name"].as_str().unwrap().to_owned();
    let (status, body) = h
        .call(
            reqwest::Method::PATCH,
            &name,
            &[],
            Some(json!({ "text": "b" })),
        )
        .await;
    assert_eq!((status, error_status(&body)), (400, "INVALID_ARGUMENT"));
    let (status, body) = h
        .call(
            reqwest::Method::PATCH,
            &name,
            &[("updateMask", "sender")],
            Some(json!({ "text": "b" })),
        )
        .await;
    assert_eq!((status, error_status(&body)), (400, "INVALID_ARGUMENT"));
    let (status, body) = h
        .call(
            reqwest::Method::PATCH,
            &name,
            &[("updateMask", "text")],
            Some(json!({ "text": "b" })),
        )
        .await;
    assert_eq!((status, body["text"].as_str()), (200, Some("b")));
    assert!(body["lastUpdateTime"].is_string());
    // allowMissing with a client id creates.
    let upsert = format!("{}/messages/client-upsert", h.space);
    let (status, _) = h
        .call(
            reqwest::Method::PATCH,
            &upsert,
            &[("updateMask", "text"), ("allowMissing", "true")],
            Some(json!({ "text": "made" })),
        )
        .await;
    assert_eq!(status, 200);
    // A person's message is not the app's to edit.
    let ada = h.sim.person("ada");
    let theirs = h.sim.person_writes(&h.space, &ada, "mine", None).unwrap();
    let (status, body) = h
        .call(
            reqwest::Method::PATCH,
            &theirs.name,
            &[("updateMask", "text")],
            Some(json!({ "text": "x" })),
        )
        .await;
    assert_eq!((status, error_status(&body)), (403, "PERMISSION_DENIED"));
    let (status, body) = h.create(&[], json!({ "text": "x", "bogus": 1 })).await;
    assert_eq!((status, error_status(&body)), (400, "INVALID_ARGUMENT"));
    let (status, body) = h.create(&[], json!({ "text": "" })).await;
    assert_eq!((status, error_status(&body)), (400, "INVALID_ARGUMENT"));
    let (status, body) = h.create(&[], json!({ "text": "é".repeat(16_001) })).await;
    assert_eq!(
        (status, error_status(&body)),
        (400, "INVALID_ARGUMENT"),
        "over 32,000 bytes"
    );
    // No token, a wrong token.
    let url = format!("{}v1/{}/messages", h.sim.api_url(), h.space);
    let none = reqwest::Client::new()
        .post(&url)
        .json(&json!({ "text": "x" }))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 401);
    let wrong = reqwest::Client::new()
        .post(&url)
        .bearer_auth("ya29.wrong")
        .json(&json!({ "text": "x" }))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(error_status(&body), "UNAUTHENTICATED");
    let (status, _) = h.call(reqwest::Method::DELETE, &name, &[], None).await;
    assert_eq!(status, 200);
    let (status, _) = h.call(reqwest::Method::DELETE, &name, &[], None).await;
    assert_eq!(status, 404);
}
