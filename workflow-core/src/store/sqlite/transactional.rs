//! [`TransactionalStore`] on SQLite: a transactional step's transaction is an IMMEDIATE
//! transaction on a connection of its own to the store's file, held by a thread of its own
//! (started with the first such step). The step's body sends it closures to run on the
//! transaction (`tx.sqlite(..)`); the commit appends the step's result with the shared
//! policy's fenced append, in the same transaction, then commits. A session whose handle is
//! dropped (the body failed, the attempt was abandoned) rolls back.
//!
//! SQLite has one writer at a time: while a step's transaction is open, the store's writer
//! thread (every other write of this process, heartbeats included) and other processes wait
//! for it, as they wait for each other's transactions. Step transactions of one process take
//! turns on the one thread.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc;

use rusqlite::{params, Connection, ErrorCode, Transaction};
use tokio::sync::oneshot;

use super::schema::open_error;
use super::statements::SQL;
use super::tx::{now, one, Lite};
use super::writer::{begin_immediate, retry_busy};
use super::{database_error, panic_message, start_thread, thread_gone, SqliteStore, BUSY_TIMEOUT};
use crate::error::StoreError;
use crate::store::sql::policy;
use crate::store::sql::{sql_epoch, EncodedAppend};
use crate::store::{Append, Lease, StepTransaction, TransactionalStore};

