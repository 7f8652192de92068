//! Transactional steps as the code inside them sees them: [`Tx`], the step's first
//! parameter, lends the body the store's open transaction (`tx.sqlite(..)`, `tx.postgres()`);
//! the driver (`driver/transactional.rs`) opens it, runs the attempt, and commits the body's
//! writes with the step's recorded result. The transaction is handed to the body through a
//! task-local set for the attempt, which also marks the body as one that may not call steps
//! or write streams.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::registry::{BoxFuture, StepDef};
use crate::store::StepTransaction;

tokio::task_local! {
    static TX: TxEnv;
}

/// What an attempt of a transactional step shares with its body.
#[derive(Clone)]
pub(crate) struct TxEnv {
    /// The step's name, for messages.
    pub(crate) step: &'static str,
    /// The open transaction: taken by the body while it runs, given back when it returns.
    pub(crate) slot: Arc<Mutex<Option<Box<dyn StepTransaction>>>>,
    /// Set when a statement of the body failed on a busy database or a serialization
    /// failure: the attempt is then run again instead of counted.
    pub(crate) conflict: Arc<AtomicBool>,
}

impl TxEnv {
    pub(crate) fn new(step: &'static str, open: Box<dyn StepTransaction>) -> Self {
        TxEnv {
            step,
            slot: Arc::new(Mutex::new(Some(open))),
            conflict: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Runs `fut` (the attempt) with this transaction available to the body.
    pub(crate) async fn scope<F: std::future::Future>(self, fut: F) -> F::Output {
        TX.scope(self, fut).await
    }

    /// The transaction, once the body gave it back.
    pub(crate) fn take(&self) -> Option<Box<dyn StepTransaction>> {
        crate::sync::lock(&self.slot).take()
    }
}

/// The transactional step whose body is running here, if any.
pub(crate) fn current_step() -> Option<&'static str> {
    TX.try_with(|env| env.step).ok()
}

/// The error of a step call or stream write (`what`) inside a transactional step's body.
pub(crate) fn forbidden(what: &str) -> Option<Error> {
    current_step().map(|step| {
        Error::fatal(format!(
            "{what} inside transactional step `{step}`: its body may only use its \
             transaction (`tx`); call other steps, and write streams, from the workflow or \
             from an ordinary step"
        ))
    })
}

/// Notes that a statement of the running transactional body failed on a busy database or a
/// serialization failure, so the attempt is run again (from a fresh transaction) instead of
/// counted as failed.
pub(crate) fn note_conflict() {
    let _ = TX.try_with(|env| env.conflict.store(true, Ordering::Relaxed));
}

/// The store's open transaction, lent to a `#[step(transactional)]` fn as its first parameter.
///
/// Everything the body writes through it commits in one transaction with the step's recorded
/// result and the check of the run's lease: all of it, exactly once, or none of it. On SQLite
/// use [`Tx::sqlite`], on PostgreSQL [`Tx::postgres`].
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[step(transactional)]
/// async fn deposit(tx: &mut Tx<'_>, account: String, cents: i64) -> Result<i64> {
///     let balance = tx.sqlite(move |c| {
///         c.execute(
///             "INSERT INTO accounts (id, balance) VALUES (?1, ?2)
///              ON CONFLICT (id) DO UPDATE SET balance = balance + ?2",
///             workflow_core::rusqlite::params![account, cents],
///         )?;
///         c.query_row("SELECT balance FROM accounts WHERE id = ?1", [&account], |r| r.get(0))
///     })?;
///     Ok(balance)
/// }
///
/// #[workflow]
/// async fn pay_twice(account: String) -> Result<i64> {
///     deposit(account.clone(), 250).await?;
///     deposit(account, 250).await
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("app.db");
/// let rt = Runtime::builder().sqlite(&path).build().await?;
/// // The user's table lives in the store's own file.
/// workflow_core::rusqlite::Connection::open(&path)?
///     .execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)", [])?;
/// let run = rt.start(pay_twice, ("ana".to_string(),)).await?;
/// assert_eq!(run.return_value().await?, 500);
/// # Ok(())
/// # }
/// ```
pub struct Tx<'a> {
    open: &'a mut dyn StepTransaction,
    step: &'static str,
}

impl std::fmt::Debug for Tx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx")
            .field("store", &self.open.store_name())
            .field("step", &self.step)
            .finish()
    }
}

