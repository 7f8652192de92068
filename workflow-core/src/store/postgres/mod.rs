//! [`PostgresStore`]: the store for deployments where many worker processes on many machines
//! share one PostgreSQL database. It owns the PostgreSQL statements (`Statements`), the
//! tables in one schema (created and migrated on connect), the connection pool, and the
//! `LISTEN` connection that turns other processes' commits into [`Notice`]s; what it decides
//! in each transaction is the shared SQL layer's (`store::sql`), made atomic by the
//! database (row locks, unique keys, `FOR UPDATE SKIP LOCKED`).
//!
//! Every statement names its tables through the quoted schema, so several stores (say, one per
//! test, or one per tenant) share a database without seeing each other. Writers announce their
//! changes with `pg_notify` on a channel named after the schema, after their commit, so a
//! notice goes out only once the change it announces is visible: the hot statements (a run
//! admitted or ended, a chunk written) return their notices and the `Notifier` sends them, many
//! in one statement of their own; the others notify inside their transaction.
//!
//! This file is the face: [`PostgresStore`], `connect`, and the small helpers every operation
//! uses (a connection, a transaction, `Pg` on it). One file per concern beside it: `schema`
//! (DDL and migrations), `statements` (the SQL table), `tx` (the policies' statements), `commit`
//! (group commit), `stash` (connections), `listen` (notices), and one file per capability
//! (`runs`, `hooks`, `streams`, `queues`, `admin`). Nothing here decides what a write means.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::error::{DatabaseError, StoreError};
use crate::store::Notice;

mod admin;
mod chain;
mod chain_sql;
mod commit;
mod hooks;
mod listen;
mod messages;
mod queues;
mod rekey;
mod runs;
mod schedules;
mod schema;
mod stash;
mod statements;
mod streams;
#[cfg(test)]
mod tests;
mod transactional;
mod tx;

use self::commit::{Write, Writer};
use self::listen::Notifier;
use self::schema::{
    application_name, check_schema_name, describe_target, lock_key, migrate, quote_ident,
};
use self::stash::{stash_size, Conn, Stash, StashTx, ACQUIRE_TIMEOUT};
use self::statements::{statements, Statements};
pub(crate) use self::transactional::PgStepTx;
use self::tx::Pg;

/// Connections of the pool beyond the `Stash`'s: the listener's, and room for the statements of
/// tests and migrations.
const POOL_SPARE: usize = 4;

/// How long the first connection (and the listener's reconnects) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A [`Store`](crate::store::Store) in a PostgreSQL schema, shared by any number of processes on any number of
/// machines.
///
/// Clones are cheap and share one connection pool. Dropping the last clone ends the
/// background task behind [`RunStore::notices`](crate::store::RunStore::notices).
///
/// ```no_run
/// use workflow_core::store::postgres::PostgresStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PostgresStore::connect("postgres://app@db.internal/app", "workflow").await?;
/// assert_eq!(store.schema(), "workflow");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    /// As given (also the notification channel's name).
    schema: String,
    /// `user@host:port/database`, for messages (never the password).
    target: String,
    /// For the listener's own connection.
    options: PgConnectOptions,
    sql: Arc<Statements>,
    /// The advisory lock key serializing this schema's inbox inserts.
    inbox_lock: i64,
    /// Where the listener task runs; captured on connect, so `notices()` works from any thread.
    runtime: tokio::runtime::Handle,
    /// Started by the first `notices()` call.
    notices: OnceLock<Notices>,
    /// The queue to the committers, started by the first batched write.
    committers: OnceLock<mpsc::UnboundedSender<Write>>,
    /// What the committers and a lone write write with.
    writer: Writer,
}

