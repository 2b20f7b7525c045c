//! The embedded SQLite backend of clawgate's storage ports (layer 1): one database file per
//! state directory, WAL, one writer thread with group commit, and a pool of read-only
//! connections. The ports, the model and the conformance suite are `clawgate-store`'s.
//!
//! Invariants:
//! * a write reported `Ok` is committed (with `synchronous=FULL`, durable across power loss);
//! * no operation is half-applied: each port method is one transaction;
//! * migrations never delete stored intents; stored payloads carry a format version.

// The README's example is compiled and run as a doctest, so the packaged README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

mod channels;
mod errors;
mod inbound;
mod intents;
mod memory;
mod migrate;
mod notices;
mod registry;
mod signals;
mod wal_vfs;
mod writer;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, OpenFlags};

pub use memory::{release_page_caches, sqlite_memory_used};
pub use migrate::{MIGRATIONS, Migration, MigrationStatus, SCHEMA_VERSION};

use self::errors::{DbResult, ErrorContext, Phase};
use self::writer::{Ack, Isolation, WalSync, Writer};
pub use self::writer::{CommitHook, CommitStage, CommitVerdict};
use clawgate_store::{StoreError, StoreResult};

/// The file name of the state database inside a state directory.
pub const STATE_DB_FILE: &str = "state.db";

/// How hard SQLite syncs each commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Sync the WAL before any commit is reported: durable across power loss. The default.
    /// The fsync runs on its own thread, overlapping the next batch (see the writer).
    #[default]
    Full,
    /// Durable across process crashes only; the last commits may be lost on power loss.
    Normal,
}

/// Tunables of the SQLite backend.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    pub synchronous: Synchronous,
    /// How long a connection waits for another process's lock before failing.
    pub busy_timeout: Duration,
    /// Read-only connections in the pool.
    pub readers: u32,
    /// Most logical writes committed in one transaction.
    pub max_batch: usize,
    /// Caps the database size in pages (`PRAGMA max_page_count`); writes past it fail as
    /// [`StoreError::DiskFull`]. `None` leaves SQLite's own limit.
    pub max_page_count: Option<u64>,
    /// The size, in bytes, the write-ahead log is cut back to once a checkpoint has emptied it
    /// (`PRAGMA journal_size_limit`). SQLite reuses the file from its start after each
    /// checkpoint and otherwise keeps its largest size until the last connection closes: a
    /// backlog, or a long read that held checkpoints back, would keep that disk for as long as
    /// the gateway runs. Well above the size between two automatic checkpoints (about 4 MiB), so
    /// steady writing never regrows a cut file.
    pub wal_size_limit: u64,
    /// Called by the writer thread around each transaction's `COMMIT` (a test hook: the
    /// gateway's crash points abort the process there). `None`, the default, costs one check
    /// per batch.
    pub commit_hook: Option<CommitHook>,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            readers: 4,
            max_batch: 512,
            max_page_count: None,
            wal_size_limit: 64 * 1024 * 1024,
            commit_hook: None,
        }
    }
}

/// Where reads run.
#[derive(Debug)]
enum Readers {
    Pool(r2d2::Pool<SqliteConnectionManager>),
    /// An in-memory database has one connection: reads queue behind writes on the writer.
    Writer,
}

#[derive(Debug)]
struct Inner {
    ctx: ErrorContext,
    readers: Readers,
    // Dropped last: joining the writer flushes queued writes.
    writer: Writer,
}

