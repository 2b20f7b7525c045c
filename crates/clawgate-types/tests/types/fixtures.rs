//! Fully populated sample values: every optional field set, so snapshots show every field name.

use clawgate_types::{
    AcpBackend, AcpSessionOwner, AcpxProcessLease, ActorType, AgentToAgentPolicy,
    AttachmentCapabilities, BatchAtomicity, ChannelMessage, DeliveryCapabilities, DeliveryFailure,
    DeliveryFailureKind, DurableSendIntent, FailureReason, GatewayFailureCode, GatewayInstanceId,
    IntentId, IntentStatus, LeaseId, LeaseState, LiveCapabilities, LiveMessageState, LiveMode,
    MessageActor, MessageAttachment, MessageBody, MessageCapabilities, MessageDirection,
    MessageOrigin, MessagePartKind, MessageQuote, MessageReceipt, MessageReceiptPart,
    MessageRelation, MessageTarget, RenderedMessageBatch, RenderedMessageUnit, RunOutcome,
    SessionKey, SessionStateEvent, SessionStateEventKind, SessionVisibility,
    SessionVisibilityInput, TargetKind, TextCapabilities, ThreadCapabilities, VisibilityRow,
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
    MessageTarget {
        kind: TargetKind::Thread,
        id: "C123:1700000000.0001".into(),
        label: Some("#ops".into()),
        space_id: Some("T0001".into()),
        parent_id: Some("C123".into()),
        thread_id: Some("1700000000.0001".into()),
        native_channel_id: Some("C123".into()),
    }
}

pub(crate) fn actor() -> MessageActor {
    MessageActor {
        id: "U42".into(),
        display_name: Some("Ada".into()),
        is_bot: true,
    }
}

pub(crate) fn body() -> MessageBody {
    MessageBody {
        text: "Build **green**".into(),
        format: Some("markdown".into()),
    }
}

pub(crate) fn attachment() -> MessageAttachment {
    MessageAttachment {
        kind: MessagePartKind::Media,
        url: Some("https://files.example/report.png".into()),
        mime_type: Some("image/png".into()),
        file_name: Some("report.png".into()),
        size_bytes: Some(48_213),
    }
}

pub(crate) fn quote() -> MessageQuote {
    MessageQuote {
        text: "is the build green?".into(),
        author_id: Some("U7".into()),
    }
}

pub(crate) fn relation_reply() -> MessageRelation {
    MessageRelation::Reply {
        inbound_message_id: Some("in-1".into()),
        reply_to_id: Some("1700000000.0002".into()),
        thread_id: Some("1700000000.0001".into()),
        quote: Some(quote()),
    }
}

pub(crate) fn relation_followup() -> MessageRelation {
    MessageRelation::Followup {
        session_key: Some("agent:main:subagent:child".into()),
        previous_message_id: Some("out-9".into()),
    }
}

pub(crate) fn relation_broadcast() -> MessageRelation {
    MessageRelation::Broadcast {
        reason: Some("maintenance window".into()),
    }
}

pub(crate) fn relation_system() -> MessageRelation {
    MessageRelation::System {
        reason: clawgate_types::SystemReason::ControlUi,
    }
}

pub(crate) fn gateway_failure_origin() -> MessageOrigin {
    MessageOrigin::gateway_failure(GatewayFailureCode::MissingApiKey)
}

pub(crate) fn channel_message() -> ChannelMessage {
    ChannelMessage {
        id: "out-10".into(),
        channel: "slack".into(),
        account_id: Some("acct-1".into()),
        direction: MessageDirection::Outbound,
        target: target(),
        sender: Some(actor()),
        body: Some(body()),
        attachments: vec![attachment()],
        relation: Some(relation_reply()),
        origin: Some(gateway_failure_origin()),
        timestamp: Some(1_700_000_000_123),
        raw: Some(json!({ "ts": "1700000000.0003", "blocks": [1, true, null] })),
    }
}

pub(crate) fn receipt_part(index: u32, id: &str) -> MessageReceiptPart {
    MessageReceiptPart {
        platform_message_id: id.into(),
        kind: MessagePartKind::Text,
        index,
        thread_id: None,
        reply_to_id: None,
        edit_token: None,
        delete_token: None,
        url: None,
        raw: None,
    }
}

pub(crate) fn receipt_part_full() -> MessageReceiptPart {
    MessageReceiptPart {
        platform_message_id: "1700000000.0003".into(),
        kind: MessagePartKind::Text,
        index: 0,
        thread_id: Some("1700000000.0001".into()),
        reply_to_id: Some("1700000000.0002".into()),
        edit_token: Some("edit-0".into()),
        delete_token: Some("del-0".into()),
        url: Some("https://chat.example/p/0003".into()),
        raw: Some(json!({ "ok": true })),
    }
}

pub(crate) fn receipt() -> MessageReceipt {
    let second = MessageReceiptPart {
        platform_message_id: "1700000000.0004".into(),
        kind: MessagePartKind::Media,
        index: 1,
        edit_token: Some("edit-1".into()),
        delete_token: Some("del-1".into()),
        url: Some("https://chat.example/p/0004".into()),
        raw: None,
        ..receipt_part_full()
    };
    MessageReceipt {
        edit_token: Some("edit-0".into()),
        delete_token: Some("del-0".into()),
        url: Some("https://chat.example/p/0003".into()),
        raw: Some(json!({ "batch": 2 })),
        ..MessageReceipt::from_parts(vec![receipt_part_full(), second], 1_700_000_000_500)
    }
}

pub(crate) fn batch_unit(index: u32) -> RenderedMessageUnit {
    RenderedMessageUnit {
        index,
        kind: MessagePartKind::Text,
        payload: json!({ "text": format!("chunk {index}") }),
        required: true,
    }
}

pub(crate) fn batch() -> RenderedMessageBatch {
    RenderedMessageBatch {
        units: vec![
            batch_unit(0),
            RenderedMessageUnit {
                index: 1,
                kind: MessagePartKind::Media,
                payload: json!({ "url": "https://files.example/report.png" }),
                required: false,
            },
        ],
        atomicity: BatchAtomicity::AllOrRetryRemaining,
        idempotency_key: "slack:out-10".into(),
    }
}

pub(crate) fn live_state() -> LiveMessageState {
    LiveMessageState {
        mode: LiveMode::Partial,
        receipt: Some(MessageReceipt::from_parts(
            vec![receipt_part(0, "preview-1")],
            1_700_000_000_200,
        )),
        visible_since: Some(1_700_000_000_200),
        can_finalize_in_place: true,
        last_rendered_hash: Some("sha256:4f2a".into()),
        stale_after_ms: Some(600_000),
        streamed_media: [(
            "https://files.example/report.png".to_owned(),
            MessageReceiptPart {
                kind: MessagePartKind::Media,
                ..receipt_part(0, "media-1")
            },
        )]
        .into(),
    }
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
    MessageCapabilities {
        text: TextCapabilities {
            max_length: Some(4000),
            chunking: true,
        },
        attachments: Some(AttachmentCapabilities {
            upload: true,
            remote_url: true,
            voice: true,
        }),
        threads: Some(ThreadCapabilities {
            reply: true,
            topic: true,
            native_thread: true,
        }),
        live: Some(LiveCapabilities {
            edit: true,
            delete: true,
            native_stream: true,
            progress: true,
            max_edits_per_second: Some(1),
        }),
        delivery: Some(DeliveryCapabilities {
            idempotency_key: true,
            retry_after: true,
            receipt_required: true,
            reconcile_unknown_send: true,
            duplicates_acceptable: true,
        }),
    }
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
