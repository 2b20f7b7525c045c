//! Media messages: the platform stores attachments by URL and keeps them across restarts (old
//! state files without them still load); the adapter declares them and sends a media unit as
//! its own message.

use clawgate_channel_qa::{
    MessageAnswer, PlatformAttachment, QaAdapter, QaPlatform, QaPlatformConfig,
};
use clawgate_channel_sdk::{
    ChannelMessageAdapter, DefaultRenderer, MessageReceiveAdapter, MessageRenderAdapter,
    SendContext, SideEffect,
};
use clawgate_types::{
    ChannelMessage, DeliveryFailureKind, MessageAttachment, MessagePartKind, MessageTarget,
    RenderedMessageUnit,
};
use serde_json::json;

const IMAGE: &str = "https://files.example/cat.png";

async fn post(platform: &QaPlatform, body: serde_json::Value) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(format!(
            "{}/api/conversations/c1/messages",
            platform.base_url()
        ))
        .bearer_auth(platform.token())
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn image() -> PlatformAttachment {
    PlatformAttachment {
        kind: MessagePartKind::Media,
        url: IMAGE.into(),
        mime_type: Some("image/png".into()),
        file_name: Some("cat.png".into()),
    }
}

#[tokio::test]
async fn a_media_message_lands_with_its_attachment_and_an_optional_caption() {
    let platform = QaPlatform::start(QaPlatformConfig::default())
        .await
        .unwrap();
    let (status, answer) = post(
        &platform,
        json!({ "attachments": [image()], "idempotencyKey": "k#0" }),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let landed: MessageAnswer = serde_json::from_value(answer).unwrap();
    assert_eq!(landed.message.attachments, vec![image()]);
    assert_eq!(landed.message.text, "", "no caption");
    let (status, _) = post(
        &platform,
        json!({ "text": "a cat", "attachments": [image()] }),
    )
    .await;
    assert_eq!(status, 201);
    let listed = platform.messages("c1");
    assert_eq!(listed.len(), 2, "each media message is its own message");
    assert_eq!(listed[1].text, "a cat");
    assert_ne!(listed[0].id, listed[1].id);
    assert_eq!(platform.landed_with_attachment(IMAGE), 2);
    assert_eq!(
        platform.log()[0].attachments,
        vec![image()],
        "the log says what landed"
    );

    // A replayed key answers with the first message, attachment included, and lands nothing.
    let (status, answer) = post(
        &platform,
        json!({ "attachments": [image()], "idempotencyKey": "k#0" }),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["message"]["id"], json!(landed.message.id));
    assert_eq!(platform.landed_with_attachment(IMAGE), 2);
}

#[tokio::test]
async fn a_message_with_nothing_to_show_or_an_attachment_without_url_is_refused() {
    let platform = QaPlatform::start(QaPlatformConfig::default())
        .await
        .unwrap();
    #[rustfmt::skip]
    let cases = [
        ("no text, no attachment", json!({ "text": "" })),
        ("nothing at all",         json!({})),
        ("empty url",              json!({ "attachments": [{ "kind": "media", "url": " " }] })),
        ("no url",                 json!({ "attachments": [{ "kind": "media", "fileName": "a.png" }] })),
        ("unknown kind",           json!({ "attachments": [{ "kind": "hologram", "url": IMAGE }] })),
    ];
    for (name, body) in cases {
        let (status, answer) = post(&platform, body).await;
        assert_eq!(status, 400, "{name}: {answer}");
        assert_eq!(answer["error"]["code"], json!("invalid_request"), "{name}");
    }
    assert!(platform.log().is_empty(), "nothing landed");
}

#[tokio::test]
async fn attachments_survive_a_restart_and_an_old_state_file_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qa-state.json");
    let config = QaPlatformConfig {
        state_path: Some(path.clone()),
        ..QaPlatformConfig::default()
    };
    let first = QaPlatform::start(config.clone()).await.unwrap();
    let (status, _) = post(&first, json!({ "attachments": [image()] })).await;
    assert_eq!(status, 201);
    let before = first.messages("c1");
    first.stop().await;
    let second = QaPlatform::start(config.clone()).await.unwrap();
    assert_eq!(second.messages("c1"), before);
    assert_eq!(second.messages("c1")[0].attachments, vec![image()]);
    assert_eq!(second.landed_with_attachment(IMAGE), 1);
    second.stop().await;

    // A file written before attachments existed: same format, no `attachments` anywhere.
    let old = json!({
        "format": 1, "seq": 1, "nextUpdateId": 0,
        "messages": { "m-1": {
            "id": "m-1", "conversationId": "c1", "text": "from before", "edits": 0, "seq": 1,
            "authorId": "clawgate-bot", "authorIsBot": true
        } },
        "byKey": {}, "updates": [],
        "log": [{ "seq": 1, "event": "sent", "messageId": "m-1", "conversationId": "c1",
                  "text": "from before" }]
    });
    std::fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
    let third = QaPlatform::start(config).await.unwrap();
    let messages = third.messages("c1");
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].text, "from before");
    assert!(messages[0].attachments.is_empty());
}