/// The SQLite implementation of every storage port. Cheap to clone (shared handle).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) `state.db` in an existing state directory.
    pub fn open_state_dir(dir: &Path, options: SqliteOptions) -> StoreResult<SqliteStore> {
        if !dir.is_dir() {
            return Err(StoreError::MissingDirectory {
                path: dir.to_path_buf(),
            });
        }
        SqliteStore::open_file(&dir.join(STATE_DB_FILE), options)
    }

    /// Opens (creating and migrating if needed) a database file.
    pub fn open_file(path: &Path, options: SqliteOptions) -> StoreResult<SqliteStore> {
        let ctx = ErrorContext {
            path: path.to_path_buf(),
            busy_timeout_ms: u64::try_from(options.busy_timeout.as_millis()).unwrap_or(u64::MAX),
        };
        check_file_writable(path)?;
        create_private(path);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = match wal_vfs::register() {
            Ok(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs),
            Err(code) => {
                tracing::warn!(
                    code,
                    "could not register the WAL batching VFS; using SQLite's default"
                );
                Connection::open_with_flags(path, flags)
            }
        }
        .map_err(|e| ctx.map_sqlite(e, Phase::Open))?;
        configure_writer(&conn, &options, true).map_err(|e| ctx.map(e, Phase::Open))?;
        migrate::migrate(&mut conn, &ctx)?;

        let manager = SqliteConnectionManager::file(path)
            .with_flags(OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            .with_init({
                let timeout = options.busy_timeout;
                move |c| {
                    c.set_prepared_statement_cache_capacity(64);
                    c.busy_timeout(timeout)?;
                    c.pragma_update(None, "query_only", true)
                }
            });
        let pool = r2d2::Pool::builder()
            .max_size(options.readers.max(1))
            .min_idle(Some(1))
            .build(manager)
            .map_err(|e| StoreError::Backend(Box::new(e)))?;
        // FULL's durability, with each batch's fsync overlapping the next batch (see `writer`).
        let sync = match options.synchronous {
            Synchronous::Full => WalSync::Pipelined(wal_path(path)),
            Synchronous::Normal => WalSync::AtCommit,
        };
        let writer = Writer::spawn(
            conn,
            options.max_batch,
            ctx.clone(),
            sync,
            options.commit_hook.clone(),
        )?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                ctx,
                readers: Readers::Pool(pool),
                writer,
            }),
        })
    }

    /// A private in-memory database (for tests and throwaway runs; nothing survives).
    pub fn open_in_memory(options: SqliteOptions) -> StoreResult<SqliteStore> {
        let ctx = ErrorContext {
            path: PathBuf::from(":memory:"),
            busy_timeout_ms: 0,
        };
        let mut conn = Connection::open_in_memory().map_err(|e| ctx.map_sqlite(e, Phase::Open))?;
        configure_writer(&conn, &options, false).map_err(|e| ctx.map(e, Phase::Open))?;
        migrate::migrate(&mut conn, &ctx)?;
        let writer = Writer::spawn(
            conn,
            options.max_batch,
            ctx.clone(),
            WalSync::AtCommit,
            options.commit_hook.clone(),
        )?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                ctx,
                readers: Readers::Writer,
                writer,
            }),
        })
    }

    /// The database file (`:memory:` for in-memory stores).
    pub fn path(&self) -> &Path {
        &self.inner.ctx.path
    }

    /// Runs `f` in the next group commit, in its own savepoint.
    pub(crate) async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> DbResult<T> + Send + 'static,
    {
        self.inner
            .writer
            .write(&self.inner.ctx, Isolation::Savepoint, Ack::Durable, f)
            .await
    }

    /// Runs `f` in the next group commit without a savepoint: `f` changes the database with one
    /// statement at most and fails only before or in that statement (the hot writes of a send).
    pub(crate) async fn write_statement<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> DbResult<T> + Send + 'static,
    {
        self.write_statement_acked(Ack::Durable, f).await
    }

    /// [`write_statement`](Self::write_statement), answered when `ack` says (see [`Ack`]).
    pub(crate) async fn write_statement_acked<T, F>(&self, ack: Ack, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> DbResult<T> + Send + 'static,
    {
        self.inner
            .writer
            .write(&self.inner.ctx, Isolation::Statement, ack, f)
            .await
    }

    /// Deletes the rows of `table` that `oldest` picks — a `SELECT rowid …` of the oldest rows
    /// before `?1`, at most `?2` — in one write; returns how many (retention, in slices).
    pub(crate) async fn delete_oldest(
        &self,
        table: &'static str,
        oldest: &'static str,
        before: i64,
        limit: u32,
    ) -> StoreResult<u64> {
        self.write_statement(move |conn| {
            let n = conn
                .prepare_cached(&format!("DELETE FROM {table} WHERE rowid IN ({oldest})"))?
                .execute(rusqlite::params![before, limit])?;
            Ok(n as u64)
        })
        .await
    }

    pub(crate) fn error_context(&self) -> &ErrorContext {
        &self.inner.ctx
    }

    /// Types an error raised outside a database job (encoding on the caller's task).
    pub(crate) fn map_error(&self, error: errors::DbError) -> StoreError {
        self.inner.ctx.map(error, Phase::Operate)
    }

    /// Runs `f` on a read-only connection (a consistent snapshot of the last commit).
    pub(crate) async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> DbResult<T> + Send + 'static,
    {
        match &self.inner.readers {
            Readers::Writer => self.write(f).await,
            Readers::Pool(pool) => {
                let pool = pool.clone();
                let ctx = self.inner.ctx.clone();
                tokio::task::spawn_blocking(move || {
                    let conn = pool.get().map_err(|e| StoreError::Backend(Box::new(e)))?;
                    f(&conn).map_err(|e| ctx.map(e, Phase::Operate))
                })
                .await
                .map_err(|e| StoreError::Backend(Box::new(e)))?
            }
        }
    }
}

