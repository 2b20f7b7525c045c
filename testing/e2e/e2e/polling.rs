//! The polling watermark against random poll batches, completion orders and crashes, on a real
//! state file: the durable watermark never passes an update that was not finished, and after
//! the source is drained every update has been finished.

use std::collections::BTreeSet;
use std::sync::Arc;

use clawgate_messages::PollingWatermark;
use clawgate_store::{WatermarkKey, WatermarkStore};
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::ManualClock;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    /// Poll up to this many updates from the next offset.
    Poll(usize),
    /// Finish the in-flight update at this position (modulo how many are in flight).
    Finish(usize),
    /// The process dies: in-flight updates are forgotten; only the durable watermark remains.
    Crash,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1usize..5).prop_map(Step::Poll),
        4 => any::<usize>().prop_map(Step::Finish),
        1 => Just(Step::Crash),
    ]
}

fn key() -> WatermarkKey {
    WatermarkKey {
        channel: "qa".into(),
        account_id: "bot".into(),
        source: "updates".into(),
    }
}

async fn open(store: &Arc<SqliteStore>) -> PollingWatermark {
    PollingWatermark::open(store.clone(), Arc::new(ManualClock::new(0)), key())
        .await
        .unwrap()
}

async fn run(gaps: Vec<i64>, steps: Vec<Step>) {
    // The platform's updates: increasing ids with gaps, like Telegram's.
    let mut ids = Vec::new();
    let mut id = 0;
    for gap in gaps {
        id += gap;
        ids.push(id);
    }
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let mut cursor = open(&store).await;
    let mut in_flight: Vec<i64> = Vec::new();
    let mut finished: BTreeSet<i64> = BTreeSet::new();
    let check = |durable: i64, finished: &BTreeSet<i64>| {
        for id in ids.iter().filter(|id| **id <= durable) {
            assert!(
                finished.contains(id),
                "watermark {durable} passed unfinished update {id}"
            );
        }
    };
    for step in steps {
        match step {
            Step::Poll(n) => {
                // The source returns what is at or after the offset: replays included.
                let offset = cursor.next_offset();
                for &id in ids.iter().filter(|id| **id >= offset).take(n) {
                    if cursor.accept(id) {
                        in_flight.push(id);
                    }
                }
            }
            Step::Finish(at) if !in_flight.is_empty() => {
                let id = in_flight.remove(at % in_flight.len());
                finished.insert(id);
                cursor.finish(id).await.unwrap();
            }
            Step::Finish(_) => {}
            Step::Crash => {
                in_flight.clear();
                cursor = open(&store).await;
            }
        }
        let durable = store
            .load_watermark(&key())
            .await
            .unwrap()
            .map_or(0, |(w, _)| w);
        assert_eq!(
            durable,
            cursor.safe(),
            "the watermark in memory is the durable one"
        );
        check(durable, &finished);
    }
    // Drain: poll and finish until the source is exhausted.
    loop {
        let batch: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| *id >= cursor.next_offset())
            .take(3)
            .collect();
        if batch.is_empty() {
            break;
        }
        for id in batch {
            if cursor.accept(id) {
                finished.insert(id);
                cursor.finish(id).await.unwrap();
            }
        }
        // Updates accepted before and never finished are still in flight: finish them too.
        for id in std::mem::take(&mut in_flight) {
            finished.insert(id);
            cursor.finish(id).await.unwrap();
        }
    }
    let durable = store
        .load_watermark(&key())
        .await
        .unwrap()
        .map_or(0, |(w, _)| w);
    assert_eq!(
        durable,
        ids.last().copied().unwrap_or(0),
        "drained: the watermark reaches the last update"
    );
    assert_eq!(
        finished,
        ids.iter().copied().collect(),
        "every update finished at least once"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_watermark_never_passes_an_unfinished_update(
        gaps in proptest::collection::vec(1i64..4, 1..25),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(run(gaps, steps));
    }
}
