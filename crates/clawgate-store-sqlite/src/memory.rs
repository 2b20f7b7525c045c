//! What SQLite's page caches hold, and giving it back when the gateway falls idle.
//!
//! Each connection keeps up to `cache_size` pages (2 MiB by default) of the database it read.
//! A burst over a large database fills every connection's cache, and that memory would stay as
//! resident memory of an idle gateway. The bundled SQLite is built with
//! `SQLITE_ENABLE_MEMORY_MANAGEMENT` (libsqlite3-sys), so all connections of the process share
//! one page-cache group and one call frees every connection's unused pages, under SQLite's own
//! mutex, whatever thread the connections run on. A page freed is read again when needed.

/// Frees the clean page-cache pages no statement holds, on every SQLite connection of this
/// process, and returns how many bytes SQLite freed. Safe to call at any time.
pub fn release_page_caches() -> usize {
    #[allow(unsafe_code)]
    // SAFETY: sqlite3_release_memory takes no pointers; with the memory-management build it
    // walks the shared page-cache LRU under the page cache's global mutex and frees only pages
    // no connection has pinned.
    let freed = unsafe { rusqlite::ffi::sqlite3_release_memory(i32::MAX) };
    usize::try_from(freed).unwrap_or(0)
}

/// The bytes SQLite has allocated in this process now (`sqlite3_memory_used`).
pub fn sqlite_memory_used() -> u64 {
    #[allow(unsafe_code)]
    // SAFETY: sqlite3_memory_used takes no arguments and reads a counter under SQLite's mutex.
    let used = unsafe { rusqlite::ffi::sqlite3_memory_used() };
    u64::try_from(used).unwrap_or(0)
}
