//! Seeds of the deterministic simulation: every invariant holds for each, a seed replays
//! exactly, and the broken variants are caught. `CLAWGATE_SIM_SEEDS` sets how many seeds
//! (`cargo xtask soak --matrix sim` runs 10,000).
#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::time::Instant;

use clawgate_sim::{AdapterKind, Bug, Config, run_notice_seed, run_seed};

fn seeds(default: u64) -> u64 {
    std::env::var("CLAWGATE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `count` seeds and fails with the first violation's trace.
fn all_hold(config: &Config, count: u64) {
    let started = Instant::now();
    let (mut messages, mut crashes, mut landed) = (0, 0, 0);
    for seed in 0..count {
        match run_seed(seed, config) {
            Ok(run) => {
                messages += run.messages;
                crashes += run.crashes;
                landed += run.landed.len();
            }
            Err(violation) => panic!("{violation}"),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{:?} adapter: {count} seeds, {messages} messages, {crashes} crashes, {landed} units \
         landed; every invariant held ({:.0} seeds/s)",
        config.adapter,
        count as f64 / seconds
    );
    assert!(
        crashes > 0 && messages > 0,
        "the seeds exercised crashes and messages"
    );
}

#[test]
fn every_seed_holds_with_a_reconciling_adapter() {
    all_hold(&Config::new(AdapterKind::Reconciles), seeds(200));
}

#[test]
fn every_seed_holds_with_an_adapter_that_neither_reconciles_nor_repeats() {
    all_hold(&Config::new(AdapterKind::Neither), seeds(100));
}

#[test]
fn a_seed_replays_exactly() {
    let config = Config::new(AdapterKind::Reconciles);
    for seed in 0..20 {
        let first = run_seed(seed, &config).unwrap();
        let second = run_seed(seed, &config).unwrap();
        assert_eq!(first, second, "seed {seed} ran differently the second time");
    }
}

/// The first seed (of a few hundred) whose run breaks `property`; its trace is printed.
fn caught(config: &Config, property: &str) {
    for seed in 0..500 {
        if let Err(violation) = run_seed(seed, config) {
            println!("{violation}");
            assert!(
                violation.property.contains(property),
                "expected a violation of {property:?}, found {}",
                violation.property
            );
            return;
        }
    }
    panic!("no seed of 500 broke {property:?}");
}

#[test]
fn a_turn_that_completes_before_its_reply_commits_is_caught() {
    let mut config = Config::new(AdapterKind::Reconciles);
    config.bug = Some(Bug::CompleteBeforeCommit);
    caught(&config, "completed while its reply");
}

#[test]
fn replaying_unknown_outcomes_on_a_platform_that_does_not_deduplicate_is_caught() {
    caught(
        &Config::new(AdapterKind::ClaimsDuplicatesAcceptable),
        "at most once",
    );
}

#[test]
fn every_notice_seed_holds() {
    let count = seeds(200);
    let started = Instant::now();
    let (mut crashes, mut shown) = (0, 0);
    for seed in 0..count {
        match run_notice_seed(seed, 30) {
            Ok(trace) => {
                crashes += trace.iter().filter(|s| s.starts_with("CRASHED")).count();
                shown += trace
                    .iter()
                    .filter(|s| s.contains("turn: shown [") && !s.ends_with("[]"))
                    .count();
            }
            Err(violation) => panic!("{violation}"),
        }
    }
    println!(
        "notices: {count} seeds, {crashes} crashes, {shown} turns shown a notice; every \
         invariant held ({:.0} seeds/s)",
        count as f64 / started.elapsed().as_secs_f64()
    );
    assert!(
        crashes > 0 && shown > 0,
        "the seeds exercised crashes and notices"
    );
}

#[test]
fn a_notice_seed_replays_exactly() {
    for seed in 0..20 {
        assert_eq!(
            run_notice_seed(seed, 30).unwrap(),
            run_notice_seed(seed, 30).unwrap(),
            "seed {seed} ran differently the second time"
        );
    }
}
