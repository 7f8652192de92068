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

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection, Postgres};
use tokio::sync::{broadcast, mpsc, oneshot, Mutex};

use super::sql::migrations::{self, Migration, Place};
use super::sql::policy::{
    self, ChunkAppend, EncodedCancel, EncodedChunk, EncodedFailure, NewRunRow, Tx,
};
use super::sql::rows::{
    decode_events, ChunkRow, EventRow, HookRow, InboxRow, LeasedRow, PayloadRow, Picked,
    QueueLimits, QueueRow, RunRow, StreamRow, StreamStateRow,
};
use super::sql::{
    lease_end, owner_of, payload_id_of, sql_epoch, sql_id, sql_time, to_json, EncodedAppend,
    EncodedEnd, EncodedEvents,
};
use super::{
    AcquireRequest, AdminStore, Admission, AdmitOrResume, Append, CancelOutcome, ClaimOutcome,
    EventRecord, FailureOutcome, HookFilter, HookRecord, HookStore, Lease, LeasedRun, NewEvent,
    NewRun, Notice, Payload, PruneStats, QueueDef, QueueInfo, QueueStore, RetryOutcome, RunFilter,
    RunRecord, RunStore, StreamInfo, StreamPage, StreamStore, CHILD_NOTICE_TOKEN,
};
use crate::error::{DatabaseError, Error, StoreError};
use crate::ids::{stable_hash, RunId};

/// Connections of the pool beyond the `Stash`'s: the listener's, and room for the statements of
/// tests and migrations.
const POOL_SPARE: usize = 4;

/// Connections out through the `Stash` at most, in use or kept between uses: twice this
/// machine's cores, from 4 to 16. Each operation holds one for a few round trips. More
/// connections than the work can keep busy cost more than they give: each warms up on its own
/// (statements prepared and planned, catalogs read), and PostgreSQL serves them in turns. On
/// this project's 2-core test machine, W3 (1,000 one-step runs, 100 in flight) printed
/// 5,221 and 5,038 runs/s with 4, 4,619-4,699 with 6, 4,552-4,591 with 8, 3,486-4,447 with 12.
fn stash_size() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    (2 * cores).clamp(4, 16)
}
/// How long the first connection (and the listener's reconnects) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an operation waits for a free pooled connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// Notices buffered per receiver before it lags (lagging loses hints, never data).
const NOTICE_CAPACITY: usize = 1024;
/// The listener's reconnect delay: doubled after each failure, up to the maximum.
const LISTEN_BACKOFF_MIN: Duration = Duration::from_millis(100);
const LISTEN_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Committers per store, each committing one batch at a time on a pooled connection: while
/// one waits for its commit (the WAL flush), the next takes the writes that arrived meanwhile.
const COMMITTERS: usize = 4;
/// Writes per group transaction at most.
const MAX_BATCH: usize = 256;

/// The schema's history, applied in order on connect. `{schema}` stands for the quoted
/// schema name.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "runs, events, hooks and the hook inbox",
        ddl: MIGRATION_1,
    },
    Migration {
        version: 2,
        name: "each run keeps the number of its last event",
        ddl: MIGRATION_2,
    },
    Migration {
        version: 3,
        name: "failed tries and blocks counted per run; blocked runs",
        ddl: MIGRATION_3,
    },
    Migration {
        version: 4,
        name: "child runs: each run names the run that started it",
        ddl: MIGRATION_4,
    },
    Migration {
        version: 5,
        name: "queues: their limits, and each run's queue, partition key, priority and begin",
        ddl: MIGRATION_5,
    },
    Migration {
        version: 6,
        name: "streams from runs and their chunks",
        ddl: MIGRATION_6,
    },
];
/// The tables each version must have (from the version that created them on).
const TABLES: &[(&str, i64)] = &[
    ("runs", 1),
    ("events", 1),
    ("hooks", 1),
    ("hook_inbox", 1),
    ("streams", 6),
    ("stream_chunks", 6),
    ("queues", 5),
];

const MIGRATION_1: &str = r#"
CREATE TABLE {schema}.runs (
    -- "C": ULIDs sort by creation time byte-wise, whatever the database's collation.
    id          TEXT COLLATE "C" PRIMARY KEY,
    workflow    TEXT NOT NULL,
    status      TEXT NOT NULL
                CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    -- JSON is kept as the exact text serde wrote (JSONB would reorder keys, rewrite numbers
    -- and reject \u0000); cast to jsonb to inspect it.
    input       TEXT NOT NULL,
    output      TEXT,
    error       TEXT,                -- JSON of Error
    created_at  BIGINT NOT NULL,     -- ms since the Unix epoch, like every time here
    updated_at  BIGINT NOT NULL,
    wake_at     BIGINT NOT NULL,     -- acquirable from then on (if no live lease)
    epoch       BIGINT NOT NULL DEFAULT 0,  -- the fencing token, +1 per acquisition
    lease_until BIGINT,              -- NULL: nobody holds it
    hook_token  TEXT                 -- claimed at admission (`start(..).hook(token)`)
);
-- Only live runs are ever acquired; ended runs, the bulk over time, stay out of the index.
CREATE INDEX runs_ready ON {schema}.runs (wake_at, id) WHERE status IN ('pending', 'running');
-- list_runs: newest first.
CREATE INDEX runs_created ON {schema}.runs (created_at, id);

CREATE TABLE {schema}.events (
    run_id TEXT NOT NULL,
    seq    BIGINT NOT NULL,
    at     BIGINT NOT NULL,
    kind   TEXT NOT NULL,            -- the serde tag, e.g. step_completed, for SQL inspection
    data   TEXT NOT NULL,            -- JSON of Event
    PRIMARY KEY (run_id, seq)
);

-- One row per claimed token: the primary key is what lets at most one claim win. A row is
-- taken while `active`, or after its release while `retain_until` lies ahead; a free row left
-- behind (released, retention over) is replaced by the next claim.
CREATE TABLE {schema}.hooks (
    token        TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    active       BOOLEAN NOT NULL,
    retain_until BIGINT               -- NULL: free as soon as released
);
CREATE INDEX hooks_run ON {schema}.hooks (run_id);

-- Payloads sent with resume_hook. Ids are drawn under a transaction-level advisory lock, so
-- they grow in commit order (see `PostgresStore::resume_hook`).
CREATE TABLE {schema}.hook_inbox (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id  TEXT NOT NULL,
    token   TEXT NOT NULL,
    payload TEXT NOT NULL,            -- JSON
    at      BIGINT NOT NULL
);
CREATE INDEX hook_inbox_run ON {schema}.hook_inbox (run_id, id);
"#;

/// An append numbers its events from the run's row, which it locks anyway (fencing), instead
/// of from `MAX(seq)` over its events: the row's newest version is what an `UPDATE` reads
/// after waiting for the lock, whatever its snapshot, so fencing, numbering and inserting fit
/// in one statement (one round trip).
const MIGRATION_2: &str = r#"
ALTER TABLE {schema}.runs ADD COLUMN last_seq BIGINT NOT NULL DEFAULT 0;
UPDATE {schema}.runs AS r SET last_seq = e.seq
FROM (SELECT run_id, MAX(seq) AS seq FROM {schema}.events GROUP BY run_id) AS e
WHERE e.run_id = r.id;
-- Room on each page for the appends' row updates to stay heap-only (no index writes).
ALTER TABLE {schema}.runs SET (fillfactor = 80);
"#;

/// Poison runs end (SPEC 8): a run counts the tries at it that failed in a row. A run whose
/// replay diverged is `blocked` (SPEC 9) and counts its blocks for its backoff; it is
/// acquirable when due, so the ready index takes it in.
const MIGRATION_3: &str = r#"
ALTER TABLE {schema}.runs
    ADD COLUMN failed_tries INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN blocked_tries INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN deadline BIGINT,  -- NULL: none (`start(..).timeout(d)`)
    DROP CONSTRAINT runs_status_check,
    ADD CONSTRAINT runs_status_check CHECK
        (status IN ('pending', 'running', 'completed', 'failed', 'cancelled', 'blocked'));
DROP INDEX {schema}.runs_ready;
CREATE INDEX runs_ready ON {schema}.runs (wake_at, id)
    WHERE status IN ('pending', 'running', 'blocked');
"#;

/// Child runs (SPEC 10): a run started with `start_child` names its parent, and whether a
/// cancellation of the parent reaches it.
const MIGRATION_4: &str = r#"
ALTER TABLE {schema}.runs
    ADD COLUMN parent_id TEXT COLLATE "C",  -- NULL: started from outside a workflow
    ADD COLUMN detached BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX runs_parent ON {schema}.runs (parent_id) WHERE parent_id IS NOT NULL;
"#;

/// Streams from runs (SPEC 12): a row per stream holds its length, which is the index the
/// next chunk gets (drawn by the append's upsert, under the row's lock), and whether it is
/// closed; a row per chunk.
const MIGRATION_6: &str = r#"
CREATE TABLE {schema}.streams (
    run_id TEXT COLLATE "C" NOT NULL,
    name   TEXT COLLATE "C" NOT NULL,
    len    BIGINT NOT NULL,
    closed BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (run_id, name)
);
CREATE TABLE {schema}.stream_chunks (
    run_id  TEXT COLLATE "C" NOT NULL,
    name    TEXT COLLATE "C" NOT NULL,
    idx     BIGINT NOT NULL,     -- from 0 per run and stream, in write order
    attempt BIGINT NOT NULL,     -- of the step that wrote it
    at      BIGINT NOT NULL,
    value   TEXT NOT NULL,       -- JSON
    PRIMARY KEY (run_id, name, idx)
);
"#;

/// Flow control (SPEC 11): the queues every process enforces, and where each run stands in
/// its queue. A queued run holds a slot from its first lease (`began_at`) until it ends. An
/// acquirer locks a queue's row while it begins runs of the queue, so acquirers in every
/// process take turns per queue.
const MIGRATION_5: &str = r#"
ALTER TABLE {schema}.runs
    ADD COLUMN queue TEXT,              -- NULL: not in a queue
    ADD COLUMN partition_key TEXT,      -- one run at a time per key and queue
    ADD COLUMN priority INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN began_at BIGINT;         -- queued runs: when it took its slot
CREATE TABLE {schema}.queues (
    name        TEXT COLLATE "C" PRIMARY KEY,
    concurrency BIGINT,                 -- NULL: no limit
    rate_limit  BIGINT,                 -- runs begun per window; NULL: no limit
    rate_period BIGINT,                 -- the window, ms
    updated_at  BIGINT NOT NULL
);
-- The runs waiting for a slot, in the order they begin.
CREATE INDEX runs_queue_waiting ON {schema}.runs (queue, priority DESC, created_at, id)
    WHERE queue IS NOT NULL AND began_at IS NULL AND status IN ('pending', 'running', 'blocked');
-- The waiting runs of each partition key, in start order.
CREATE INDEX runs_queue_keyed ON {schema}.runs (queue, partition_key, created_at, id)
    WHERE queue IS NOT NULL AND partition_key IS NOT NULL AND began_at IS NULL
      AND status IN ('pending', 'running', 'blocked');
-- The runs holding a slot, by partition key.
CREATE INDEX runs_queue_holding ON {schema}.runs (queue, partition_key)
    WHERE queue IS NOT NULL AND began_at IS NOT NULL
      AND status IN ('pending', 'running', 'blocked');
-- Begins, for the rate window.
CREATE INDEX runs_queue_begun ON {schema}.runs (queue, began_at) WHERE began_at IS NOT NULL;
"#;

/// The server's clock, in microseconds since the Unix epoch: what [`Store::now`] reports and
/// every process times its writes by.
const CLOCK: &str = "SELECT floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint";
/// The server's clock as a time column (ms), for what a statement decides without a caller's
/// time: one value for the whole statement.
const NOW_MS: &str = "floor(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::bigint";

/// Serializes migrations of one schema; released at commit. (`resume_hook` takes the same
/// kind of lock on its own key inside its statement.)
const XACT_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// Notice payloads on the wire: short, so a burst stays far below the queue's limits.
const NOTE_READY: &str = "r";
const NOTE_PAYLOAD: &str = "p:";
const NOTE_ENDED: &str = "e:";
const NOTE_CHUNK: &str = "c:";
/// Sends every notice of `$2` on channel `$1`.
const NOTIFY_ALL: &str = "SELECT count(pg_notify($1, n)) FROM UNNEST($2::text[]) AS n";

