//! Stale-state notices: the text, and the in-memory queue that mirrors durable cursors.
//!
//! The durable cursor (`notified_version` set) is the truth; this queue is a cache of it for
//! the watchers this process serves, rebuilt from cursors after a restart or another process's
//! commit. Invariants: at most one notice per (watcher, target); a notice's text depends only on
//! the target and the acknowledged version, so it is byte-identical while pending; a main-session
//! watcher is woken once per batch of notices until it consumes them.

use std::collections::{BTreeMap, BTreeSet};

use clawgate_store::WatchCursor;
use clawgate_types::{SessionKey, StateVersion};
use serde::Serialize;

/// One pending stale-state notice.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Notice {
    pub watcher: SessionKey,
    pub target: SessionKey,
    /// The version the watcher last acknowledged: where its reconcile call starts.
    pub changes_since: StateVersion,
    /// Set when the target was deleted: who deleted it. This is the watcher's last notice on
    /// the target; consuming it ends the watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_by: Option<String>,
}

impl Notice {
    /// The notice of a cursor with a pending notice.
    pub fn from_cursor(cursor: &WatchCursor) -> Option<Notice> {
        cursor.notified_version.map(|_| Notice {
            watcher: cursor.watcher_key.clone(),
            target: cursor.target_key.clone(),
            changes_since: cursor.acked_version,
            deleted_by: cursor.target_deleted_by.clone(),
        })
    }

    /// The line placed in the watcher's prompt: names the target and the exact reconcile call
    /// (or, for a deleted target, who deleted it). Depends only on the durable cursor, so it is
    /// byte-identical while pending, after a restart too.
    pub fn text(&self) -> String {
        let target = &self.target;
        if let Some(by) = &self.deleted_by {
            return format!(
                "Session \"{target}\" was deleted (by {by}). Its watch has ended: do not wait on \
                 it or send to it."
            );
        }
        format!(
            "Session \"{target}\" changed (another actor). Reconcile before acting: \
             session_status sessionKey \"{target}\" changesSince {}.",
            self.changes_since
        )
    }

    /// The control API address of the reconcile call: the target's status with the changes
    /// since the acknowledged version, under `control_url` (the gateway's `http://host:port`).
    pub fn status_url(&self, control_url: &str) -> String {
        format!(
            "{}/v1/sessions/{}?changesSince={}",
            control_url.trim_end_matches('/'),
            path_segment(self.target.as_str()),
            self.changes_since
        )
    }

    /// [`Notice::text`] followed by the [`Notice::status_url`] link when the control API's
    /// address is known. Still byte-identical while pending: the address is fixed per run.
    pub fn text_with_link(&self, control_url: Option<&str>) -> String {
        match control_url {
            Some(url) => format!("{} Status: {}", self.text(), self.status_url(url)),
            None => self.text(),
        }
    }
}

/// `text` as one URL path segment: unreserved characters and `:` (which session keys are
/// made of) stay, every other byte is percent-encoded, so a key with `/`, `?` or `#` in its
/// conversation id still names the one session.
fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Called to wake a main session at once when a notice is queued for it.
pub trait HeartbeatHook: Send + Sync {
    /// Must not block: post to the gateway's scheduler and return.
    fn wake(&self, session: &SessionKey);
}

/// No heartbeat wiring: main sessions see their notices on their next turn, like nested ones.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHeartbeat;

impl HeartbeatHook for NoHeartbeat {
    fn wake(&self, _: &SessionKey) {}
}

#[derive(Debug, Default)]
pub(crate) struct NoticeQueue {
    by_watcher: BTreeMap<SessionKey, BTreeMap<SessionKey, Notice>>,
    /// Watchers woken since they last consumed: further notices do not wake them again.
    woken: BTreeSet<SessionKey>,
    /// Bumped by every local change, so a rebuild computed from an older read of the store
    /// is not applied.
    generation: u64,
    /// (watcher, target) pairs taken for consumption whose durable ack has not finished: a
    /// rebuild must not queue them again from a read that still shows them pending.
    consuming: BTreeSet<(SessionKey, SessionKey)>,
    /// The generations at which appends still in flight read the queue (how many at each).
    appends: BTreeMap<u64, usize>,
    /// Notices taken for a turn while an append was in flight, with the generation they were
    /// taken at: a notice the append opened and finds here was found by a rebuild first and
    /// shown already. Kept only as far back as the oldest append in flight.
    taken_during_appends: Vec<(u64, Notice)>,
}

impl NoticeQueue {
    /// Queues a notice; true when it is new or replaces a different one for the pair.
    pub(crate) fn insert(&mut self, notice: Notice) -> bool {
        self.generation += 1;
        let slot = self.by_watcher.entry(notice.watcher.clone()).or_default();
        match slot.get(&notice.target) {
            Some(existing) if *existing == notice => false,
            _ => {
                slot.insert(notice.target.clone(), notice);
                true
            }
        }
    }

    /// Marks a watcher woken; true when it was not already (so the hook runs once).
    pub(crate) fn mark_woken(&mut self, watcher: &SessionKey) -> bool {
        self.woken.insert(watcher.clone())
    }

