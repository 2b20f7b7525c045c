//! The small pure decisions carried by the vocabulary's enums, checked for every variant.

use clawgate_types::{
    DeliveryFailureKind, DeliveryStatus, LeaseState, MessageDurabilityPolicy, MessageRelation,
    SessionStateEventKind, StateVersion, TargetKind,
};

use crate::fixtures;
use crate::variants::*;

/// Asserts that a table lists each variant exactly once, in the canonical order.
fn assert_covers<T: PartialEq + std::fmt::Debug, X>(table: &[(T, X)], all: &[T]) {
    let listed: Vec<&T> = table.iter().map(|(v, _)| v).collect();
    let all: Vec<&T> = all.iter().collect();
    assert_eq!(listed, all, "the table must list every variant once");
}

#[test]
fn failure_kind_retry_classes() {
    use DeliveryFailureKind::*;
    // (kind, (is_retryable, needs_configuration_change))
    let table = [
        (Transient, (true, false)),
        (RateLimit, (true, false)),
        (Auth, (false, true)),
        (Permission, (false, true)),
        (NotFound, (false, false)),
        (InvalidPayload, (false, false)),
        (Conflict, (false, false)),
        (Cancelled, (false, false)),
        (Unknown, (false, false)),
    ];
    assert_covers(&table, FAILURE_KINDS);
    for (kind, (retryable, configuration)) in table {
        assert_eq!(kind.is_retryable(), retryable, "{kind:?}.is_retryable()");
        assert_eq!(kind.needs_configuration_change(), configuration, "{kind:?}");
    }
}

#[test]
fn target_kind_roomishness() {
    use TargetKind::*;
    let table = [
        (Direct, false),
        (Group, true),
        (Channel, true),
        (Thread, true),
    ];
    assert_covers(&table, TARGET_KINDS);
    for (kind, roomish) in table {
        assert_eq!(kind.is_roomish(), roomish, "{kind:?}");
    }
}

#[test]
fn delivery_status_terminality() {
    use DeliveryStatus::*;
    let table = [
        (HandledVisible, true),
        (HandledNoSend, true),
        (Unsupported, false),
        (NotApplicable, false),
        (Failed, false),
    ];
    assert_covers(&table, DELIVERY_STATUSES);
    for (status, terminal) in table {
        assert_eq!(status.is_terminal(), terminal, "{status:?}");
    }
}

#[test]
fn lease_state_spelling_and_finish() {
    use LeaseState::*;
    let table = [
        (Open, ("open", false)),
        (Closing, ("closing", false)),
        (Closed, ("closed", true)),
        (Lost, ("lost", true)),
    ];
    assert_covers(&table, LEASE_STATES);
    for (state, (spelling, finished)) in table {
        assert_eq!(state.as_str(), spelling);
        assert_eq!(LeaseState::parse(spelling), Some(state));
        assert_eq!(
            serde_json::to_string(&state).unwrap(),
            format!("\"{spelling}\"")
        );
        assert_eq!(state.is_finished(), finished, "{state:?}");
    }
    assert_eq!(LeaseState::parse("Open"), None);
    assert_eq!(LeaseState::parse(""), None);
}

#[test]
fn session_event_kinds_that_notify() {
    use SessionStateEventKind::*;
    let table = [
        (Created, false),
        (HumanDirectMessage, true),
        (GoalChanged, true),
        (ChildSpawned, false),
        (RunCompleted, false),
        (RunFailed, false),
        (Compacted, false),
    ];
    assert_covers(&table, SESSION_EVENT_KINDS);
    for (kind, notifies) in table {
        assert_eq!(kind.notifies(), notifies, "{kind:?}");
    }
}

#[test]
fn relation_accessors() {
    assert_eq!(
        fixtures::relation_reply().reply_to_id(),
        Some("1700000000.0002")
    );
    assert_eq!(
        fixtures::relation_reply().thread_id(),
        Some("1700000000.0001")
    );
    let bare_reply = MessageRelation::reply().with_inbound_message_id("in");
    for other in [
        bare_reply,
        fixtures::relation_followup(),
        fixtures::relation_broadcast(),
        fixtures::relation_system(),
    ] {
        assert_eq!(other.reply_to_id(), None, "{other:?}");
        assert_eq!(other.thread_id(), None, "{other:?}");
    }
}

#[test]
fn legacy_entry_points_default_to_no_durability() {
    assert_eq!(
        MessageDurabilityPolicy::default(),
        MessageDurabilityPolicy::Disabled
    );
}

#[test]
fn state_versions_order_and_display() {
    assert_eq!(StateVersion::default(), StateVersion(0));
    assert!(StateVersion(2) > StateVersion(1));
    assert_eq!(StateVersion(17).to_string(), "17");
    assert_eq!(clawgate_types::to_json(&StateVersion(17)).unwrap(), "17");
}
