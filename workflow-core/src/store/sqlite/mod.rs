//! [`SqliteStore`]: the embedded default store, one SQLite file in WAL mode that several
//! processes may share. It owns the SQLite statements (`Statements`), the file's schema
//! and its migrations, and the threads that talk to SQLite; what it decides in each
//! transaction is the shared SQL layer's (`store::sql`).
//!
//! SQLite allows one writer at a time, and with `synchronous=FULL` each commit costs an fsync.
//! So all writes go to one thread that drains every request queued while it was busy and runs
//! them in one transaction (group commit: many runs share one fsync; when a request fails, the
//! group is written again with a savepoint per request, so it rolls back only itself). Callers hear back only after the
//! commit. Reads run beside it on a few reader threads; WAL lets them see the last commit
//! without waiting for the writer. Between processes, `BEGIN IMMEDIATE` and `busy_timeout`
//! serialize the writers, and every check-then-write happens inside one such transaction.
//!
//! This file is the face: [`SqliteStore`], its opening, and the two doors every capability
//! goes through, `write` (a request in the writer's next group transaction) and `read` (a
//! reader thread's connection), with the errors they report. The SQL, the schema and the
//! threads live in the files beside it; nothing here runs a statement itself.

mod admin;
mod chain;
mod hooks;
mod messages;
mod queues;
mod readers;
mod rekey;
mod runs;
mod schedules;
mod schema;
mod statements;
mod streams;
mod transactional;
mod tx;
mod writer;

#[cfg(test)]
mod tests;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode};
use tokio::sync::oneshot;

use self::readers::{open_reader, reader_loop, ReadJob};
pub(crate) use self::transactional::{is_busy, SqliteStepTx};
use self::tx::{now, Lite};
use self::writer::{open_writer, writer_loop, Job, WriteJob};
use crate::error::{DatabaseError, StoreError};
use crate::store::sql::policy::{self, NewRunRow};
use crate::store::{Admission, Lease, NewRun};

/// How long one SQLite call waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Reader threads, each with its own connection.
const READERS: usize = 4;

/// A [`Store`](crate::store::Store) in one SQLite file, safe to share between threads, runtimes and processes.
///
/// Clones are cheap and share the connections; the background threads end when the last
/// clone is dropped (after finishing the writes already queued).
///
/// Beside the file, SQLite keeps `<file>-wal` and `<file>-shm`. The store keeps the
/// write-ahead log allocated at about 4 MiB (1024 pages), its size in steady state anyway, so
/// that commits overwrite it instead of growing it (see BENCHMARKS.md); a process that exits
/// without closing the store leaves both files behind, and the next open uses them.
///
/// ```
/// use workflow_core::store::sqlite::SqliteStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("workflows.db")).await?;
/// assert!(store.path().ends_with("workflows.db"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: mpsc::Sender<Box<dyn WriteJob>>,
    readers: mpsc::Sender<ReadJob>,
    /// The queue of the transactional steps' thread, once the first one began.
    transactions: tokio::sync::Mutex<Option<transactional::Sessions>>,
    /// Lets tests count commits and see the threads end.
    #[cfg(test)]
    stats: Arc<Stats>,
}

