//! The writer thread: its connection (opened, checked, migrated and switched to WAL, with the
//! write-ahead log preallocated), and its loop, which takes the queued requests as groups and
//! commits each as `store::sql::batch` does, in one transaction (with a savepoint per request
//! only when a request of the group failed).
//! It knows no statement of its own beyond transaction control: the requests bring their
//! work.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use futures::FutureExt;
use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

use super::schema::{open_error, prepare_schema};
use super::{database_error, panic_message, Stats, BUSY_TIMEOUT};
use crate::error::{DatabaseError, StoreError};
use crate::store::sql::batch::{commit, take, Committer, Finish, Group, Request};

/// How long a write keeps retrying when the lock is still held after `BUSY_TIMEOUT`.
pub(super) const LOCK_WAIT: Duration = Duration::from_secs(30);
/// Requests per transaction at most, so one burst cannot hold the lock for long.
pub(super) const MAX_BATCH: usize = 1024;

/// The writer's connection: validates the file, creates the schema if the file is new (or,
/// `shared`, holds only the application's tables), and switches it to WAL, in that order, so
/// that a rejected file is never modified.
pub(super) fn open_writer(path: &Path, shared: bool) -> Result<Connection, StoreError> {
    let fail = |e: rusqlite::Error| open_error(path, e);
    let conn = Connection::open(path).map_err(fail)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
    // Per connection: a commit reported to the caller has reached the disk.
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(fail)?;
    conn.set_prepared_statement_cache_capacity(64);

    // One IMMEDIATE transaction: processes opening the same new file at once take turns, and
    // the second one sees the first one's schema.
    {
        let tx = begin_immediate(&conn).map_err(fail)?;
        prepare_schema(&tx, path, shared)?;
        retry_busy("COMMIT", || tx.execute_batch("COMMIT")).map_err(fail)?;
    }

    let mode: String = retry_busy("PRAGMA journal_mode", || {
        conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
    })
    .map_err(fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::database(format!(
            "{}: SQLite cannot use WAL mode for this file (it stays in `{mode}` mode); \
             put the file on a local file system",
            path.display()
        )));
    }
    if let Err(e) = preallocate_wal(&conn, path) {
        // Only speed is at stake: the store works the same without it.
        tracing::debug!(error = %e, "could not preallocate the write-ahead log");
    }
    Ok(conn)
}

/// Frames of write-ahead log kept allocated: SQLite checkpoints after 1000 and then starts
/// over at the front of the file, so the log never needs to grow past this in steady state.
pub(super) const WAL_FRAMES: u64 = 1024;

/// Extends the write-ahead log with zeros to [`WAL_FRAMES`] frames if it is shorter (a new
/// file, or one SQLite deleted when the last connection closed). A commit that only
/// overwrites allocated blocks of the log is much cheaper to make durable than one that grows
/// the file: on the ext4 disk of BENCHMARKS.md, about 120 µs instead of 210 µs per commit,
/// because `fsync` then writes the data alone, not also the file's metadata (new size, new
/// blocks). SQLite reads a log only up to its last valid frame, and zeros are never valid, so
/// the padding is invisible; the write lock (an IMMEDIATE transaction) keeps other processes
/// from appending frames while the zeros are written.
pub(super) fn preallocate_wal(conn: &Connection, path: &Path) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};

    let page_size: u64 = conn
        .query_row("PRAGMA page_size", [], |row| row.get(0))
        .map_err(std::io::Error::other)?;
    // A 32-byte header, then per frame a 24-byte header and one page.
    let target = 32 + WAL_FRAMES * (24 + page_size);
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let tx = begin_immediate(conn).map_err(std::io::Error::other)?;
    let len = std::fs::metadata(&wal)?.len();
    if len < target {
        let mut file = std::fs::OpenOptions::new().write(true).open(&wal)?;
        file.seek(SeekFrom::Start(len))?;
        let zeros = vec![0u8; 64 * 1024];
        let mut left = target - len;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            file.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        file.sync_all()?;
    }
    tx.rollback().map_err(std::io::Error::other)
}

