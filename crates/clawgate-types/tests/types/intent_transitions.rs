//! The intent state machine, checked pair by pair against a table written out here.

use std::collections::VecDeque;

use clawgate_types::IntentStatus::{
    self, Cancelled, Committing, Failed, Pending, Sending, Sent, UnknownAfterSend,
};
use clawgate_types::{ALL_INTENT_STATUSES, IllegalTransition};

/// Every legal transition, one row each: (from, to, why).
const LEGAL: &[(IntentStatus, IntentStatus, &str)] = &[
    // Bookkeeping: a pending intent rescheduled to a later `nextAttemptAt`.
    (Pending, Pending, "reschedule"),
    // A worker claims the intent; platform I/O may start.
    (Pending, Sending, "claim and attempt"),
    // Expired or parked before any attempt was made.
    (Pending, Failed, "fail before any I/O"),
    // Cancelled while nothing can have reached the platform.
    (Pending, Cancelled, "cancel before any I/O"),
    // The attempt failed in a way proven to have had no platform side effect: retry later.
    (Sending, Pending, "retry after side-effect-free failure"),
    // The platform returned a receipt; only committing it is left.
    (Sending, Committing, "receipt returned"),
    // The platform returned a receipt, recorded and committed in the same write.
    (Sending, Sent, "receipt returned and committed"),
    // I/O may have happened but no receipt came back (timeout, crash): reconcile first.
    (Sending, UnknownAfterSend, "outcome unknown"),
    // A classified, non-retryable failure.
    (Sending, Failed, "permanent failure"),
    // The receipt is committed: done.
    (Committing, Sent, "receipt committed"),
    // Reconciliation stayed unresolved; the intent waits for another look.
    (
        UnknownAfterSend,
        UnknownAfterSend,
        "reconciliation unresolved",
    ),
    // Reconciliation found the message on the platform: commit it.
    (UnknownAfterSend, Sent, "reconciled as sent"),
    // Reconciliation proved the message never landed: send it again.
    (UnknownAfterSend, Pending, "reconciled as not sent"),
    // Reconciliation gave up, or the intent expired while unresolved.
    (UnknownAfterSend, Failed, "reconciliation failed"),
    // An operator cancels an unresolved send.
    (
        UnknownAfterSend,
        Cancelled,
        "operator cancels unknown outcome",
    ),
    // An operator retries a parked or failed intent.
    (Failed, Pending, "operator retry"),
    // An operator gives up on a failed intent.
    (Failed, Cancelled, "operator cancels failed intent"),
];

fn expected_legal(from: IntentStatus, to: IntentStatus) -> Option<&'static str> {
    LEGAL
        .iter()
        .find(|(f, t, _)| (*f, *t) == (from, to))
        .map(|(_, _, why)| *why)
}

#[test]
fn the_table_has_no_duplicate_rows() {
    for (i, (from, to, _)) in LEGAL.iter().enumerate() {
        assert!(
            !LEGAL[i + 1..].iter().any(|(f, t, _)| (f, t) == (from, to)),
            "duplicate row {from:?} -> {to:?}"
        );
    }
}

#[test]
fn every_pair_matches_the_table() {
    let mut legal_seen = 0;
    for from in ALL_INTENT_STATUSES {
        for to in ALL_INTENT_STATUSES {
            let expected = expected_legal(from, to);
            assert_eq!(
                from.can_transition_to(to),
                expected.is_some(),
                "{from:?} -> {to:?} (expected: {})",
                expected.unwrap_or("illegal")
            );
            match (from.transition_to(to), expected) {
                (Ok(next), Some(_)) => {
                    assert_eq!(next, to);
                    legal_seen += 1;
                }
                (Err(error), None) => assert_eq!(error, IllegalTransition { from, to }),
                (result, expected) => {
                    panic!("{from:?} -> {to:?}: got {result:?}, expected {expected:?}")
                }
            }
        }
    }
    assert_eq!(legal_seen, LEGAL.len());
    assert_eq!(ALL_INTENT_STATUSES.len() * ALL_INTENT_STATUSES.len(), 49);
}

#[test]
fn sent_and_cancelled_have_no_way_out() {
    for terminal in [Sent, Cancelled] {
        for to in ALL_INTENT_STATUSES {
            assert!(!terminal.can_transition_to(to), "{terminal:?} -> {to:?}");
            assert_eq!(
                terminal.transition_to(to),
                Err(IllegalTransition { from: terminal, to })
            );
        }
    }
}

#[test]
fn illegal_transition_error_names_both_ends() {
    let error = Sent.transition_to(Pending).unwrap_err();
    assert_eq!(
        error.to_string(),
        "illegal intent transition Sent -> Pending"
    );
}

#[test]
fn terminal_and_recoverable_statuses() {
    // (status, is_terminal, is_recoverable)
    let expected = [
        (Pending, false, true),
        (Sending, false, true),
        (Committing, false, true),
        (UnknownAfterSend, false, true),
        (Sent, true, false),
        (Failed, false, false),
        (Cancelled, true, false),
    ];
    assert_eq!(expected.map(|(s, _, _)| s), ALL_INTENT_STATUSES);
    for (status, terminal, recoverable) in expected {
        assert_eq!(status.is_terminal(), terminal, "{status:?}.is_terminal()");
        assert_eq!(
            status.is_recoverable(),
            recoverable,
            "{status:?}.is_recoverable()"
        );
        // Terminal means exactly "no outgoing transition".
        let has_exit = ALL_INTENT_STATUSES
            .into_iter()
            .any(|to| status.can_transition_to(to));
        assert_eq!(terminal, !has_exit, "{status:?}");
    }
}

/// From every status the lifecycle can still end: a terminal status is reachable.
#[test]
fn every_status_can_reach_an_end() {
    for start in ALL_INTENT_STATUSES {
        let mut seen = vec![start];
        let mut queue = VecDeque::from([start]);
        while let Some(at) = queue.pop_front() {
            for to in ALL_INTENT_STATUSES {
                if at.can_transition_to(to) && !seen.contains(&to) {
                    seen.push(to);
                    queue.push_back(to);
                }
            }
        }
        assert!(
            seen.iter().any(|s| s.is_terminal()),
            "{start:?} can never end"
        );
        if !start.is_terminal() {
            assert!(seen.contains(&Sent), "{start:?} can never be sent");
        }
    }
}

#[test]
fn wire_spelling_agrees_everywhere() {
    let spellings = [
        (Pending, "pending"),
        (Sending, "sending"),
        (Committing, "committing"),
        (UnknownAfterSend, "unknown_after_send"),
        (Sent, "sent"),
        (Failed, "failed"),
        (Cancelled, "cancelled"),
    ];
    assert_eq!(spellings.map(|(s, _)| s), ALL_INTENT_STATUSES);
    for (status, spelling) in spellings {
        assert_eq!(status.as_str(), spelling);
        assert_eq!(status.to_string(), spelling);
        assert_eq!(IntentStatus::parse(status.as_str()), Some(status));
        assert_eq!(
            serde_json::to_string(&status).unwrap(),
            format!("\"{}\"", status.as_str())
        );
        let decoded: IntentStatus = clawgate_types::from_json(&format!("\"{spelling}\"")).unwrap();
        assert_eq!(decoded, status);
    }
    for not_a_status in [
        "",
        "Pending",
        "PENDING",
        "unknown-after-send",
        "UnknownAfterSend",
        " sent",
    ] {
        assert_eq!(IntentStatus::parse(not_a_status), None, "{not_a_status:?}");
    }
}