/// A [`Store`] in a PostgreSQL schema, shared by any number of processes on any number of
/// machines.
///
/// Clones are cheap and share one connection pool. Dropping the last clone ends the
/// background task behind [`Store::notices`].
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
            .options([("plan_cache_mode", "force_generic_plan")]);
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
            notifier: Arc::new(Notifier {
                queue: OnceLock::new(),
                runtime: tokio::runtime::Handle::current(),
            }),
            full_ends: Arc::default(),
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
        crate::lock(&self.inner.writer.stash.idle).clear();
        self.inner.pool.close().await;
        Ok(())
    }

    /// Admits `run`; with `lease`, leased to the caller at once (epoch 1).
    async fn admit(
        &self,
        run: NewRun,
        lease: Option<Duration>,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        let row = NewRunRow::new(run, lease)?;
        let Some((token, retain_until)) = &row.hook else {
            // One statement (the insert): committed with whatever other writes are waiting.
            let (reply, answer) = oneshot::channel();
            self.commit(Write::Admit(row, reply)).await;
            return answer.await.unwrap_or_else(|_| Err(writer_gone()));
        };
        if let Some(decided) = self.admit_claiming(&row, token, *retain_until).await? {
            return Ok(decided);
        }
        // Not batched: a claim locks its token's row, won or lost, and a group transaction
        // would hold it to its commit while the run owning the token, ending in another
        // batch, waits for it (and that batch may hold a token this one claims next). A
        // conflict wrote nothing: ending the transaction at once frees the token's row lock
        // for the next contender.
        self.in_tx_noting(async |pg| policy::admit(pg, &row).await)
            .await
    }

    /// `policy` in a transaction, its notices sent once it committed.
    async fn in_tx_noting<T>(
        &self,
        policy: impl AsyncFnOnce(&mut Pg<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut tx = self.begin().await?;
        let mut notes = Vec::new();
        let done = policy(&mut self.noting(&mut tx, &mut notes)).await;
        let done = settle(tx, done).await?;
        self.inner.writer.announce(notes);
        Ok(done)
    }

    /// Admits `row` claiming `token` in one statement, committed on its own (`policy::admit`'s
    /// statements in one): the claim is the upsert's WHERE on the token's primary key, and the
    /// run is inserted only when it won. A token the statement's snapshot already shows taken
    /// is not claimed at all: the upsert would lock its row (a WAL record, so a flushed
    /// commit, for a start that writes nothing), and the answer is the same as if the start
    /// had come at that snapshot. A claim that lost reads the owner from the snapshot; `None`
    /// when the snapshot shows no owner, because the winning claim committed while this one
    /// waited for the token's row (then `policy::admit`, in a transaction, reads it).
    async fn admit_claiming(
        &self,
        row: &NewRunRow,
        token: &str,
        retain_until: Option<i64>,
    ) -> Result<Option<(Admission, Option<Lease>)>, StoreError> {
        let sql = &self.inner.sql.dialect.admit_claiming[usize::from(row.lease_until.is_some())];
        let (parent, detached) = match &row.parent {
            Some((p, detached)) => (Some(p.as_str()), *detached),
            None => (None, false),
        };
        let query = sqlx::query_as::<_, (bool, bool, Option<String>, bool)>(sql)
            .bind(&row.key)
            .bind(&row.workflow)
            .bind(&row.input)
            .bind(row.created_at)
            .bind(token)
            .bind(retain_until)
            .bind(row.deadline)
            .bind(parent)
            .bind(detached);
        let query = match row.lease_until {
            Some(until) => query.bind(until),
            None => query
                .bind(&row.queue)
                .bind(&row.partition_key)
                .bind(row.priority),
        };
        let mut conn = self.conn().await?;
        let decided = query.fetch_one(&mut *conn).await;
        let (new, admitted, owner, taken) = conn.kept(decided)?;
        if !new {
            return Err(policy::exists(&row.id));
        }
        if admitted {
            self.inner.writer.full_ends.note(&row.key);
            if row.lease_until.is_none() {
                // Nobody leased it: any worker may take it.
                self.inner.writer.announce(vec![NOTE_READY.to_owned()]);
            }
            let lease = row.lease_until.map(|_| Lease {
                run_id: row.id,
                epoch: 1,
            });
            return Ok(Some((Admission::Admitted, lease)));
        }
        match owner {
            Some(owner) if taken => Ok(Some((Admission::Conflict(owner_of(&owner, token)?), None))),
            _ => Ok(None),
        }
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
            full_ends: &self.inner.writer.full_ends,
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

    /// Commits `write`: at once from the caller's task when no other write is under way (a
    /// committer would only add two task wake-ups, with nothing to batch it with), else
    /// through the committers (starting them on first use, where the listener runs: in the
    /// runtime the store was connected in), which answer on the write's own reply channel.
    /// When that runtime is gone, the write is committed here, alone.
    async fn commit(&self, write: Write) {
        let writer = &self.inner.writer;
        let under_way = Writing::count(&writer.writing);
        if under_way.before == 0 {
            let answer = writer.alone(&write).await;
            drop(under_way);
            write.answer(answer);
            return;
        }
        // Counted until a committer answers it.
        under_way.hand_over();
        let queue = self.inner.committers.get_or_init(|| {
            let (queue, writes) = mpsc::unbounded_channel();
            let writes = Arc::new(Mutex::new(writes));
            for _ in 0..COMMITTERS {
                self.inner
                    .runtime
                    .spawn(committer(writer.clone(), writes.clone()));
            }
            queue
        });
        if let Err(mpsc::error::SendError(write)) = queue.send(write) {
            let answer = writer.alone(&write).await;
            writer.writing.fetch_sub(1, Ordering::AcqRel);
            write.answer(answer);
        }
    }
}

#[async_trait::async_trait]
impl RunStore for PostgresStore {
    /// The database server's clock: every process on this store times its writes and
    /// decisions by it, whatever its own clock says.
    async fn now(&self) -> Result<Option<SystemTime>, StoreError> {
        let mut conn = self.conn().await?;
        let micros = sqlx::query_scalar(CLOCK).fetch_one(&mut *conn).await;
        let micros: i64 = conn.kept(micros)?;
        let micros = u64::try_from(micros).map_err(|e| {
            StoreError::Corrupt(format!("the database's clock reads {micros} µs: {e}"))
        })?;
        Ok(Some(SystemTime::UNIX_EPOCH + Duration::from_micros(micros)))
    }

    async fn create_run(&self, run: NewRun) -> Result<Admission, StoreError> {
        Ok(self.admit(run, None).await?.0)
    }

    async fn create_run_leased(
        &self,
        run: NewRun,
        lease: Duration,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        self.admit(run, Some(lease)).await
    }

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let row = sqlx::query_as::<_, RunRow>(&self.inner.sql.get_run)
            .bind(id.to_string())
            .fetch_optional(&mut *conn)
            .await;
        conn.kept(row)?.map(RunRow::decode).transpose()
    }

    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as::<_, EventRow>(&self.inner.sql.events)
            .bind(id.to_string())
            .fetch_all(&mut *conn)
            .await;
        decode_events(conn.kept(rows)?)
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Vec<LeasedRun>, StoreError> {
        if req.limit == 0 || req.workflows.is_empty() {
            return Ok(Vec::new());
        }
        let s = &self.inner.sql;
        let mut tx = self.begin().await?;
        let leased = async {
            // One statement picks and leases; SKIP LOCKED makes concurrent acquirers, in any
            // process, pass over each other's picks instead of waiting or sharing them.
            let (until, at, limit) = (
                lease_end(req.now, req.lease),
                sql_time(req.now),
                sql_id(req.limit),
            );
            let mut rows: Vec<LeasedRow> = sqlx::query_as(&s.acquire)
                .bind(until)
                .bind(at)
                .bind(req.workflows)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?;
            // Then the queued runs that may begin, each queue's row locked meanwhile.
            let room = limit - rows.len() as i64;
            let begin =
                policy::queued_to_begin(&mut self.tx(&mut tx), at, req.workflows, room).await?;
            if !begin.is_empty() {
                let begun: Vec<LeasedRow> = sqlx::query_as(&s.begin_queued)
                    .bind(until)
                    .bind(at)
                    .bind(&begin)
                    .fetch_all(&mut *tx)
                    .await?;
                rows.extend(begun);
            }
            let picked = Picked::new(rows.into_iter().map(Ok).collect());
            let ids = picked.ids();
            if ids.is_empty() {
                return Ok((picked, Vec::new()));
            }
            // All histories in one query, not one round trip per run.
            let events = sqlx::query_as(&s.events_of)
                .bind(&ids)
                .fetch_all(&mut *tx)
                .await?;
            Ok((picked, events))
        }
        .await;
        let (picked, events) = settle(tx, leased).await?;
        let acquired = picked.attach(events);
        for leased in &acquired.runs {
            let run = &leased.run;
            if run.parent.is_some() || run.queue.is_some() || run.hook_token.is_some() {
                self.inner.writer.full_ends.note(&run.id.to_string());
            }
        }
        for (lease, why) in acquired.failed {
            policy::undecodable(self, &lease, &why, req.now).await;
        }
        Ok(acquired.runs)
    }

    async fn append(&self, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        // A write without events that still needs a time (a run's end, token releases) takes
        // the server's, like every other time here.
        let timeless = write.events.is_empty()
            && (write.outcome.is_some() || !write.release_tokens.is_empty());
        let at = if timeless { self.now().await? } else { None };
        let write = EncodedAppend::timed(write, || at.unwrap_or_else(SystemTime::now))?;
        let (reply, answer) = oneshot::channel();
        self.commit(Write::Append(lease.clone(), write, reply))
            .await;
        answer.await.unwrap_or_else(|_| Err(writer_gone()))
    }

    async fn release(
        &self,
        lease: &Lease,
        wake_at: SystemTime,
        payloads_seen: u64,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let released = async {
            // Fenced and locked first (an append of no events), checked for unseen payloads in
            // the next statement: its fresh snapshot sees every payload committed before the
            // lock was granted, and a payload committed later finds the released row and
            // lowers its wake time itself.
            let (run, fence) = (lease.run_id.to_string(), Some(sql_epoch(lease.epoch)));
            let none = EncodedEvents::default();
            if !self.tx(&mut tx).append_events(&run, fence, &none).await? {
                return Err(StoreError::LeaseLost(lease.run_id));
            }
            sqlx::query(&self.inner.sql.release)
                .bind(&run)
                .bind(sql_time(wake_at))
                .bind(sql_id(payloads_seen))
                .bind(&self.inner.schema)
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
        .await;
        settle(tx, released).await
    }

    async fn block(
        &self,
        lease: &Lease,
        divergence: &Error,
        now: SystemTime,
    ) -> Result<SystemTime, StoreError> {
        let error = to_json(divergence, "the divergence")?;
        let epoch = sql_epoch(lease.epoch);
        let mut tx = self.begin().await?;
        let run = &lease.run_id;
        let blocked = policy::block(&mut self.tx(&mut tx), run, epoch, &error, now).await;
        settle(tx, blocked).await
    }

    async fn retry(&self, id: &RunId, now: SystemTime) -> Result<RetryOutcome, StoreError> {
        let mut tx = self.begin().await?;
        let done = policy::retry(&mut self.tx(&mut tx), id, now).await;
        settle(tx, done).await
    }

    async fn wake_blocked(&self, now: SystemTime) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        let woken = sqlx::query_as::<_, (i64, i64)>(&self.inner.sql.wake_blocked)
            .bind(sql_time(now))
            .bind(&self.inner.schema)
            .fetch_one(&mut *conn)
            .await;
        let (woken, _notes) = conn.kept(woken)?;
        Ok(woken.unsigned_abs())
    }

    async fn create_run_with_history(
        &self,
        run: NewRun,
        history: &[NewEvent],
    ) -> Result<(), StoreError> {
        let row = NewRunRow::new(run, None)?;
        let events = EncodedEvents::new(history)?;
        let mut tx = self.begin().await?;
        let created = policy::create_with_history(&mut self.tx(&mut tx), &row, &events).await;
        settle(tx, created).await
    }

    async fn start_child(
        &self,
        lease: &Lease,
        child_key: &str,
        child: NewRun,
    ) -> Result<Admission, StoreError> {
        let row = NewRunRow::new(child, None)?;
        self.in_tx_noting(async |pg| policy::start_child(pg, lease, child_key, &row).await)
            .await
    }

    async fn record_failure(
        &self,
        lease: &Lease,
        cause: &Error,
        now: SystemTime,
    ) -> Result<FailureOutcome, StoreError> {
        let failure = EncodedFailure::new(cause, now)?;
        let epoch = sql_epoch(lease.epoch);
        let mut tx = self.begin().await?;
        let run = &lease.run_id;
        let recorded = policy::record_failure(&mut self.tx(&mut tx), run, epoch, &failure).await;
        settle(tx, recorded).await
    }

    async fn heartbeat(
        &self,
        leases: &[Lease],
        lease: Duration,
        now: SystemTime,
    ) -> Result<Vec<RunId>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = leases.iter().map(|l| l.run_id.to_string()).collect();
        let epochs: Vec<i64> = leases.iter().map(|l| sql_epoch(l.epoch)).collect();
        // One statement renews every lease still held; the rest are lost.
        let mut conn = self.conn().await?;
        let renewed = sqlx::query_as(&self.inner.sql.heartbeat)
            .bind(&ids)
            .bind(&epochs)
            .bind(lease_end(now, lease))
            .fetch_all(&mut *conn)
            .await;
        let renewed: Vec<(String, i64)> = conn.kept(renewed)?;
        Ok(policy::lost(leases, renewed))
    }

    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        let cancel = EncodedCancel::new(id, now)?;
        self.in_tx_noting(async |pg| policy::cancel(pg, &cancel).await)
            .await
    }

    fn notices(&self) -> Option<broadcast::Receiver<Notice>> {
        let notices = self.inner.notices.get_or_init(|| {
            let (sender, _) = broadcast::channel(NOTICE_CAPACITY);
            let (stop, stopped) = oneshot::channel();
            // The task holds no reference to the store, only what it needs: it ends when the
            // last clone drops `stop`.
            self.inner.runtime.spawn(listen(
                self.inner.options.clone(),
                self.inner.schema.clone(),
                sender.clone(),
                stopped,
            ));
            Notices {
                sender,
                _stop: stop,
            }
        });
        Some(notices.sender.subscribe())
    }
}

#[async_trait::async_trait]
impl HookStore for PostgresStore {
    /// One transaction decides. It holds the inbox lock from its first statement (the resume)
    /// to its commit, so concurrent `admit_or_resume` calls in the schema, and resumes, take
    /// turns; only a plain `.hook(..)` start or a workflow's `create_hook` can take the token
    /// between its resume and its claim, and then the transaction is rolled back (it wrote
    /// nothing) and the next one resumes to that hook.
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: Value,
    ) -> Result<AdmitOrResume, StoreError> {
        const ATTEMPTS: usize = 8;
        let row = NewRunRow::new(run, lease)?;
        let payload = to_json(&payload, "the payload")?;
        for _ in 0..ATTEMPTS {
            let mut tx = self.begin().await?;
            let decided = policy::admit_or_resume(&mut self.tx(&mut tx), &row, &payload).await;
            if let Some(outcome) = settle(tx, decided).await? {
                return Ok(outcome);
            }
        }
        Err(StoreError::Database(
            DatabaseError::new(format!(
                "hook token {:?} changed hands {ATTEMPTS} times while starting or resuming",
                row.hook.as_ref().map_or("", |h| h.0.as_str())
            ))
            .transient(true),
        ))
    }

    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut tx = self.begin().await?;
        let claimed = policy::claim_hook(&mut self.tx(&mut tx), lease, hook_key, token, at).await;
        settle(tx, claimed).await
    }

    /// Payload ids must grow in commit order: `payloads_since` readers advance a cursor past
    /// every id they have seen, so an id drawn earlier but committed later would be skipped
    /// for good. Identity values are drawn at insert time, not at commit, so each insert takes
    /// a transaction-level advisory lock (one key per schema) before drawing its id and holds
    /// it until its commit; PostgreSQL makes a commit visible before it releases the
    /// transaction's locks, so when the next insert draws an id, every smaller id is already
    /// visible. Locking the token's hook row instead would only order payloads per token,
    /// not across tokens, which is what the global cursor needs. The cost is one resume
    /// committing at a time per schema; the whole resume is one statement (one round trip,
    /// its own transaction), so the lock is held for little more than the commit.
    async fn resume_hook(
        &self,
        token: &str,
        payload: Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError> {
        let payload = to_json(&payload, "the payload")?;
        let mut conn = self.conn().await?;
        let queued = sqlx::query_as(&self.inner.sql.resume)
            .bind(token)
            .bind(&payload)
            .bind(sql_time(at))
            .bind(self.inner.inbox_lock)
            .bind(&self.inner.schema)
            .fetch_optional(&mut *conn)
            .await;
        let queued: Option<(i64, String, i64)> = conn.kept(queued)?;
        let Some((payload_id, owner, _notes)) = queued else {
            return Ok(None);
        };
        Ok(Some((owner_of(&owner, token)?, payload_id_of(payload_id)?)))
    }

    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<Payload>, StoreError> {
        let key = run.to_string();
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.payloads)
            .bind(&key)
            .bind(sql_id(after))
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<PayloadRow> = conn.kept(rows)?;
        rows.into_iter().map(|p| p.decode(&key)).collect()
    }

    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.payloads_since)
            .bind(sql_id(after))
            .bind(sql_id(limit))
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<InboxRow> = conn.kept(rows)?;
        rows.into_iter().map(InboxRow::decode).collect()
    }

    async fn last_payload_id(&self) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        let last = sqlx::query_scalar(&self.inner.sql.last_payload_id)
            .fetch_one(&mut *conn)
            .await;
        let last: i64 = conn.kept(last)?;
        payload_id_of(last)
    }

    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let row = sqlx::query_as(&self.inner.sql.get_hook)
            .bind(token)
            .fetch_optional(&mut *conn)
            .await;
        let row: Option<HookRow> = conn.kept(row)?;
        row.map(HookRow::decode).transpose()
    }

    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        let (token, run, limit) = policy::hook_filter(filter);
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.list_hooks)
            .bind(token)
            .bind(run)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<HookRow> = conn.kept(rows)?;
        rows.into_iter().map(HookRow::decode).collect()
    }
}

#[async_trait::async_trait]
impl StreamStore for PostgresStore {
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let chunk = EncodedChunk::new(stream, attempt, &value, at)?;
        // One statement, its own transaction.
        let mut conn = self.conn().await?;
        let mut notes = Vec::new();
        let appended =
            policy::append_chunk(&mut self.noting(&mut conn, &mut notes), lease, &chunk).await;
        let appended = conn.kept(appended)?;
        self.inner.writer.announce(notes);
        Ok(appended)
    }

    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        _at: SystemTime,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let closed = policy::close_stream(&mut self.tx(&mut tx), lease, stream).await;
        settle(tx, closed).await
    }

    /// Two statements on one connection, the state first: each sees every commit made before
    /// it started, so what the state says was true before the chunks were read.
    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        let run = run.to_string();
        let mut conn = self.conn().await?;
        let read = async {
            let state: StreamStateRow = sqlx::query_as(&self.inner.sql.stream_state)
                .bind(&run)
                .bind(stream)
                .fetch_one(&mut *conn)
                .await?;
            let chunks: Vec<ChunkRow> = sqlx::query_as(&self.inner.sql.stream_chunks)
                .bind(&run)
                .bind(stream)
                .bind(sql_id(from))
                .bind(sql_id(limit))
                .fetch_all(&mut *conn)
                .await?;
            Ok::<_, sqlx::Error>((state, chunks))
        }
        .await;
        let (state, chunks) = conn.kept(read)?;
        state.page(&run, stream, chunks)
    }

    async fn list_streams(&self, run: &RunId) -> Result<Vec<StreamInfo>, StoreError> {
        let run = run.to_string();
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.list_streams)
            .bind(&run)
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<StreamRow> = conn.kept(rows)?;
        rows.into_iter().map(|r| r.decode(&run)).collect()
    }
}

#[async_trait::async_trait]
impl QueueStore for PostgresStore {
    async fn define_queues(&self, queues: &[QueueDef]) -> Result<(), StoreError> {
        if queues.is_empty() {
            return Ok(());
        }
        let rows = policy::queue_rows(queues);
        let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let concurrency: Vec<Option<i64>> = rows.iter().map(|r| r.1).collect();
        let rates: Vec<Option<i64>> = rows.iter().map(|r| r.2).collect();
        let periods: Vec<Option<i64>> = rows.iter().map(|r| r.3).collect();
        let at = self.now().await?.unwrap_or_else(SystemTime::now);
        let mut conn = self.conn().await?;
        let done = sqlx::query(&self.inner.sql.define_queue)
            .bind(names)
            .bind(concurrency)
            .bind(rates)
            .bind(periods)
            .bind(sql_time(at))
            .execute(&mut *conn)
            .await;
        conn.kept(done)?;
        Ok(())
    }

    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        let mut conn = self.conn().await?;
        let opening = sqlx::query_scalar(&self.inner.sql.queue_opening)
            .bind(sql_time(now))
            .fetch_one(&mut *conn)
            .await;
        let opening: Option<i64> = conn.kept(opening)?;
        opening
            .map(|ms| super::sql::time_of(ms, "-", "queue opening"))
            .transpose()
    }

    async fn list_queues(&self, now: SystemTime) -> Result<Vec<QueueInfo>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.list_queues)
            .bind(sql_time(now))
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<QueueRow> = conn.kept(rows)?;
        rows.into_iter().map(QueueRow::decode).collect()
    }
}

#[async_trait::async_trait]
impl AdminStore for PostgresStore {
    async fn prune(&self, before: SystemTime, now: SystemTime) -> Result<PruneStats, StoreError> {
        let mut tx = self.begin().await?;
        let pruned = policy::prune(&mut self.tx(&mut tx), before, now).await;
        settle(tx, pruned).await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let (status, workflow, limit, queue, parent, after, before, cursor) =
            policy::run_filter(filter);
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.list_runs)
            .bind(status)
            .bind(workflow)
            .bind(limit)
            .bind(queue)
            .bind(parent)
            .bind(after)
            .bind(before)
            .bind(cursor)
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<RunRow> = conn.kept(rows)?;
        let runs = rows
            .into_iter()
            .map(RunRow::decode)
            .collect::<Result<_, _>>()?;
        policy::listed(self, filter, runs).await
    }
}

// ---------------------------------------------------------------------------------------------
// Statements

/// Every statement with the schema spelled in, built once per store: sqlx prepares each one
/// once per connection and reuses it (its cache is keyed by the SQL text). Read it side by
/// side with SQLite's.
type Statements = super::sql::Statements<String, PgOnly>;