fn outbound(attachments: Vec<MessageAttachment>, text: &str) -> ChannelMessage {
    ChannelMessage::outbound("out-1", "qa", MessageTarget::group("c1"), text)
        .with_attachments(attachments)
}

fn context(message: &ChannelMessage) -> SendContext {
    let mut ctx = SendContext::new(message.clone(), "qa:out-1");
    "qa".clone_into(&mut ctx.channel);
    ctx
}

fn cat() -> MessageAttachment {
    MessageAttachment::new(MessagePartKind::Media)
        .with_url(IMAGE)
        .with_mime_type("image/png")
        .with_file_name("cat.png")
        .with_size_bytes(1_024)
}

#[tokio::test]
async fn the_adapter_declares_attachments_and_sends_a_media_unit_as_its_own_message() {
    let platform = QaPlatform::start(QaPlatformConfig::default())
        .await
        .unwrap();
    let adapter = QaAdapter::new(&platform.base_url(), platform.token());
    let declared = adapter.capabilities().attachments.clone().unwrap();
    assert!(declared.remote_url && !declared.upload, "{declared:?}");

    let message = outbound(vec![cat()], "look");
    let batch = DefaultRenderer
        .render(&message, adapter.capabilities(), "qa:out-1")
        .unwrap();
    assert_eq!(batch.units.len(), 2, "the text, then the image");
    let ctx = context(&message);
    let mut parts = Vec::new();
    for unit in &batch.units {
        parts.push(adapter.send_unit(&ctx, unit).await.unwrap());
    }
    let landed = platform.messages("c1");
    assert_eq!(landed.len(), 2);
    assert_eq!(
        (landed[0].text.as_str(), landed[0].attachments.len()),
        ("look", 0)
    );
    assert_eq!(landed[1].attachments, vec![image()]);
    assert_eq!(landed[1].idempotency_key.as_deref(), Some("qa:out-1#1"));
    assert_eq!(
        (parts[1].platform_message_id.as_str(), parts[1].kind),
        (landed[1].id.as_str(), MessagePartKind::Media)
    );

    // A renderer may give the media unit a caption.
    let mut captioned = batch.units[1].clone();
    captioned.index = 2;
    captioned.payload["caption"] = json!("a cat");
    adapter.send_unit(&ctx, &captioned).await.unwrap();
    assert_eq!(platform.messages("c1")[2].text, "a cat");

    // Without a URL there is nothing the platform could fetch: refused before any I/O.
    let upload = RenderedMessageUnit::new(
        3,
        MessagePartKind::Media,
        json!({ "kind": "media", "fileName": "local.png" }),
    );
    let error = adapter.send_unit(&ctx, &upload).await.unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::InvalidPayload, SideEffect::None)
    );
    assert_eq!(platform.messages("c1").len(), 3);

    // A media message received back normalizes with its attachment.
    let raw = serde_json::to_value(&landed[1]).unwrap();
    let inbound = adapter.normalize(&raw).unwrap();
    assert_eq!(
        inbound.message.attachments,
        vec![{
            let mut received = cat();
            received.size_bytes = None;
            received
        }]
    );
}