/// Work for the session's transaction.
pub(crate) type SqliteJob = Box<dyn FnOnce(&Transaction<'_>) + Send>;

enum Msg {
    /// Runs on the transaction (the job answers for itself).
    Run(SqliteJob),
    /// Appends and commits; the session ends.
    Commit {
        lease: Lease,
        write: Box<EncodedAppend>,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// A step transaction waiting for the thread.
pub(super) struct Session {
    lease: Lease,
    began: oneshot::Sender<Result<(), StoreError>>,
    msgs: mpsc::Receiver<Msg>,
}

pub(super) type Sessions = mpsc::Sender<Session>;

/// An open step transaction on SQLite, as the body's `Tx` finds it.
pub(crate) struct SqliteStepTx {
    msgs: mpsc::Sender<Msg>,
}

impl SqliteStepTx {
    /// Runs `job` on the transaction, on the session's thread; waits for it.
    pub(crate) fn run<T: Send + 'static>(
        &mut self,
        job: impl FnOnce(&Transaction<'_>) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = mpsc::sync_channel(1);
        let job: SqliteJob = Box::new(move |tx| {
            let _ = reply.send(catch_unwind(AssertUnwindSafe(|| job(tx))));
        });
        self.msgs
            .send(Msg::Run(job))
            .map_err(|_| thread_gone("transactions"))?;
        // The caller asked for a synchronous call; on a multi-threaded runtime the wait lets
        // the runtime move its other tasks to other threads meanwhile.
        let wait = || answer.recv();
        let answer = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            _ => wait(),
        };
        match answer {
            Ok(Ok(value)) => Ok(value),
            // The user's closure panicked: so does the step attempt, which counts it.
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => Err(thread_gone("transactions")),
        }
    }
}

#[async_trait::async_trait]
impl StepTransaction for SqliteStepTx {
    fn store_name(&self) -> &'static str {
        "SQLite"
    }

    fn as_any(&mut self) -> &mut (dyn Any + Send) {
        self
    }

    async fn commit(self: Box<Self>, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        let write = Box::new(EncodedAppend::new(write)?);
        let (reply, answer) = oneshot::channel();
        let lease = lease.clone();
        self.msgs
            .send(Msg::Commit {
                lease,
                write,
                reply,
            })
            .map_err(|_| thread_gone("transactions"))?;
        answer.await.map_err(|_| thread_gone("transactions"))?
    }
}

#[async_trait::async_trait]
impl TransactionalStore for SqliteStore {
    async fn begin_step(
        &self,
        lease: &Lease,
    ) -> Result<Option<Box<dyn StepTransaction>>, StoreError> {
        let sessions = self.sessions().await?;
        let (msgs, inbox) = mpsc::channel();
        let (began, begun) = oneshot::channel();
        let lease = lease.clone();
        let session = Session {
            lease,
            began,
            msgs: inbox,
        };
        sessions
            .send(session)
            .map_err(|_| thread_gone("transactions"))?;
        begun.await.map_err(|_| thread_gone("transactions"))??;
        Ok(Some(Box::new(SqliteStepTx { msgs })))
    }
}

impl SqliteStore {
    /// The queue of the transactions' thread, started on first use.
    async fn sessions(&self) -> Result<Sessions, StoreError> {
        let mut started = self.inner.transactions.lock().await;
        if let Some(sessions) = &*started {
            return Ok(sessions.clone());
        }
        let (sessions, queue) = mpsc::channel();
        let path = self.inner.path.clone();
        start_thread(
            "workflow-sqlite-transactions".to_owned(),
            move || open_transactions(&path),
            move |conn| {
                while let Ok(session) = queue.recv() {
                    serve(&conn, session);
                }
            },
        )?
        .await
        .map_err(|_| thread_gone("transactions"))??;
        *started = Some(sessions.clone());
        Ok(sessions)
    }
}

/// The transactions' connection: a writer like the store's own (the file is already in WAL
/// mode and migrated: the store opened it first).
fn open_transactions(path: &Path) -> Result<Connection, StoreError> {
    let fail = |e: rusqlite::Error| open_error(path, e);
    let conn = Connection::open(path).map_err(fail)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(fail)?;
    conn.set_prepared_statement_cache_capacity(16);
    Ok(conn)
}

/// One step transaction, from `BEGIN IMMEDIATE` and the lease check to the commit, or to the
/// rollback when its handle is dropped first.
fn serve(conn: &Connection, session: Session) {
    let began = begin_immediate(conn)
        .map_err(|e| StoreError::Database(database_error(format!("cannot begin: {e}"), e)))
        .and_then(|tx| {
            let (run, epoch) = (
                session.lease.run_id.to_string(),
                sql_epoch(session.lease.epoch),
            );
            match one(&tx, SQL.dialect.lease_held, params![run, epoch], |_| Ok(()))? {
                Some(()) => Ok(tx),
                None => Err(StoreError::LeaseLost(session.lease.run_id)),
            }
        });
    let tx = match began {
        Ok(tx) => tx,
        Err(e) => {
            let _ = session.began.send(Err(e));
            return;
        }
    };
    if session.began.send(Ok(())).is_err() {
        return;
    }
    // Until the handle is dropped (rollback, as `tx` drops) or commits.
    while let Ok(msg) = session.msgs.recv() {
        match msg {
            Msg::Run(job) => job(&tx),
            Msg::Commit {
                lease,
                write,
                reply,
            } => {
                let committed = catch_unwind(AssertUnwindSafe(|| commit(&tx, &lease, &write)))
                    .unwrap_or_else(|p| {
                        Err(StoreError::database(format!(
                            "internal error: a step transaction's commit panicked: {}",
                            panic_message(p.as_ref())
                        )))
                    });
                let _ = reply.send(committed);
                return;
            }
        }
    }
}

fn commit(tx: &Transaction<'_>, lease: &Lease, write: &EncodedAppend) -> Result<(), StoreError> {
    if tx.is_autocommit() {
        // The body's own statements ended the transaction (a `COMMIT` or `ROLLBACK` of its
        // own, or an error SQLite rolls back for): what it wrote is not ours to record.
        return Err(StoreError::database(
            "the step's transaction was ended inside its body (by a COMMIT or ROLLBACK \
             statement, or an error SQLite rolled it back for); nothing was recorded",
        ));
    }
    let began = std::time::Instant::now();
    now(policy::append(&mut Lite(tx), lease, write))?;
    retry_busy("COMMIT", || tx.execute_batch("COMMIT")).map_err(|e| {
        StoreError::Database(database_error(format!("the step's commit failed: {e}"), e))
    })?;
    crate::telemetry::store_commit("sqlite", began.elapsed());
    Ok(())
}

/// Whether `e` is SQLite's "busy" or "locked": the attempt is run again.
pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}