/// Shared with the background threads: it outlives the store until every thread has ended.
#[derive(Default)]
struct Stats {
    /// Transactions committed by the writer thread.
    commits: AtomicU64,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens the store in the file at `path`, creating the file and its schema if absent.
    ///
    /// Fails with [`StoreError::Incompatible`], leaving the file untouched, when the file is
    /// not a SQLite database, is a database of something else (see
    /// [`SqliteStore::open_shared`] to create the store beside an application's tables), or
    /// holds a store written by a newer version of this crate.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        Self::opening(path.as_ref(), false).await
    }

    /// Opens the store in the file at `path` like [`SqliteStore::open`], and creates it also
    /// in a database that holds the application's own tables, keeping them as they are: the
    /// file transactional steps write to is the store's own (`tx.sqlite(..)`).
    ///
    /// Fails with [`StoreError::Incompatible`], leaving the file untouched, when one of the
    /// application's tables has the name of a table the store creates (`runs`, `events`, ..),
    /// and for the reasons [`SqliteStore::open`] gives.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use workflow_core::rusqlite::Connection;
    /// use workflow_core::store::sqlite::SqliteStore;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let db = dir.path().join("app.db");
    /// Connection::open(&db)?.execute_batch(
    ///     "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
    ///      INSERT INTO accounts VALUES ('alice', 100);",
    /// )?;
    /// // `SqliteStore::open` refuses this file: it is some application's database.
    /// assert!(SqliteStore::open(&db).await.is_err());
    /// let store = SqliteStore::open_shared(&db).await?;
    /// let balance: i64 = Connection::open(&db)?
    ///     .query_row("SELECT balance FROM accounts WHERE id = 'alice'", [], |r| r.get(0))?;
    /// assert_eq!(balance, 100);
    /// # drop(store);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn open_shared(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        Self::opening(path.as_ref(), true).await
    }

    async fn opening(path: &Path, shared: bool) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        let stats = Arc::new(Stats::default());

        // Opening can wait on other processes' locks, so it happens on the writer thread too.
        let (writer, write_jobs) = mpsc::channel::<Box<dyn WriteJob>>();
        let (path2, stats2) = (path.clone(), stats.clone());
        start_thread(
            "workflow-sqlite-writer".to_owned(),
            move || open_writer(&path2, shared),
            move |conn| writer_loop(conn, write_jobs, stats2),
        )?
        .await
        .map_err(|_| thread_gone("writer"))??;

        // Readers open after the writer has validated the file and switched it to WAL.
        let (readers, read_jobs) = mpsc::channel::<ReadJob>();
        let read_jobs = Arc::new(Mutex::new(read_jobs));
        let mut opened = Vec::with_capacity(READERS);
        for i in 0..READERS {
            let (path, jobs, stats) = (path.clone(), read_jobs.clone(), stats.clone());
            opened.push(start_thread(
                format!("workflow-sqlite-reader-{i}"),
                move || open_reader(&path),
                move |conn| reader_loop(conn, jobs, stats),
            )?);
        }
        drop(read_jobs);
        for done in opened {
            done.await.map_err(|_| thread_gone("reader"))??;
        }

        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer,
                readers,
                transactions: tokio::sync::Mutex::new(None),
                #[cfg(test)]
                stats,
            }),
        })
    }

    /// The file this store was opened from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `work` on the writer thread in the current group transaction; answers once that
    /// transaction has committed (or with `work`'s own error, in which case everything `work`
    /// wrote was rolled back). `work` may run twice: when a request of its group fails, the
    /// group is rolled back and written again (see `writer::run_batch`), so it must do nothing
    /// but its writes.
    async fn write<R, F>(&self, work: F) -> Result<R, StoreError>
    where
        F: Fn(&Connection) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let (job, answer) = Job::new(work);
        self.inner
            .writer
            .send(Box::new(job))
            .map_err(|_| thread_gone("writer"))?;
        answer.await.map_err(|_| thread_gone("writer"))?
    }

    /// [`SqliteStore::write`] of `work` on `data`, which this thread frees once the answer
    /// is in, not the writer thread: the writer is the store's one lane for writes, and
    /// freeing memory another thread allocated takes that thread's allocator arena lock
    /// (glibc). In a profile of 1,000 schedules firing each second, freeing requests' data
    /// took about 7 % of the writer thread's time.
    async fn write_on<D, R, F>(&self, data: D, work: F) -> Result<R, StoreError>
    where
        D: Send + Sync + 'static,
        F: Fn(&Connection, &D) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let data = Arc::new(data);
        let lent = Arc::clone(&data);
        let answer = self.write(move |tx| work(tx, &lent)).await;
        // The writer dropped its clone with `work`, before it answered: this one is the last.
        drop(data);
        answer
    }

    /// Runs `work` on a reader thread's connection.
    async fn read<R, F>(&self, work: F) -> Result<R, StoreError>
    where
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: ReadJob = Box::new(move |conn| {
            let result = catch_unwind(AssertUnwindSafe(|| work(conn))).unwrap_or_else(|p| {
                Err(StoreError::database(format!(
                    "internal error: a store read panicked: {}",
                    panic_message(p.as_ref())
                )))
            });
            let _ = reply.send(result);
        });
        self.inner
            .readers
            .send(job)
            .map_err(|_| thread_gone("reader"))?;
        answer.await.map_err(|_| thread_gone("reader"))?
    }

    /// Admits `run`; with `lease`, leased to the caller in the same transaction.
    async fn admit(
        &self,
        run: NewRun,
        lease: Option<Duration>,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        let row = NewRunRow::new(run, lease)?;
        self.write_on(row, |tx, row| now(policy::admit(&mut Lite(tx), row)))
            .await
    }
}

/// A value of the wrong type is a corrupt record; anything else is the database's error,
/// transient when another connection holds the lock.
impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::Error::{
            FromSqlConversionFailure, IntegralValueOutOfRange, InvalidColumnType,
        };
        match e {
            InvalidColumnType(..) | IntegralValueOutOfRange(..) | FromSqlConversionFailure(..) => {
                StoreError::Corrupt(e.to_string())
            }
            e => StoreError::Database(database_error(e.to_string(), e)),
        }
    }
}

fn database_error(message: String, e: rusqlite::Error) -> DatabaseError {
    let busy = matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    );
    DatabaseError::with_source(message, e).transient(busy)
}

/// Starts thread `name`, which opens its connection with `open`, says whether it could,
/// and then serves with it until `serve` returns.
fn start_thread(
    name: String,
    open: impl FnOnce() -> Result<Connection, StoreError> + Send + 'static,
    serve: impl FnOnce(Connection) + Send + 'static,
) -> Result<oneshot::Receiver<Result<(), StoreError>>, StoreError> {
    let (ready, opened) = oneshot::channel();
    let thread = move || match open() {
        Ok(conn) => {
            let _ = ready.send(Ok(()));
            serve(conn);
        }
        Err(e) => {
            let _ = ready.send(Err(e));
        }
    };
    match std::thread::Builder::new().name(name.clone()).spawn(thread) {
        Ok(_) => Ok(opened),
        Err(e) => Err(StoreError::Database(DatabaseError::with_source(
            format!("cannot start thread {name}: {e}"),
            e,
        ))),
    }
}

fn thread_gone(which: &str) -> StoreError {
    StoreError::database(format!("the store's {which} thread has stopped"))
}
fn panic_message(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
