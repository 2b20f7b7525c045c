//! proptest strategies for every wire type: optional fields present or absent, arbitrary text
//! (any Unicode scalar, so escaping is exercised) and small arbitrary JSON payloads.

use clawgate_types::{
    AcpSessionOwner, AcpxProcessLease, AgentToAgentPolicy, AttachmentCapabilities, ChannelMessage,
    DeliveryCapabilities, DeliveryFailure, DurableSendIntent, GatewayInstanceId, GatewayOrigin,
    IntentId, LeaseId, LeaseSurvivor, LiveCapabilities, LiveMessageState, LiveMessageUpdate,
    MessageActor, MessageAttachment, MessageBody, MessageCapabilities, MessageOrigin, MessageQuote,
    MessageReceipt, MessageReceiptPart, MessageRelation, MessageTarget, ReceiveAckPolicy,
    RenderedMessageBatch, RenderedMessageUnit, SessionKey, SessionStateEvent,
    SessionVisibilityInput, StateVersion, TextCapabilities, ThreadCapabilities, VisibilityRow,
};
use proptest::prelude::*;
use proptest::{collection::vec, option::of as maybe, sample::select};
use serde_json::Value;

use crate::variants::*;

/// Any one variant of a field-less enum.
pub(crate) fn one_of<T: Clone + std::fmt::Debug + 'static>(all: &[T]) -> impl Strategy<Value = T> {
    select(all.to_vec())
}

/// Short text over all of Unicode, control characters included.
pub(crate) fn text() -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..12).prop_map(String::from_iter)
}

pub(crate) fn opt_text() -> impl Strategy<Value = Option<String>> {
    maybe(text())
}

/// A small JSON value: null, bool, integer, string, and shallow arrays/objects of those.
pub(crate) fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            vec((text(), inner), 0..4)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// An optional opaque payload (`raw`). `Some(Value::Null)` is excluded: it is encoded as
/// `null`, which decodes as an absent field (see `roundtrip::raw_null_decodes_as_absent`).
pub(crate) fn opt_raw() -> impl Strategy<Value = Option<Value>> {
    maybe(
        json_value().prop_filter("Some(null) is indistinguishable from None", |v| {
            !v.is_null()
        }),
    )
}

const ID_PATTERN: &str = "[A-Za-z0-9._:-]{1,128}";

pub(crate) fn intent_id() -> impl Strategy<Value = IntentId> {
    ID_PATTERN.prop_map(|s| IntentId::parse(s).unwrap())
}

pub(crate) fn lease_id() -> impl Strategy<Value = LeaseId> {
    ID_PATTERN.prop_map(|s| LeaseId::parse(s).unwrap())
}

pub(crate) fn gateway_instance_id() -> impl Strategy<Value = GatewayInstanceId> {
    ID_PATTERN.prop_map(|s| GatewayInstanceId::parse(s).unwrap())
}

/// Agent-qualified keys, the global key and unqualified legacy keys, all valid.
pub(crate) fn session_key() -> impl Strategy<Value = SessionKey> {
    let segment = "[A-Za-z0-9_.@/é漢-]{1,10}";
    prop_oneof![
        (segment, vec(segment, 1..4)).prop_map(|(agent, rest)| SessionKey::for_agent(
            &agent,
            &rest.join(":")
        )
        .unwrap()),
        Just(SessionKey::global()),
        // A legacy key whose first segment happens to be `agent` with a single further
        // segment would be invalid (`agent:x`); the filter keeps only keys that parse.
        vec(segment, 1..4).prop_filter_map("must be a valid key", |segs| {
            SessionKey::parse(&segs.join(":")).ok()
        }),
    ]
}

