//! The durable "safe completed" watermark of a polling source (Telegram's getUpdates offset is
//! the model): it only ever moves past updates that are finished, so an update accepted but not
//! finished before a crash is fetched again after the restart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use clawgate_store::{WatermarkKey, WatermarkStore};

use crate::{Clock, MessagesError};

/// Tracks the updates of one polling source between fetch and finish.
pub struct PollingWatermark {
    store: Arc<dyn WatermarkStore>,
    clock: Arc<dyn Clock>,
    key: WatermarkKey,
    /// Every update at or below this id is finished (durable).
    safe: i64,
    /// Accepted and not finished yet (including failed ones waiting for a retry).
    unfinished: BTreeSet<i64>,
    /// Finished above the watermark, waiting for the updates below them.
    finished: BTreeSet<i64>,
    /// The resume checkpoint valid at the watermark, and those of accepted updates.
    checkpoint: Option<String>,
    checkpoints: BTreeMap<i64, String>,
}

impl std::fmt::Debug for PollingWatermark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollingWatermark")
            .field("key", &self.key)
            .field("safe", &self.safe)
            .field("unfinished", &self.unfinished.len())
            .finish()
    }
}

impl PollingWatermark {
    /// Loads the source's durable watermark (0 when it never advanced).
    pub async fn open(
        store: Arc<dyn WatermarkStore>,
        clock: Arc<dyn Clock>,
        key: WatermarkKey,
    ) -> Result<PollingWatermark, MessagesError> {
        let (safe, checkpoint) = store.load_watermark(&key).await?.unwrap_or((0, None));
        Ok(PollingWatermark {
            store,
            clock,
            key,
            safe,
            unfinished: BTreeSet::new(),
            finished: BTreeSet::new(),
            checkpoint,
            checkpoints: BTreeMap::new(),
        })
    }

    /// The offset to fetch from: the first update that is not known finished.
    pub fn next_offset(&self) -> i64 {
        self.safe + 1
    }

    /// The durable watermark: every update at or below it is finished.
    pub fn safe(&self) -> i64 {
        self.safe
    }

    /// The source's resume checkpoint valid at the watermark, if it gave one.
    pub fn checkpoint(&self) -> Option<&str> {
        self.checkpoint.as_deref()
    }

    /// [`Self::accept`] for an update that carries the checkpoint valid once it is finished.
    pub fn accept_with_checkpoint(&mut self, update_id: i64, checkpoint: Option<String>) -> bool {
        let accepted = self.accept(update_id);
        if let (true, Some(checkpoint)) = (accepted, checkpoint) {
            self.checkpoints.insert(update_id, checkpoint);
        }
        accepted
    }

    /// Takes a fetched update in; `false` when it is already finished or already in flight
    /// (a replayed poll), so it must not be processed again.
    pub fn accept(&mut self, update_id: i64) -> bool {
        if update_id <= self.safe || self.finished.contains(&update_id) {
            return false;
        }
        self.unfinished.insert(update_id)
    }

    /// Marks an update finished (handled, or dead-lettered) and moves the durable watermark as
    /// far as every update below it allows. Returns the new watermark.
    pub async fn finish(&mut self, update_id: i64) -> Result<i64, MessagesError> {
        if !self.unfinished.remove(&update_id) {
            return Ok(self.safe);
        }
        self.finished.insert(update_id);
        // Everything finished below the lowest unfinished update (or all of it) is safe.
        let limit = self.unfinished.first().copied().unwrap_or(i64::MAX);
        let mut safe = self.safe;
        while let Some(&next) = self.finished.first() {
            if next >= limit {
                break;
            }
            safe = next;
            self.finished.remove(&next);
        }
        if safe > self.safe {
            // The checkpoint of the last update passed (if it carried one) is where the source
            // resumes; checkpoints below the new watermark are spent.
            let mut later = self.checkpoints.split_off(&(safe + 1));
            std::mem::swap(&mut later, &mut self.checkpoints);
            let checkpoint = later.remove(&safe);
            self.safe = self
                .store
                .advance_watermark(&self.key, safe, checkpoint.as_deref(), self.clock.now_ms())
                .await?;
            self.checkpoint = checkpoint;
        }
        Ok(self.safe)
    }
}
