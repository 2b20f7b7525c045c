//! Fully populated sample values: every optional field set, so snapshots show every field name.

use clawgate_types::{
    AcpBackend, AcpSessionOwner, AcpxProcessLease, ActorType, AgentToAgentPolicy,
    AttachmentCapabilities, BatchAtomicity, ChannelMessage, DeliveryCapabilities, DeliveryFailure,
    DeliveryFailureKind, DurableSendIntent, FailureReason, GatewayFailureCode, GatewayInstanceId,
    IntentId, IntentStatus, LeaseId, LeaseState, LeaseSurvivor, LiveCapabilities, LiveMessageState,
    LiveMode, MessageActor, MessageAttachment, MessageBody, MessageCapabilities, MessageOrigin,
    MessagePartKind, MessageQuote, MessageReceipt, MessageReceiptPart, MessageRelation,
    MessageTarget, RenderedMessageBatch, RenderedMessageUnit, RunOutcome, SessionKey,
    SessionStateEvent, SessionStateEventKind, SessionVisibility, SessionVisibilityInput,
    TextCapabilities, ThreadCapabilities, VisibilityRow,
};
use serde_json::json;

pub(crate) fn key(text: &str) -> SessionKey {
    SessionKey::parse(text).unwrap()
}

pub(crate) fn intent_id() -> IntentId {
    IntentId::parse("01970c3e-7d2a-7b3c-9f00-5a1b2c3d4e5f").unwrap()
}

pub(crate) fn lease_id() -> LeaseId {
    LeaseId::parse("lease_01970c3e.acpx").unwrap()
}

pub(crate) fn gateway_instance_id() -> GatewayInstanceId {
    GatewayInstanceId::parse("gw:host-a:7").unwrap()
}

pub(crate) fn target() -> MessageTarget {
    MessageTarget::thread("C123:1700000000.0001")
        .with_label("#ops")
        .with_space_id("T0001")
        .with_parent_id("C123")
        .with_thread_id(Some("1700000000.0001"))
        .with_native_channel_id("C123")
}

pub(crate) fn actor() -> MessageActor {
    MessageActor::bot("U42").with_display_name("Ada")
}

pub(crate) fn body() -> MessageBody {
    MessageBody::new("Build **green**").with_format("markdown")
}

pub(crate) fn attachment() -> MessageAttachment {
    MessageAttachment::new(MessagePartKind::Media)
        .with_url("https://files.example/report.png")
        .with_mime_type("image/png")
        .with_file_name("report.png")
        .with_size_bytes(48_213)
}

pub(crate) fn quote() -> MessageQuote {
    MessageQuote::new("is the build green?").with_author_id("U7")
}

pub(crate) fn relation_reply() -> MessageRelation {
    MessageRelation::reply_to("1700000000.0002")
        .with_inbound_message_id("in-1")
        .with_thread_id(Some("1700000000.0001"))
        .with_quote(quote())
}

pub(crate) fn relation_followup() -> MessageRelation {
    MessageRelation::followup(
        Some("agent:main:subagent:child".into()),
        Some("out-9".into()),
    )
}

pub(crate) fn relation_broadcast() -> MessageRelation {
    MessageRelation::broadcast(Some("maintenance window".into()))
}

pub(crate) fn relation_system() -> MessageRelation {
    MessageRelation::system(clawgate_types::SystemReason::ControlUi)
}

pub(crate) fn gateway_failure_origin() -> MessageOrigin {
    MessageOrigin::gateway_failure(GatewayFailureCode::MissingApiKey)
}

pub(crate) fn channel_message() -> ChannelMessage {
    ChannelMessage::outbound("out-10", "slack", target(), "Build **green**")
        .with_account_id("acct-1")
        .with_sender(actor())
        .with_body(body())
        .with_attachment(attachment())
        .with_relation(relation_reply())
        .with_origin(gateway_failure_origin())
        .with_timestamp(1_700_000_000_123)
        .with_raw(json!({ "ts": "1700000000.0003", "blocks": [1, true, null] }))
}

pub(crate) fn receipt_part(index: u32, id: &str) -> MessageReceiptPart {
    MessageReceiptPart::new(id, MessagePartKind::Text, index)
}

pub(crate) fn receipt_part_full() -> MessageReceiptPart {
    MessageReceiptPart::new("1700000000.0003", MessagePartKind::Text, 0)
        .with_thread_id("1700000000.0001")
        .with_reply_to_id("1700000000.0002")
        .with_edit_token("edit-0")
        .with_delete_token("del-0")
        .with_url("https://chat.example/p/0003")
        .with_raw(json!({ "ok": true }))
}

pub(crate) fn receipt() -> MessageReceipt {
    let second = MessageReceiptPart::new("1700000000.0004", MessagePartKind::Media, 1)
        .with_thread_id("1700000000.0001")
        .with_reply_to_id("1700000000.0002")
        .with_edit_token("edit-1")
        .with_delete_token("del-1")
        .with_url("https://chat.example/p/0004");
    MessageReceipt::from_parts(vec![receipt_part_full(), second], 1_700_000_000_500)
        .with_edit_token("edit-0")
        .with_delete_token("del-0")
        .with_url("https://chat.example/p/0003")
        .with_raw(json!({ "batch": 2 }))
}

pub(crate) fn batch_unit(index: u32) -> RenderedMessageUnit {
    RenderedMessageUnit::text(index, format!("chunk {index}"))
}

pub(crate) fn batch() -> RenderedMessageBatch {
    RenderedMessageBatch::new(
        vec![
            batch_unit(0),
            RenderedMessageUnit::new(
                1,
                MessagePartKind::Media,
                json!({ "url": "https://files.example/report.png" }),
            )
            .with_required(false),
        ],
        BatchAtomicity::AllOrRetryRemaining,
        "slack:out-10",
    )
}