/// The statements SQLite does without: its writer holds the database's one write lock.
struct PgOnly {
    /// `append`, taking the inbox lock first when the run has a parent (`$6` lock key): the
    /// first statement of a run's end, which may queue a notice to the parent. The lock is
    /// an InitPlan of the row's UPDATE, so it is held before the row is locked.
    append_ending: String,
    /// Takes the inbox lock (see `resume_hook`). `$1` lock key.
    lock_inbox: String,
    /// See [`policy::Tx::append_and_end`].
    append_and_end: String,
    /// Takes the inbox lock (`$1`) if any of the runs `$2` has a parent: what a group
    /// transaction ending those runs does first.
    lock_inbox_for_children: String,
    /// `append_and_end` for a run with no parent, no queue and no live token (most runs):
    /// none of its other parts has anything to do, and PostgreSQL sets them all up on every
    /// call. No row when the run is not such a run, or its lease is lost; then
    /// `append_and_end` decides. `$1` run, `$2` times, `$3` kinds, `$4` data, `$5` epoch or
    /// NULL, `$6` status, `$7` output, `$8` error, `$9` now.
    append_and_end_plain: String,
    /// The events of several runs in one statement (see `Writer::append_many`): `$1` runs, `$2`
    /// their epochs, `$3` their counts of events; `$4` .. `$8` the events (run, index within the
    /// run from 1, time, kind, data). The rows are locked in id order, each fenced as `append`
    /// fences it; the answer: the runs written (a run missing was fenced out).
    append_many: String,
    /// Admissions without a token, several in one statement (see `Writer::admit_many`), leased
    /// to the admitting worker where `$5` has a lease's end: `$1` ids, `$2` workflows, `$3`
    /// inputs, `$4` times, `$5` lease ends, `$6` deadlines, `$7` parents, `$8` detached, `$9`
    /// queues, `$10` partition keys, `$11` priorities. The answer: the ids admitted (an id
    /// missing existed already).
    admit_many: String,
    /// An admission claiming its token, in one statement: see `PostgresStore::admit_claiming`.
    /// `[0]` waits for a worker, `[1]` is leased to the admitting one.
    admit_claiming: [String; 2],
}

/// The statement admitting a run with its token (see `PostgresStore::admit_claiming`): `$1` id,
/// `$2` workflow, `$3` input, `$4` created at, `$5` token, `$6` retained until, `$7` deadline,
/// `$8` parent, `$9` detached, then with `leased` `$10` the lease's end, else `$10` queue,
/// `$11` partition key, `$12` priority. One row: whether the id was new, whether the run was
/// admitted, and the token's owner as the statement's snapshot saw it (and whether it holds
/// the token).
fn admit_claiming_sql(s: &str, leased: bool) -> String {
    let insert = if leased {
        format!(
            "INSERT INTO {s}.runs
                 (id, workflow, status, input, created_at, updated_at, wake_at, hook_token,
                  epoch, lease_until, deadline, parent_id, detached)
             SELECT $1, $2, 'running', $3, $4, $4, $4, $5, 1, $10, $7, $8, $9 FROM claimed"
        )
    } else {
        format!(
            "INSERT INTO {s}.runs
                 (id, workflow, status, input, created_at, updated_at, wake_at, hook_token,
                  deadline, parent_id, detached, queue, partition_key, priority)
             SELECT $1, $2, 'pending', $3, $4, $4, $4, $5, $7, $8, $9, $10, $11, $12
             FROM claimed"
        )
    };
    format!(
        "WITH fresh AS (SELECT NOT EXISTS (SELECT 1 FROM {s}.runs WHERE id = $1) AS new),
         seen AS (
             SELECT run_id FROM {s}.hooks
             WHERE token = $5 AND (active OR COALESCE(retain_until, 0) > $4)),
         claimed AS (
             INSERT INTO {s}.hooks AS h (token, run_id, created_at, active, retain_until)
             SELECT $5, $1, $4, TRUE, $6 FROM fresh
             WHERE fresh.new AND NOT EXISTS (SELECT 1 FROM seen)
             ON CONFLICT (token) DO UPDATE SET
                 run_id = EXCLUDED.run_id, created_at = EXCLUDED.created_at, active = TRUE,
                 retain_until = EXCLUDED.retain_until
             WHERE NOT h.active AND COALESCE(h.retain_until, 0) <= EXCLUDED.created_at
             RETURNING run_id),
         inserted AS ({insert} RETURNING id)
         SELECT (SELECT new FROM fresh), EXISTS (SELECT 1 FROM inserted), o.run_id,
                COALESCE(o.active OR COALESCE(o.retain_until, 0) > $4, FALSE)
         FROM (SELECT 1) AS one
         LEFT JOIN {s}.hooks AS o ON o.token = $5"
    )
}

const RUN_COLUMNS: &str = "id, workflow, status, input, output, error, created_at, updated_at, \
                           hook_token, deadline, parent_id, queue, partition_key, priority";

/// SQL building a child's [`ChildNotice`](crate::store::ChildNotice) JSON from the run id,
/// status, output JSON and error JSON parameters named, as `ChildNotice::encode` writes it.
fn child_notice_sql(id: &str, status: &str, output: &str, error: &str) -> String {
    format!(
        r#"('{{"child":"' || {id} || '","status":"' || {status} || '","output":' || COALESCE({output}, 'null') || ',"error":' || COALESCE({error}, 'null') || '}}')"#
    )
}

