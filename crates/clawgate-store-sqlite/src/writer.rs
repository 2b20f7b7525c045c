//! The single writer: one connection on one thread that applies logical writes in batches.
//!
//! Concurrent writers queue closures; the writer drains what is queued (up to `max_batch`),
//! runs them in one `BEGIN IMMEDIATE … COMMIT` (group commit: one fsync for many writes), and
//! wraps each in its own `SAVEPOINT` so a write that fails is rolled back alone while its
//! neighbours commit. A write that changes the database with one statement at most
//! ([`Isolation::Statement`]) skips the savepoint: SQLite already undoes a failed statement, and a
//! savepoint copies every page the write touches into the statement journal. Should such a write
//! report failure after changing rows anyway, the whole batch is rolled back and reported failed
//! rather than committed half-done. A caller hears back only after the commit is durable, unless
//! it asked to hear at commit ([`Ack::Committed`]).
//!
//! With [`WalSync::Pipelined`] the connection commits with `synchronous=NORMAL` (COMMIT writes
//! the WAL frames but does not fsync them) and a second thread fsyncs the WAL file and only then
//! reports the batch committed — the durability of `synchronous=FULL`, with the fsync of one
//! batch overlapping the execution of the next. Several batches committed while one fsync runs
//! share the next fsync. Other connections may see a batch up to one fsync before it is reported.
//! A failed fsync leaves the WAL's durability unknown, so the store then refuses every write.
//!
//! Invariant: a write is reported `Ok` only if the transaction that holds it committed, and with a
//! pipelined sync only after the WAL holding it was synced. An [`Ack::Committed`] write is reported
//! at commit, and no write committed after it is reported durable unless it is durable too.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};
use tracing::{error, warn};

use super::errors::{DbError, DbResult, ErrorContext, Phase, duplicate};
use super::wal_vfs;
use clawgate_store::{StoreError, StoreResult};

/// Called once the batch's fate is known: `None` when it committed, else why it did not.
type Finish = Box<dyn FnOnce(Option<&rusqlite::Error>) + Send>;

/// A queued write: run against the connection (or `None`: the batch could not start), it says
/// whether it succeeded and hands back its `Finish`.
type Run = Box<dyn FnOnce(Option<&Connection>, Option<&rusqlite::Error>) -> (bool, Finish) + Send>;

/// How a write is kept apart from the other writes of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isolation {
    /// In its own savepoint: any number of statements, rolled back alone if it fails.
    Savepoint,
    /// Changes the database with one statement at most, and fails only before or in it.
    Statement,
}

/// When a write's caller hears back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ack {
    /// Once the write is durable (after the WAL sync, with a pipelined sync).
    Durable,
    /// Once the transaction holding it committed, before it is durable. It is ordered before
    /// every later write, so it is durable no later than the next write reported durable; should
    /// its sync fail, every later write fails too. A batch of such writes alone is not synced
    /// until a later batch is.
    Committed,
}

struct Job {
    isolation: Isolation,
    ack: Ack,
    run: Run,
}

/// Where in a transaction's commit a [`CommitHook`] is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitStage {
    /// Every write of the batch ran; `COMMIT` comes next (nothing of the batch is stored yet).
    Before,
    /// `COMMIT` returned: the batch is in the WAL (a process crash keeps it; with
    /// `Synchronous::Full` its fsync may still be pending) and no caller has heard of it yet.
    Committed,
}

/// What a [`CommitHook`] wants done with the commit it was shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitVerdict {
    Proceed,
    /// (At [`CommitStage::Before`].) Fail this commit as a full disk would: nothing of the
    /// batch is stored and every write in it fails with [`clawgate_store::StoreError::DiskFull`]; the
    /// writer goes on with the next batch. Ignored after the commit.
    RefuseAsDiskFull,
}

/// A test hook on the writer thread, called with the stage and the number of the commit
/// (1 for the first batch the writer thread commits; migrations run before it and are not
/// counted).
#[derive(Clone)]
pub struct CommitHook(pub Arc<dyn Fn(CommitStage, u64) -> CommitVerdict + Send + Sync>);

