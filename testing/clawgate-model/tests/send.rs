//! The durable send protocol, checked exhaustively to the CI bounds.

use clawgate_model::checker::{Report, check};
use clawgate_model::send::{Adapter, Bug, SendModel};

fn checked(model: &SendModel) -> Report {
    let started = std::time::Instant::now();
    let report = check(model);
    println!(
        "send model, {:?} adapter, {} workers, {} units, {} crashes, bug {:?}: {report} ({:.1?})",
        model.adapter,
        model.workers,
        model.units,
        model.crashes,
        model.bug,
        started.elapsed()
    );
    report
}

#[test]
fn a_reconciling_adapter_delivers_each_final_at_most_once_and_every_event_ends() {
    let report = checked(&SendModel::new(Adapter::Reconciles));
    assert!(report.violation.is_none());
}

#[test]
fn an_adapter_that_cannot_reconcile_never_replays_blindly() {
    let report = checked(&SendModel::new(Adapter::Neither));
    assert!(report.violation.is_none());
}

#[test]
fn an_at_least_once_adapter_still_ends_every_event() {
    let report = checked(&SendModel::new(Adapter::DuplicatesAcceptable));
    assert!(report.violation.is_none());
}

/// The checker finds a violation of `property` and prints its trace.
fn caught(model: &SendModel, property: &str) {
    let report = checked(model);
    let violation = report.violation.expect("the checker finds the violation");
    assert!(
        violation.property.contains(property),
        "expected a violation of {property:?}, found {:?}",
        violation.property
    );
}

#[test]
fn completing_the_inbound_before_the_final_commits_is_caught() {
    let mut model = SendModel::new(Adapter::Reconciles);
    model.bug = Some(Bug::CompleteInboundBeforeCommit);
    caught(
        &model,
        "the inbound event is completed while its final is neither",
    );
}

#[test]
fn replaying_an_unknown_outcome_without_reconciling_is_caught() {
    for adapter in [Adapter::Reconciles, Adapter::Neither] {
        let mut model = SendModel::new(adapter);
        model.bug = Some(Bug::ReplayUnknownWithoutReconciling);
        caught(&model, "at most once");
    }
}

#[test]
fn an_intent_whose_dead_holder_keeps_its_claim_is_caught_by_the_progress_check() {
    let mut model = SendModel::new(Adapter::Reconciles);
    model.bug = Some(Bug::DeadClaimsKept);
    caught(&model, "progress: no end state is reachable");
}

/// Found in the code and since closed: recovery's `sending → unknown_after_send` write, made before it asks the
/// platform, leaves the intent with no `next_attempt_at` and no claim — parked, to every
/// reader — so a turn waiting on it completes its event, and whatever the reconciliation then
/// leads to (a resend that fails, a crash that leaves it parked) happens after the event
/// counts as answered.
#[test]
fn the_write_before_reconciling_lets_a_waiting_turn_complete_early() {
    let mut model = SendModel::new(Adapter::Reconciles);
    model.unknown_before_reconcile = true;
    caught(
        &model,
        "the inbound event is completed while its final is neither",
    );
}

/// The dead letter is recorded and acknowledged before the failure notice's intent is; without
/// the restart's sweep, a crash between the two leaves an event nothing processes again (only
/// `received` records are) and nobody told.
#[test]
fn a_crash_between_the_dead_letter_and_its_notice_without_the_sweep_loses_the_notice() {
    let mut model = SendModel::new(Adapter::Reconciles);
    model.sweep_untold_dead_letters = false;
    caught(&model, "without a final or a failure notice");
}

/// Recording the notice in the dead letter's own step holds without a sweep.
#[test]
fn the_notice_in_the_dead_letters_step_holds_without_the_sweep() {
    let mut model = SendModel::new(Adapter::Reconciles);
    model.notice_with_dead_letter = true;
    model.sweep_untold_dead_letters = false;
    let report = checked(&model);
    assert!(report.violation.is_none());
}