prop_compose! {
    pub(crate) fn target()(
        kind in one_of(TARGET_KINDS),
        id in text(),
        (label, space_id, parent_id) in (opt_text(), opt_text(), opt_text()),
        (thread_id, native_channel_id) in (opt_text(), opt_text()),
    ) -> MessageTarget {
        let mut target = MessageTarget::new(kind, id);
        (target.label, target.space_id, target.parent_id) = (label, space_id, parent_id);
        (target.thread_id, target.native_channel_id) = (thread_id, native_channel_id);
        target
    }
}

prop_compose! {
    pub(crate) fn actor()(id in text(), display_name in opt_text(), is_bot in any::<bool>())
        -> MessageActor {
        let mut actor = MessageActor::new(id).with_is_bot(is_bot);
        actor.display_name = display_name;
        actor
    }
}

prop_compose! {
    pub(crate) fn body()(text in text(), format in opt_text()) -> MessageBody {
        let mut body = MessageBody::new(text);
        body.format = format;
        body
    }
}

prop_compose! {
    pub(crate) fn attachment()(
        kind in one_of(PART_KINDS),
        (url, mime_type, file_name) in (opt_text(), opt_text(), opt_text()),
        size_bytes in maybe(any::<u64>()),
    ) -> MessageAttachment {
        let mut attachment = MessageAttachment::new(kind);
        (attachment.url, attachment.mime_type) = (url, mime_type);
        (attachment.file_name, attachment.size_bytes) = (file_name, size_bytes);
        attachment
    }
}

prop_compose! {
    pub(crate) fn quote()(text in text(), author_id in opt_text()) -> MessageQuote {
        let mut quote = MessageQuote::new(text);
        quote.author_id = author_id;
        quote
    }
}

pub(crate) fn relation() -> impl Strategy<Value = MessageRelation> {
    prop_oneof![
        (opt_text(), opt_text(), opt_text(), maybe(quote())).prop_map(
            |(inbound_message_id, reply_to_id, thread_id, quote)| {
                let mut reply = MessageRelation::reply().with_thread_id(thread_id);
                if let MessageRelation::Reply {
                    inbound_message_id: inbound,
                    reply_to_id: to,
                    quote: quoted,
                    ..
                } = &mut reply
                {
                    (*inbound, *to, *quoted) = (inbound_message_id, reply_to_id, quote);
                }
                reply
            }
        ),
        (opt_text(), opt_text()).prop_map(|(session_key, previous_message_id)| {
            MessageRelation::followup(session_key, previous_message_id)
        }),
        opt_text().prop_map(MessageRelation::broadcast),
        one_of(SYSTEM_REASONS).prop_map(MessageRelation::system),
    ]
}

prop_compose! {
    pub(crate) fn gateway_origin()(
        schema_version in any::<u32>(),
        kind in one_of(GATEWAY_ORIGIN_KINDS),
        code in one_of(GATEWAY_FAILURE_CODES),
        echo_policy in one_of(ECHO_POLICIES),
    ) -> GatewayOrigin {
        GatewayOrigin { schema_version, kind, code, echo_policy }
    }
}

pub(crate) fn origin() -> impl Strategy<Value = MessageOrigin> {
    prop_oneof![
        gateway_origin().prop_map(MessageOrigin::Clawgate),
        one_of(GATEWAY_FAILURE_CODES).prop_map(MessageOrigin::gateway_failure),
        Just(MessageOrigin::User),
        Just(MessageOrigin::ExternalBot),
        Just(MessageOrigin::Platform),
        Just(MessageOrigin::Unknown),
    ]
}

prop_compose! {
    pub(crate) fn channel_message()(
        (id, channel, account_id) in (text(), text(), opt_text()),
        (direction, target) in (one_of(MESSAGE_DIRECTIONS), target()),
        (sender, body) in (maybe(actor()), maybe(body())),
        attachments in vec(attachment(), 0..3),
        (relation, origin) in (maybe(relation()), maybe(origin())),
        (timestamp, raw) in (maybe(any::<i64>()), opt_raw()),
    ) -> ChannelMessage {
        let mut message = match direction {
            clawgate_types::MessageDirection::Inbound => ChannelMessage::inbound(id, channel, target),
            clawgate_types::MessageDirection::Outbound => ChannelMessage::outbound(id, channel, target, ""),
        }
        .with_attachments(attachments);
        (message.account_id, message.sender, message.body) = (account_id, sender, body);
        (message.relation, message.origin) = (relation, origin);
        (message.timestamp, message.raw) = (timestamp, raw);
        message
    }
}