/// The statements for the tables in schema `s` (quoted).
fn statements(s: &str) -> Statements {
    // A child's `ChildNotice` JSON, assembled by the statement that ends the child and only
    // for a child: the end's status, output and error are sent once, as its columns.
    let end_notice = child_notice_sql("$1", "$2", "$3", "$4");
    let ending_notice = child_notice_sql("$1", "$6", "$7", "$8");
    // What every append of one run's events (`$1` run, `$2` times, `$3` kinds, `$4` data)
    // inserts, numbered after the `base` its fenced update of the run's row returned (from
    // CTE `numbered` or `ended`).
    let insert_events = |from: &str| {
        format!(
            "INSERT INTO {s}.events (run_id, seq, at, kind, data)
             SELECT $1, {from}.base + e.n, e.at, e.kind, e.data
             FROM {from},
                  UNNEST($2::bigint[], $3::text[], $4::text[])
                      WITH ORDINALITY AS e(at, kind, data, n)"
        )
    };
    let (insert_numbered, insert_ended) = (insert_events("numbered"), insert_events("ended"));
    // After a run's end (CTE `ended`: its id, parent and queue) and its notice queued to the
    // parent (CTE `queued`): the parent woken at `now`, and the notices to send.
    let woken_notes = |now: &str| {
        format!(
            "woken AS (
                 UPDATE {s}.runs r SET wake_at = CASE r.status
                     WHEN 'blocked' THEN r.wake_at ELSE LEAST(r.wake_at, {now}) END
                 FROM queued q WHERE r.id = q.run_id
                 RETURNING r.id, r.status IN ('pending', 'running')
                     AND (r.lease_until IS NULL OR r.lease_until <= {NOW_MS}) AS idle),
             notes AS (
                 SELECT ARRAY['{NOTE_ENDED}' || e.id]
                     || ARRAY(SELECT '{NOTE_PAYLOAD}' || w.id FROM woken w)
                     || CASE WHEN e.queue IS NOT NULL
                                  OR EXISTS (SELECT 1 FROM woken w WHERE w.idle)
                             THEN ARRAY['{NOTE_READY}'] ELSE ARRAY[]::text[] END AS n
                 FROM ended e)"
        )
    };
    let (end_woken_notes, ending_woken_notes) = (woken_notes("$5"), woken_notes("$9"));
    // A run's end with its last events, fenced by epoch `$5` unless NULL: status `$6`, output
    // `$7`, error `$8` at `$9`.
    let end_fenced = format!(
        "UPDATE {s}.runs SET last_seq = last_seq + cardinality($2::bigint[]),
             status = $6, output = $7, error = $8, updated_at = $9, lease_until = NULL
         WHERE id = $1
           AND ($5::bigint IS NULL
                OR (epoch = $5 AND status = 'running' AND lease_until IS NOT NULL))"
    );
    {
        Statements {
            run_exists: format!("SELECT 1 FROM {s}.runs WHERE id = $1"),
            // Inserted and announced, or nothing (the id exists): one row or none.
            insert_run: format!(
                "WITH inserted AS (
                     INSERT INTO {s}.runs
                         (id, workflow, status, input, created_at, updated_at, wake_at, hook_token,
                          deadline, parent_id, detached, queue, partition_key, priority)
                     VALUES ($1, $2, 'pending', $3, $4, $4, $4, $5, $6, $7, $8, $9, $10, $11)
                     ON CONFLICT (id) DO NOTHING
                     RETURNING id)
                 SELECT id FROM inserted"
            ),
            // Admitted and leased to the admitting worker (epoch 1, lease until `$6`): nobody
            // else may take it, so nobody is told it is ready.
            insert_leased_run: format!(
                "INSERT INTO {s}.runs
                     (id, workflow, status, input, created_at, updated_at, wake_at, hook_token,
                      epoch, lease_until, deadline, parent_id, detached)
                 VALUES ($1, $2, 'running', $3, $4, $4, $4, $5, 1, $6, $7, $8, $9)
                 ON CONFLICT (id) DO NOTHING
                 RETURNING id"
            ),
            // The decision is the upsert's own WHERE on the token's primary key: of any number
            // of claims, in any process, exactly one takes a free token. A taken token's row
            // is locked all the same, so the owner read next is the owner.
            claim: format!(
                "INSERT INTO {s}.hooks AS h (token, run_id, created_at, active, retain_until)
                 VALUES ($1, $2, $3, TRUE, $4)
                 ON CONFLICT (token) DO UPDATE SET
                     run_id = EXCLUDED.run_id, created_at = EXCLUDED.created_at, active = TRUE,
                     retain_until = EXCLUDED.retain_until
                 WHERE NOT h.active AND COALESCE(h.retain_until, 0) <= EXCLUDED.created_at"
            ),
            hook_owner: format!("SELECT run_id, active FROM {s}.hooks WHERE token = $1"),
            get_run: format!("SELECT {RUN_COLUMNS} FROM {s}.runs WHERE id = $1"),
            events: format!(
                "SELECT run_id, seq, at, data FROM {s}.events WHERE run_id = $1 ORDER BY seq"
            ),
            events_of: format!(
                "SELECT run_id, seq, at, data FROM {s}.events
                 WHERE run_id = ANY($1) ORDER BY run_id, seq"
            ),
            // MATERIALIZED: the locked pick is computed exactly once.
            acquire: format!(
                "WITH picked AS MATERIALIZED (
                     SELECT id FROM {s}.runs
                     WHERE status IN ('pending', 'running', 'blocked')
                       AND wake_at <= $2
                       AND (lease_until IS NULL OR lease_until <= $2)
                       AND workflow = ANY($3)
                       -- Waiting queued runs are left to `begin_queued`, unless their
                       -- deadline has passed: handed out without a slot, they fail at once.
                       AND (queue IS NULL OR began_at IS NOT NULL OR deadline <= $2)
                     ORDER BY wake_at, id
                     LIMIT $4
                     FOR UPDATE SKIP LOCKED)
                 UPDATE {s}.runs AS r
                 SET epoch = r.epoch + 1, status = 'running', lease_until = $1, error = NULL
                 FROM picked WHERE r.id = picked.id
                 RETURNING r.id, r.workflow, r.status, r.input, r.output, r.error,
                           r.created_at, r.updated_at, r.hook_token, r.deadline, r.parent_id,
                           r.queue, r.partition_key, r.priority, r.epoch, r.wake_at"
            ),
            // Fenced (with epoch `$5`, unless NULL), numbered after the run's last event
            // (`runs.last_seq`, bumped in the same statement) and inserted: one statement. The
            // run's row stays locked until commit, so no takeover, cancel or other write to
            // the run interleaves with the caller's. No row when the lease is lost. `$2`
            // times, `$3` kinds, `$4` data.
            append: format!(
                "WITH numbered AS (
                     UPDATE {s}.runs SET last_seq = last_seq + cardinality($2::bigint[])
                     WHERE id = $1
                       AND ($5::bigint IS NULL
                            OR (epoch = $5 AND status = 'running' AND lease_until IS NOT NULL))
                     RETURNING last_seq - cardinality($2::bigint[]) AS base),
                 inserted AS (
                     {insert_numbered})
                 SELECT base FROM numbered"
            ),
            run_status: format!("SELECT status FROM {s}.runs WHERE id = $1 FOR UPDATE"),
            // Ended; a child's end (a `ChildNotice`, built here from the end's own columns) is
            // queued to its parent under the notice token (`$6`), with the inbox lock (`$7`,
            // see `resume`) taken only then, and the parent woken; the end of a queued run
            // frees a slot, so its queue's waiting runs may be ready. The answer: the notices
            // to send. With `$8`, the run's tokens are given up too (as `release_tokens` does
            // for all of them): a retained row stays, inactive, the others go.
            end_run: format!(
                "WITH ended AS (
                     UPDATE {s}.runs SET status = $2, output = $3, error = $4, updated_at = $5,
                         lease_until = NULL
                     WHERE id = $1
                     RETURNING id, parent_id, queue),
                 freed AS (
                     DELETE FROM {s}.hooks
                     WHERE $8 AND run_id = $1 AND active AND COALESCE(retain_until, 0) <= $5),
                 kept AS (
                     UPDATE {s}.hooks SET active = FALSE
                     WHERE $8 AND run_id = $1 AND active AND COALESCE(retain_until, 0) > $5),
                 locked AS (
                     SELECT pg_advisory_xact_lock($7), e.parent_id
                     FROM ended e WHERE e.parent_id IS NOT NULL),
                 queued AS (
                     INSERT INTO {s}.hook_inbox (run_id, token, payload, at)
                     SELECT l.parent_id, $6, {end_notice}, $5 FROM locked l
                     RETURNING run_id),
                 {end_woken_notes}
                 SELECT COALESCE((SELECT n FROM notes), ARRAY[]::text[])"
            ),
            children_to_cancel: format!(
                "SELECT id FROM {s}.runs
                 WHERE parent_id = $1 AND NOT detached
                   AND status NOT IN ('completed', 'failed', 'cancelled')"
            ),
            // Giving up tokens (`$3`, or NULL for all the run's): the row goes, freeing the
            // token, unless retained past now; then it stays, inactive, until a claim after
            // its retention replaces it.
            release_tokens: [
                format!(
                    "DELETE FROM {s}.hooks
                     WHERE run_id = $1 AND active AND COALESCE(retain_until, 0) <= $2
                       AND ($3::text[] IS NULL OR token = ANY($3))"
                ),
                format!(
                    "UPDATE {s}.hooks SET active = FALSE
                     WHERE run_id = $1 AND active AND ($2::text[] IS NULL OR token = ANY($2))"
                ),
            ],
            // Announced only when acquirable now: telling every worker about a run due later
            // would only make them look in vain. A payload it has not seen makes it due now,
            // on the server's clock. `$4` channel.
            release: format!(
                "WITH released AS (
                     UPDATE {s}.runs SET lease_until = NULL, failed_tries = 0,
                         wake_at = CASE
                             WHEN EXISTS (SELECT 1 FROM {s}.hook_inbox WHERE run_id = $1 AND id > $3)
                             THEN {NOW_MS} ELSE $2 END
                     WHERE id = $1
                     RETURNING wake_at)
                 SELECT pg_notify($4, '{NOTE_READY}') FROM released WHERE wake_at <= {NOW_MS}"
            ),
            count_failure: format!(
                "UPDATE {s}.runs SET failed_tries = failed_tries + 1, lease_until = NULL
                 WHERE id = $1 AND epoch = $2 AND status = 'running' AND lease_until IS NOT NULL
                 RETURNING failed_tries::bigint"
            ),
            retry_at: format!("UPDATE {s}.runs SET wake_at = $2 WHERE id = $1"),
            block: format!(
                "UPDATE {s}.runs SET status = 'blocked', error = $3, updated_at = $4,
                     lease_until = NULL, blocked_tries = blocked_tries + 1
                 WHERE id = $1 AND epoch = $2 AND status = 'running' AND lease_until IS NOT NULL
                 RETURNING blocked_tries::bigint"
            ),
            // Announced: the run is acquirable now. `$3` channel.
            retry: format!(
                "WITH retried AS (
                     UPDATE {s}.runs SET
                         status = CASE status WHEN 'failed' THEN 'pending' ELSE status END,
                         error = CASE status WHEN 'failed' THEN NULL ELSE error END,
                         -- Re-opened, it waits for a slot of its queue again.
                         began_at = CASE status WHEN 'failed' THEN NULL ELSE began_at END,
                         updated_at = $2, wake_at = $2, failed_tries = 0, blocked_tries = 0
                     WHERE id = $1 AND status IN ('failed', 'blocked')
                     RETURNING id)
                 SELECT pg_notify($3, '{NOTE_READY}') FROM retried"
            ),
            // `$2` channel.
            wake_blocked: format!(
                "WITH woken AS (
                     UPDATE {s}.runs SET wake_at = LEAST(wake_at, $1) WHERE status = 'blocked'
                     RETURNING id),
                 notes AS (SELECT pg_notify($2, '{NOTE_READY}') FROM (SELECT 1 FROM woken LIMIT 1) w)
                 SELECT (SELECT count(*) FROM woken), (SELECT count(*) FROM notes)"
            ),
            forget_payloads: format!("DELETE FROM {s}.hook_inbox WHERE run_id = $1 AND id = ANY($2)"),
            // One statement, so one round trip and an implicit transaction: take the inbox
            // lock (see `PostgresStore::resume_hook`), queue the payload if the token has an
            // owner, lower the owner's wake time, and announce the payload (and, when nobody
            // drives the run, that it is ready). The insert's rows come from the join with
            // `locked`, so its identity value is drawn only after the lock is held. `notes` is
            // read only so that it runs: PostgreSQL skips a `WITH` query that does not modify
            // data unless something reads it. Whether a lease still holds the run is judged
            // on the server's clock. `$1` token, `$2` payload, `$3` at, `$4` lock key, `$5`
            // channel.
            resume: format!(
                "WITH locked AS (SELECT pg_advisory_xact_lock($4)),
                 queued AS (
                     INSERT INTO {s}.hook_inbox (run_id, token, payload, at)
                     SELECT h.run_id, h.token, $2, $3 FROM {s}.hooks h, locked
                     WHERE h.token = $1 AND h.active
                     RETURNING id, run_id),
                 woken AS (
                     UPDATE {s}.runs r SET wake_at = CASE r.status
                         WHEN 'blocked' THEN r.wake_at ELSE LEAST(r.wake_at, $3) END
                     FROM queued q WHERE r.id = q.run_id
                     RETURNING r.status IN ('pending', 'running')
                         AND (r.lease_until IS NULL OR r.lease_until <= {NOW_MS}) AS idle),
                 notes AS (
                     SELECT pg_notify($5, n)
                     FROM queued q LEFT JOIN woken w ON true,
                     UNNEST(CASE WHEN w.idle
                         THEN ARRAY['{NOTE_PAYLOAD}' || q.run_id, '{NOTE_READY}']
                         ELSE ARRAY['{NOTE_PAYLOAD}' || q.run_id] END) AS n)
                 SELECT q.id, q.run_id, (SELECT count(*) FROM notes) FROM queued q"
            ),
            payloads: format!(
                "SELECT id, token, payload FROM {s}.hook_inbox
                 WHERE run_id = $1 AND id > $2 ORDER BY id"
            ),
            payloads_since: format!(
                "SELECT id, run_id FROM {s}.hook_inbox WHERE id > $1 ORDER BY id LIMIT $2"
            ),
            last_payload_id: format!("SELECT COALESCE(MAX(id), 0) FROM {s}.hook_inbox"),
            get_hook: format!(
                "SELECT token, run_id, created_at FROM {s}.hooks WHERE token = $1 AND active"
            ),
            // The rows are locked in id order, the order a group transaction of the
            // committers locks them in: a renewal and a batch of the same runs never wait for
            // each other both ways.
            heartbeat: format!(
                "WITH held AS MATERIALIZED (
                     SELECT r.id FROM {s}.runs r
                     JOIN UNNEST($1::text[], $2::bigint[]) AS l(id, epoch)
                         ON r.id = l.id AND r.epoch = l.epoch
                     WHERE r.status = 'running' AND r.lease_until IS NOT NULL
                     ORDER BY r.id
                     FOR UPDATE OF r)
                 UPDATE {s}.runs AS r SET lease_until = $3
                 FROM held WHERE r.id = held.id
                 RETURNING r.id, r.epoch"
            ),
            // A NULL filter matches everything.
            list_runs: format!(
                "SELECT {RUN_COLUMNS} FROM {s}.runs
                 WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR workflow = $2)
                   AND ($4::text IS NULL OR queue = $4) AND ($5::text IS NULL OR parent_id = $5)
                   AND ($6::bigint IS NULL OR created_at >= $6)
                   AND ($7::bigint IS NULL OR created_at < $7)
                   AND ($8::text IS NULL OR (created_at, id) <
                        (SELECT c.created_at, c.id FROM {s}.runs c WHERE c.id = $8))
                 ORDER BY created_at DESC, id DESC
                 LIMIT $3"
            ),
            // Ties broken byte-wise, like the other stores.
            list_hooks: format!(
                "SELECT token, run_id, created_at FROM {s}.hooks
                 WHERE active AND ($1::text IS NULL OR token = $1)
                   AND ($2::text IS NULL OR run_id = $2)
                 ORDER BY created_at DESC, token COLLATE \"C\"
                 LIMIT $3"
            ),
            // `$1` ended before, `$2` now; then `$1`: the pruned ids.
            prune_runs: format!(
                "DELETE FROM {s}.runs r
                 WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < $1
                   AND NOT EXISTS (SELECT 1 FROM {s}.hooks h
                                   WHERE h.run_id = r.id AND h.retain_until > $2)
                 RETURNING id"
            ),
            prune_records: ["events", "hook_inbox", "hooks", "streams", "stream_chunks"]
                .map(|t| format!("DELETE FROM {s}.{t} WHERE run_id = ANY($1)")),
            // One statement, so one round trip and its own transaction: fence (the run's row
            // stays locked to the end, so no end or cancel of the run interleaves), draw the
            // index from the stream's row (the counter, locked too: concurrent writers to one
            // stream take turns and get indexes in commit order; a closed stream's row is not
            // updated, so no index) and insert the chunk. `$1` run, `$2` epoch, `$3` stream,
            // `$4` attempt, `$5` at, `$6` value; the answer: (fenced, index or NULL when
            // closed).
            append_chunk: format!(
                "WITH fenced AS (
                     UPDATE {s}.runs SET last_seq = last_seq
                     WHERE id = $1 AND epoch = $2 AND status = 'running'
                       AND lease_until IS NOT NULL
                     RETURNING id),
                 counted AS (
                     INSERT INTO {s}.streams AS st (run_id, name, len, closed)
                     SELECT id, $3, 1, FALSE FROM fenced
                     ON CONFLICT (run_id, name) DO UPDATE SET len = st.len + 1
                     WHERE NOT st.closed
                     RETURNING st.len - 1 AS idx),
                 inserted AS (
                     INSERT INTO {s}.stream_chunks (run_id, name, idx, attempt, at, value)
                     SELECT $1, $3, idx, $4, $5, $6 FROM counted
                     RETURNING run_id)
                 SELECT (SELECT count(*) FROM fenced), (SELECT idx FROM counted)"
            ),
            // Closed and announced. `$3` channel.
            close_stream: format!(
                "WITH closed AS (
                     INSERT INTO {s}.streams AS st (run_id, name, len, closed)
                     VALUES ($1, $2, 0, TRUE)
                     ON CONFLICT (run_id, name) DO UPDATE SET closed = TRUE
                     RETURNING run_id)
                 SELECT pg_notify($3, '{NOTE_CHUNK}' || run_id) FROM closed"
            ),
            stream_state: format!(
                "SELECT (SELECT status FROM {s}.runs WHERE id = $1) AS status,
                        (SELECT len FROM {s}.streams WHERE run_id = $1 AND name = $2) AS len,
                        (SELECT closed FROM {s}.streams WHERE run_id = $1 AND name = $2)
                            AS closed"
            ),
            stream_chunks: format!(
                "SELECT idx, attempt, at, value FROM {s}.stream_chunks
                 WHERE run_id = $1 AND name = $2 AND idx >= $3 ORDER BY idx LIMIT $4"
            ),
            list_streams: format!(
                "SELECT name, len, closed FROM {s}.streams WHERE run_id = $1 ORDER BY name"
            ),
            // Rows as arrays: `$1` names, `$2` concurrency, `$3` rate limits, `$4` periods,
            // `$5` now.
            define_queue: format!(
                "INSERT INTO {s}.queues (name, concurrency, rate_limit, rate_period, updated_at)
                 SELECT q.name, q.concurrency, q.rate_limit, q.rate_period, $5
                 FROM UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::bigint[])
                     AS q(name, concurrency, rate_limit, rate_period)
                 ON CONFLICT (name) DO UPDATE SET concurrency = EXCLUDED.concurrency,
                     rate_limit = EXCLUDED.rate_limit, rate_period = EXCLUDED.rate_period,
                     updated_at = EXCLUDED.updated_at"
            ),
            // `$1` now.
            list_queues: format!(
                "SELECT q.name, q.concurrency, q.rate_limit, q.rate_period,
                     (SELECT count(*) FROM {s}.runs
                      WHERE queue = q.name AND began_at IS NOT NULL
                        AND status IN ('pending', 'running', 'blocked')) AS occupied,
                     (SELECT count(*) FROM {s}.runs
                      WHERE queue = q.name AND began_at IS NULL
                        AND status IN ('pending', 'running', 'blocked')) AS waiting,
                     (SELECT count(*) FROM {s}.runs
                      WHERE q.rate_period IS NOT NULL AND queue = q.name
                        AND began_at > $1 - q.rate_period) AS begun_in_window
                 FROM {s}.queues q ORDER BY q.name"
            ),
            // `$1` now. The window's oldest begin leaves it at `began_at + rate_period`.
            queue_opening: format!(
                "SELECT MIN(opening) FROM (
                     SELECT (SELECT MIN(began_at) FROM {s}.runs r
                             WHERE r.queue = q.name AND r.began_at > $1 - q.rate_period)
                            + q.rate_period AS opening
                     FROM {s}.queues q
                     WHERE q.rate_limit IS NOT NULL AND q.rate_period IS NOT NULL
                       AND EXISTS (SELECT 1 FROM {s}.runs w
                                   WHERE w.queue = q.name AND w.began_at IS NULL
                                     AND w.status IN ('pending', 'running', 'blocked'))
                       AND (SELECT count(*) FROM {s}.runs r
                            WHERE r.queue = q.name AND r.began_at > $1 - q.rate_period)
                           >= q.rate_limit) AS o"
            ),
            // In byte order, the order declarations lock queues in too.
            waiting_queues: format!(
                "SELECT DISTINCT queue COLLATE \"C\" AS q FROM {s}.runs
                 WHERE queue IS NOT NULL AND began_at IS NULL
                   AND status IN ('pending', 'running', 'blocked')
                   AND wake_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)
                   AND workflow = ANY($2)
                 ORDER BY q"
            ),
            // Held until the acquire's transaction ends: one acquirer at a time begins runs
            // of the queue, and the next one's counts, read after the lock is granted, see
            // what it began.
            lock_queue: format!(
                "SELECT concurrency, rate_limit, rate_period FROM {s}.queues
                 WHERE name = $1 FOR UPDATE"
            ),
            queue_counts: format!(
                "SELECT
                     (SELECT count(*) FROM {s}.runs
                      WHERE queue = $1 AND began_at IS NOT NULL
                        AND status IN ('pending', 'running', 'blocked')),
                     (SELECT count(*) FROM {s}.runs WHERE queue = $1 AND began_at > $2)"
            ),
            // `$1` queue, `$2` now, `$3` workflows, `$4` limit. Walks the waiting runs in the
            // order they begin and stops at the limit. Of a key, only the earliest started
            // waiting run may begin, and only while none of the key holds a slot.
            queue_candidates: format!(
                "SELECT id FROM {s}.runs w
                 WHERE queue = $1 AND began_at IS NULL
                   AND status IN ('pending', 'running', 'blocked')
                   AND wake_at <= $2 AND (lease_until IS NULL OR lease_until <= $2)
                   AND workflow = ANY($3)
                   AND (partition_key IS NULL OR (
                       NOT EXISTS (
                           SELECT 1 FROM {s}.runs e
                           WHERE e.queue = $1 AND e.partition_key = w.partition_key
                             AND e.partition_key IS NOT NULL AND e.began_at IS NULL
                             AND e.status IN ('pending', 'running', 'blocked')
                             AND (e.created_at, e.id) < (w.created_at, w.id))
                       AND NOT EXISTS (
                           SELECT 1 FROM {s}.runs h
                           WHERE h.queue = $1 AND h.partition_key = w.partition_key
                             AND h.began_at IS NOT NULL
                             AND h.status IN ('pending', 'running', 'blocked'))))
                 ORDER BY priority DESC, created_at, id
                 LIMIT $4"
            ),
            // `$1` lease until, `$2` now, `$3` the run ids. A run locked meanwhile (being
            // cancelled) is passed over.
            begin_queued: format!(
                "WITH picked AS MATERIALIZED (
                     SELECT id FROM {s}.runs
                     WHERE id = ANY($3) AND began_at IS NULL
                       AND status IN ('pending', 'running', 'blocked')
                       AND (lease_until IS NULL OR lease_until <= $2)
                     FOR UPDATE SKIP LOCKED)
                 UPDATE {s}.runs AS r
                 SET epoch = r.epoch + 1, status = 'running', lease_until = $1, error = NULL,
                     began_at = $2
                 FROM picked WHERE r.id = picked.id
                 RETURNING r.id, r.workflow, r.status, r.input, r.output, r.error,
                           r.created_at, r.updated_at, r.hook_token, r.deadline, r.parent_id,
                           r.queue, r.partition_key, r.priority, r.epoch, r.wake_at"
            ),
            dialect: PgOnly {
                append_ending: format!(
                    "WITH numbered AS (
                         UPDATE {s}.runs SET last_seq = last_seq + cardinality($2::bigint[])
                         WHERE id = $1
                           AND ($5::bigint IS NULL
                                OR (epoch = $5 AND status = 'running' AND lease_until IS NOT NULL))
                           AND (SELECT count(*) FROM (
                                    SELECT pg_advisory_xact_lock($6) FROM {s}.runs p
                                    WHERE p.id = $1 AND p.parent_id IS NOT NULL) l) >= 0
                         RETURNING last_seq - cardinality($2::bigint[]) AS base),
                     inserted AS (
                         {insert_numbered})
                     SELECT base FROM numbered"
                ),
                // `append_ending` and `end_run` (releasing the tokens) in one statement: the
                // run's row is updated once, numbering the events and ending it. `$1` run,
                // `$2` times, `$3` kinds, `$4` data, `$5` epoch or NULL, `$6` status, `$7`
                // output, `$8` error, `$9` now, `$10` the notice token (the child's notice is
                // built from `$1`, `$6`, `$7`, `$8`), `$11` the inbox lock (taken before the
                // row lock, and only for a child). One row, with the notices to send; none when
                // the lease is lost.
                append_and_end: format!(
                    "WITH ended AS (
                         {end_fenced}
                           AND (SELECT count(*) FROM (
                                    SELECT pg_advisory_xact_lock($11) FROM {s}.runs p
                                    WHERE p.id = $1 AND p.parent_id IS NOT NULL) l) >= 0
                         RETURNING id, parent_id, queue,
                                   last_seq - cardinality($2::bigint[]) AS base),
                     inserted AS (
                         {insert_ended}),
                     freed AS (
                         DELETE FROM {s}.hooks
                         WHERE run_id = $1 AND EXISTS (SELECT 1 FROM ended)
                           AND active AND COALESCE(retain_until, 0) <= $9),
                     kept AS (
                         UPDATE {s}.hooks SET active = FALSE
                         WHERE run_id = $1 AND EXISTS (SELECT 1 FROM ended)
                           AND active AND COALESCE(retain_until, 0) > $9),
                     queued AS (
                         INSERT INTO {s}.hook_inbox (run_id, token, payload, at)
                         SELECT e.parent_id, $10, {ending_notice}, $9 FROM ended e
                         WHERE e.parent_id IS NOT NULL
                         RETURNING run_id),
                     {ending_woken_notes}
                     SELECT base, (SELECT n FROM notes) FROM ended"
                ),
                append_and_end_plain: format!(
                    "WITH ended AS (
                         {end_fenced}
                           AND parent_id IS NULL AND queue IS NULL AND hook_token IS NULL
                           AND NOT EXISTS (SELECT 1 FROM {s}.hooks h
                                           WHERE h.run_id = $1 AND h.active)
                         RETURNING last_seq - cardinality($2::bigint[]) AS base),
                     inserted AS (
                         {insert_ended})
                     SELECT base FROM ended"
                ),
                append_many: format!(
                    "WITH locked AS MATERIALIZED (
                         SELECT r.id, i.n
                         FROM {s}.runs r
                         JOIN UNNEST($1::text[], $2::bigint[], $3::bigint[]) AS i(run, epoch, n)
                             ON r.id = i.run
                         WHERE r.epoch = i.epoch AND r.status = 'running'
                           AND r.lease_until IS NOT NULL
                         ORDER BY r.id
                         FOR UPDATE OF r),
                     numbered AS (
                         UPDATE {s}.runs r SET last_seq = r.last_seq + l.n
                         FROM locked l WHERE r.id = l.id
                         RETURNING r.id, r.last_seq - l.n AS base),
                     inserted AS (
                         INSERT INTO {s}.events (run_id, seq, at, kind, data)
                         SELECT e.run, nb.base + e.k, e.at, e.kind, e.data
                         FROM UNNEST($4::text[], $5::bigint[], $6::bigint[], $7::text[],
                                     $8::text[]) AS e(run, k, at, kind, data)
                         JOIN numbered nb ON nb.id = e.run)
                     SELECT id FROM numbered"
                ),
                admit_many: format!(
                    "INSERT INTO {s}.runs
                         (id, workflow, status, input, created_at, updated_at, wake_at,
                          epoch, lease_until, deadline, parent_id, detached, queue,
                          partition_key, priority)
                     SELECT a.id, a.workflow,
                            CASE WHEN a.lease_until IS NULL THEN 'pending' ELSE 'running' END,
                            a.input, a.at, a.at, a.at,
                            CASE WHEN a.lease_until IS NULL THEN 0 ELSE 1 END,
                            a.lease_until, a.deadline, a.parent_id, a.detached, a.queue,
                            a.partition_key, a.priority
                     FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bigint[],
                                 $5::bigint[], $6::bigint[], $7::text[], $8::bool[],
                                 $9::text[], $10::text[], $11::int[])
                          AS a(id, workflow, input, at, lease_until, deadline, parent_id,
                               detached, queue, partition_key, priority)
                     ON CONFLICT (id) DO NOTHING
                     RETURNING id"
                ),
                lock_inbox: "SELECT pg_advisory_xact_lock($1)".to_owned(),
                admit_claiming: [false, true].map(|leased| admit_claiming_sql(s, leased)),
                // Parent ids never change, so reading them unlocked is enough.
                lock_inbox_for_children: format!(
                    "SELECT count(pg_advisory_xact_lock($1)) FROM (
                         SELECT 1 FROM {s}.runs
                         WHERE id = ANY($2) AND parent_id IS NOT NULL LIMIT 1) AS c"
                ),
            },
        }
    }
}

