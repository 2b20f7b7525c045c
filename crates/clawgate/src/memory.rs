//! Giving freed heap back to the operating system once a burst is over.
//!
//! A burst of conversations (thousands of turns queued at once) raises the heap's high-water
//! mark. The binary allocates with mimalloc (`main.rs`), which keeps a thread's emptied pages
//! and purges freed arena memory only when that thread next does allocator work, so an idle
//! gateway's RSS would stay at the burst's peak long after everything it held was freed. Once
//! the gateway falls idle (its agent sessions closed, no turn running) `release_free_heap`
//! collects the calling thread's heap and purges every arena, and asks each runtime worker to
//! collect its own heap the next time it parks ([`on_worker_park`], the runtime's park hook:
//! an idle worker parks at once). SQLite allocates with the system allocator: its page caches
//! (up to 2 MiB per connection, full after a burst over a large database) are released first,
//! then glibc's free pages are trimmed.
//!
//! Idle blocking threads (SQLite reads, file work) each keep an allocator heap that only they
//! collect, and a steady trickle of small blocking jobs (an idle gateway's once-a-second checks)
//! wakes them in turn often enough that none reaches the runtime's 10 s keep-alive: a burst's
//! twenty threads stayed for good, holding about 2 MiB each. With a keep-alive of
//! [`BLOCKING_THREAD_KEEP_ALIVE`] only the few threads the trickle needs stay; a thread that
//! ends hands its freed pages back.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long an idle blocking thread of the runtime waits for work before it ends.
pub const BLOCKING_THREAD_KEEP_ALIVE: Duration = Duration::from_secs(1);

/// Bumped by each release; a worker collects once per value it has not seen.
static RELEASES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COLLECTED: Cell<u64> = const { Cell::new(0) };
}

/// Returns the allocators' free pages to the system: mimalloc's of this thread and every
/// arena now, each runtime worker's when it next parks, and, after SQLite's page caches are
/// released, glibc's (Linux) now.
pub(crate) fn release_free_heap() {
    let release = RELEASES.fetch_add(1, Ordering::SeqCst) + 1;
    COLLECTED.with(|seen| seen.set(release));
    collect_this_thread();
    let sqlite_freed = clawgate_store_sqlite::release_page_caches();
    tracing::debug!(sqlite_freed, "idle: free heap given back");
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim takes no pointers and only rearranges the allocator's own free lists
    // under its locks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The runtime's park hook: a worker that has not collected since the last release does so
/// (one atomic load otherwise).
pub fn on_worker_park() {
    let release = RELEASES.load(Ordering::Relaxed);
    if release == 0 {
        return;
    }
    let due = COLLECTED.with(|seen| {
        let due = seen.get() != release;
        seen.set(release);
        due
    });
    if due {
        collect_this_thread();
    }
}

fn collect_this_thread() {
    #[allow(unsafe_code)]
    // SAFETY: mi_collect takes no pointers; it frees the calling thread's empty pages and
    // purges unused arena memory under mimalloc's own synchronisation. When mimalloc is not
    // the global allocator (the library's tests) it has nothing to collect.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}