prop_compose! {
    pub(crate) fn receipt_part()(
        (platform_message_id, kind, index) in (text(), one_of(PART_KINDS), any::<u32>()),
        (thread_id, reply_to_id) in (opt_text(), opt_text()),
        (edit_token, delete_token, url) in (opt_text(), opt_text(), opt_text()),
        raw in opt_raw(),
    ) -> MessageReceiptPart {
        let mut part = MessageReceiptPart::new(platform_message_id, kind, index);
        (part.thread_id, part.reply_to_id) = (thread_id, reply_to_id);
        (part.edit_token, part.delete_token, part.url) = (edit_token, delete_token, url);
        part.raw = raw;
        part
    }
}

prop_compose! {
    pub(crate) fn receipt()(
        primary_platform_message_id in opt_text(),
        platform_message_ids in vec(text(), 0..3),
        parts in vec(receipt_part(), 0..3),
        (thread_id, reply_to_id) in (opt_text(), opt_text()),
        (edit_token, delete_token, url) in (opt_text(), opt_text(), opt_text()),
        (sent_at, raw) in (any::<i64>(), opt_raw()),
    ) -> MessageReceipt {
        // Arbitrary, not derived from the parts: decoding must keep whatever the wire says.
        let mut receipt = MessageReceipt::from_parts(parts, sent_at);
        receipt.primary_platform_message_id = primary_platform_message_id;
        receipt.platform_message_ids = platform_message_ids;
        (receipt.thread_id, receipt.reply_to_id) = (thread_id, reply_to_id);
        (receipt.edit_token, receipt.delete_token, receipt.url) = (edit_token, delete_token, url);
        receipt.raw = raw;
        receipt
    }
}

prop_compose! {
    pub(crate) fn batch_unit()(
        index in any::<u32>(),
        kind in one_of(PART_KINDS),
        payload in json_value(),
        required in any::<bool>(),
    ) -> RenderedMessageUnit {
        RenderedMessageUnit::new(index, kind, payload).with_required(required)
    }
}

prop_compose! {
    pub(crate) fn batch()(
        units in vec(batch_unit(), 0..4),
        atomicity in one_of(BATCH_ATOMICITIES),
        idempotency_key in text(),
    ) -> RenderedMessageBatch {
        RenderedMessageBatch::new(units, atomicity, idempotency_key)
    }
}

prop_compose! {
    pub(crate) fn live_state()(
        mode in one_of(LIVE_MODES),
        receipt in maybe(receipt()),
        visible_since in maybe(any::<i64>()),
        can_finalize_in_place in any::<bool>(),
        last_rendered_hash in opt_text(),
        stale_after_ms in maybe(any::<u64>()),
        streamed_media in proptest::collection::btree_map(text(), receipt_part(), 0..3),
    ) -> LiveMessageState {
        let mut state = LiveMessageState::empty(mode)
            .with_can_finalize_in_place(can_finalize_in_place)
            .with_streamed_media(streamed_media);
        (state.receipt, state.visible_since) = (receipt, visible_since);
        (state.last_rendered_hash, state.stale_after_ms) = (last_rendered_hash, stale_after_ms);
        state
    }
}