impl std::fmt::Debug for CommitHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitHook")
    }
}

/// How a commit becomes durable before it is reported.
#[derive(Debug, Clone)]
pub(crate) enum WalSync {
    /// SQLite's COMMIT is all there is (its own `synchronous` setting, or nothing to sync).
    AtCommit,
    /// COMMIT writes the WAL (this file) without syncing; a sync thread fsyncs it.
    Pipelined(PathBuf),
}

/// Why the store stopped accepting writes after a failed WAL fsync (set once, never cleared).
type Poisoned = Arc<OnceLock<String>>;

fn poisoned_error(reason: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR_FSYNC),
        Some(format!(
            "syncing the write-ahead log failed ({reason}); whether recent commits are on disk is \
             unknown, so this store accepts no more writes: fix the disk and restart"
        )),
    )
}

#[derive(Debug)]
pub(crate) struct Writer {
    queue: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    syncer: Option<JoinHandle<()>>,
}

impl Writer {
    pub(crate) fn spawn(
        conn: Connection,
        max_batch: usize,
        ctx: ErrorContext,
        sync: WalSync,
        hook: Option<CommitHook>,
    ) -> StoreResult<Writer> {
        // Bounded: a flood of writers waits instead of growing memory without limit.
        let (queue, jobs) = mpsc::channel::<Job>(max_batch.max(1) * 8);
        let poisoned: Poisoned = Arc::default();
        let (synced, syncer) = match sync {
            WalSync::AtCommit => (None, None),
            WalSync::Pipelined(wal) => {
                // The sync thread makes commits durable; COMMIT itself only writes the WAL.
                conn.pragma_update(None, "synchronous", "NORMAL")
                    .map_err(|e| ctx.map_sqlite(e, Phase::Open))?;
                let (to_sync, batches) = std::sync::mpsc::channel::<Vec<Finish>>();
                let poisoned = poisoned.clone();
                let thread = std::thread::Builder::new()
                    .name("clawgate-store-sync".into())
                    .spawn(move || sync_loop(&wal, &batches, &poisoned))
                    .map_err(|e| StoreError::Backend(Box::new(e)))?;
                (Some(to_sync), Some(thread))
            }
        };
        let thread = std::thread::Builder::new()
            .name("clawgate-store-writer".into())
            .spawn(move || {
                run(conn, jobs, max_batch.max(1), ctx, synced, poisoned, hook);
            })
            .map_err(|e| StoreError::Backend(Box::new(e)))?;
        Ok(Writer {
            queue: Some(queue),
            thread: Some(thread),
            syncer,
        })
    }

    /// Runs `f` inside the next group commit and returns its result once committed.
    pub(crate) async fn write<T, F>(
        &self,
        ctx: &ErrorContext,
        isolation: Isolation,
        ack: Ack,
        f: F,
    ) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> DbResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel::<StoreResult<T>>();
        let ctx_for_job = ctx.clone();
        let run: Run = Box::new(move |conn, start_error| {
            let Some(conn) = conn else {
                let error = start_error.map_or(StoreError::WriterStopped, |e| {
                    ctx_for_job.map_sqlite(duplicate(e), Phase::Operate)
                });
                let finish: Finish = Box::new(move |_| {
                    let _ = reply.send(Err(error));
                });
                return (false, finish);
            };
            let result = match std::panic::catch_unwind(AssertUnwindSafe(|| f(conn))) {
                Ok(result) => result,
                Err(_) => Err(DbError::Store(StoreError::InvalidInput(
                    "a store write panicked; it was rolled back".into(),
                ))),
            };
            let ok = result.is_ok();
            let finish: Finish = Box::new(move |commit_error| {
                let outcome = match (result, commit_error) {
                    (Ok(value), None) => Ok(value),
                    (Ok(_), Some(e)) => Err(ctx_for_job.map_sqlite(duplicate(e), Phase::Operate)),
                    (Err(e), _) => Err(ctx_for_job.map(e, Phase::Operate)),
                };
                let _ = reply.send(outcome);
            });
            (ok, finish)
        });
        let job = Job {
            isolation,
            ack,
            run,
        };
        let queue = self.queue.as_ref().ok_or(StoreError::WriterStopped)?;
        queue
            .send(job)
            .await
            .map_err(|_| StoreError::WriterStopped)?;
        answer.await.map_err(|_| StoreError::WriterStopped)?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue lets the thread finish what is queued and exit; its exit closes the
        // sync queue, so the sync thread reports the last batches and exits too.
        self.queue.take();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            error!("store writer thread panicked");
        }
        if let Some(thread) = self.syncer.take()
            && thread.join().is_err()
        {
            error!("store sync thread panicked");
        }
    }
}