pub(crate) fn live_state() -> LiveMessageState {
    LiveMessageState::empty(LiveMode::Partial)
        .with_receipt(MessageReceipt::from_parts(
            vec![receipt_part(0, "preview-1")],
            1_700_000_000_200,
        ))
        .with_visible_since(1_700_000_000_200)
        .with_can_finalize_in_place(true)
        .with_last_rendered_hash("sha256:4f2a")
        .with_stale_after_ms(600_000)
        .with_streamed_media(
            [(
                "https://files.example/report.png".to_owned(),
                MessageReceiptPart::new("media-1", MessagePartKind::Media, 0),
            )]
            .into(),
        )
}

pub(crate) fn delivery_failure() -> DeliveryFailure {
    DeliveryFailure {
        kind: DeliveryFailureKind::RateLimit,
        message: "429 Too Many Requests".into(),
        reason: Some(FailureReason::MaxAttemptsExceeded),
        retry_after_ms: Some(30_000),
        platform_code: Some("ratelimited".into()),
        at: 1_700_000_000_900,
    }
}

pub(crate) fn durable_send_intent() -> DurableSendIntent {
    DurableSendIntent {
        id: intent_id(),
        idempotency_key: "slack:out-10".into(),
        channel: "slack".into(),
        account_id: Some("acct-1".into()),
        message: channel_message(),
        batch: Some(batch()),
        live_state: Some(live_state()),
        status: IntentStatus::UnknownAfterSend,
        attempt: 3,
        reconciliations: 2,
        next_attempt_at: Some(1_700_000_060_000),
        expires_at: Some(1_700_003_600_000),
        receipt: Some(receipt()),
        partial_receipt: Some(MessageReceipt::from_parts(
            vec![receipt_part_full()],
            1_700_000_000_400,
        )),
        failure: Some(delivery_failure()),
        created_at: 1_700_000_000_000,
        updated_at: 1_700_000_001_000,
    }
}

pub(crate) fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(4000)
                .with_chunking(true),
        )
        .with_attachments(
            AttachmentCapabilities::default()
                .with_upload(true)
                .with_remote_url(true)
                .with_voice(true),
        )
        .with_threads(
            ThreadCapabilities::default()
                .with_reply(true)
                .with_topic(true)
                .with_native_thread(true),
        )
        .with_live(
            LiveCapabilities::default()
                .with_edit(true)
                .with_delete(true)
                .with_native_stream(true)
                .with_progress(true)
                .with_max_edits_per_second(1),
        )
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(true)
                .with_retry_after(true)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(true)
                .with_duplicates_acceptable(true),
        )
}

pub(crate) fn event_run_failed() -> SessionStateEvent {
    SessionStateEvent {
        sequence: 42,
        kind: SessionStateEventKind::RunFailed,
        actor_type: ActorType::Agent,
        actor_id: Some("agent:main:subagent:child".into()),
        summary: "child run timed out after 600s".into(),
        outcome: Some(RunOutcome::Timeout),
        child_session_key: None,
        created_at: Some(1_700_000_002_000),
    }
}

pub(crate) fn event_child_spawned() -> SessionStateEvent {
    SessionStateEvent {
        sequence: 41,
        kind: SessionStateEventKind::ChildSpawned,
        actor_type: ActorType::System,
        actor_id: Some("subagents".into()),
        summary: "spawned subagent child".into(),
        outcome: None,
        child_session_key: Some(key("agent:main:subagent:child")),
        created_at: Some(1_700_000_001_500),
    }
}

pub(crate) fn acp_session_owner() -> AcpSessionOwner {
    AcpSessionOwner {
        session_key: key("agent:coder:acp:7"),
        spawned_by: Some(key("agent:main:main")),
        parent_session_key: Some(key("agent:main:main")),
        owner_session_key: key("agent:main:main"),
        agent_id: "coder".into(),
        backend: AcpBackend::Acpx,
        gateway_instance_id: gateway_instance_id(),
        created_at: 1_700_000_000_000,
    }
}

pub(crate) fn acpx_lease() -> AcpxProcessLease {
    AcpxProcessLease {
        lease_id: lease_id(),
        gateway_instance_id: gateway_instance_id(),
        session_key: key("agent:coder:acp:7"),
        wrapper_root: "/var/lib/clawgate/acpx".into(),
        wrapper_path: "/var/lib/clawgate/acpx/bin/acpx-wrapper".into(),
        root_pid: Some(31_337),
        root_start_time: Some(987_654),
        boot_id: Some("6f1c0d5e-boot".into()),
        process_group_id: Some(31_337),
        command_hash: "sha256:9b1e".into(),
        started_at: 1_700_000_000_000,
        state: LeaseState::Closing,
        ended_at: Some(1_700_000_100_000),
        survivors: vec![LeaseSurvivor {
            pid: 31_340,
            start_time: 987_700,
        }],
        stderr_tail: Vec::new(),
    }
}

pub(crate) fn a2a_policy() -> AgentToAgentPolicy {
    AgentToAgentPolicy {
        enabled: true,
        allow: vec!["coder".into(), "research-*".into()],
    }
}

pub(crate) fn visibility_input() -> SessionVisibilityInput {
    SessionVisibilityInput {
        requester_session_key: key("agent:main:main"),
        row: VisibilityRow {
            key: key("agent:coder:acp:7"),
            agent_id: "coder".into(),
            owner_session_key: Some(key("agent:main:main")),
            spawned_by: Some(key("agent:main:main")),
            parent_session_key: Some(key("agent:main:main")),
        },
        visibility: SessionVisibility::OwnSession,
        a2a_policy: a2a_policy(),
        requester_sandboxed: true,
    }
}