/// A write request as the writer thread sees it, whatever it answers: run inside the
/// transaction (again if the group is written a second time), then, once the transaction's
/// fate is known, answer.
pub(super) trait WriteJob: Send {
    /// Runs the request on the writer's connection, inside its transaction, recording its
    /// answer (a later run replaces it); false if it failed. It may run more than once: a
    /// group whose request failed is rolled back and written again with a savepoint per
    /// request.
    fn run(&mut self, tx: &Connection) -> bool;
    /// See [`Request::finish`].
    fn finish(self: Box<Self>, commit: Result<(), &DatabaseError>);
}

/// A request whose write is work on the writer's transaction: a function, not a one-shot
/// closure, so that the group it is in can be written again.
pub(super) type Job<F, R> = Request<F, R>;

impl<F, R> WriteJob for Job<F, R>
where
    F: Fn(&Connection) -> Result<R, StoreError> + Send,
    R: Send,
{
    fn run(&mut self, tx: &Connection) -> bool {
        let work = &self.write;
        let result = catch_unwind(AssertUnwindSafe(|| work(tx))).unwrap_or_else(|p| {
            Err(StoreError::database(format!(
                "internal error: a store write panicked: {}",
                panic_message(p.as_ref())
            )))
        });
        let ok = result.is_ok();
        self.written(result);
        ok
    }

    fn finish(self: Box<Self>, commit: Result<(), &DatabaseError>) {
        Request::finish(*self, commit);
    }
}

impl Finish for Box<dyn WriteJob> {
    fn finish(self, commit: Result<(), &DatabaseError>) {
        WriteJob::finish(self, commit);
    }
}

/// The writer thread's side of group commit: one IMMEDIATE transaction per group, a
/// savepoint per request. Synchronous: its futures are ready at once.
struct OnThread<'a> {
    conn: &'a Connection,
    stats: &'a Stats,
}

impl OnThread<'_> {
    fn write(&self, group: &mut [Box<dyn WriteJob>]) -> Result<(), DatabaseError> {
        run_batch(self.conn, group)?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Committer for OnThread<'_> {
    type Request = Box<dyn WriteJob>;

    async fn together(&self, group: &mut [Box<dyn WriteJob>]) -> Group {
        match self.write(group) {
            Ok(()) => Group::Committed,
            Err(why) => Group::Failed(why),
        }
    }

    async fn alone(&self, request: &mut Box<dyn WriteJob>) -> Result<(), DatabaseError> {
        self.write(std::slice::from_mut(request))
    }
}

pub(super) fn writer_loop(
    conn: Connection,
    jobs: mpsc::Receiver<Box<dyn WriteJob>>,
    stats: Arc<Stats>,
) {
    let writer = OnThread {
        conn: &conn,
        stats: &stats,
    };
    // Ends when every sender (every store clone) is gone and the queue is empty.
    let mut look = false;
    while let Some(first) = next_job(&jobs, look) {
        let group = take(first, MAX_BATCH, || jobs.try_recv().ok());
        // A lone request: most likely a run waiting for its commit to write again at once
        // (steps one after the other). In a burst the groups are many requests, and the
        // callers need the cores the writer would spin on.
        look = group.len() == 1;
        if commit(&writer, group).now_or_never().is_none() {
            // Cannot happen: nothing here waits. The requests' callers hear that the writer
            // dropped them.
            tracing::error!("internal error: a SQLite group commit did not finish at once");
        }
    }
}

/// How long the writer, after a group of one request, keeps looking for its next request,
/// yielding its core between looks, before it sleeps until one comes. A run's next write
/// follows its last commit by tens of microseconds (the caller's wake-up, the workflow's
/// next step); a writer asleep by then costs that write the thread's wake-up as well. After
/// a larger group (a burst: many runs writing) it sleeps at once: spinning there took the
/// cores the callers needed. Idle, the writer spins at most this long after its last
/// commit, and not at all when nothing is written. Figures: the SQLite W1 row of BENCHMARKS.md.
const LOOK_FOR_NEXT: Duration = Duration::from_micros(100);