/// SQLite's write-ahead log beside a database file.
fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Applies pending migrations to the database file and reports every migration's state,
/// without starting the writer (what `migrate` commands use).
pub fn migrate_file(path: &Path, options: &SqliteOptions) -> StoreResult<Vec<MigrationStatus>> {
    let store = SqliteStore::open_file(path, options.clone())?;
    drop(store);
    migration_status(path, options)
}

/// Reports every migration's state in an existing database file without changing it.
pub fn migration_status(path: &Path, options: &SqliteOptions) -> StoreResult<Vec<MigrationStatus>> {
    let ctx = ErrorContext {
        path: path.to_path_buf(),
        busy_timeout_ms: u64::try_from(options.busy_timeout.as_millis()).unwrap_or(u64::MAX),
    };
    if !path.exists() {
        if path
            .parent()
            .is_some_and(|p| !p.as_os_str().is_empty() && !p.is_dir())
        {
            return Err(StoreError::MissingDirectory {
                path: path.parent().map(Path::to_path_buf).unwrap_or_default(),
            });
        }
        return Ok(MIGRATIONS
            .iter()
            .map(|m| MigrationStatus {
                version: m.version,
                name: m.name.to_owned(),
                applied_at: None,
            })
            .collect());
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| ctx.map_sqlite(e, Phase::Open))?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| ctx.map_sqlite(e, Phase::Open))?;
    migrate::status(&conn, &ctx)
}

/// Refuses a database file whose permission bits forbid writing, even for root: an operator
/// who marked the state read-only meant it.
/// A new database file is created readable by its owner only (0600) before SQLite opens it:
/// SQLite gives its WAL and shared-memory files the database file's permissions, and the
/// database holds every conversation. An existing file is left as it is; a failure here is
/// left to SQLite's own open to report.
fn create_private(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
}

fn check_file_writable(path: &Path) -> StoreResult<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.permissions().readonly() => Err(StoreError::ReadOnly {
            database: path.display().to_string(),
            detail: "the file's permissions forbid writing".into(),
        }),
        _ => Ok(()),
    }
}

