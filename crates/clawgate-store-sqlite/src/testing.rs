//! How every crate's tests open a SQLite state directory (feature `testing`).
#![allow(clippy::missing_panics_doc)]

use std::path::Path;

use crate::{SqliteOptions, SqliteStore};

/// Opens (creating and migrating if needed) the SQLite store of a test's state directory with
/// the default options, as the tests of every crate do; panics naming the directory and the
/// store's error.
pub fn open_store(dir: &Path) -> SqliteStore {
    open_store_with(dir, SqliteOptions::default())
}

/// [`open_store`] with the given options (a synchronous mode, a size cap, a commit hook).
pub fn open_store_with(dir: &Path, options: SqliteOptions) -> SqliteStore {
    SqliteStore::open_state_dir(dir, options)
        .unwrap_or_else(|e| panic!("opening the test store in {}: {e}", dir.display()))
}
