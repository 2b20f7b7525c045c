//! The QA adapter's normalizer on mutated platform messages (wrong types, missing fields, huge
//! numbers, long and odd strings, deep nesting) and arbitrary JSON: a message or a typed error,
//! never a panic.

use clawgate_channel_qa::QaAdapter;
use serde_json::json;

#[test]
fn normalize_never_panics_on_mutated_payloads() {
    let adapter = QaAdapter::new("http://127.0.0.1:9", "token");
    let dm = json!({ "id": "m1", "conversationId": "dm-ada", "text": "hello", "edits": 0,
        "seq": 1, "authorId": "ada", "authorIsBot": false });
    let room = json!({ "id": "m2", "conversationId": "room", "threadId": "t1",
        "replyToId": "m1", "text": "a cat", "edits": 2, "seq": 2, "authorId": "bo",
        "metadata": { "k": [1, 2] }, "idempotencyKey": "k1",
        "attachments": [{ "kind": "media", "url": "http://127.0.0.1:9/cat.png",
            "fileName": "cat.png" }] });
    clawgate_conformance::fuzz::normalizer_never_panics(&adapter, vec![dm, room]);
}