fn configure_writer(conn: &Connection, options: &SqliteOptions, file: bool) -> DbResult<()> {
    conn.busy_timeout(options.busy_timeout)?;
    // Every statement the writer runs stays prepared (the default cache of 16 thrashes).
    conn.set_prepared_statement_cache_capacity(256);
    if file {
        // Reading the header here is also what detects a corrupt or foreign file.
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::InvalidInput(format!(
                "could not switch the database to WAL (journal mode is {mode}); \
                 WAL needs a local filesystem"
            ))
            .into());
        }
    }
    let sync = match options.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    if let Some(pages) = options.max_page_count {
        conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))?;
    }
    let limit = i64::try_from(options.wal_size_limit).unwrap_or(i64::MAX);
    conn.query_row(&format!("PRAGMA journal_size_limit = {limit}"), [], |_| {
        Ok(())
    })?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn count(conn: &Connection) -> DbResult<i64> {
        Ok(conn.query_row(
            "SELECT COUNT(*) FROM gateway_meta WHERE key LIKE 'probe-%'",
            [],
            |r| r.get(0),
        )?)
    }

    fn put(key: &'static str) -> impl FnOnce(&Connection) -> DbResult<()> + Send + 'static {
        move |conn| {
            conn.execute(
                "INSERT INTO gateway_meta (key, value) VALUES (?1, 'x')",
                [key],
            )?;
            Ok(())
        }
    }

    /// The writer connection goes through the WAL batching shim: a commit of 60 pages reaches
    /// the log in a few writes, not SQLite's two per page. The count is taken on the writer
    /// thread, in the write after the commit.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_commits_a_transaction_in_a_few_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open_store(dir.path());
        let before = store
            .write_statement(|conn| {
                let before = wal_vfs::tests::write_calls();
                // One statement, as `write_statement` asks: 60 rows of 3,000 bytes.
                conn.execute(
                    "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 59)
                     INSERT INTO gateway_meta (key, value)
                     SELECT 'page-' || i, hex(zeroblob(1500)) FROM n",
                    [],
                )?;
                Ok(before)
            })
            .await
            .unwrap();
        let after = store
            .write_statement(|_| Ok(wal_vfs::tests::write_calls()))
            .await
            .unwrap();
        let calls = after - before;
        assert!(calls <= 5, "{calls} write calls for one 60-page commit");
    }

    /// The commit hook sees every transaction twice, before and after its `COMMIT`, under one
    /// number that counts up; a rolled-back write is not reported committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_commit_hook_sees_each_commit_before_and_after() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteOptions {
            commit_hook: Some(CommitHook(Arc::new(move |stage, n| {
                sink.lock().unwrap().push((stage, n));
                CommitVerdict::Proceed
            }))),
            ..SqliteOptions::default()
        };
        let store = crate::testing::open_store_with(dir.path(), options);
        let before = seen.lock().unwrap().len();
        for n in 0..2 {
            store
                .write_statement(move |conn| {
                    conn.execute(
                        "INSERT INTO gateway_meta (key, value) VALUES (?1, 'x')",
                        [format!("hook-{n}")],
                    )?;
                    Ok(())
                })
                .await
                .unwrap();
        }
        let seen = seen.lock().unwrap()[before..].to_vec();
        let first = seen.first().map_or(0, |(_, n)| *n);
        assert_eq!(
            seen,
            vec![
                (CommitStage::Before, first),
                (CommitStage::Committed, first),
                (CommitStage::Before, first + 1),
                (CommitStage::Committed, first + 1),
            ]
        );
    }

    /// A commit the hook refuses fails as a full disk would — typed, nothing of it stored —
    /// and the writer goes on: the next write commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_the_hook_refuses_fails_as_disk_full_and_the_next_one_commits() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let refusing = Arc::new(AtomicBool::new(false));
        let flag = refusing.clone();
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteOptions {
            commit_hook: Some(CommitHook(Arc::new(move |stage, _| {
                if stage == CommitStage::Before && flag.load(Ordering::SeqCst) {
                    CommitVerdict::RefuseAsDiskFull
                } else {
                    CommitVerdict::Proceed
                }
            }))),
            ..SqliteOptions::default()
        };
        let store = crate::testing::open_store_with(dir.path(), options);
        let insert = |key: &'static str| {
            store.write_statement(move |conn| {
                conn.execute(
                    "INSERT INTO gateway_meta (key, value) VALUES (?1, 'x')",
                    [key],
                )?;
                Ok(())
            })
        };
        insert("fault-a").await.unwrap();
        refusing.store(true, Ordering::SeqCst);
        let refused = insert("fault-b").await;
        assert!(
            matches!(refused, Err(StoreError::DiskFull { .. })),
            "{refused:?}"
        );
        refusing.store(false, Ordering::SeqCst);
        insert("fault-c").await.unwrap();
        let stored: Vec<String> = store
            .read(|conn| {
                let mut statement = conn.prepare(
                    "SELECT key FROM gateway_meta WHERE key LIKE 'fault-%' ORDER BY key",
                )?;
                let keys = statement
                    .query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<Vec<String>>>()?;
                Ok(keys)
            })
            .await
            .unwrap();
        assert_eq!(
            stored,
            ["fault-a", "fault-c"],
            "the refused write left nothing"
        );
    }

    /// Once a checkpoint has emptied the write-ahead log, the file is cut back to the limit
    /// instead of keeping the size a run of writes grew it to (SQLite alone never shrinks it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_file_is_cut_back_to_its_limit_after_a_checkpoint() {
        const LIMIT: u64 = 256 * 1024;
        // One round's rows: a page each, so the log grows by about this much per round.
        const ROUND: u64 = 50;
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteOptions {
            wal_size_limit: LIMIT,
            ..SqliteOptions::default()
        };
        let store = crate::testing::open_store_with(dir.path(), options);
        let wal = wal_path(store.path());
        let mut sizes = Vec::new();
        // Well past the 1,000 frames that trigger an automatic checkpoint.
        for round in 0..30u64 {
            let writes: Vec<_> = (0..ROUND)
                .map(|n| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        store
                            .write_statement(move |conn| {
                                conn.execute(
                                    "INSERT INTO gateway_meta (key, value) VALUES (?1, ?2)",
                                    rusqlite::params![
                                        format!("bulk-{round}-{n}"),
                                        "x".repeat(4000)
                                    ],
                                )?;
                                Ok(())
                            })
                            .await
                    })
                })
                .collect();
            for write in writes {
                write.await.unwrap().unwrap();
            }
            sizes.push(std::fs::metadata(&wal).unwrap().len());
        }
        let grown = sizes
            .iter()
            .position(|&size| size > 4 * LIMIT)
            .unwrap_or_else(|| panic!("the log never grew past the limit: {sizes:?}"));
        let smallest_after = sizes[grown..].iter().min().copied().unwrap_or(u64::MAX);
        // Cut to the limit at the commit after the checkpoint; the rest of that round regrows it.
        assert!(
            smallest_after <= LIMIT + ROUND * 4200,
            "the log was never cut back after growing: {sizes:?}"
        );
    }

    /// With FULL, a write is reported only after the WAL holding it was synced; when that sync
    /// fails, whether recent commits are on disk is unknown, so the store refuses every write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_wal_sync_fails_the_write_and_every_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open_store(dir.path());
        store.write(put("probe-1")).await.unwrap();
        // SQLite keeps writing to the file it has open; the sync thread can no longer find it.
        std::fs::remove_file(wal_path(store.path())).unwrap();
        for key in ["probe-2", "probe-3"] {
            let refused = store.write(put(key)).await.unwrap_err();
            assert!(
                refused
                    .to_string()
                    .contains("syncing the write-ahead log failed"),
                "{refused}"
            );
        }
        let again = store.write_statement(put("probe-4")).await.unwrap_err();
        assert!(
            again.to_string().contains("accepts no more writes"),
            "{again}"
        );
    }

    /// A write acknowledged at commit is answered without waiting for the WAL sync, and is
    /// synced with the next write acknowledged as durable; when that sync fails, that write
    /// fails, so nothing after the unsynced write is ever reported durable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_acked_at_commit_does_not_wait_for_the_sync_it_depends_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open_store(dir.path());
        store.write(put("probe-1")).await.unwrap();
        std::fs::remove_file(wal_path(store.path())).unwrap();
        for key in ["probe-2", "probe-3"] {
            store
                .write_statement_acked(Ack::Committed, put(key))
                .await
                .expect("answered at commit; no sync has run since the WAL went");
            // Time for a sync, had one been started for this batch, to fail and poison the
            // store before the next write (correct code starts none, so this cannot flake).
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let refused = store.write(put("probe-4")).await.unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("syncing the write-ahead log failed"),
            "{refused}"
        );
    }

    /// A write without a savepoint that changes rows and then fails must not commit those rows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_write_that_fails_after_changing_rows_commits_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open_store(dir.path());
        let broken = store
            .write_statement(|conn| -> DbResult<()> {
                conn.execute(
                    "INSERT INTO gateway_meta (key, value) VALUES ('probe-1', 'x')",
                    [],
                )?;
                Err(StoreError::InvalidInput("fails after its change".into()).into())
            })
            .await;
        assert!(broken.is_err(), "{broken:?}");
        store
            .write_statement(|conn| -> DbResult<()> {
                conn.execute(
                    "INSERT INTO gateway_meta (key, value) VALUES ('probe-2', 'y')",
                    [],
                )?;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(
            store.read(count).await.unwrap(),
            1,
            "only the write that succeeded is stored"
        );
    }
}
