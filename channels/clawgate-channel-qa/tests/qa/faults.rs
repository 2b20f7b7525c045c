//! Fault injection refuses what it does not understand.

use clawgate_channel_qa::{QaPlatform, QaPlatformConfig};

#[tokio::test]
async fn a_fault_with_a_misspelt_field_is_refused() {
    let platform = QaPlatform::start(QaPlatformConfig::default())
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let post = |body: serde_json::Value| {
        http.post(format!("{}/control/faults", platform.base_url()))
            .bearer_auth(platform.token())
            .json(&body)
            .send()
    };
    let refused = post(serde_json::json!([{ "count": 1, "mode": "status", "stauts": 500 }]))
        .await
        .unwrap();
    assert!(refused.status().is_client_error(), "{}", refused.status());
    let body = refused.text().await.unwrap();
    assert!(
        body.contains("stauts"),
        "the answer names the field: {body}"
    );
    let accepted = post(serde_json::json!([{ "count": 1, "mode": "status", "status": 500 }]))
        .await
        .unwrap();
    assert!(accepted.status().is_success(), "{}", accepted.status());
}