pub(crate) fn live_update() -> impl Strategy<Value = LiveMessageUpdate> {
    prop_oneof![
        text().prop_map(LiveMessageUpdate::partial),
        (any::<u32>(), text()).prop_map(|(index, text)| LiveMessageUpdate::block(index, text)),
        (text(), maybe(0.0f64..=1.0))
            .prop_map(|(label, fraction)| LiveMessageUpdate::progress(label, fraction)),
        // Exact ends and tiny values, which the uniform range rarely hits.
        (
            text(),
            select(vec![0.0, 1.0, f64::MIN_POSITIVE, 1e-300, 0.1, 1.0 / 3.0])
        )
            .prop_map(|(label, f)| LiveMessageUpdate::progress(label, Some(f))),
        json_value().prop_map(LiveMessageUpdate::native),
    ]
}

prop_compose! {
    pub(crate) fn delivery_failure()(
        kind in one_of(FAILURE_KINDS),
        message in text(),
        reason in maybe(one_of(FAILURE_REASONS)),
        retry_after_ms in maybe(any::<u64>()),
        platform_code in opt_text(),
        at in any::<i64>(),
    ) -> DeliveryFailure {
        DeliveryFailure { kind, message, reason, retry_after_ms, platform_code, at }
    }
}

pub(crate) fn receive_ack_policy() -> impl Strategy<Value = ReceiveAckPolicy> {
    prop_oneof![
        one_of(IMMEDIATE_ACK_REASONS).prop_map(|reason| ReceiveAckPolicy::Immediate { reason }),
        Just(ReceiveAckPolicy::AfterRecord),
        Just(ReceiveAckPolicy::AfterDurableSend),
        Just(ReceiveAckPolicy::Manual),
    ]
}

prop_compose! {
    pub(crate) fn durable_send_intent()(
        (id, idempotency_key, channel) in (intent_id(), text(), text()),
        account_id in opt_text(),
        message in channel_message(),
        (batch, live_state) in (maybe(batch()), maybe(live_state())),
        (status, attempt, reconciliations) in
            (one_of(&clawgate_types::ALL_INTENT_STATUSES), any::<u32>(), any::<u32>()),
        (next_attempt_at, expires_at) in (maybe(any::<i64>()), maybe(any::<i64>())),
        (receipt, partial_receipt) in (maybe(receipt()), maybe(receipt())),
        failure in maybe(delivery_failure()),
        (created_at, updated_at) in (any::<i64>(), any::<i64>()),
    ) -> DurableSendIntent {
        DurableSendIntent {
            id, idempotency_key, channel, account_id, message, batch, live_state, status,
            attempt, reconciliations, next_attempt_at, expires_at, receipt, partial_receipt,
            failure, created_at, updated_at,
        }
    }
}

prop_compose! {
    pub(crate) fn capabilities()(
        text in (maybe(any::<u32>()), any::<bool>())
            .prop_map(|(max_length, chunking)| {
                let mut text = TextCapabilities::default().with_chunking(chunking);
                text.max_length = max_length;
                text
            }),
        attachments in maybe(any::<(bool, bool, bool)>().prop_map(|(upload, remote_url, voice)| {
            AttachmentCapabilities::default()
                .with_upload(upload)
                .with_remote_url(remote_url)
                .with_voice(voice)
        })),
        threads in maybe(any::<(bool, bool, bool)>().prop_map(|(reply, topic, native_thread)| {
            ThreadCapabilities::default()
                .with_reply(reply)
                .with_topic(topic)
                .with_native_thread(native_thread)
        })),
        live in maybe((any::<(bool, bool, bool, bool)>(), maybe(any::<u32>())).prop_map(
            |((edit, delete, native_stream, progress), max_edits_per_second)| {
                let mut live = LiveCapabilities::default()
                    .with_edit(edit)
                    .with_delete(delete)
                    .with_native_stream(native_stream)
                    .with_progress(progress);
                live.max_edits_per_second = max_edits_per_second;
                live
            },
        )),
        delivery in maybe(any::<(bool, bool, bool, bool, bool)>().prop_map(|(a, b, c, d, e)| {
            DeliveryCapabilities::default()
                .with_idempotency_key(a)
                .with_retry_after(b)
                .with_receipt_required(c)
                .with_reconcile_unknown_send(d)
                .with_duplicates_acceptable(e)
        })),
    ) -> MessageCapabilities {
        let mut capabilities = MessageCapabilities::default().with_text(text);
        (capabilities.attachments, capabilities.threads) = (attachments, threads);
        (capabilities.live, capabilities.delivery) = (live, delivery);
        capabilities
    }
}