/// The policies' statements on one connection: inside a transaction, or in autocommit when
/// the policy runs a single statement.
struct Pg<'a> {
    conn: &'a mut PgConnection,
    sql: &'a Statements,
    /// The schema's notification channel.
    channel: &'a str,
    /// The advisory lock key serializing the schema's inbox inserts.
    inbox_lock: i64,
    /// Set by `lock_inbox_for_end(Some(run))`: the next append of that run takes the inbox
    /// lock (if the run has a parent) before its row lock, in the same statement.
    lock_with_append: bool,
    /// The transaction took the inbox lock before any row lock (a group transaction with
    /// runs' ends): `lock_inbox_for_end` has nothing left to take.
    inbox_held: bool,
    /// Where the hot statements' notices go, to be sent once the transaction committed (see
    /// `Notifier`); without it they are sent in the transaction.
    notes: Option<&'a mut Vec<String>>,
    /// The runs known to need the whole `append_and_end` (see `FullEnds`).
    full_ends: &'a FullEnds,
}

impl Pg<'_> {
    /// Ends the run; with `release`, gives up its tokens in the same statement.
    async fn end(
        &mut self,
        run: &str,
        end: &EncodedEnd,
        now: i64,
        release: bool,
    ) -> Result<(), StoreError> {
        let notes: Vec<String> = sqlx::query_scalar(&self.sql.end_run)
            .bind(run)
            .bind(end.status.as_str())
            .bind(&end.output)
            .bind(&end.error)
            .bind(now)
            .bind(CHILD_NOTICE_TOKEN)
            .bind(self.inbox_lock)
            .bind(release)
            .fetch_one(&mut *self.conn)
            .await?;
        self.announce(notes).await
    }

    /// Announces `notes` on the schema's channel: once the transaction committed when a
    /// caller collects them, else with a statement of the transaction.
    async fn announce(&mut self, notes: Vec<String>) -> Result<(), StoreError> {
        if notes.is_empty() {
            return Ok(());
        }
        match &mut self.notes {
            Some(collected) => collected.extend(notes),
            None => {
                sqlx::query(NOTIFY_ALL)
                    .bind(self.channel)
                    .bind(&notes)
                    .execute(&mut *self.conn)
                    .await?;
            }
        }
        Ok(())
    }
}

impl Tx for Pg<'_> {
    async fn run_exists(&mut self, id: &str) -> Result<bool, StoreError> {
        let row = sqlx::query(&self.sql.run_exists)
            .bind(id)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(row.is_some())
    }

    async fn insert_run(&mut self, run: &NewRunRow) -> Result<bool, StoreError> {
        let token = run.hook.as_ref().map(|h| h.0.as_str());
        let sql = match run.lease_until {
            None => &self.sql.insert_run,
            Some(_) => &self.sql.insert_leased_run,
        };
        let insert = sqlx::query(sql)
            .bind(&run.key)
            .bind(&run.workflow)
            .bind(&run.input)
            .bind(run.created_at)
            .bind(token);
        // `$6`: until when it is leased.
        let insert = match run.lease_until {
            None => insert,
            Some(until) => insert.bind(until),
        };
        let (parent, detached) = match &run.parent {
            Some((p, detached)) => (Some(p.as_str()), *detached),
            None => (None, false),
        };
        let insert = insert.bind(run.deadline).bind(parent).bind(detached);
        let insert = match run.lease_until {
            None => insert
                .bind(&run.queue)
                .bind(&run.partition_key)
                .bind(run.priority),
            Some(_) => insert,
        };
        let inserted = insert.fetch_optional(&mut *self.conn).await?.is_some();
        if inserted && (token.is_some() || run.parent.is_some() || run.queue.is_some()) {
            self.full_ends.note(&run.key);
        }
        // A run nobody leased: any worker may take it.
        if inserted && run.lease_until.is_none() {
            self.announce(vec![NOTE_READY.to_owned()]).await?;
        }
        Ok(inserted)
    }

    async fn claim(
        &mut self,
        token: &str,
        run: &str,
        at: i64,
        retain_until: Option<i64>,
    ) -> Result<bool, StoreError> {
        let claimed = sqlx::query(&self.sql.claim)
            .bind(token)
            .bind(run)
            .bind(at)
            .bind(retain_until)
            .execute(&mut *self.conn)
            .await?;
        let claimed = claimed.rows_affected() > 0;
        if claimed {
            self.full_ends.note(run);
        }
        Ok(claimed)
    }

    async fn hook_owner(&mut self, token: &str) -> Result<(String, bool), StoreError> {
        Ok(sqlx::query_as(&self.sql.hook_owner)
            .bind(token)
            .fetch_one(&mut *self.conn)
            .await?)
    }

    async fn resume(
        &mut self,
        token: &str,
        payload: &str,
        at: i64,
    ) -> Result<Option<InboxRow>, StoreError> {
        // The inbox lock it takes is held until this transaction ends (see
        // `PostgresStore::resume_hook`).
        let queued: Option<(i64, String, i64)> = sqlx::query_as(&self.sql.resume)
            .bind(token)
            .bind(payload)
            .bind(at)
            .bind(self.inbox_lock)
            .bind(self.channel)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(queued.map(|(id, run_id, _notes)| InboxRow { id, run_id }))
    }

    async fn append_events(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
    ) -> Result<bool, StoreError> {
        let ending = std::mem::take(&mut self.lock_with_append);
        let sql = if ending {
            &self.sql.dialect.append_ending
        } else {
            &self.sql.append
        };
        let mut query = sqlx::query_scalar(sql)
            .bind(run)
            .bind(&events.at)
            .bind(&events.kind)
            .bind(&events.data)
            .bind(fence);
        if ending {
            query = query.bind(self.inbox_lock);
        }
        let base: Option<i64> = query.fetch_optional(&mut *self.conn).await?;
        Ok(base.is_some())
    }

    async fn release_tokens(
        &mut self,
        run: &str,
        tokens: Option<&[String]>,
        now: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.sql.release_tokens[0])
            .bind(run)
            .bind(now)
            .bind(tokens)
            .execute(&mut *self.conn)
            .await?;
        sqlx::query(&self.sql.release_tokens[1])
            .bind(run)
            .bind(tokens)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn prune_runs(&mut self, before: i64, now: i64) -> Result<Vec<String>, StoreError> {
        let query = sqlx::query_scalar(&self.sql.prune_runs).bind(before);
        Ok(query.bind(now).fetch_all(&mut *self.conn).await?)
    }

    async fn prune_records(&mut self, runs: &[String]) -> Result<Vec<u64>, StoreError> {
        let mut deleted = Vec::new();
        for sql in &self.sql.prune_records {
            let done = sqlx::query(sql).bind(runs).execute(&mut *self.conn).await?;
            deleted.push(done.rows_affected());
        }
        Ok(deleted)
    }

    async fn forget_payloads(&mut self, run: &str, ids: &[i64]) -> Result<(), StoreError> {
        let query = sqlx::query(&self.sql.forget_payloads).bind(run).bind(ids);
        query.execute(&mut *self.conn).await?;
        Ok(())
    }

    async fn count_failure(&mut self, run: &str, epoch: i64) -> Result<Option<i64>, StoreError> {
        let query = sqlx::query_scalar(&self.sql.count_failure).bind(run);
        Ok(query.bind(epoch).fetch_optional(&mut *self.conn).await?)
    }

    async fn block(
        &mut self,
        run: &str,
        epoch: i64,
        error: &str,
        now: i64,
    ) -> Result<Option<i64>, StoreError> {
        let query = sqlx::query_scalar(&self.sql.block).bind(run).bind(epoch);
        let query = query.bind(error).bind(now);
        Ok(query.fetch_optional(&mut *self.conn).await?)
    }

    async fn retry(&mut self, run: &str, now: i64) -> Result<(), StoreError> {
        let query = sqlx::query(&self.sql.retry).bind(run).bind(now);
        query.bind(self.channel).execute(&mut *self.conn).await?;
        Ok(())
    }

    async fn retry_at(&mut self, run: &str, at: i64) -> Result<(), StoreError> {
        let query = sqlx::query(&self.sql.retry_at).bind(run).bind(at);
        query.execute(&mut *self.conn).await?;
        Ok(())
    }

    async fn run_status(&mut self, run: &str) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(&self.sql.run_status)
            .bind(run)
            .fetch_optional(&mut *self.conn)
            .await?)
    }

    async fn append_chunk(
        &mut self,
        run: &str,
        fence: i64,
        chunk: &EncodedChunk,
    ) -> Result<ChunkAppend, StoreError> {
        let (fenced, idx): (i64, Option<i64>) = sqlx::query_as(&self.sql.append_chunk)
            .bind(run)
            .bind(fence)
            .bind(&chunk.stream)
            .bind(chunk.attempt)
            .bind(chunk.at)
            .bind(&chunk.value)
            .fetch_one(&mut *self.conn)
            .await?;
        if fenced != 0 && idx.is_some() {
            self.announce(vec![format!("{NOTE_CHUNK}{run}")]).await?;
        }
        Ok(match (fenced, idx) {
            (0, _) => ChunkAppend::LeaseLost,
            (_, None) => ChunkAppend::Closed,
            (_, Some(idx)) => ChunkAppend::Appended(idx),
        })
    }

    async fn close_stream(&mut self, run: &str, stream: &str) -> Result<(), StoreError> {
        sqlx::query(&self.sql.close_stream)
            .bind(run)
            .bind(stream)
            .bind(self.channel)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn waiting_queues(
        &mut self,
        now: i64,
        workflows: &[String],
    ) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(&self.sql.waiting_queues)
            .bind(now)
            .bind(workflows)
            .fetch_all(&mut *self.conn)
            .await?)
    }

    async fn lock_queue(&mut self, name: &str) -> Result<Option<QueueLimits>, StoreError> {
        Ok(sqlx::query_as(&self.sql.lock_queue)
            .bind(name)
            .fetch_optional(&mut *self.conn)
            .await?)
    }

    async fn queue_counts(&mut self, name: &str, since: i64) -> Result<(i64, i64), StoreError> {
        Ok(sqlx::query_as(&self.sql.queue_counts)
            .bind(name)
            .bind(since)
            .fetch_one(&mut *self.conn)
            .await?)
    }

    async fn queue_candidates(
        &mut self,
        name: &str,
        now: i64,
        workflows: &[String],
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(&self.sql.queue_candidates)
            .bind(name)
            .bind(now)
            .bind(workflows)
            .bind(limit)
            .fetch_all(&mut *self.conn)
            .await?)
    }

    async fn end_run(&mut self, run: &str, end: &EncodedEnd, now: i64) -> Result<(), StoreError> {
        self.end(run, end, now, false).await
    }

    async fn append_and_end(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
        end: &EncodedEnd,
        now: i64,
    ) -> Result<bool, StoreError> {
        // The statement takes the inbox lock itself (for a child), before the row lock.
        self.lock_with_append = false;
        // `$1` .. `$9`, the same in both statements.
        let ending = |sql| {
            sqlx::query(sql)
                .bind(run)
                .bind(&events.at)
                .bind(&events.kind)
                .bind(&events.data)
                .bind(fence)
                .bind(end.status.as_str())
                .bind(&end.output)
                .bind(&end.error)
                .bind(now)
        };
        if !self.full_ends.take(run) {
            let plain = ending(&self.sql.dialect.append_and_end_plain)
                .fetch_optional(&mut *self.conn)
                .await?;
            if plain.is_some() {
                self.announce(vec![format!("{NOTE_ENDED}{run}")]).await?;
                return Ok(true);
            }
        }
        let ended = ending(&self.sql.dialect.append_and_end)
            .bind(CHILD_NOTICE_TOKEN)
            .bind(self.inbox_lock)
            .fetch_optional(&mut *self.conn)
            .await?;
        let Some(ended) = ended else {
            return Ok(false);
        };
        let notes: Vec<String> = sqlx::Row::try_get(&ended, 1)?;
        self.announce(notes).await?;
        Ok(true)
    }

    async fn end_run_releasing(
        &mut self,
        run: &str,
        end: &EncodedEnd,
        now: i64,
    ) -> Result<(), StoreError> {
        self.end(run, end, now, true).await
    }

    async fn lock_inbox_for_end(&mut self, run: Option<&str>) -> Result<(), StoreError> {
        if self.inbox_held {
            return Ok(());
        }
        match run {
            // Taken by the run's next statement, its fenced append: no round trip of its own.
            Some(_) => self.lock_with_append = true,
            None => {
                sqlx::query(&self.sql.dialect.lock_inbox)
                    .bind(self.inbox_lock)
                    .execute(&mut *self.conn)
                    .await?;
            }
        }
        Ok(())
    }

    async fn children_to_cancel(&mut self, run: &str) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(&self.sql.children_to_cancel)
            .bind(run)
            .fetch_all(&mut *self.conn)
            .await?)
    }
}

// ---------------------------------------------------------------------------------------------
// The committers (group commit across runs)

/// A write the committers take: an append, or an admission without a hook token (one
/// insert). Each carries where its answer goes.
enum Write {
    Append(Lease, EncodedAppend, Reply<()>),
    Admit(NewRunRow, Reply<(Admission, Option<Lease>)>),
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A write's outcome, held until its transaction's fate is known.
enum Answer {
    Append(Result<(), StoreError>),
    Admit(Result<(Admission, Option<Lease>), StoreError>),
}

impl Answer {
    /// The error, if the write failed.
    fn error(&self) -> Option<&StoreError> {
        match self {
            Answer::Append(r) => r.as_ref().err(),
            Answer::Admit(r) => r.as_ref().err(),
        }
    }
}

impl Write {
    /// The run it writes: a group transaction writes its runs in id order, the order
    /// heartbeats lock rows in (see `heartbeat`), so the two never wait for each other both
    /// ways.
    fn run_id(&self) -> &RunId {
        match self {
            Write::Append(lease, ..) => &lease.run_id,
            Write::Admit(row, _) => &row.id,
        }
    }

    /// The append, when it only adds events (a step's result and the next step, say).
    fn events_only(&self) -> Option<(&Lease, &EncodedAppend)> {
        match self {
            Write::Append(lease, write, _) if write.events_only() => Some((lease, write)),
            _ => None,
        }
    }

    /// Whether the write may take the inbox lock: an append ending its run.
    fn ends_run(&self) -> bool {
        matches!(self, Write::Append(_, write, _) if write.end.is_some())
    }

    /// Its policy, on `pg`.
    async fn apply(&self, pg: &mut Pg<'_>) -> Answer {
        match self {
            Write::Append(lease, write, _) => {
                Answer::Append(policy::append(pg, lease, write).await)
            }
            Write::Admit(row, _) => Answer::Admit(policy::admit(pg, row).await),
        }
    }

    /// Sends `answer` to the caller, who may have stopped waiting (the write stands either
    /// way). An answer of the other kind cannot happen; it is reported, not panicked on.
    fn answer(self, answer: Answer) {
        let mismatch = || StoreError::database("internal error: a write got another's answer");
        match (self, answer) {
            (Write::Append(_, _, reply), Answer::Append(r)) => drop(reply.send(r)),
            (Write::Admit(_, reply), Answer::Admit(r)) => drop(reply.send(r)),
            (Write::Append(_, _, reply), _) => drop(reply.send(Err(mismatch()))),
            (Write::Admit(_, reply), _) => drop(reply.send(Err(mismatch()))),
        }
    }

    /// The answer of this write failing with `e`.
    fn failed(&self, e: StoreError) -> Answer {
        match self {
            Write::Append(..) => Answer::Append(Err(e)),
            Write::Admit(..) => Answer::Admit(Err(e)),
        }
    }

    /// Answers with `why` (its group transaction did not commit).
    fn fail(self, why: &DatabaseError) {
        let e = || StoreError::Database(why.clone());
        match self {
            Write::Append(_, _, reply) => drop(reply.send(Err(e()))),
            Write::Admit(_, reply) => drop(reply.send(Err(e()))),
        }
    }
}

/// The error a caller gets when its write's committer ended before answering (its tokio
/// runtime shut down): whether the write committed is unknown.
fn writer_gone() -> StoreError {
    StoreError::Database(
        DatabaseError::new("the store's committer stopped before answering; the write may or may not have committed")
            .transient(true),
    )
}

/// `e` as the error of a whole group transaction.
fn database_of(e: StoreError) -> DatabaseError {
    match e {
        StoreError::Database(why) => why,
        other => DatabaseError::new(other.to_string()),
    }
}

/// Connections kept between uses instead of given back to sqlx's pool, which pings each
/// connection given back (one more round trip, and a task, per use). A kept connection is
/// used again as it is: sqlx reads whatever an earlier, cancelled use left unread before its
/// next statement. One whose use failed on the database's or the network's side goes back to
/// the pool, which checks it and closes it if it is broken.
///
/// At most [`stash_size`] connections are out through the stash at a time, and a caller waits for
/// a permit rather than for the pool: a connection given back to the stash reaches the next
/// caller, where one waiting on the pool would never see it.
struct Stash {
    pool: PgPool,
    idle: std::sync::Mutex<Vec<PoolConnection<Postgres>>>,
    permits: tokio::sync::Semaphore,
}

impl Stash {
    fn new(pool: PgPool) -> Self {
        Stash {
            pool,
            idle: std::sync::Mutex::new(Vec::new()),
            permits: tokio::sync::Semaphore::new(stash_size()),
        }
    }

    /// A kept connection, or else one from the pool.
    async fn conn(&self) -> Result<Conn<'_>, StoreError> {
        // A free permit at once, as usual; the timer only for a wait.
        let permit = match self.permits.try_acquire() {
            Ok(permit) => permit,
            Err(_) => tokio::time::timeout(ACQUIRE_TIMEOUT, self.permits.acquire())
                .await
                .map_err(|_| StoreError::from(sqlx::Error::PoolTimedOut))?
                .map_err(|_| StoreError::from(sqlx::Error::PoolClosed))?,
        };
        let kept = crate::lock(&self.idle).pop();
        let conn = match kept {
            Some(conn) => conn,
            None => self.pool.acquire().await?,
        };
        Ok(Conn {
            stash: self,
            conn: Some(conn),
            keep: true,
            _permit: permit,
        })
    }
}

