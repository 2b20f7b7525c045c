//! The model's intent transition table is the real one: compared pair by pair, so the two
//! cannot drift apart.

use clawgate_model::send::{ALL_STATUSES, Status};
use clawgate_types::{ALL_INTENT_STATUSES, IntentStatus};

fn real(status: Status) -> IntentStatus {
    match status {
        Status::Pending => IntentStatus::Pending,
        Status::Sending => IntentStatus::Sending,
        Status::Committing => IntentStatus::Committing,
        Status::UnknownAfterSend => IntentStatus::UnknownAfterSend,
        Status::Sent => IntentStatus::Sent,
        Status::Failed => IntentStatus::Failed,
        Status::Cancelled => IntentStatus::Cancelled,
    }
}

#[test]
fn the_model_knows_every_real_status_once() {
    let mut mapped: Vec<IntentStatus> = ALL_STATUSES.into_iter().map(real).collect();
    mapped.sort();
    mapped.dedup();
    let mut all = ALL_INTENT_STATUSES.to_vec();
    all.sort();
    assert_eq!(mapped, all);
}

#[test]
fn the_model_transition_table_is_intent_status_can_transition_to() {
    let mut differences = Vec::new();
    for from in ALL_STATUSES {
        assert_eq!(from.is_terminal(), real(from).is_terminal(), "{from:?}");
        for to in ALL_STATUSES {
            let (model, code) = (
                from.can_transition_to(to),
                real(from).can_transition_to(real(to)),
            );
            if model != code {
                differences.push(format!("{from:?} -> {to:?}: model {model}, code {code}"));
            }
        }
    }
    assert!(differences.is_empty(), "{differences:#?}");
}