/// Fsyncs the WAL for every batch committed since the last fsync, then reports them.
fn sync_loop(
    wal: &std::path::Path,
    batches: &std::sync::mpsc::Receiver<Vec<Finish>>,
    poisoned: &Poisoned,
) {
    let mut file: Option<WalFile> = None;
    while let Ok(first) = batches.recv() {
        let mut finishes = first;
        while let Ok(more) = batches.try_recv() {
            finishes.extend(more);
        }
        let failure = match poisoned.get() {
            Some(reason) => Some(poisoned_error(reason)),
            None => match sync_wal(wal, &mut file) {
                Ok(()) => None,
                Err(e) => {
                    let reason = format!("{}: {e}", wal.display());
                    error!(error = %reason, "WAL fsync failed; the store refuses further writes");
                    let _ = poisoned.set(reason.clone());
                    Some(poisoned_error(&reason))
                }
            },
        };
        for finish in finishes {
            finish(failure.as_ref());
        }
    }
}

/// The WAL file, kept open between fsyncs, with the identity it had when opened.
struct WalFile {
    file: std::fs::File,
    #[cfg(unix)]
    inode: (u64, u64),
}

fn sync_wal(path: &std::path::Path, file: &mut Option<WalFile>) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        // SQLite keeps the WAL while this store's writer connection is open; should the file
        // ever be replaced, the new one is what needs syncing.
        let meta = std::fs::metadata(path)?;
        let inode = (meta.dev(), meta.ino());
        if file.as_ref().is_none_or(|f| f.inode != inode) {
            *file = Some(WalFile {
                file: std::fs::File::open(path)?,
                inode,
            });
        }
    }
    #[cfg(not(unix))]
    {
        *file = Some(WalFile {
            file: std::fs::File::open(path)?,
        });
    }
    match file {
        Some(wal) => wal.file.sync_data(),
        None => Ok(()),
    }
}

fn run(
    conn: Connection,
    mut jobs: mpsc::Receiver<Job>,
    max_batch: usize,
    ctx: ErrorContext,
    synced: Option<std::sync::mpsc::Sender<Vec<Finish>>>,
    poisoned: Poisoned,
    hook: Option<CommitHook>,
) {
    let mut hook = hook.map(|hook| (hook, 0u64));
    let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
    let mut last_batch = 0usize;
    while let Some(first) = jobs.blocking_recv() {
        batch.push(first);
        let mut yields = 0;
        while batch.len() < max_batch {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                // Writers woken by the previous commit are still queueing their next write:
                // give them a moment when the last batch says many are coming. An idle or
                // single-writer store never waits here.
                Err(_) if batch.len() < last_batch && yields < 64 => {
                    yields += 1;
                    std::thread::yield_now();
                }
                Err(_) => break,
            }
        }
        last_batch = batch.len();
        if let Some(reason) = poisoned.get() {
            let e = poisoned_error(reason);
            for job in batch.drain(..) {
                let (_, finish) = (job.run)(None, Some(&e));
                finish(Some(&e));
            }
            continue;
        }
        let (finishes, commit_error) = commit_batch(&conn, &mut batch, &ctx, hook.as_mut());
        match (&synced, commit_error) {
            (Some(to_sync), None) => {
                let mut to_report = Vec::with_capacity(finishes.len());
                for (ack, finish) in finishes {
                    match ack {
                        Ack::Committed => finish(None),
                        Ack::Durable => to_report.push(finish),
                    }
                }
                // A batch no caller waits to see durable is synced with the next one that has
                // such a caller: syncing it now would only hold that sync up behind this one.
                if !to_report.is_empty()
                    && let Err(unsent) = to_sync.send(to_report)
                {
                    // The sync thread is gone (it panicked): nothing can be made durable.
                    let e = poisoned_error("the sync thread stopped");
                    for finish in unsent.0 {
                        finish(Some(&e));
                    }
                }
            }
            (_, commit_error) => {
                for (_, finish) in finishes {
                    finish(commit_error.as_ref());
                }
            }
        }
    }
}

