//! The single writer: one connection on one thread that applies logical writes in batches.
//!
//! Concurrent writers queue closures; the writer drains what is queued (up to `max_batch`),
//! runs them in one `BEGIN IMMEDIATE … COMMIT` (group commit: one fsync for many writes), and
//! wraps each in its own `SAVEPOINT` so a write that fails is rolled back alone while its
//! neighbours commit. A caller hears back only after the commit is durable.
//!
//! Invariant: a write is reported `Ok` only if the transaction that holds it committed.

use std::panic::AssertUnwindSafe;
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};
use tracing::{error, warn};

use super::errors::{DbError, DbResult, ErrorContext, Phase, duplicate};
use crate::{StoreError, StoreResult};

/// Called once the batch's fate is known: `None` when it committed, else why it did not.
type Finish = Box<dyn FnOnce(Option<&rusqlite::Error>) + Send>;

/// A queued write: run against the connection (or `None`: the batch could not start), it says
/// whether it succeeded and hands back its `Finish`.
type Job = Box<dyn FnOnce(Option<&Connection>, Option<&rusqlite::Error>) -> (bool, Finish) + Send>;

#[derive(Debug)]
pub(crate) struct Writer {
    queue: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(crate) fn spawn(
        conn: Connection,
        max_batch: usize,
        ctx: ErrorContext,
    ) -> StoreResult<Writer> {
        // Bounded: a flood of writers waits instead of growing memory without limit.
        let (queue, jobs) = mpsc::channel::<Job>(max_batch.max(1) * 8);
        let thread = std::thread::Builder::new()
            .name("clawgate-store-writer".into())
            .spawn(move || run(conn, jobs, max_batch.max(1), ctx))
            .map_err(|e| StoreError::Backend(Box::new(e)))?;
        Ok(Writer {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Runs `f` inside the next group commit and returns its result once committed.
    pub(crate) async fn write<T, F>(&self, ctx: &ErrorContext, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> DbResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel::<StoreResult<T>>();
        let ctx_for_job = ctx.clone();
        let job: Job = Box::new(move |conn, start_error| {
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
        // Closing the queue lets the thread finish what is queued and exit.
        self.queue.take();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            error!("store writer thread panicked");
        }
    }
}

fn run(conn: Connection, mut jobs: mpsc::Receiver<Job>, max_batch: usize, ctx: ErrorContext) {
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
        commit_batch(&conn, &mut batch, &ctx);
    }
}

/// Runs a statement from the connection's cache: savepoints run once per write.
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn commit_batch(conn: &Connection, batch: &mut Vec<Job>, ctx: &ErrorContext) {
    if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
        warn!(path = %ctx.path.display(), error = %e, "could not start a write transaction");
        for job in batch.drain(..) {
            let (_, finish) = job(None, Some(&e));
            finish(Some(&e));
        }
        return;
    }
    let mut finishes: Vec<Finish> = Vec::with_capacity(batch.len());
    let mut aborted: Option<rusqlite::Error> = None;
    for job in batch.drain(..) {
        if let Some(e) = &aborted {
            let (_, finish) = job(None, Some(e));
            finishes.push(finish);
            continue;
        }
        if let Err(e) = exec(conn, "SAVEPOINT write") {
            let (_, finish) = job(None, Some(&e));
            finishes.push(finish);
            aborted = Some(e);
            continue;
        }
        let (ok, finish) = job(Some(conn), None);
        finishes.push(finish);
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back (disk full, I/O error…): the writes
            // before this one are gone too and must not be reported as committed.
            aborted = Some(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                Some("transaction rolled back by SQLite after a failed write".into()),
            ));
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
        None => exec(conn, "COMMIT").err(),
    };
    if let Some(e) = &commit_error {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        warn!(path = %ctx.path.display(), error = %e, writes = finishes.len(), "group commit failed");
    }
    for finish in finishes {
        finish(commit_error.as_ref());
    }
}