/// The writer's next request: one that waits, or, when it `look`s, one that comes within
/// [`LOOK_FOR_NEXT`], or else the next to come, asleep until then. `None` once every sender
/// is gone and the queue is empty.
fn next_job(jobs: &mpsc::Receiver<Box<dyn WriteJob>>, look: bool) -> Option<Box<dyn WriteJob>> {
    if !look {
        return jobs.recv().ok();
    }
    let until = Instant::now() + LOOK_FOR_NEXT;
    loop {
        match jobs.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if Instant::now() < until => {
                // Gives the core to a runnable thread (the caller preparing its next write).
                std::thread::yield_now();
            }
            Err(mpsc::TryRecvError::Empty) => return jobs.recv().ok(),
        }
    }
}

/// One group transaction. Err only when the transaction as a whole did not commit.
///
/// A group's requests run one after the other in one transaction, without savepoints: a
/// savepoint per request cost a statement to open and one to release it, and made SQLite
/// copy every page the request touched that an earlier request had written into the
/// savepoint's sub-journal (in W3, 1,000 one-step runs, 42M of 562M instructions). Requests
/// rarely fail; when one does, what it wrote may be half done, so the transaction is rolled
/// back and the group written again ([`write_guarded`]) with a savepoint per request, so
/// that the failing one is undone alone and the others stand. A request alone needs neither
/// (undoing it is undoing the transaction).
pub(super) fn run_batch(
    conn: &Connection,
    batch: &mut [Box<dyn WriteJob>],
) -> Result<(), DatabaseError> {
    let began = std::time::Instant::now();
    let tx = WriteTx::begin(conn).map_err(failed)?;
    let mut all_ok = true;
    for job in batch.iter_mut() {
        all_ok = job.run(&tx);
        if tx.is_autocommit() {
            // Some errors (disk full, I/O) make SQLite roll back the whole transaction.
            return Err(rolled_back());
        }
        if !all_ok {
            break;
        }
    }
    if !all_ok {
        if let [_] = batch {
            // Nothing else is in the transaction: its rollback (dropping `tx`) undoes the
            // request, whose own answer is its error.
            return Ok(());
        }
        tx.rollback().map_err(failed)?;
        return write_guarded(conn, batch, began);
    }
    commit_tx(tx, began)
}

/// `batch` written again in one transaction with a savepoint per request: a failing request
/// is rolled back to its savepoint, and its own answer is its error.
fn write_guarded(
    conn: &Connection,
    batch: &mut [Box<dyn WriteJob>],
    began: Instant,
) -> Result<(), DatabaseError> {
    let control = |sql: &str| cached(conn, sql).map_err(failed);
    let tx = WriteTx::begin(conn).map_err(failed)?;
    for job in batch.iter_mut() {
        control("SAVEPOINT request")?;
        let ok = job.run(&tx);
        if tx.is_autocommit() {
            return Err(rolled_back());
        }
        if !ok {
            control("ROLLBACK TO request")?;
        }
        control("RELEASE request")?;
    }
    commit_tx(tx, began)
}

/// Commits `tx` (begun at `began` for its group). On any error return before it, dropping
/// `tx` rolls back whatever is left.
fn commit_tx(tx: WriteTx<'_>, began: Instant) -> Result<(), DatabaseError> {
    tx.commit().map_err(failed)?;
    crate::telemetry::store_commit("sqlite", began.elapsed());
    Ok(())
}

/// Runs one transaction-control statement, prepared once per connection.
fn cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql).and_then(|mut s| s.execute([]))?;
    Ok(())
}

/// The writer's transaction: an IMMEDIATE transaction on its connection (which it derefs
/// to, so that requests run their statements on it), rolled back when dropped uncommitted.
/// Its `BEGIN IMMEDIATE` and `COMMIT` are prepared once: rusqlite's `Transaction` parses its
/// `BEGIN` anew each time (about 5,000 instructions, once per group, so once per step of a
/// run waiting alone on each of its commits).
struct WriteTx<'c> {
    conn: &'c Connection,
    open: bool,
}

impl<'c> WriteTx<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        retry_busy("BEGIN IMMEDIATE", || cached(conn, "BEGIN IMMEDIATE"))?;
        Ok(WriteTx { conn, open: true })
    }

    fn commit(mut self) -> rusqlite::Result<()> {
        retry_busy("COMMIT", || cached(self.conn, "COMMIT"))?;
        self.open = false;
        Ok(())
    }

    fn rollback(mut self) -> rusqlite::Result<()> {
        self.open = false;
        cached(self.conn, "ROLLBACK")
    }
}