/// A connection from the [`Stash`], kept again when dropped unless its use failed.
struct Conn<'a> {
    stash: &'a Stash,
    /// Always `Some` until dropped.
    conn: Option<PoolConnection<Postgres>>,
    keep: bool,
    /// Given back after the connection (fields drop in order).
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Conn<'_> {
    /// Passes on `result`, the outcome of this connection's use: after a database error the
    /// connection goes back to the pool instead of being kept.
    fn kept<T, E: Into<StoreError>>(mut self, result: Result<T, E>) -> Result<T, StoreError> {
        let result = result.map_err(Into::into);
        if matches!(result, Err(StoreError::Database(_))) {
            self.keep = false;
        }
        result
    }
}

impl<'a> Conn<'a> {
    /// Opens a transaction on this connection.
    async fn begin(mut self) -> Result<StashTx<'a>, StoreError> {
        if let Err(e) = self.execute("BEGIN").await {
            self.keep = false;
            return Err(e.into());
        }
        Ok(StashTx {
            conn: self,
            open: true,
        })
    }
}

/// A transaction on a stashed connection, from BEGIN to COMMIT or ROLLBACK. Dropped while open
/// (its caller stopped waiting), it closes its connection, which ends the transaction on the
/// server; a connection is never kept or given back to the pool in a transaction.
struct StashTx<'a> {
    conn: Conn<'a>,
    open: bool,
}

impl StashTx<'_> {
    async fn commit(self) -> Result<(), StoreError> {
        self.end("COMMIT").await
    }

    async fn rollback(self) -> Result<(), StoreError> {
        self.end("ROLLBACK").await
    }

    async fn end(mut self, how: &str) -> Result<(), StoreError> {
        self.conn.execute(how).await?;
        self.open = false;
        Ok(())
    }
}

impl std::ops::Deref for StashTx<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for StashTx<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

impl Drop for StashTx<'_> {
    fn drop(&mut self) {
        if self.open {
            self.conn.keep = false;
            if let Some(conn) = &mut self.conn.conn {
                conn.close_on_drop();
            }
        }
    }
}

impl std::ops::Deref for Conn<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match &self.conn {
            Some(conn) => conn,
            None => unreachable!("a stashed connection is only taken when dropped"),
        }
    }
}

impl std::ops::DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match &mut self.conn {
            Some(conn) => conn,
            None => unreachable!("a stashed connection is only taken when dropped"),
        }
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if self.keep {
            crate::lock(&self.stash.idle).push(conn);
        }
    }
}

/// What the committers write with: the store's pool and statements (not the store itself:
/// the committers end when the last clone of it is dropped, which closes their queue).
#[derive(Clone)]
struct Writer {
    stash: Arc<Stash>,
    sql: Arc<Statements>,
    channel: Arc<str>,
    inbox_lock: i64,
    /// Writes under way: taken by a caller alone, or handed to the committers and not yet
    /// answered.
    writing: Arc<AtomicUsize>,
    notifier: Arc<Notifier>,
    full_ends: Arc<FullEnds>,
}

/// The runs leased or admitted here that have a parent, a queue or a token: their end needs
/// the whole `append_and_end`, so it is not first tried as a plain end (a round trip that
/// would find nothing). Only a hint: a run missing here that needs it costs that round trip,
/// and a run listed here that no longer does costs nothing but a larger statement.
#[derive(Default)]
struct FullEnds(std::sync::Mutex<std::collections::HashSet<String>>);

/// Runs listed in [`FullEnds`] at most; the list starts again when full (leases lost to
/// other processes leave their runs listed).
const FULL_ENDS_MAX: usize = 100_000;

impl FullEnds {
    fn note(&self, run: &str) {
        let mut runs = crate::lock(&self.0);
        if runs.len() >= FULL_ENDS_MAX {
            runs.clear();
        }
        runs.insert(run.to_owned());
    }

    /// Whether `run`'s end needs the whole statement; forgotten now (it ends).
    fn take(&self, run: &str) -> bool {
        crate::lock(&self.0).remove(run)
    }
}

/// Sends the notices of committed writes (the hot ones: runs admitted, ended, chunks
/// written), a statement of its own for all the notices waiting. Announced inside the writes'
/// own transactions, they made PostgreSQL commit those one at a time: a transaction that
/// notifies holds a database-wide lock from its commit's start to its end, WAL flush
/// included. Sent after the commit, a notice still reaches listeners only once what it
/// announces is visible; it may be lost with this process, and then listeners find the change
/// at their next poll, as after any lost notice.
struct Notifier {
    queue: OnceLock<mpsc::UnboundedSender<Vec<String>>>,
    /// Where the notifier task runs: the runtime the store was connected in.
    runtime: tokio::runtime::Handle,
}

/// The notifier task: takes every waiting batch of notices, drops repeats, sends the rest in
/// one statement; ends when every writer is gone.
async fn notifier(
    stash: Arc<Stash>,
    channel: Arc<str>,
    mut queue: mpsc::UnboundedReceiver<Vec<String>>,
) {
    while let Some(mut notes) = queue.recv().await {
        while let Ok(more) = queue.try_recv() {
            notes.extend(more);
        }
        notes.sort_unstable();
        notes.dedup();
        let sent = async {
            let mut conn = stash.conn().await?;
            let sent = sqlx::query(NOTIFY_ALL)
                .bind(&*channel)
                .bind(&notes)
                .execute(&mut *conn)
                .await;
            conn.kept(sent)
        };
        if let Err(e) = sent.await {
            tracing::debug!(error = %e, notices = notes.len(), "sending notices failed; listeners catch up at their next poll");
        }
    }
}

/// One write counted in [`Writer::writing`] while its caller commits it; uncounted when
/// dropped, also when the caller stops waiting halfway.
struct Writing<'a> {
    count: &'a AtomicUsize,
    /// The writes under way before this one.
    before: usize,
}

impl<'a> Writing<'a> {
    fn count(count: &'a AtomicUsize) -> Self {
        let before = count.fetch_add(1, Ordering::AcqRel);
        Writing { count, before }
    }

    /// Leaves the write counted: a committer uncounts it when it answers.
    fn hand_over(self) {
        std::mem::forget(self);
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Takes the writes waiting in `writes` (at least one: a lone write goes out at once) and
/// commits them together, until every store clone is gone.
async fn committer(writer: Writer, writes: Arc<Mutex<mpsc::UnboundedReceiver<Write>>>) {
    loop {
        let mut batch = Vec::new();
        {
            // Held only while taking writes, never while committing them.
            let mut queue = writes.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(write) => batch.push(write),
                    Err(_) => break,
                }
            }
        }
        let n = batch.len();
        writer.commit_batch(batch).await;
        writer.writing.fetch_sub(n, Ordering::AcqRel);
    }
}

/// How a group transaction ended.
enum Group {
    /// Committed: each write's own answer holds.
    Committed(Vec<Answer>),
    /// A write failed in a way that may have aborted the transaction, which was rolled
    /// back: every write is committed again, alone.
    Redo,
    /// The transaction did not commit.
    Failed(DatabaseError),
}

impl Writer {
    fn pg<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        inbox_held: bool,
        notes: &'a mut Vec<String>,
    ) -> Pg<'a> {
        Pg {
            conn,
            sql: &self.sql,
            channel: &self.channel,
            inbox_lock: self.inbox_lock,
            lock_with_append: false,
            inbox_held,
            notes: Some(notes),
            full_ends: &self.full_ends,
        }
    }

    async fn commit_batch(&self, mut batch: Vec<Write>) {
        if batch.len() == 1 {
            if let Some(write) = batch.pop() {
                let answer = self.alone(&write).await;
                write.answer(answer);
            }
            return;
        }
        batch.sort_by(|a, b| a.run_id().cmp(b.run_id()));
        match self.together(&batch).await {
            Group::Committed(answers) => {
                for (write, answer) in batch.into_iter().zip(answers) {
                    write.answer(answer);
                }
            }
            Group::Redo => {
                for write in batch {
                    let answer = self.alone(&write).await;
                    write.answer(answer);
                }
            }
            Group::Failed(why) => {
                tracing::error!(requests = batch.len(), error = %why, "store write failed");
                for write in batch {
                    write.fail(&why);
                }
            }
        }
    }

    /// One write in its own transaction, as if no other were waiting: a write of one
    /// statement (a step's events, a run's usual end, an admission) commits by itself,
    /// without BEGIN and COMMIT.
    async fn alone(&self, write: &Write) -> Answer {
        let single = match write {
            // Both are one statement (see `policy::append`).
            Write::Append(_, append, _) => append.events_only() || append.plain_end(),
            Write::Admit(..) => true,
        };
        let conn = match self.stash.conn().await {
            Ok(conn) => conn,
            Err(e) => return write.failed(e),
        };
        let mut notes = Vec::new();
        let answer = if single {
            let mut conn = conn;
            let answer = write
                .apply(&mut self.pg(&mut conn, false, &mut notes))
                .await;
            conn.keep = !matches!(answer.error(), Some(StoreError::Database(_)));
            answer
        } else {
            self.in_transaction(conn, write, &mut notes).await
        };
        if answer.error().is_none() {
            self.announce(notes);
        }
        answer
    }

    /// `write` in a transaction of its own on `conn`.
    async fn in_transaction(
        &self,
        conn: Conn<'_>,
        write: &Write,
        notes: &mut Vec<String>,
    ) -> Answer {
        let mut tx = match conn.begin().await {
            Ok(tx) => tx,
            Err(e) => return write.failed(e),
        };
        let answer = write.apply(&mut self.pg(&mut tx, false, notes)).await;
        let settled = match answer.error() {
            None => tx.commit().await,
            Some(_) => tx.rollback().await,
        };
        match (settled, answer.error()) {
            (Err(e), None) => write.failed(e),
            // Rolled back or not, the write's own error is its answer.
            _ => answer,
        }
    }

    /// The writes in one transaction. A write refused without writing (lease lost) answers
    /// only its caller; any other error may have aborted the transaction (PostgreSQL aborts
    /// it on a failed statement), so all are redone alone. No savepoints: a refusal of the
    /// policies batched here (`append`: the fenced first statement; `admit` without a token:
    /// its one insert) writes nothing, so the round trip a savepoint costs per write buys
    /// nothing.
    ///
    /// Lock order: a transaction ending child runs takes the inbox lock before any run row
    /// lock, as every writer does (see `lock_inbox_for_end`), since a later write in the
    /// batch could otherwise wait for it while holding a row a resume or another end waits
    /// for; ends of runs without a parent need no inbox lock, so a batch of them holds none
    /// (holding it would make every committer's batch wait for the others'). A deadlock
    /// left (PostgreSQL detects it and aborts one transaction) costs its batch a redo, not
    /// an error.
    async fn together(&self, batch: &[Write]) -> Group {
        let begun = match self.stash.conn().await {
            Ok(conn) => conn.begin().await,
            Err(e) => Err(e),
        };
        let mut tx = match begun {
            Ok(tx) => tx,
            Err(e) => return Group::Failed(database_of(e)),
        };
        let mut notes = Vec::new();
        match self.together_on(&mut tx, batch, &mut notes).await {
            Ok(answers) => match tx.commit().await {
                Ok(()) => {
                    self.announce(notes);
                    Group::Committed(answers)
                }
                Err(e) => Group::Failed(database_of(e)),
            },
            Err(group) => {
                if let Err(why) = tx.rollback().await {
                    tracing::debug!(error = %why, "rolling back after an error failed");
                }
                group
            }
        }
    }

    /// The events of `writes` (appends that only add events, of distinct runs, in id order) in
    /// one statement: each write's answer, `LeaseLost` for a run whose lease is gone.
    async fn append_many(
        &self,
        conn: &mut PgConnection,
        writes: &[Write],
    ) -> Result<Vec<Answer>, sqlx::Error> {
        let (mut runs, mut epochs, mut counts) = (Vec::new(), Vec::new(), Vec::new());
        let (mut ev_runs, mut ev_index, mut ev_at, mut ev_kinds, mut ev_data) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (lease, write) in writes.iter().filter_map(Write::events_only) {
            let run = lease.run_id.to_string();
            let events = &write.events;
            for (k, ((at, kind), data)) in
                (1i64..).zip(events.at.iter().zip(&events.kind).zip(&events.data))
            {
                ev_runs.push(run.clone());
                ev_index.push(k);
                ev_at.push(*at);
                ev_kinds.push(kind.as_str());
                ev_data.push(data.as_str());
            }
            runs.push(run);
            epochs.push(sql_epoch(lease.epoch));
            counts.push(i64::try_from(events.at.len()).unwrap_or(i64::MAX));
        }
        let written: Vec<String> = sqlx::query_scalar(&self.sql.dialect.append_many)
            .bind(&runs)
            .bind(&epochs)
            .bind(&counts)
            .bind(&ev_runs)
            .bind(&ev_index)
            .bind(&ev_at)
            .bind(&ev_kinds)
            .bind(&ev_data)
            .fetch_all(&mut *conn)
            .await?;
        let written: std::collections::HashSet<String> = written.into_iter().collect();
        Ok(runs
            .iter()
            .zip(writes)
            .map(|(run, write)| {
                Answer::Append(if written.contains(run) {
                    Ok(())
                } else {
                    Err(StoreError::LeaseLost(*write.run_id()))
                })
            })
            .collect())
    }

    /// The admissions among `batch` (none with a token) in one statement: their answers, in
    /// order. The notice that runs nobody leased are ready goes to `notes`.
    async fn admit_many(
        &self,
        conn: &mut PgConnection,
        batch: &[Write],
        notes: &mut Vec<String>,
    ) -> Result<Vec<Answer>, sqlx::Error> {
        let rows: Vec<&NewRunRow> = batch
            .iter()
            .filter_map(|w| match w {
                Write::Admit(row, _) => Some(row),
                Write::Append(..) => None,
            })
            .collect();
        let ids: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        let workflows: Vec<&str> = rows.iter().map(|r| r.workflow.as_str()).collect();
        let inputs: Vec<&str> = rows.iter().map(|r| r.input.as_str()).collect();
        let at: Vec<i64> = rows.iter().map(|r| r.created_at).collect();
        let leases: Vec<Option<i64>> = rows.iter().map(|r| r.lease_until).collect();
        let deadlines: Vec<Option<i64>> = rows.iter().map(|r| r.deadline).collect();
        let parents: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.parent.as_ref().map(|(p, _)| p.as_str()))
            .collect();
        let detached: Vec<bool> = rows
            .iter()
            .map(|r| r.parent.as_ref().is_some_and(|(_, d)| *d))
            .collect();
        let queues: Vec<Option<&str>> = rows.iter().map(|r| r.queue.as_deref()).collect();
        let keys: Vec<Option<&str>> = rows.iter().map(|r| r.partition_key.as_deref()).collect();
        let priorities: Vec<i32> = rows.iter().map(|r| r.priority).collect();
        let inserted: Vec<String> = sqlx::query_scalar(&self.sql.dialect.admit_many)
            .bind(&ids)
            .bind(&workflows)
            .bind(&inputs)
            .bind(&at)
            .bind(&leases)
            .bind(&deadlines)
            .bind(&parents)
            .bind(&detached)
            .bind(&queues)
            .bind(&keys)
            .bind(&priorities)
            .fetch_all(&mut *conn)
            .await?;
        // An id twice in the batch was inserted once: the first admission has it.
        let mut inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
        let mut ready = false;
        let answers = rows
            .iter()
            .map(|row| {
                if !inserted.remove(&row.key) {
                    return Answer::Admit(Err(policy::exists(&row.id)));
                }
                if row.parent.is_some() || row.queue.is_some() {
                    self.full_ends.note(&row.key);
                }
                let lease = row.lease_until.map(|_| Lease {
                    run_id: row.id,
                    epoch: 1,
                });
                ready |= lease.is_none();
                Answer::Admit(Ok((Admission::Admitted, lease)))
            })
            .collect();
        if ready {
            notes.push(NOTE_READY.to_owned());
        }
        Ok(answers)
    }

    /// Sends `notes`, the notices of writes that committed, through the store's notifier
    /// (started on first use).
    fn announce(&self, notes: Vec<String>) {
        if notes.is_empty() {
            return;
        }
        let queue = self.notifier.queue.get_or_init(|| {
            let (queue, notes) = mpsc::unbounded_channel();
            self.notifier
                .runtime
                .spawn(notifier(self.stash.clone(), self.channel.clone(), notes));
            queue
        });
        // The notifier stops only when every sender is gone.
        let _ = queue.send(notes);
    }

    /// The writes of `batch` on `tx`, a transaction: their answers, or how the transaction
    /// must end instead (rolled back, then redone alone or failed).
    async fn together_on(
        &self,
        tx: &mut PgConnection,
        batch: &[Write],
        notes: &mut Vec<String>,
    ) -> Result<Vec<Answer>, Group> {
        let redo = |why: sqlx::Error| {
            tracing::debug!(error = %why, "a batch's statement failed; its writes are redone alone");
            Group::Redo
        };
        let ending: Vec<String> = batch
            .iter()
            .filter(|w| w.ends_run())
            .filter_map(|w| match w {
                Write::Append(lease, ..) => Some(lease.run_id.to_string()),
                Write::Admit(..) => None,
            })
            .collect();
        if !ending.is_empty() {
            sqlx::query(&self.sql.dialect.lock_inbox_for_children)
                .bind(self.inbox_lock)
                .bind(&ending)
                .execute(&mut *tx)
                .await
                .map_err(|e| Group::Failed(database_of(e.into())))?;
        }
        let ending = !ending.is_empty();
        // Admissions insert new rows, which no other writer waits for: first, together.
        let admitting = batch
            .iter()
            .filter(|w| matches!(w, Write::Admit(..)))
            .count();
        let mut admitted = if admitting >= 2 {
            self.admit_many(tx, batch, notes).await.map_err(redo)?
        } else {
            Vec::new()
        }
        .into_iter();
        let mut answers = Vec::with_capacity(batch.len());
        let mut rest = batch;
        while let Some(write) = rest.first() {
            // Neighbours in id order that only add events: one statement for all of them,
            // which locks their rows in the same order.
            let plain = rest
                .iter()
                .take_while(|w| w.events_only().is_some())
                .count();
            if plain >= 2 {
                let (these, after) = rest.split_at(plain);
                rest = after;
                answers.extend(self.append_many(tx, these).await.map_err(redo)?);
                continue;
            }
            rest = &rest[1..];
            if admitting >= 2 && matches!(write, Write::Admit(..)) {
                // Answered by `admit_many`, an id that existed included (that statement wrote
                // the others).
                answers.push(admitted.next().ok_or(Group::Redo)?);
                continue;
            }
            let answer = write.apply(&mut self.pg(tx, ending, notes)).await;
            if matches!(answer.error(), Some(StoreError::Database(_))) {
                return Err(Group::Redo);
            }
            answers.push(answer);
        }
        Ok(answers)
    }
}