/// The listener task's side of the store. Dropping it (with the last store clone) drops
/// `_stop`, which ends the task.
struct Notices {
    sender: broadcast::Sender<Notice>,
    _stop: oneshot::Sender<()>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.inner.target)
            .field("schema", &self.inner.schema)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user[:password]@host[:port]/database`)
    /// and uses the tables in `schema`, creating the schema and its tables, or migrating them,
    /// first. Processes connecting at the same time take turns migrating.
    ///
    /// `schema` is 1 to 63 ASCII letters, digits and underscores, not starting with a digit or
    /// `pg_`; it is quoted, so it is case-sensitive. Fails with [`StoreError::Database`] when
    /// the database cannot be reached (the message names user, host and database, never the
    /// password), and with [`StoreError::Incompatible`] when the schema holds other tables or
    /// a store written by a newer version of this crate.
    pub async fn connect(url: &str, schema: &str) -> Result<PostgresStore, StoreError> {
        check_schema_name(schema)?;
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| with_source(format!("invalid PostgreSQL URL: {e}"), e))?
            // Tells the store's connections apart in `pg_stat_activity`.
            .application_name(&application_name(schema))
            // Every statement here is prepared once per connection and looks rows up by key;
            // planned anew for each call's values (PostgreSQL's default for a statement's
            // first five runs, and for good when the generic plan looks costlier), the larger
            // ones spent more time planning than running: an end's CTEs took about 0.45 ms to
            // plan and 0.2 ms to run.
            //
            // And never compiled (JIT): the planner's row estimates lag behind tables whose
            // rows are rewritten all the time (1,000 schedules were estimated at 20,010 rows
            // after ten seconds of every-second ticks), so a listing that runs in 8-15 ms was
            // costed at 577,376, above the thresholds of JIT with inlining and optimization,
            // and took 120-150 ms, compiled anew at every execution (auto_explain, `JIT:
            // Functions: 28`). No statement of this store reads enough rows to gain from it.
            .options([("plan_cache_mode", "force_generic_plan"), ("jit", "off")]);
        let target = describe_target(&options);
        let unreachable = format!("cannot connect to PostgreSQL at {target}");
        let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .map_err(|e| {
                let why = format!("{unreachable}: no answer within {CONNECT_TIMEOUT:?}");
                StoreError::Database(DatabaseError::with_source(why, e).transient(true))
            })?
            .map_err(|e| with_source(format!("{unreachable}: {e}"), e))?;
        migrate(&mut conn, schema, &target).await?;
        // The pool opens its own connections on demand; this one was only for migrating.
        let _ = conn.close().await;

        let pool = PgPoolOptions::new()
            .max_connections(u32::try_from(stash_size() + POOL_SPARE).unwrap_or(u32::MAX))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // A ping before every use would double the round trips; connections are already
            // checked when returned to the pool, and a dead one fails one call, not the store.
            .test_before_acquire(false)
            .connect_lazy_with(options.clone());
        let quoted = quote_ident(schema);
        let sql = Arc::new(statements(&quoted));
        let writer = Writer {
            stash: Arc::new(Stash::new(pool.clone())),
            sql: sql.clone(),
            channel: schema.into(),
            inbox_lock: lock_key("inbox", schema),
            writing: Arc::new(AtomicUsize::new(0)),
            commits: Arc::new(AtomicU64::new(0)),
            notifier: Arc::new(Notifier {
                queue: OnceLock::new(),
                runtime: tokio::runtime::Handle::current(),
            }),
            #[cfg(test)]
            groups: Arc::default(),
        };
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                schema: schema.to_owned(),
                target,
                options,
                sql,
                inbox_lock: writer.inbox_lock,
                runtime: tokio::runtime::Handle::current(),
                notices: OnceLock::new(),
                committers: OnceLock::new(),
                writer,
            }),
        })
    }

    /// The schema holding this store's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// Drops the schema with everything in it and closes the pool (for tests). Other clones
    /// of this store fail from then on.
    pub async fn drop_schema(self) -> Result<(), StoreError> {
        let sql = format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            quote_ident(&self.inner.schema)
        );
        sqlx::query(&sql).execute(&self.inner.pool).await?;
        // The pool closes once every connection is back: the kept ones first.
        crate::sync::lock(&self.inner.writer.stash.idle).clear();
        self.inner.pool.close().await;
        Ok(())
    }

    /// A connection for a few statements (see [`Stash`]).
    async fn conn(&self) -> Result<Conn<'_>, StoreError> {
        self.inner.writer.stash.conn().await
    }

    async fn begin(&self) -> Result<StashTx<'_>, StoreError> {
        self.conn().await?.begin().await
    }

    /// The policies' statements on `conn`.
    fn tx<'a>(&'a self, conn: &'a mut PgConnection) -> Pg<'a> {
        Pg {
            conn,
            sql: &self.inner.sql,
            channel: &self.inner.schema,
            inbox_lock: self.inner.inbox_lock,
            lock_with_append: false,
            inbox_held: false,
            notes: None,
        }
    }

    /// The policies' statements on `conn`, the notices of the hot ones collected in `notes`
    /// for [`Writer::announce`] once the transaction committed.
    fn noting<'a>(&'a self, conn: &'a mut PgConnection, notes: &'a mut Vec<String>) -> Pg<'a> {
        Pg {
            notes: Some(notes),
            ..self.tx(conn)
        }
    }
}

/// A value of the wrong type is a corrupt record; anything else is the database's error.
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
                StoreError::Corrupt(e.to_string())
            }
            e => with_source(e.to_string(), e),
        }
    }
}

/// A [`StoreError::Database`] reporting `e`: transient when the connection failed, no pooled
/// connection was free in time, or PostgreSQL asked for a retry (serialization failure,
/// deadlock, shutdown, too many connections).
fn with_source(message: String, e: sqlx::Error) -> StoreError {
    let transient = match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d.code().is_some_and(|c| {
            c.starts_with("08")
                || ["40001", "40P01", "53300", "57P01", "57P02", "57P03"].contains(&&*c)
        }),
        _ => false,
    };
    StoreError::Database(DatabaseError::with_source(message, e).transient(transient))
}