impl std::ops::Deref for WriteTx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        // SQLite may have rolled it back already (some I/O errors do).
        if self.open && !self.conn.is_autocommit() {
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::error!(error = %e, "could not roll back the write transaction");
            }
        }
    }
}

fn failed(e: rusqlite::Error) -> DatabaseError {
    database_error(format!("the write transaction failed: {e}"), e)
}

fn rolled_back() -> DatabaseError {
    DatabaseError::new("the write transaction was rolled back by SQLite")
}

pub(super) fn begin_immediate(conn: &Connection) -> rusqlite::Result<Transaction<'_>> {
    retry_busy("BEGIN IMMEDIATE", || {
        Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
    })
}

/// `busy_timeout` already waits inside SQLite; this covers a lock held longer than that by
/// another process, up to `LOCK_WAIT`.
pub(super) fn retry_busy<T>(
    what: &str,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let start = Instant::now();
    loop {
        match f() {
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && start.elapsed() < LOCK_WAIT =>
            {
                tracing::warn!(
                    statement = what,
                    "the database is locked by another connection; retrying"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use rusqlite::Connection;

    use super::{next_job, WriteJob, LOOK_FOR_NEXT};
    use crate::error::DatabaseError;

    /// A job that writes its number where the test reads it when run.
    struct Tagged(u32, Arc<AtomicU32>);

    impl WriteJob for Tagged {
        fn run(&mut self, _tx: &Connection) -> bool {
            self.1.store(self.0, Ordering::Relaxed);
            true
        }

        fn finish(self: Box<Self>, _commit: Result<(), &DatabaseError>) {}
    }

    /// The number of the job taken, by running it.
    fn number(job: Option<Box<dyn WriteJob>>, seen: &AtomicU32) -> Option<u32> {
        let conn = Connection::open_in_memory().unwrap();
        job.map(|mut job| {
            job.run(&conn);
            seen.load(Ordering::Relaxed)
        })
    }

    #[test]
    fn takes_what_waits_what_comes_while_it_looks_and_what_comes_after_it_slept() {
        let seen = Arc::new(AtomicU32::new(0));
        let job = |n| -> Box<dyn WriteJob> { Box::new(Tagged(n, seen.clone())) };
        let (send, jobs) = mpsc::channel::<Box<dyn WriteJob>>();
        send.send(job(1)).unwrap();
        assert_eq!(
            number(next_job(&jobs, true), &seen),
            Some(1),
            "a request that waits"
        );

        // One sent during the look, and one long after it (the writer asleep by then).
        let (second, third) = (job(2), job(3));
        let sender = std::thread::spawn(move || {
            std::thread::sleep(LOOK_FOR_NEXT / 4);
            send.send(second).unwrap();
            std::thread::sleep(LOOK_FOR_NEXT * 20);
            send.send(third).unwrap();
            send
        });
        assert_eq!(
            number(next_job(&jobs, true), &seen),
            Some(2),
            "sent while it looked"
        );
        assert_eq!(
            number(next_job(&jobs, true), &seen),
            Some(3),
            "sent after it slept"
        );
        let send = sender.join().unwrap();

        // Without looking (after a group of many), what waits, else asleep until one comes.
        let (fourth, fifth) = (job(4), job(5));
        send.send(fourth).unwrap();
        assert_eq!(number(next_job(&jobs, false), &seen), Some(4), "waiting");
        let sender = std::thread::spawn(move || {
            std::thread::sleep(LOOK_FOR_NEXT * 20);
            send.send(fifth).unwrap();
            send
        });
        assert_eq!(number(next_job(&jobs, false), &seen), Some(5), "came later");
        let send = sender.join().unwrap();

        // Every sender gone and nothing queued: the writer's loop ends.
        drop(send);
        let (done, answer) = mpsc::channel();
        std::thread::spawn(move || {
            let ended = next_job(&jobs, true).is_none() && next_job(&jobs, false).is_none();
            done.send(ended).unwrap()
        });
        assert_eq!(answer.recv_timeout(Duration::from_secs(10)), Ok(true));
    }
}