/// Ends `tx` the way `result` says: commit on success, roll back on error. Every transaction
/// ends here, at once, so an error never leaves a connection holding locks until its next use.
/// (An `Ok` that wrote nothing, such as a conflict, commits nothing.)
async fn settle<T>(tx: StashTx<'_>, result: Result<T, StoreError>) -> Result<T, StoreError> {
    match result {
        Ok(v) => {
            tx.commit().await?;
            Ok(v)
        }
        Err(e) => {
            if let Err(why) = tx.rollback().await {
                // The connection is closed or broken; the server rolls back on its own.
                tracing::debug!(error = %why, "rolling back after an error failed");
            }
            Err(e)
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

// ---------------------------------------------------------------------------------------------
// Connecting and migrating

/// Accepts what is safe to spell inside double quotes and to use as a channel name.
fn check_schema_name(schema: &str) -> Result<(), StoreError> {
    let mut chars = schema.chars();
    let valid = schema.len() <= 63
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !schema.to_ascii_lowercase().starts_with("pg_");
    if valid {
        Ok(())
    } else {
        Err(StoreError::database(format!(
            "invalid PostgreSQL schema name {schema:?}: use 1 to 63 ASCII letters, digits and \
             underscores, starting with a letter or underscore and not with `pg_`"
        )))
    }
}

/// What the store's connections call themselves (`workflow-rs <schema>`).
fn application_name(schema: &str) -> String {
    format!("workflow-rs {schema}")
}

/// The identifier in double quotes; callers have checked it contains none.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Where `options` point, for messages: user, host, port and database; no password.
fn describe_target(options: &PgConnectOptions) -> String {
    let database = options.get_database().unwrap_or(options.get_username());
    match options.get_socket() {
        Some(socket) => format!(
            "{}@{} (socket)/{database}",
            options.get_username(),
            socket.display()
        ),
        None => format!(
            "{}@{}:{}/{database}",
            options.get_username(),
            options.get_host(),
            options.get_port()
        ),
    }
}

/// A stable advisory lock key for `what` in `schema` (the same in every process and build).
fn lock_key(what: &str, schema: &str) -> i64 {
    let key = format!("workflow-rs:{what}:{schema}");
    stable_hash(key.as_bytes()) as i64
}

/// Creates or migrates the schema (see [`migrations::migrate`]) in one transaction that holds
/// an advisory lock keyed by the schema: processes connecting at once take turns, and each
/// later one finds the work done.
async fn migrate(conn: &mut PgConnection, schema: &str, target: &str) -> Result<(), StoreError> {
    let place = Place {
        shown: format!("schema `{schema}` at {target}"),
        kind: "schema",
        foreign: "is not a workflow-rs store",
    };
    let fail = |e: sqlx::Error| with_source(format!("cannot prepare {place}: {e}"), e);
    let mut tx = conn.begin().await.map_err(fail)?;
    sqlx::query(XACT_LOCK)
        .bind(lock_key("migrate", schema))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    // Read after the lock: the next statement's snapshot includes a concurrent migration's
    // commit.
    let mut migrating = Migrating {
        conn: &mut tx,
        schema,
        quoted: quote_ident(schema),
        created: false,
    };
    migrations::migrate(&mut migrating, MIGRATIONS, TABLES, &place).await?;
    tx.commit().await.map_err(fail)
}

/// The statements of preparing a schema.
struct Migrating<'a> {
    conn: &'a mut PgConnection,
    schema: &'a str,
    quoted: String,
    /// Whether `CREATE SCHEMA` ran: only a store that needs migrating needs that right.
    created: bool,
}

impl migrations::Schema for Migrating<'_> {
    async fn tables(&mut self) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_catalog.pg_class c
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
             ORDER BY 1",
        )
        .bind(self.schema)
        .fetch_all(&mut *self.conn)
        .await?)
    }

    async fn recorded(&mut self) -> Result<i64, StoreError> {
        let sql = format!(
            "SELECT COALESCE(MAX(version), 0)::bigint FROM {}.workflow_migrations",
            self.quoted
        );
        Ok(sqlx::query_scalar(&sql).fetch_one(&mut *self.conn).await?)
    }

    async fn execute(&mut self, ddl: &str) -> Result<(), StoreError> {
        let mut sql = ddl.replace("{schema}", &self.quoted);
        if !std::mem::replace(&mut self.created, true) {
            sql = format!("CREATE SCHEMA IF NOT EXISTS {}; {sql}", self.quoted);
        }
        // Several statements: a query without arguments goes over the simple protocol, which
        // takes them. (`sqlx::raw_sql(..).execute` would make the future not `Send` in
        // general, sqlx issue #3150.)
        (&mut *self.conn).execute(sql.as_str()).await?;
        Ok(())
    }

    async fn record(&mut self, m: &Migration) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO {}.workflow_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
            self.quoted
        );
        sqlx::query(&sql)
            .bind(i32::try_from(m.version).unwrap_or(i32::MAX))
            .bind(m.name)
            .bind(sql_time(SystemTime::now()))
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Notices

