//! Giving freed heap back to the operating system once a burst is over.
//!
//! A burst of conversations (thousands of turns queued at once) raises the heap's high-water
//! mark; glibc's allocator keeps the freed pages of its per-thread arenas mapped, so the
//! gateway's RSS stays at the burst's peak long after everything it held was freed. Once the
//! gateway falls idle (its agent sessions closed, no turn running), `malloc_trim(0)` returns
//! every whole free page of every arena. Elsewhere (musl, other systems) this does nothing.

/// Returns the allocator's free pages to the system (glibc), else nothing.
pub(crate) fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim takes no pointers and only rearranges the allocator's own free lists
    // under its locks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