/// Runs a statement from the connection's cache: savepoints run once per write.
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Runs the batch in one transaction; returns every write's `Finish` (with when it wants it) and
/// why the transaction did not commit, if it did not.
fn commit_batch(
    conn: &Connection,
    batch: &mut Vec<Job>,
    ctx: &ErrorContext,
    hook: Option<&mut (CommitHook, u64)>,
) -> (Vec<(Ack, Finish)>, Option<rusqlite::Error>) {
    if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
        warn!(path = %ctx.path.display(), error = %e, "could not start a write transaction");
        let finishes = batch
            .drain(..)
            .map(|job| (job.ack, (job.run)(None, Some(&e)).1))
            .collect();
        return (finishes, Some(e));
    }
    let mut finishes: Vec<(Ack, Finish)> = Vec::with_capacity(batch.len());
    let mut aborted: Option<rusqlite::Error> = None;
    for job in batch.drain(..) {
        if let Some(e) = &aborted {
            let (_, finish) = (job.run)(None, Some(e));
            finishes.push((job.ack, finish));
            continue;
        }
        let savepoint = job.isolation == Isolation::Savepoint;
        if savepoint && let Err(e) = exec(conn, "SAVEPOINT write") {
            let (_, finish) = (job.run)(None, Some(&e));
            finishes.push((job.ack, finish));
            aborted = Some(e);
            continue;
        }
        let changes_before = conn.total_changes();
        let (ok, finish) = (job.run)(Some(conn), None);
        finishes.push((job.ack, finish));
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back (disk full, I/O error…): the writes
            // before this one are gone too and must not be reported as committed.
            aborted = Some(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                Some("transaction rolled back by SQLite after a failed write".into()),
            ));
            continue;
        }
        if !savepoint {
            if !ok && conn.total_changes() != changes_before {
                // The write broke its promise: it changed rows, then failed. Nothing of this
                // batch may commit half-done.
                error!("a single-statement write failed after changing rows; batch rolled back");
                aborted = Some(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                    Some("a write failed after changing rows; its batch was rolled back".into()),
                ));
            }
            continue;
        }
        let step = if ok {
            exec(conn, "RELEASE write")
        } else {
            exec(conn, "ROLLBACK TO write").and_then(|_| exec(conn, "RELEASE write"))
        };
        if let Err(e) = step {
            aborted = Some(e);
        }
    }
    let commit_error = match aborted {
        Some(e) => Some(e),
        // The commit's WAL frames go out in one write (see `wal_vfs`).
        None => match hook {
            None => wal_vfs::commit(|| exec(conn, "COMMIT")).err(),
            Some((hook, commits)) => {
                *commits += 1;
                match (hook.0)(CommitStage::Before, *commits) {
                    CommitVerdict::RefuseAsDiskFull => Some(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                        Some("commit refused by the commit hook (a test's disk-full fault)".into()),
                    )),
                    CommitVerdict::Proceed => {
                        let error = wal_vfs::commit(|| exec(conn, "COMMIT")).err();
                        if error.is_none() {
                            (hook.0)(CommitStage::Committed, *commits);
                        }
                        error
                    }
                }
            }
        },
    };
    if let Some(e) = &commit_error {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        warn!(path = %ctx.path.display(), error = %e, writes = finishes.len(), "group commit failed");
    }
    (finishes, commit_error)
}