/// Relays this schema's notifications to `sender` until `stop` fires (or its sender is
/// dropped). A lost connection is re-established with backoff; since anything sent meanwhile
/// is lost, every (re)subscription is followed by a `RunsReady`, which makes receivers look.
async fn listen(
    options: PgConnectOptions,
    channel: String,
    sender: broadcast::Sender<Notice>,
    mut stop: oneshot::Receiver<()>,
) {
    // Its own pool of one: the listener holds its connection for good, which must not take a
    // slot from the store's operations.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(CONNECT_TIMEOUT)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options);
    let mut backoff = LISTEN_BACKOFF_MIN;
    'connect: loop {
        let subscribed = tokio::select! {
            _ = &mut stop => break 'connect,
            l = subscribe(&pool, &channel) => l,
        };
        match subscribed {
            Ok(mut listener) => {
                backoff = LISTEN_BACKOFF_MIN;
                let _ = sender.send(Notice::RunsReady);
                loop {
                    let next = tokio::select! {
                        _ = &mut stop => break 'connect,
                        n = listener.try_recv() => n,
                    };
                    match next {
                        Ok(Some(n)) => match parse_notice(n.payload()) {
                            // No receiver right now is fine: notices are hints.
                            Some(notice) => {
                                let _ = sender.send(notice);
                            }
                            None => tracing::debug!(
                                channel,
                                payload = n.payload(),
                                "ignoring an unknown notification"
                            ),
                        },
                        Ok(None) => {
                            // Reconnected already (and listening again), but whatever was sent
                            // in between is lost.
                            tracing::warn!(
                                channel,
                                "the notification connection was lost and re-established"
                            );
                            let _ = sender.send(Notice::RunsReady);
                        }
                        Err(e) => {
                            tracing::warn!(
                                channel,
                                error = %e,
                                retry_in = ?backoff,
                                "the notification connection failed; reconnecting"
                            );
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(
                channel,
                error = %e,
                retry_in = ?backoff,
                "cannot listen for workflow notifications; retrying"
            ),
        }
        tokio::select! {
            _ = &mut stop => break 'connect,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(LISTEN_BACKOFF_MAX);
    }
    // Bounded: the listener's connection comes back to the pool through a spawned task.
    let _ = tokio::time::timeout(Duration::from_secs(1), pool.close()).await;
}

async fn subscribe(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

fn parse_notice(payload: &str) -> Option<Notice> {
    if payload == NOTE_READY {
        return Some(Notice::RunsReady);
    }
    if let Some(run) = payload.strip_prefix(NOTE_PAYLOAD) {
        return run.parse().ok().map(Notice::Payload);
    }
    if let Some(run) = payload.strip_prefix(NOTE_ENDED) {
        return run.parse().ok().map(Notice::RunEnded);
    }
    if let Some(run) = payload.strip_prefix(NOTE_CHUNK) {
        return run.parse().ok().map(Notice::Chunk);
    }
    None
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{from_millis, RunOutcome};
    use super::*;
    use crate::testing::store::{
        acquire, ap, conformance_tests, create, event_seqs, lease_one, names,
        previous_release_is_kept, start, step_done, t, within, Damage, Inspect,
    };

    /// How long a notice may take to arrive.
    const NOTICE_WAIT: Duration = Duration::from_secs(10);

    /// The test database, or `None` (the test is skipped) when none is configured; under
    /// `CI=true` a missing database fails the test instead.
    fn test_url() -> Option<String> {
        match std::env::var("WORKFLOW_TEST_DATABASE_URL") {
            Ok(url) if !url.trim().is_empty() => Some(url),
            _ => {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "WORKFLOW_TEST_DATABASE_URL is not set, but CI=true requires the PostgreSQL \
                     store tests to run"
                );
                eprintln!("skipped: WORKFLOW_TEST_DATABASE_URL is not set");
                None
            }
        }
    }

    /// A schema of the test's own, dropped when this goes out of scope (also when the test
    /// panics), after the stores using it.
    struct TestSchema {
        url: String,
        name: String,
    }

    impl TestSchema {
        fn new() -> Option<TestSchema> {
            Some(TestSchema {
                url: test_url()?,
                name: format!("wf_t_{:016x}", rand::random::<u64>()),
            })
        }

        async fn connect(&self) -> PostgresStore {
            within(PostgresStore::connect(&self.url, &self.name))
                .await
                .unwrap()
        }

        /// A plain connection for inspecting and damaging tables.
        async fn raw(&self) -> PgConnection {
            within(PgConnection::connect(&self.url)).await.unwrap()
        }

        fn table(&self, table: &str) -> String {
            format!("{}.{table}", quote_ident(&self.name))
        }

        async fn count(&self, table: &str) -> i64 {
            let mut conn = self.raw().await;
            sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.table(table)))
                .fetch_one(&mut conn)
                .await
                .unwrap()
        }

        async fn exec(&self, sql: &str) {
            let mut conn = self.raw().await;
            conn.execute(sql).await.unwrap();
        }
    }

    impl Drop for TestSchema {
        fn drop(&mut self) {
            let (url, name) = (self.url.clone(), self.name.clone());
            // Drop cannot await, and may run on a runtime thread: use a thread of its own.
            let dropped = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async {
                    let mut conn = PgConnection::connect(&url)
                        .await
                        .map_err(|e| e.to_string())?;
                    // This thread blocks the test's runtime, so connections its stores left
                    // inside a transaction (sqlx rolls back on the next use) would hold their
                    // locks against the DROP forever: end them first.
                    sqlx::query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                         WHERE application_name = $1 AND pid <> pg_backend_pid()",
                    )
                    .bind(application_name(&name))
                    .execute(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                    conn.execute("SET lock_timeout = '10s'")
                        .await
                        .map_err(|e| e.to_string())?;
                    conn.execute(
                        format!("DROP SCHEMA IF EXISTS {} CASCADE", quote_ident(&name)).as_str(),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                    conn.close().await.map_err(|e| e.to_string())
                })
            })
            .join();
            if !matches!(dropped, Ok(Ok(()))) {
                eprintln!("could not drop test schema {}: {dropped:?}", self.name);
            }
        }
    }

    /// A fresh schema and a store on it, or return (skipping the test).
    macro_rules! fresh {
        () => {{
            let Some(schema) = TestSchema::new() else {
                return;
            };
            let store = schema.connect().await;
            (schema, store)
        }};
    }

    impl PostgresStore {
        /// `table` of this store's schema, quoted.
        fn table(&self, table: &str) -> String {
            format!("{}.{table}", quote_ident(self.schema()))
        }
    }

    impl Inspect for PostgresStore {
        async fn count(&self, table: &str) -> i64 {
            sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.table(table)))
                .fetch_one(&self.inner.pool)
                .await
                .unwrap()
        }

        async fn wake_at(&self, run: RunId) -> SystemTime {
            let ms: i64 = sqlx::query_scalar(&format!(
                "SELECT wake_at FROM {} WHERE id = $1",
                self.table("runs")
            ))
            .bind(run.to_string())
            .fetch_one(&self.inner.pool)
            .await
            .unwrap();
            from_millis(u64::try_from(ms).unwrap())
        }

        async fn event_kinds(&self, run: RunId) -> Option<Vec<String>> {
            let kinds = sqlx::query_scalar(&format!(
                "SELECT kind FROM {} WHERE run_id = $1 ORDER BY seq",
                self.table("events")
            ))
            .bind(run.to_string())
            .fetch_all(&self.inner.pool)
            .await
            .unwrap();
            Some(kinds)
        }
    }

    impl Damage for PostgresStore {
        async fn corrupt_input(&self, run: RunId) {
            sqlx::query(&format!(
                "UPDATE {} SET input = 'not json' WHERE id = $1",
                self.table("runs")
            ))
            .bind(run.to_string())
            .execute(&self.inner.pool)
            .await
            .unwrap();
        }

        async fn add_undecodable_event(&self, run: RunId) {
            sqlx::query(&format!(
                "INSERT INTO {} (run_id, seq, at, kind, data) VALUES ($1, 1, 0, 'x', '{{}}')",
                self.table("events")
            ))
            .bind(run.to_string())
            .execute(&self.inner.pool)
            .await
            .unwrap();
            sqlx::query(&format!(
                "UPDATE {} SET last_seq = 1 WHERE id = $1",
                self.table("runs")
            ))
            .bind(run.to_string())
            .execute(&self.inner.pool)
            .await
            .unwrap();
        }
    }

    conformance_tests! {
        groups: [contract, inspect, compared, damage],
        // Each on a schema of its own; skipped without a test database.
        one: {
            let (_schema, store) = fresh!();
        } => store,
        shared: {
            let (schema, a) = fresh!();
            // Three stores, three pools, one schema.
            let stores = [a, schema.connect().await, schema.connect().await];
        } => stores,
    }

    // -----------------------------------------------------------------------------------------
    // Connecting and migrating

    #[tokio::test]
    async fn rejects_invalid_schema_names_before_connecting() {
        let long = "a".repeat(64);
        for bad in [
            "", "1abc", "bad-name", "a\"b", "a b", "pg_temp", "PG_x", "ünï", &long,
        ] {
            let err = PostgresStore::connect("postgres://nobody@127.0.0.1:1/none", bad)
                .await
                .unwrap_err();
            assert!(
                matches!(&err, StoreError::Database(m) if m.message().contains("invalid PostgreSQL schema name")),
                "{bad:?}: {err:?}"
            );
        }
        assert!(check_schema_name(&"a".repeat(63)).is_ok());
        assert!(check_schema_name("_Workflow_2").is_ok());
    }

    #[tokio::test]
    async fn an_unreachable_database_is_an_error_naming_it_without_the_password() {
        let err = within(PostgresStore::connect(
            "postgres://alice:s3cret@127.0.0.1:1/orders",
            "workflow",
        ))
        .await
        .unwrap_err();
        let StoreError::Database(msg) = &err else {
            panic!("expected Database, got {err:?}");
        };
        assert!(err.is_transient(), "a refused connection may succeed later");
        let msg = msg.message();
        assert!(
            msg.contains("cannot connect to PostgreSQL at alice@127.0.0.1:1/orders"),
            "{msg}"
        );
        assert!(!msg.contains("s3cret"), "{msg}");

        let err = within(PostgresStore::connect("not a url", "workflow"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Database(m) if m.message().contains("invalid PostgreSQL URL")),
            "{err:?}"
        );
    }

    /// Writes arriving together are committed by the committers in batches, where neighbouring
    /// appends of events and all admissions go in one statement each: every write still
    /// answers for itself (a stale lease is refused alone, an id admitted twice is admitted
    /// once) and each run's events are numbered without gaps.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batched_appends_and_admissions_each_answer_for_themselves() {
        let Some(schema) = TestSchema::new() else {
            return;
        };
        let store = schema.connect().await;
        let run = |id: RunId| NewRun {
            parent: None,
            id,
            workflow: "orders".to_owned(),
            input: json!([]),
            created_at: t(0),
            hook: None,
            deadline: None,
            queue: None,
        };
        let ids: Vec<RunId> = (0..40).map(|_| RunId::new()).collect();
        // Each id twice, all at once.
        let admissions = ids
            .iter()
            .chain(&ids)
            .map(|id| store.create_run_leased(run(*id), Duration::from_secs(600)));
        let admitted = within(futures::future::join_all(admissions)).await;
        let mut leases = std::collections::HashMap::new();
        let mut refused = 0;
        for admission in admitted {
            match admission {
                Ok((Admission::Admitted, Some(lease))) => {
                    assert!(
                        leases.insert(lease.run_id, lease).is_none(),
                        "admitted twice"
                    );
                }
                Err(StoreError::Database(e)) if e.to_string().contains("exists") => refused += 1,
                other => panic!("unexpected admission: {other:?}"),
            }
        }
        assert_eq!((leases.len(), refused), (40, 40));
        // Three rounds of appends to every run at once; every fourth run is taken over by a
        // later lease first, so its appends under the first lease are refused.
        let stale: Vec<RunId> = ids.iter().step_by(4).copied().collect();
        let mut sql = schema.raw().await;
        for id in &stale {
            sqlx::query(&format!(
                "UPDATE {} SET epoch = epoch + 1 WHERE id = $1",
                schema.table("runs")
            ))
            .bind(id.to_string())
            .execute(&mut sql)
            .await
            .unwrap();
        }
        for round in 0..3u32 {
            let appends = ids.iter().map(|id| {
                let lease = leases[id].clone();
                let store = &store;
                async move {
                    let write = ap(
                        vec![step_done(t(10), round), step_done(t(10), round + 100)],
                        None,
                    );
                    (lease.run_id, store.append(&lease, &write).await)
                }
            });
            for (id, appended) in within(futures::future::join_all(appends)).await {
                match appended {
                    Ok(()) => assert!(!stale.contains(&id), "a stale lease's append was taken"),
                    Err(StoreError::LeaseLost(run)) => {
                        assert_eq!(run, id);
                        assert!(stale.contains(&id), "a live lease's append was refused");
                    }
                    Err(e) => panic!("append failed: {e}"),
                }
            }
        }
        for id in &ids {
            let expected: Vec<u64> = if stale.contains(id) {
                vec![]
            } else {
                (1..=6).collect()
            };
            assert_eq!(event_seqs(&store, *id).await, expected, "run {id}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_connects_of_a_new_schema_migrate_once() {
        let Some(schema) = TestSchema::new() else {
            return;
        };
        let connects: Vec<_> = (0..4)
            .map(|_| {
                let (url, name) = (schema.url.clone(), schema.name.clone());
                tokio::spawn(async move { PostgresStore::connect(&url, &name).await })
            })
            .collect();
        let mut stores = Vec::new();
        for c in connects {
            stores.push(within(c).await.unwrap().unwrap());
        }
        let id = within(create(&stores[0], "orders", t(0))).await;
        for store in &stores {
            assert!(within(store.get_run(&id)).await.unwrap().is_some());
        }

        let versions = || async {
            let mut conn = schema.raw().await;
            sqlx::query_as::<_, (i32, String)>(&format!(
                "SELECT version, name FROM {} ORDER BY version",
                schema.table("workflow_migrations")
            ))
            .fetch_all(&mut conn)
            .await
            .unwrap()
        };
        let expected: Vec<(i32, String)> = MIGRATIONS
            .iter()
            .map(|m| (m.version as i32, m.name.to_owned()))
            .collect();
        assert_eq!(versions().await, expected);

        // Connecting again migrates nothing and keeps the data.
        let again = schema.connect().await;
        assert_eq!(versions().await, expected);
        assert!(within(again.get_run(&id)).await.unwrap().is_some());

        let mut conn = schema.raw().await;
        let objects: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'i') ORDER BY 1",
        )
        .bind(&schema.name)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            objects,
            [
                "events",
                "events_pkey",
                "hook_inbox",
                "hook_inbox_pkey",
                "hook_inbox_run",
                "hooks",
                "hooks_pkey",
                "hooks_run",
                "queues",
                "queues_pkey",
                "runs",
                "runs_created",
                "runs_parent",
                "runs_pkey",
                "runs_queue_begun",
                "runs_queue_holding",
                "runs_queue_keyed",
                "runs_queue_waiting",
                "runs_ready",
                "stream_chunks",
                "stream_chunks_pkey",
                "streams",
                "streams_pkey",
                "workflow_migrations",
                "workflow_migrations_pkey"
            ]
        );
    }

    /// Processes time everything by the store's clock: it must be the server's, read when
    /// asked (not the time its transaction or connection began).
    #[tokio::test]
    async fn its_clock_is_the_servers() {
        async fn server(conn: &mut PgConnection) -> SystemTime {
            let us: i64 = sqlx::query_scalar(CLOCK).fetch_one(conn).await.unwrap();
            SystemTime::UNIX_EPOCH + Duration::from_micros(us as u64)
        }
        let (schema, store) = fresh!();
        let mut conn = schema.raw().await;
        for _ in 0..3 {
            let before = server(&mut conn).await;
            let now = within(store.now())
                .await
                .unwrap()
                .expect("a clock of its own");
            let after = server(&mut conn).await;
            assert!(
                before <= now && now <= after,
                "{before:?} <= {now:?} <= {after:?}"
            );
        }
    }

    #[tokio::test]
    async fn refuses_a_schema_of_a_newer_version() {
        let (schema, store) = fresh!();
        drop(store);
        let newest = MIGRATIONS.last().map_or(0, |m| m.version);
        let future = newest + 1;
        schema
            .exec(&format!(
                "INSERT INTO {} (version, name, applied_at) VALUES ({future}, 'from the future', 0)",
                schema.table("workflow_migrations")
            ))
            .await;
        let err = within(PostgresStore::connect(&schema.url, &schema.name))
            .await
            .unwrap_err();
        let StoreError::Incompatible(msg) = &err else {
            panic!("expected Incompatible, got {err:?}");
        };
        assert!(msg.contains(&format!("schema `{}`", schema.name)), "{msg}");
        assert!(msg.contains(&format!("schema version {future}")), "{msg}");
        assert!(msg.contains(&format!("versions up to {newest}")), "{msg}");
        assert_eq!(
            schema.count("workflow_migrations").await,
            MIGRATIONS.len() as i64 + 1
        );
    }

    /// A store of schema version 1 (before `runs.last_seq`) is migrated with its histories
    /// numbered on: appends after the migration continue each run's sequence.
    #[tokio::test]
    async fn migrates_a_version_1_store_and_keeps_numbering_its_events() {
        let (schema, store) = fresh!();
        let id = RunId::new();
        within(store.create_run(NewRun {
            parent: None,
            id,
            workflow: "orders".to_owned(),
            input: json!(null),
            created_at: t(0),
            hook: None,
            deadline: None,
            queue: None,
        }))
        .await
        .unwrap();
        let leased = within(acquire(
            &store,
            &names(&["orders"]),
            t(1),
            Duration::from_secs(60),
            1,
        ))
        .await;
        let lease = leased[0].lease.clone();
        within(store.append(
            &lease,
            &ap(vec![step_done(t(2), 1), step_done(t(3), 2)], None),
        ))
        .await
        .unwrap();
        drop(store);
        // Back to version 1, as an older build left it.
        schema
            .exec(&format!(
                "ALTER TABLE {runs} DROP COLUMN last_seq; ALTER TABLE {runs} RESET (fillfactor);
                 ALTER TABLE {runs} DROP COLUMN failed_tries, DROP COLUMN blocked_tries,
                     DROP COLUMN deadline, DROP COLUMN parent_id, DROP COLUMN detached;
                 ALTER TABLE {runs} DROP COLUMN queue, DROP COLUMN partition_key,
                     DROP COLUMN priority, DROP COLUMN began_at;
                 DROP TABLE {streams}, {chunks}, {queues};
                 DELETE FROM {migrations} WHERE version > 1",
                runs = schema.table("runs"),
                streams = schema.table("streams"),
                chunks = schema.table("stream_chunks"),
                queues = schema.table("queues"),
                migrations = schema.table("workflow_migrations"),
            ))
            .await;
        let store = schema.connect().await;
        assert_eq!(
            schema.count("workflow_migrations").await,
            MIGRATIONS.len() as i64
        );
        within(store.append(&lease, &ap(vec![step_done(t(4), 3)], None)))
            .await
            .unwrap();
        assert_eq!(event_seqs(&store, id).await, [1, 2, 3]);
    }

    /// The schema as the release before the shared SQL layer created it (do not edit).
    const RELEASED_DDL: &str = r#"
        CREATE SCHEMA {s};
        CREATE TABLE {s}.workflow_migrations (
            version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL
        );
        CREATE TABLE {s}.runs (
            id TEXT COLLATE "C" PRIMARY KEY, workflow TEXT NOT NULL, status TEXT NOT NULL
                CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
            input TEXT NOT NULL, output TEXT, error TEXT, created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL, wake_at BIGINT NOT NULL,
            epoch BIGINT NOT NULL DEFAULT 0, lease_until BIGINT, hook_token TEXT
        );
        CREATE INDEX runs_ready ON {s}.runs (wake_at, id) WHERE status IN ('pending', 'running');
        CREATE INDEX runs_created ON {s}.runs (created_at, id);
        CREATE TABLE {s}.events (
            run_id TEXT NOT NULL, seq BIGINT NOT NULL, at BIGINT NOT NULL, kind TEXT NOT NULL,
            data TEXT NOT NULL, PRIMARY KEY (run_id, seq)
        );
        CREATE TABLE {s}.hooks (
            token TEXT PRIMARY KEY, run_id TEXT NOT NULL, created_at BIGINT NOT NULL,
            active BOOLEAN NOT NULL, retain_until BIGINT
        );
        CREATE INDEX hooks_run ON {s}.hooks (run_id);
        CREATE TABLE {s}.hook_inbox (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run_id TEXT NOT NULL,
            token TEXT NOT NULL, payload TEXT NOT NULL, at BIGINT NOT NULL
        );
        CREATE INDEX hook_inbox_run ON {s}.hook_inbox (run_id, id);
        ALTER TABLE {s}.runs ADD COLUMN last_seq BIGINT NOT NULL DEFAULT 0;
        ALTER TABLE {s}.runs SET (fillfactor = 80);
        INSERT INTO {s}.workflow_migrations (version, name, applied_at) VALUES
            (1, 'runs, events, hooks and the hook inbox', 0),
            (2, 'each run keeps the number of its last event', 0);
    "#;

    /// A schema written by the previous release opens as it is: its migrations table already
    /// has the shared layout, and its runs, events, hooks and payloads are kept, each run's
    /// events numbered on from its last.
    #[tokio::test]
    async fn opens_a_schema_of_the_previous_release_and_keeps_its_data() {
        let Some(schema) = TestSchema::new() else {
            return;
        };
        let (done, live) = (RunId::new(), RunId::new());
        let events = EncodedEvents::new(&[step_done(t(1), 1), step_done(t(2), 2)]).unwrap();
        let mut sql = RELEASED_DDL.replace("{s}", &quote_ident(&schema.name));
        for (run, status) in [(done, "completed"), (live, "running")] {
            sql.push_str(&format!(
                "INSERT INTO {runs} (id, workflow, status, input, output, created_at,
                     updated_at, wake_at, epoch, hook_token, last_seq)
                 VALUES ('{run}', 'orders', '{status}', '[1]', '7', 0, 0, 0, 1, 'tok-{status}', 2);",
                runs = schema.table("runs")
            ));
            for i in 0..2 {
                sql.push_str(&format!(
                    "INSERT INTO {} (run_id, seq, at, kind, data) VALUES ('{run}', {}, {}, '{}', '{}');",
                    schema.table("events"),
                    i + 1,
                    events.at[i],
                    events.kind[i],
                    events.data[i].replace('\'', "''"),
                ));
            }
        }
        sql.push_str(&format!(
            "INSERT INTO {} (token, run_id, created_at, active) VALUES ('tok-running', '{live}', 0, TRUE);
             INSERT INTO {} (run_id, token, payload, at) VALUES ('{live}', 'tok-running', '\"early\"', 0);",
            schema.table("hooks"),
            schema.table("hook_inbox"),
        ));
        schema.exec(&sql).await;

        let store = schema.connect().await;
        assert_eq!(
            schema.count("workflow_migrations").await,
            MIGRATIONS.len() as i64
        );
        previous_release_is_kept(&store, done, live).await;
    }

    #[tokio::test]
    async fn a_database_error_keeps_sqlx_s_error_as_its_source() {
        use std::error::Error as _;
        let err = within(PostgresStore::connect(
            "postgres://nobody@127.0.0.1:1/none",
            "wf",
        ))
        .await
        .unwrap_err();
        let source = err.source().expect("a source");
        assert!(source.downcast_ref::<sqlx::Error>().is_some(), "{source:?}");
    }

    #[tokio::test]
    async fn refuses_a_schema_holding_other_tables() {
        let Some(schema) = TestSchema::new() else {
            return;
        };
        schema
            .exec(&format!(
                "CREATE SCHEMA {0}; CREATE TABLE {0}.users (id INT); CREATE TABLE {0}.orders (id INT);",
                quote_ident(&schema.name)
            ))
            .await;
        let err = within(PostgresStore::connect(&schema.url, &schema.name))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Incompatible(m)
                if m.contains("is not a workflow-rs store (it has tables `orders`, `users`)")),
            "{err:?}"
        );
        assert_eq!(schema.count("users").await, 0);

        // An empty schema made by someone else is fine.
        let Some(empty) = TestSchema::new() else {
            return;
        };
        empty
            .exec(&format!("CREATE SCHEMA {}", quote_ident(&empty.name)))
            .await;
        let store = empty.connect().await;
        within(create(&store, "orders", t(0))).await;
    }

    #[tokio::test]
    async fn drop_schema_removes_everything() {
        let Some(schema) = TestSchema::new() else {
            return;
        };
        let store = schema.connect().await;
        assert_eq!(store.schema(), schema.name);
        within(create(&store, "orders", t(0))).await;
        within(store.drop_schema()).await.unwrap();
        let mut conn = schema.raw().await;
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
            .bind(&schema.name)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(left, 0);
    }

    // -----------------------------------------------------------------------------------------
    // Notices

    /// The next notice matching `want`, skipping others; fails after `NOTICE_WAIT`.
    async fn expect_notice(
        rx: &mut broadcast::Receiver<Notice>,
        what: &str,
        want: impl Fn(&Notice) -> bool,
    ) -> Notice {
        tokio::time::timeout(NOTICE_WAIT, async {
            loop {
                match rx.recv().await {
                    Ok(n) if want(&n) => return n,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        panic!("notices closed while waiting for {what}")
                    }
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {what} notice within {NOTICE_WAIT:?}"))
    }

    fn ready(n: &Notice) -> bool {
        *n == Notice::RunsReady
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn notices_reach_every_process_of_the_schema() {
        let (schema, a) = fresh!();
        let b = schema.connect().await;
        let mut rx_a = a.notices().unwrap();
        let mut rx_b = b.notices().unwrap();
        // Each listener announces its subscription with a RunsReady: from then on, nothing
        // committed is missed.
        expect_notice(&mut rx_a, "subscribed", ready).await;
        expect_notice(&mut rx_b, "subscribed", ready).await;

        // Admission, seen by both processes.
        let (run, _) = within(start(&a, "tok", None, t(0))).await;
        expect_notice(&mut rx_a, "RunsReady on create", ready).await;
        expect_notice(&mut rx_b, "RunsReady on create", ready).await;

        // A payload for a run nobody drives: Payload and RunsReady.
        within(b.resume_hook("tok", json!(1), t(1))).await.unwrap();
        let want = Notice::Payload(run);
        expect_notice(&mut rx_a, "Payload on resume", |n| *n == want).await;
        expect_notice(&mut rx_a, "RunsReady on resume", ready).await;

        // Cancelled by the other process: RunEnded.
        within(b.cancel(&run, t(2))).await.unwrap();
        let want = Notice::RunEnded(run);
        expect_notice(&mut rx_a, "RunEnded on cancel", |n| *n == want).await;

        // Completed: RunEnded too.
        let id = within(create(&b, "orders", t(0))).await;
        let lease = within(lease_one(&b, id, t(10))).await;
        within(b.append(&lease, &ap(vec![], Some(RunOutcome::Completed(json!(1))))))
            .await
            .unwrap();
        let want = Notice::RunEnded(id);
        expect_notice(&mut rx_a, "RunEnded on completion", |n| *n == want).await;

        // Other schemas are other channels.
        let (_other_schema, other) = fresh!();
        let mut rx_other = other.notices().unwrap();
        expect_notice(&mut rx_other, "subscribed", ready).await;
        within(create(&a, "orders", t(0))).await;
        expect_notice(&mut rx_a, "RunsReady on create", ready).await;
        let stray = tokio::time::timeout(Duration::from_millis(300), rx_other.recv()).await;
        assert!(stray.is_err(), "a notice crossed schemas: {stray:?}");
    }

    #[tokio::test]
    async fn the_listener_ends_with_the_last_clone() {
        let (_schema, store) = fresh!();
        let clone = store.clone();
        let mut rx = store.notices().unwrap();
        expect_notice(&mut rx, "subscribed", ready).await;
        drop(store);
        within(create(&clone, "orders", t(0))).await;
        expect_notice(&mut rx, "RunsReady while a clone lives", ready).await;
        drop(clone);
        within(async {
            loop {
                match rx.recv().await {
                    Err(broadcast::error::RecvError::Closed) => break,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                }
            }
        })
        .await;
    }

    #[test]
    fn notice_payloads_round_trip() {
        let id = RunId::new();
        assert_eq!(parse_notice("r"), Some(Notice::RunsReady));
        assert_eq!(parse_notice(&format!("p:{id}")), Some(Notice::Payload(id)));
        assert_eq!(parse_notice(&format!("e:{id}")), Some(Notice::RunEnded(id)));
        assert_eq!(parse_notice(&format!("c:{id}")), Some(Notice::Chunk(id)));
        assert_eq!(parse_notice("p:nope"), None);
        assert_eq!(parse_notice("x"), None);
    }
}
