//! The notice protocol, checked exhaustively to the CI bounds.

use clawgate_model::checker::{Report, check};
use clawgate_model::notice::{Bug, NoticeModel};

fn checked(model: &NoticeModel) -> Report {
    let started = std::time::Instant::now();
    let report = check(model);
    println!(
        "notice model, {} watchers, {} events, {} crashes, bug {:?}: {report} ({:.1?})",
        model.watchers,
        model.events,
        model.crashes,
        model.bug,
        started.elapsed()
    );
    report
}

#[test]
fn every_material_event_of_another_actor_leaves_exactly_one_notice() {
    let report = checked(&NoticeModel::new());
    assert!(report.violation.is_none());
}

/// The checker finds a violation of `property` and prints its trace.
fn caught(model: &NoticeModel, property: &str) {
    let report = checked(model);
    let violation = report.violation.expect("the checker finds the violation");
    assert!(
        violation.property.contains(property),
        "expected a violation of {property:?}, found {:?}",
        violation.property
    );
}

fn broken(bug: Bug) -> NoticeModel {
    NoticeModel {
        bug: Some(bug),
        ..NoticeModel::new()
    }
}

#[test]
fn reopening_a_notice_on_a_log_only_event_is_caught() {
    caught(
        &broken(Bug::ReopenOnLogOnly),
        "opened at the log-only event",
    );
}

#[test]
fn a_notice_for_the_watchers_own_event_is_caught() {
    caught(
        &broken(Bug::NoSelfSuppression),
        "a notice for its own event",
    );
}

#[test]
fn an_ack_that_never_reopens_is_caught() {
    caught(&broken(Bug::AckWithoutReopen), "left no pending notice");
}

#[test]
fn a_rebuild_from_a_read_older_than_a_queue_change_is_caught() {
    caught(
        &broken(Bug::RebuildWithoutGenerationCheck),
        "the queue does not hold every pending notice",
    );
}

/// `record` queues the notices its append opened after the write. Without skipping those taken
/// since, a rebuild (the change feed announces this process's own commits too) queues the
/// notice first, the watcher's turn consumes and acks it, and the late queueing puts the
/// acknowledged notice back — shown once more.
#[test]
fn a_late_queueing_of_a_notice_taken_since_its_append_is_caught() {
    caught(&broken(Bug::EnqueueTakenNotice), "one notice per pair");
}

/// The same steps queued in the append's own write (no window at all) also hold.
#[test]
fn queueing_in_the_appends_step_holds_too() {
    let model = NoticeModel {
        enqueue_after_append: false,
        ..NoticeModel::new()
    };
    assert!(checked(&model).violation.is_none());
}
