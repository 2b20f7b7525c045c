//! Integration tests of the SQLite backend: the conformance suite on real files and in memory,
//! plus the failure modes users hit (read-only, corrupt, locked, full, newer schema).
#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod faults;
mod memory;
mod migrations;

use clawgate_store_sqlite::{SqliteOptions, SqliteStore};

fn open_file(dir: &std::path::Path) -> SqliteStore {
    clawgate_store_sqlite::testing::open_store(dir)
}

fn open_memory(_: &std::path::Path) -> SqliteStore {
    SqliteStore::open_in_memory(SqliteOptions::default()).unwrap()
}

mod sqlite_file {
    use super::*;
    clawgate_store::store_conformance_tests!(open = open_file, persistent = true);
}

mod sqlite_memory {
    use super::*;
    clawgate_store::store_conformance_tests!(open = open_memory, persistent = false);
}