    pub(crate) fn pending(&self, watcher: &SessionKey) -> Vec<Notice> {
        self.by_watcher
            .get(watcher)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn take(&mut self, watcher: &SessionKey) -> Vec<Notice> {
        self.generation += 1;
        self.woken.remove(watcher);
        let taken: Vec<Notice> = self
            .by_watcher
            .remove(watcher)
            .map(|m| m.into_values().collect())
            .unwrap_or_default();
        self.taking(&taken);
        taken
    }

    fn taking(&mut self, taken: &[Notice]) {
        self.consuming
            .extend(taken.iter().map(|n| (n.watcher.clone(), n.target.clone())));
        if !self.appends.is_empty() {
            let at = self.generation;
            self.taken_during_appends
                .extend(taken.iter().map(|n| (at, n.clone())));
        }
    }

    /// An append starts: returns the generation it read the queue at.
    pub(crate) fn begin_append(&mut self) -> u64 {
        *self.appends.entry(self.generation).or_default() += 1;
        self.generation
    }

    /// The append that began at `read_at` ended: what was taken before the oldest append still
    /// in flight is forgotten.
    pub(crate) fn end_append(&mut self, read_at: u64) {
        if let Some(count) = self.appends.get_mut(&read_at) {
            *count -= 1;
            if *count == 0 {
                self.appends.remove(&read_at);
            }
        }
        match self.appends.keys().next() {
            Some(&oldest) => self.taken_during_appends.retain(|(at, _)| *at > oldest),
            None => self.taken_during_appends.clear(),
        }
    }

    /// Queues a notice an append that read the queue at `read_at` opened, unless that very
    /// notice was taken for a turn since (a rebuild found it first): queueing it again would
    /// show it twice. True when it is new or replaces a different one for the pair.
    pub(crate) fn insert_opened(&mut self, notice: Notice, read_at: u64) -> bool {
        let shown = self
            .taken_during_appends
            .iter()
            .any(|(at, taken)| *at > read_at && *taken == notice);
        !shown && self.insert(notice)
    }

    /// Takes those of `watcher`'s notices that are still exactly as `shown` (a notice
    /// replaced meanwhile stays: its newer text was not shown). Returns them and whether other
    /// notices remain queued for the watcher.
    pub(crate) fn take_shown(
        &mut self,
        watcher: &SessionKey,
        shown: &[Notice],
    ) -> (Vec<Notice>, bool) {
        self.generation += 1;
        let Some(queued) = self.by_watcher.get_mut(watcher) else {
            return (Vec::new(), false);
        };
        let mut taken = Vec::new();
        for notice in shown.iter().filter(|n| &n.watcher == watcher) {
            if queued.get(&notice.target) == Some(notice) {
                queued.remove(&notice.target);
                taken.push(notice.clone());
            }
        }
        let remain = !queued.is_empty();
        if !remain {
            self.by_watcher.remove(watcher);
        }
        self.woken.remove(watcher);
        self.taking(&taken);
        (taken, remain)
    }

    pub(crate) fn forget_session(&mut self, session: &SessionKey, as_target: bool) {
        self.generation += 1;
        self.by_watcher.remove(session);
        self.woken.remove(session);
        if as_target {
            for notices in self.by_watcher.values_mut() {
                notices.remove(session);
            }
            self.by_watcher.retain(|_, n| !n.is_empty());
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn all(&self) -> Vec<Notice> {
        self.by_watcher
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// The durable ack of a taken notice finished (committed or failed): a read taken before
    /// it is stale, and rebuilds may queue the pair again.
    pub(crate) fn consumed(&mut self, notice: &Notice) {
        self.generation += 1;
        self.consuming
            .remove(&(notice.watcher.clone(), notice.target.clone()));
    }

    /// Makes the queue equal `durable` (the pending notices read from the store) and returns
    /// the notices that were added or changed — unless the queue changed since that read
    /// (`generation` moved): a stale read could re-add a notice consumed meanwhile, so it is not
    /// applied at all and `None` says to read again.
    pub(crate) fn rebuild(&mut self, durable: Vec<Notice>, read_at: u64) -> Option<Vec<Notice>> {
        if self.generation != read_at {
            return None;
        }
        let keep: BTreeSet<(SessionKey, SessionKey)> = durable
            .iter()
            .map(|n| (n.watcher.clone(), n.target.clone()))
            .collect();
        for (watcher, notices) in &mut self.by_watcher {
            notices.retain(|target, _| keep.contains(&(watcher.clone(), target.clone())));
        }
        self.by_watcher.retain(|_, n| !n.is_empty());
        let by_watcher = &self.by_watcher;
        self.woken.retain(|w| by_watcher.contains_key(w));
        let mut fresh = Vec::new();
        for notice in durable {
            let pair = (notice.watcher.clone(), notice.target.clone());
            if self.consuming.contains(&pair) {
                continue;
            }
            if self.insert(notice.clone()) {
                fresh.push(notice);
            }
        }
        Some(fresh)
    }
}