impl Tx<'_> {
    /// The fatal error of the accessor for `wanted` on another store.
    #[allow(dead_code)] // without either SQL feature no accessor exists
    fn mismatch(&self, accessor: &str, wanted: &str) -> Error {
        Error::fatal(format!(
            "`tx.{accessor}` was called in transactional step `{}` on a {} store: it reaches \
             a {wanted} store's transaction only; use the accessor of the store the runtime \
             was built with",
            self.step,
            self.open.store_name()
        ))
    }

    /// Runs `f` on the SQLite transaction that will also record the step's result, and
    /// returns its value. The call is synchronous: `f` runs on the store's transaction
    /// thread while the caller waits.
    ///
    /// An error of `f` is the step's error (retried by its policy, its writes rolled back),
    /// except "database is busy/locked", after which the whole attempt runs again. On a
    /// PostgreSQL store this is a fatal error naming both stores.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[step(transactional)]
    /// async fn count_visit(tx: &mut Tx<'_>, page: String) -> Result<i64> {
    ///     tx.sqlite(move |c| {
    ///         c.execute("INSERT INTO visits (page) VALUES (?1)", [&page])?;
    ///         c.query_row("SELECT count(*) FROM visits WHERE page = ?1", [&page], |r| r.get(0))
    ///     })
    /// }
    /// ```
    #[cfg(feature = "sqlite")]
    pub fn sqlite<T, F>(&mut self, f: F) -> Result<T, Error>
    where
        F: FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let step = self.step;
        let Some(open) = self
            .open
            .as_any()
            .downcast_mut::<crate::store::sqlite::SqliteStepTx>()
        else {
            return Err(self.mismatch("sqlite(..)", "SQLite"));
        };
        match open.run(f) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if crate::store::sqlite::is_busy(&e) {
                    note_conflict();
                }
                Err(Error::retryable(format!(
                    "a statement of transactional step `{step}` failed: {e}"
                )))
            }
            Err(e) => Err(Error::retryable(format!(
                "transactional step `{step}`: {e}"
            ))),
        }
    }

    /// The PostgreSQL connection, inside the transaction that will also record the step's
    /// result: run the body's statements on it (`.execute(tx.postgres()?)`).
    ///
    /// A serialization failure or deadlock (SQLSTATE 40001, 40P01) of a statement, returned
    /// with `?`, runs the whole attempt again; any other error is the step's error (retried
    /// by its policy, its writes rolled back). On a SQLite store this is a fatal error naming
    /// both stores.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[step(transactional)]
    /// async fn debit(tx: &mut Tx<'_>, account: String, cents: i64) -> Result<i64> {
    ///     let (balance,): (i64,) = workflow_core::sqlx::query_as(
    ///         "UPDATE accounts SET balance = balance - $1 WHERE id = $2 RETURNING balance",
    ///     )
    ///     .bind(cents)
    ///     .bind(&account)
    ///     .fetch_one(tx.postgres()?)
    ///     .await?;
    ///     Ok(balance)
    /// }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres(&mut self) -> Result<&mut sqlx::PgConnection, Error> {
        let wrong = self.mismatch("postgres()", "PostgreSQL");
        self.open
            .as_any()
            .downcast_mut::<crate::store::postgres::PgStepTx>()
            .map(crate::store::postgres::PgStepTx::connection)
            .ok_or(wrong)
    }
}

/// Runs a transactional step's body on the transaction its attempt opened (see [`TxEnv`]):
/// how `#[step(transactional)]`'s generated code reaches its body. Outside an attempt (the
/// step called as a plain fn, outside a workflow) there is no transaction: a fatal error.
#[doc(hidden)]
pub async fn transactional<A, R>(
    def: &'static StepDef,
    body: for<'a, 'b> fn(&'a mut Tx<'b>, A) -> BoxFuture<'a, R>,
    args: A,
) -> Result<R, Error> {
    let Ok(env) = TX.try_with(TxEnv::clone) else {
        return Err(Error::fatal(format!(
            "transactional step `{}` was called outside a workflow: its writes commit in the \
             transaction of a workflow runtime's store, so call it from a `#[workflow]` fn",
            def.name
        )));
    };
    let Some(mut open) = env.take() else {
        return Err(Error::fatal(format!(
            "transactional step `{}` found its transaction in use",
            def.name
        )));
    };
    let result = {
        let mut tx = Tx {
            open: &mut *open,
            step: def.name,
        };
        body(&mut tx, args).await
    };
    *crate::sync::lock(&env.slot) = Some(open);
    Ok(result)
}