pub(crate) fn state_version() -> impl Strategy<Value = StateVersion> {
    any::<u64>().prop_map(StateVersion)
}

prop_compose! {
    pub(crate) fn session_state_event()(
        (sequence, kind, actor_type) in
            (any::<u64>(), one_of(SESSION_EVENT_KINDS), one_of(ACTOR_TYPES)),
        (actor_id, summary) in (opt_text(), text()),
        outcome in maybe(one_of(RUN_OUTCOMES)),
        child_session_key in maybe(session_key()),
        created_at in maybe(any::<i64>()),
    ) -> SessionStateEvent {
        SessionStateEvent {
            sequence, kind, actor_type, actor_id, summary, outcome, child_session_key, created_at,
        }
    }
}

prop_compose! {
    pub(crate) fn acp_session_owner()(
        session_key in session_key(),
        (spawned_by, parent_session_key) in (maybe(session_key()), maybe(session_key())),
        owner_session_key in session_key(),
        (agent_id, backend) in (text(), one_of(ACP_BACKENDS)),
        gateway_instance_id in gateway_instance_id(),
        created_at in any::<i64>(),
    ) -> AcpSessionOwner {
        AcpSessionOwner {
            session_key, spawned_by, parent_session_key, owner_session_key, agent_id, backend,
            gateway_instance_id, created_at,
        }
    }
}

prop_compose! {
    pub(crate) fn acpx_lease()(
        (lease_id, gateway_instance_id, session_key) in
            (lease_id(), gateway_instance_id(), session_key()),
        (wrapper_root, wrapper_path) in (text(), text()),
        (root_pid, root_start_time) in (maybe(any::<u32>()), maybe(any::<u64>())),
        (boot_id, process_group_id) in (opt_text(), maybe(any::<u32>())),
        (command_hash, started_at) in (text(), any::<i64>()),
        (state, ended_at) in (one_of(LEASE_STATES), maybe(any::<i64>())),
        survivors in vec((any::<u32>(), any::<u64>()), 0..3),
        stderr_tail in vec(text(), 0..3),
    ) -> AcpxProcessLease {
        let survivors = survivors
            .into_iter()
            .map(|(pid, start_time)| LeaseSurvivor { pid, start_time })
            .collect();
        AcpxProcessLease {
            lease_id, gateway_instance_id, session_key, wrapper_root, wrapper_path, root_pid,
            root_start_time, boot_id, process_group_id, command_hash, started_at, state, ended_at,
            survivors, stderr_tail,
        }
    }
}

prop_compose! {
    pub(crate) fn a2a_policy()(enabled in any::<bool>(), allow in vec(text(), 0..3))
        -> AgentToAgentPolicy {
        AgentToAgentPolicy { enabled, allow }
    }
}

prop_compose! {
    pub(crate) fn visibility_row()(
        key in session_key(),
        agent_id in text(),
        owner_session_key in maybe(session_key()),
        spawned_by in maybe(session_key()),
        parent_session_key in maybe(session_key()),
    ) -> VisibilityRow {
        VisibilityRow { key, agent_id, owner_session_key, spawned_by, parent_session_key }
    }
}

prop_compose! {
    pub(crate) fn visibility_input()(
        requester_session_key in session_key(),
        row in visibility_row(),
        visibility in one_of(SESSION_VISIBILITIES),
        a2a_policy in a2a_policy(),
        requester_sandboxed in any::<bool>(),
    ) -> SessionVisibilityInput {
        SessionVisibilityInput {
            requester_session_key, row, visibility, a2a_policy, requester_sandboxed,
        }
    }
}
