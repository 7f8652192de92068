//! [`SqliteStore`]: the embedded default store, one SQLite file in WAL mode that several
//! processes may share. It owns the file's schema, the threads that talk to SQLite, and the
//! translation of every [`Store`] decision into one SQL transaction.
//!
//! SQLite allows one writer at a time, and with `synchronous=FULL` each commit costs an fsync.
//! So all writes go to one thread that drains every request queued while it was busy and runs
//! them in one transaction, each inside its own savepoint (group commit: many runs share one
//! fsync, and one refused request rolls back only itself). Callers hear back only after the
//! commit. Reads run beside it on a few reader threads; WAL lets them see the last commit
//! without waiting for the writer. Between processes, `BEGIN IMMEDIATE` and `busy_timeout`
//! serialize the writers, and every check-then-write happens inside one such transaction.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::types::Value as Sql;
use rusqlite::{
    params, Connection, ErrorCode, OpenFlags, OptionalExtension, Transaction, TransactionBehavior,
};
use serde_json::Value;
use tokio::sync::oneshot;

use super::sql::{
    corrupt, event_columns, lease_end, outcome_columns, payload_id_of, sql_epoch, sql_id, sql_time,
    status_of, time_of, to_json,
};
use super::{
    AcquireRequest, Admission, Append, CancelOutcome, ClaimOutcome, Event, EventRecord, HookFilter,
    HookRecord, Lease, LeasedRun, NewEvent, NewRun, Payload, RunFilter, RunRecord, RunStatus,
    Store,
};
use crate::error::{Error, StoreError};
use crate::ids::RunId;

/// The value of `workflow_meta.schema` that marks a file as ours.
const SCHEMA_NAME: &str = "workflow-rs";
/// How long one SQLite call waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a write keeps retrying when the lock is still held after `BUSY_TIMEOUT`.
const LOCK_WAIT: Duration = Duration::from_secs(30);
/// Requests per transaction at most, so one burst cannot hold the lock for long.
const MAX_BATCH: usize = 1024;
/// Reader threads, each with its own connection.
const READERS: usize = 4;

/// The file format's history: `MIGRATIONS[n]` turns a version `n` file into version `n + 1`
/// (version 0 is an empty file). Opening applies the missing ones in the transaction that
/// checks the file. Released versions are frozen: change the format by appending.
const MIGRATIONS: &[&str] = &[SCHEMA_V1, SCHEMA_V2];
/// The schema this build writes and reads.
const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;
/// The tables each version must have (from the version that created them on), checked
/// before migrating so a damaged file is reported, not half-migrated.
const TABLES: &[(&str, i64)] = &[("runs", 1), ("events", 1), ("hooks", 2), ("hook_inbox", 2)];

const SCHEMA_V1: &str = "
CREATE TABLE workflow_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value NOT NULL
);
CREATE TABLE runs (
    id          TEXT PRIMARY KEY NOT NULL,
    workflow    TEXT NOT NULL,
    status      TEXT NOT NULL,     -- RunStatus::as_str
    input       TEXT NOT NULL,     -- JSON
    output      TEXT,              -- JSON
    error       TEXT,              -- JSON of Error
    created_at  INTEGER NOT NULL,  -- ms since the Unix epoch, like every time here
    updated_at  INTEGER NOT NULL,
    wake_at     INTEGER NOT NULL,
    epoch       INTEGER NOT NULL DEFAULT 0,
    lease_until INTEGER            -- NULL: no lease
);
-- Only live runs are ever acquired; ended runs, the bulk over time, stay out of the index.
-- Queries must repeat this WHERE clause word for word for SQLite to use it.
CREATE INDEX runs_ready ON runs (wake_at, id) WHERE status IN ('pending', 'running');
CREATE TABLE events (
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    at     INTEGER NOT NULL,
    kind   TEXT NOT NULL,          -- the serde tag, e.g. step_completed, for SQL inspection
    data   TEXT NOT NULL,          -- JSON of Event
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
";

const SCHEMA_V2: &str = "
-- The token claimed at admission (`start(..).hook(token)`).
ALTER TABLE runs ADD COLUMN hook_token TEXT;
-- One row per claimed token: the primary key is what lets at most one claim win. A row is
-- taken while `active`, or after its release while `retain_until` lies ahead; a free row left
-- behind (released, retention over) is replaced by the next claim.
CREATE TABLE hooks (
    token        TEXT PRIMARY KEY NOT NULL,
    run_id       TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    active       INTEGER NOT NULL,  -- 1 while the run owns it, 0 once released
    retain_until INTEGER            -- NULL: free as soon as released
);
CREATE INDEX hooks_run ON hooks (run_id);
-- Payloads sent with resume_hook. AUTOINCREMENT: ids are never reused, so they grow in
-- commit order, which is the order workflows receive them in.
CREATE TABLE hook_inbox (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  TEXT NOT NULL,
    token   TEXT NOT NULL,
    payload TEXT NOT NULL,              -- JSON
    at      INTEGER NOT NULL
);
CREATE INDEX hook_inbox_run ON hook_inbox (run_id, id);
";

const RUN_COLUMNS: &str =
    "id, workflow, status, input, output, error, created_at, updated_at, hook_token";

/// A [`Store`] in one SQLite file, safe to share between threads, runtimes and processes.
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
    /// not a SQLite database, is a database of something else, or holds a store written by a
    /// newer version of this crate.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let stats = Arc::new(Stats::default());

        // Opening can wait on other processes' locks, so it happens on the writer thread too.
        let (writer, write_jobs) = mpsc::channel::<Box<dyn WriteJob>>();
        let (ready, opened) = oneshot::channel();
        spawn_thread("workflow-sqlite-writer", {
            let path = path.clone();
            let stats = stats.clone();
            move || match open_writer(&path) {
                Ok(conn) => {
                    let _ = ready.send(Ok(()));
                    writer_loop(conn, write_jobs, stats);
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                }
            }
        })?;
        opened.await.map_err(|_| thread_gone("writer"))??;

        // Readers open after the writer has validated the file and switched it to WAL.
        let (readers, read_jobs) = mpsc::channel::<ReadJob>();
        let read_jobs = Arc::new(Mutex::new(read_jobs));
        let mut opened = Vec::with_capacity(READERS);
        for i in 0..READERS {
            let (ready, done) = oneshot::channel();
            spawn_thread(&format!("workflow-sqlite-reader-{i}"), {
                let path = path.clone();
                let jobs = read_jobs.clone();
                let stats = stats.clone();
                move || match open_reader(&path) {
                    Ok(conn) => {
                        let _ = ready.send(Ok(()));
                        reader_loop(conn, jobs, stats);
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            })?;
            opened.push(done);
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
                #[cfg(test)]
                stats,
            }),
        })
    }

    /// The file this store was opened from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `work` on the writer thread inside a savepoint of the current group transaction;
    /// answers once that transaction has committed (or with `work`'s own error, in which case
    /// everything `work` wrote was rolled back).
    async fn write<R, F>(&self, work: F) -> Result<R, StoreError>
    where
        F: FnOnce(&Transaction<'_>) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Job {
            work: Some(work),
            result: None,
            reply,
        });
        self.inner
            .writer
            .send(job)
            .map_err(|_| thread_gone("writer"))?;
        answer.await.map_err(|_| thread_gone("writer"))?
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
                Err(StoreError::Database(format!(
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
}

impl SqliteStore {
    /// Admits `run`; with `lease`, leased to the caller in the same transaction.
    async fn admit(
        &self,
        run: NewRun,
        lease: Option<Duration>,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        let lease_until = lease.map(|l| lease_end(run.created_at, l));
        let input = to_json(&run.input, "the run's input")?;
        let at = sql_time(run.created_at);
        let hook = run.hook.map(|h| (h.token, h.retain_until.map(sql_time)));
        self.write(move |tx| {
            let id = run.id.to_string();
            let exists = tx
                .prepare_cached("SELECT 1 FROM runs WHERE id = ?1")
                .map_err(db)?
                .exists([&id])
                .map_err(db)?;
            if exists {
                return Err(StoreError::Database(format!(
                    "run {} already exists",
                    run.id
                )));
            }
            // The claim goes first: when it loses, nothing at all has been written.
            if let Some((token, retain_until)) = &hook {
                if let Some(owner) = claim_token(tx, token, &id, at, *retain_until)? {
                    return Ok((Admission::Conflict(owner), None));
                }
            }
            tx.prepare_cached(
                "INSERT INTO runs (id, workflow, status, input, created_at, updated_at, wake_at,
                                   hook_token, epoch, lease_until)
                 VALUES (?1, ?2, CASE WHEN ?6 IS NULL THEN 'pending' ELSE 'running' END,
                         ?3, ?4, ?4, ?4, ?5, CASE WHEN ?6 IS NULL THEN 0 ELSE 1 END, ?6)",
            )
            .map_err(db)?
            .execute(params![
                id,
                run.workflow,
                input,
                at,
                hook.as_ref().map(|h| &h.0),
                lease_until
            ])
            .map_err(db)?;
            let lease = lease_until.map(|_| Lease {
                run_id: run.id,
                epoch: 1,
            });
            Ok((Admission::Admitted, lease))
        })
        .await
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
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
        let id = *id;
        self.read(move |conn| {
            let raw = conn
                .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"))
                .map_err(db)?
                .query_row([id.to_string()], RawRun::from_row)
                .optional()
                .map_err(db)?;
            raw.map(RawRun::decode).transpose()
        })
        .await
    }

    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        let id = id.to_string();
        self.read(move |conn| load_events(conn, &id)).await
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Vec<LeasedRun>, StoreError> {
        if req.limit == 0 || req.workflows.is_empty() {
            return Ok(Vec::new());
        }
        let workflows = serde_json::to_string(req.workflows)
            .map_err(|e| StoreError::Database(format!("cannot encode workflow names: {e}")))?;
        let now = sql_time(req.now);
        let until = lease_end(req.now, req.lease);
        let limit = i64::try_from(req.limit).unwrap_or(i64::MAX);
        self.write(move |tx| {
            // One statement picks and leases; the IMMEDIATE transaction around it keeps every
            // other connection, in any process, from leasing the same rows meanwhile.
            let mut leased = tx
                .prepare_cached(&format!(
                    "UPDATE runs SET epoch = epoch + 1, status = 'running', lease_until = ?1
                     WHERE id IN (
                         SELECT id FROM runs
                         WHERE status IN ('pending', 'running')
                           AND wake_at <= ?2
                           AND (lease_until IS NULL OR lease_until <= ?2)
                           AND workflow IN (SELECT value FROM json_each(?3))
                         ORDER BY wake_at, id
                         LIMIT ?4)
                     RETURNING {RUN_COLUMNS}, epoch, wake_at"
                ))
                .map_err(db)?
                .query_map(params![until, now, workflows, limit], |row| {
                    Ok((
                        RawRun::from_row(row)?,
                        row.get::<_, Sql>(RawRun::COLUMNS)?,
                        row.get::<_, Sql>(RawRun::COLUMNS + 1)?,
                    ))
                })
                .map_err(db)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db)?;
            // RETURNING gives no order; hand runs out earliest wake time first.
            leased.sort_by(|a, b| order_key(&a.2, &a.0.id).cmp(&order_key(&b.2, &b.0.id)));

            let mut out = Vec::with_capacity(leased.len());
            for (raw, epoch, _) in leased {
                let shown = raw.label();
                match decode_leased(tx, raw, epoch) {
                    Ok(run) => out.push(run),
                    // Failing the whole call would stall every run in the store behind one
                    // bad row. The run keeps its new lease, so it is retried (and reported
                    // again) only after the lease expires.
                    Err(e) => tracing::error!(
                        run_id = %shown,
                        error = %e,
                        "skipping a run whose stored record cannot be decoded"
                    ),
                }
            }
            Ok(out)
        })
        .await
    }

    async fn append(&self, lease: &Lease, write: Append) -> Result<(), StoreError> {
        let lease = lease.clone();
        let Append {
            events,
            release_tokens,
            outcome,
        } = write;
        // The time of the write: its last event's, as the memory store has it.
        let now = sql_time(events.last().map_or_else(SystemTime::now, |e| e.at));
        // Encode here, not on the writer thread, which every run's writes queue behind.
        let events = events
            .iter()
            .map(EncodedEvent::new)
            .collect::<Result<Vec<_>, _>>()?;
        let outcome = outcome.as_ref().map(outcome_columns).transpose()?;
        self.write(move |tx| {
            let id = lease.run_id.to_string();
            let last = held(tx, &id, lease.epoch)?.ok_or(StoreError::LeaseLost(lease.run_id))?;
            insert_events_after(tx, &id, last, &events)?;
            for token in &release_tokens {
                release_token(tx, &id, token, now)?;
            }
            if let Some((status, output, error)) = outcome {
                tx.prepare_cached(
                    "UPDATE runs SET status = ?2, output = ?3, error = ?4, updated_at = ?5,
                         lease_until = NULL
                     WHERE id = ?1",
                )
                .map_err(db)?
                .execute(params![id, status.as_str(), output, error, now])
                .map_err(db)?;
                release_all(tx, &id, now)?;
            }
            Ok(())
        })
        .await
    }

    async fn release(
        &self,
        lease: &Lease,
        wake_at: SystemTime,
        payloads_seen: u64,
    ) -> Result<(), StoreError> {
        let lease = lease.clone();
        let wake_at = sql_time(wake_at);
        let seen = sql_id(payloads_seen);
        let now = sql_time(SystemTime::now());
        self.write(move |tx| {
            // A payload committed after the worker last looked wakes the run at once; the
            // check and the release are one statement, so none slips in between.
            let changed = tx
                .prepare_cached(
                    "UPDATE runs SET lease_until = NULL,
                         wake_at = CASE
                             WHEN EXISTS (SELECT 1 FROM hook_inbox WHERE run_id = ?1 AND id > ?4)
                             THEN ?5 ELSE ?3 END
                     WHERE id = ?1 AND epoch = ?2 AND status = 'running'
                       AND lease_until IS NOT NULL",
                )
                .map_err(db)?
                .execute(params![
                    lease.run_id.to_string(),
                    sql_epoch(lease.epoch),
                    wake_at,
                    seen,
                    now
                ])
                .map_err(db)?;
            if changed == 0 {
                return Err(StoreError::LeaseLost(lease.run_id));
            }
            Ok(())
        })
        .await
    }

    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError> {
        let lease = lease.clone();
        let hook_key = hook_key.to_owned();
        let token = token.to_owned();
        self.write(move |tx| {
            let id = lease.run_id.to_string();
            let last = held(tx, &id, lease.epoch)?.ok_or(StoreError::LeaseLost(lease.run_id))?;
            let conflict = claim_token(tx, &token, &id, sql_time(at), None)?;
            let event = EncodedEvent::new(&NewEvent {
                at,
                event: Event::HookRegistered {
                    hook_key,
                    token,
                    conflict,
                },
            })?;
            insert_events_after(tx, &id, last, std::slice::from_ref(&event))?;
            Ok(match conflict {
                None => ClaimOutcome::Claimed,
                Some(owner) => ClaimOutcome::Conflict(owner),
            })
        })
        .await
    }

    async fn resume_hook(
        &self,
        token: &str,
        payload: Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError> {
        let token = token.to_owned();
        let payload = to_json(&payload, "the payload")?;
        let at = sql_time(at);
        self.write(move |tx| {
            // Finding the owner and queueing the payload is one statement: no row, no payload.
            let queued = tx
                .prepare_cached(
                    "INSERT INTO hook_inbox (run_id, token, payload, at)
                     SELECT run_id, token, ?2, ?3 FROM hooks WHERE token = ?1 AND active = 1
                     RETURNING id, run_id",
                )
                .map_err(db)?
                .query_row(params![token, payload, at], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, Sql>(1)?))
                })
                .optional()
                .map_err(db)?;
            let Some((payload_id, owner)) = queued else {
                return Ok(None);
            };
            let (owner_key, run) = hook_owner(owner, &token)?;
            tx.prepare_cached("UPDATE runs SET wake_at = MIN(wake_at, ?2) WHERE id = ?1")
                .map_err(db)?
                .execute(params![owner_key, at])
                .map_err(db)?;
            Ok(Some((run, payload_id_of(payload_id)?)))
        })
        .await
    }

    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<Payload>, StoreError> {
        let run = run.to_string();
        let after = sql_id(after);
        self.read(move |conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT id, token, payload FROM hook_inbox
                     WHERE run_id = ?1 AND id > ?2 ORDER BY id",
                )
                .map_err(db)?
                .query_map(params![run, after], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, Sql>(1)?,
                        row.get::<_, Sql>(2)?,
                    ))
                })
                .map_err(db)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db)?;
            rows.into_iter()
                .map(|(id, token, payload)| {
                    let what = format!("payload {id}");
                    Ok(Payload {
                        id: payload_id_of(id)?,
                        token: text(token, &run, &what)?,
                        payload: json(payload, &run, &what)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError> {
        let after = sql_id(after);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT id, run_id FROM hook_inbox WHERE id > ?1 ORDER BY id LIMIT ?2",
                )
                .map_err(db)?
                .query_map(params![after, limit], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, Sql>(1)?))
                })
                .map_err(db)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db)?;
            rows.into_iter()
                .map(|(id, run)| {
                    let run = match run {
                        Sql::Text(s) => s.parse::<RunId>().map_err(|e| e.to_string()),
                        other => Err(format!("{} is not text", describe(Some(&other)))),
                    }
                    .map_err(|why| StoreError::Corrupt(format!("payload {id}: run_id: {why}")))?;
                    Ok((payload_id_of(id)?, run))
                })
                .collect()
        })
        .await
    }

    async fn last_payload_id(&self) -> Result<u64, StoreError> {
        self.read(|conn| {
            let last: i64 = conn
                .prepare_cached("SELECT COALESCE(MAX(id), 0) FROM hook_inbox")
                .map_err(db)?
                .query_row([], |row| row.get(0))
                .map_err(db)?;
            payload_id_of(last)
        })
        .await
    }

    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError> {
        let token = token.to_owned();
        self.read(move |conn| {
            let row = conn
                .prepare_cached(
                    "SELECT run_id, created_at FROM hooks WHERE token = ?1 AND active = 1",
                )
                .map_err(db)?
                .query_row([&token], |row| {
                    Ok((row.get::<_, Sql>(0)?, row.get::<_, Sql>(1)?))
                })
                .optional()
                .map_err(db)?;
            let Some((run, created_at)) = row else {
                return Ok(None);
            };
            let (key, run_id) = hook_owner(run, &token)?;
            Ok(Some(HookRecord {
                run_id,
                created_at: time(created_at, &key, &format!("hook {token:?}: created_at"))?,
                token,
            }))
        })
        .await
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
        let leases = leases.to_vec();
        let until = lease_end(now, lease);
        self.write(move |tx| {
            let mut renew = tx
                .prepare_cached(
                    "UPDATE runs SET lease_until = ?3
                     WHERE id = ?1 AND epoch = ?2 AND status = 'running'
                       AND lease_until IS NOT NULL",
                )
                .map_err(db)?;
            let mut lost = Vec::new();
            for l in leases {
                let renewed = renew
                    .execute(params![l.run_id.to_string(), sql_epoch(l.epoch), until])
                    .map_err(db)?;
                if renewed == 0 {
                    lost.push(l.run_id);
                }
            }
            Ok(lost)
        })
        .await
    }

    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        let id = *id;
        let event = EncodedEvent::new(&NewEvent {
            at: now,
            event: Event::RunCancelled,
        })?;
        let error = to_json(&Error::cancelled(&id), "the cancellation error")?;
        let now = sql_time(now);
        self.write(move |tx| {
            let key = id.to_string();
            let status: Option<Sql> = tx
                .prepare_cached("SELECT status FROM runs WHERE id = ?1")
                .map_err(db)?
                .query_row([&key], |row| row.get(0))
                .optional()
                .map_err(db)?;
            let status = status.ok_or(StoreError::RunNotFound(id))?;
            let status = decode_status(status, &key)?;
            if status.is_terminal() {
                return Ok(CancelOutcome::AlreadyEnded(status));
            }
            insert_events(tx, &key, std::slice::from_ref(&event))?;
            tx.prepare_cached(
                "UPDATE runs SET status = 'cancelled', error = ?2, updated_at = ?3,
                     lease_until = NULL
                 WHERE id = ?1",
            )
            .map_err(db)?
            .execute(params![key, error, now])
            .map_err(db)?;
            release_all(tx, &key, now)?;
            Ok(CancelOutcome::Cancelled)
        })
        .await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        // Only the conditions in use are written, so each variant gets its own cached plan.
        let mut conditions = Vec::new();
        let mut args: Vec<Sql> = Vec::new();
        if let Some(status) = filter.status {
            args.push(Sql::Text(status.as_str().to_owned()));
            conditions.push(format!("status = ?{}", args.len()));
        }
        if let Some(workflow) = &filter.workflow {
            args.push(Sql::Text(workflow.clone()));
            conditions.push(format!("workflow = ?{}", args.len()));
        }
        args.push(Sql::Integer(
            i64::try_from(filter.limit).unwrap_or(i64::MAX),
        ));
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs {} ORDER BY created_at DESC, id DESC LIMIT ?{}",
            where_clause(&conditions),
            args.len()
        );
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&sql).map_err(db)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), RawRun::from_row)
                .map_err(db)?;
            let mut runs = Vec::new();
            for raw in rows {
                runs.push(raw.map_err(db)?.decode()?);
            }
            Ok(runs)
        })
        .await
    }

    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        let mut conditions = vec!["active = 1".to_owned()];
        let mut args: Vec<Sql> = Vec::new();
        if let Some(token) = &filter.token {
            args.push(Sql::Text(token.clone()));
            conditions.push(format!("token = ?{}", args.len()));
        }
        if let Some(run) = filter.run_id {
            args.push(Sql::Text(run.to_string()));
            conditions.push(format!("run_id = ?{}", args.len()));
        }
        args.push(Sql::Integer(
            i64::try_from(filter.limit).unwrap_or(i64::MAX),
        ));
        let sql = format!(
            "SELECT token, run_id, created_at FROM hooks {} \
             ORDER BY created_at DESC, token LIMIT ?{}",
            where_clause(&conditions),
            args.len()
        );
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&sql).map_err(db)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), |row| {
                    Ok((
                        row.get::<_, Sql>(0)?,
                        row.get::<_, Sql>(1)?,
                        row.get::<_, Sql>(2)?,
                    ))
                })
                .map_err(db)?;
            let mut hooks = Vec::new();
            for row in rows {
                let (token, run, created_at) = row.map_err(db)?;
                let token = match token {
                    Sql::Text(t) => t,
                    other => {
                        return Err(StoreError::Corrupt(format!(
                            "hooks: token: {} is not text",
                            describe(Some(&other))
                        )))
                    }
                };
                let (key, run_id) = hook_owner(run, &token)?;
                hooks.push(HookRecord {
                    run_id,
                    created_at: time(created_at, &key, &format!("hook {token:?}: created_at"))?,
                    token,
                });
            }
            Ok(hooks)
        })
        .await
    }
}

/// `WHERE a AND b ..`, or nothing without conditions.
fn where_clause(conditions: &[String]) -> String {
    if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conditions.join(" AND "))
    }
}

// ---------------------------------------------------------------------------------------------
// Opening

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), StoreError> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .map(drop)
        .map_err(|e| StoreError::Database(format!("cannot start thread {name}: {e}")))
}

/// The writer's connection: validates the file, creates the schema if the file is new, and
/// switches it to WAL, in that order, so that a rejected file is never modified.
fn open_writer(path: &Path) -> Result<Connection, StoreError> {
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
        prepare_schema(&tx, path)?;
        retry_busy("COMMIT", || tx.execute_batch("COMMIT")).map_err(fail)?;
    }

    let mode: String = retry_busy("PRAGMA journal_mode", || {
        conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
    })
    .map_err(fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Database(format!(
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
const WAL_FRAMES: u64 = 1024;

/// Extends the write-ahead log with zeros to [`WAL_FRAMES`] frames if it is shorter (a new
/// file, or one SQLite deleted when the last connection closed). A commit that only
/// overwrites allocated blocks of the log is much cheaper to make durable than one that grows
/// the file: on the ext4 disk of BENCHMARKS.md, about 120 µs instead of 210 µs per commit,
/// because `fsync` then writes the data alone, not also the file's metadata (new size, new
/// blocks). SQLite reads a log only up to its last valid frame, and zeros are never valid, so
/// the padding is invisible; the write lock (an IMMEDIATE transaction) keeps other processes
/// from appending frames while the zeros are written.
fn preallocate_wal(conn: &Connection, path: &Path) -> std::io::Result<()> {
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

fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let fail = |e: rusqlite::Error| open_error(path, e);
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(fail)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
    conn.pragma_update(None, "query_only", true).map_err(fail)?;
    Ok(conn)
}

fn open_error(path: &Path, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            StoreError::Incompatible(format!(
                "{} is not a SQLite database (or is corrupt): {e}",
                path.display()
            ))
        }
        _ => StoreError::Database(format!("cannot open {}: {e}", path.display())),
    }
}

/// Creates the schema in an empty database, accepts (and migrates) our own, and rejects
/// anything else.
fn prepare_schema(tx: &Transaction<'_>, path: &Path) -> Result<(), StoreError> {
    let shown = path.display();
    let fail = |e: rusqlite::Error| open_error(path, e);
    let tables = tx
        .prepare(
            "SELECT name FROM sqlite_schema
             WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'
             ORDER BY name",
        )
        .map_err(fail)?
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(fail)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;

    if tables.is_empty() {
        return migrate(tx, 0, path);
    }

    if !tables.iter().any(|t| t == "workflow_meta") {
        let list = tables
            .iter()
            .map(|t| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(StoreError::Incompatible(format!(
            "{shown} is a SQLite database but not a workflow-rs store (it has tables {list}); \
             give the store a file of its own"
        )));
    }

    let meta = |key: &str| -> Result<Option<Sql>, StoreError> {
        tx.query_row(
            "SELECT value FROM workflow_meta WHERE key = ?1",
            [key],
            |row| row.get(0),
        )
        .optional()
        .map_err(|e| {
            StoreError::Incompatible(format!(
                "{shown} is a SQLite database but not a workflow-rs store \
                 (its `workflow_meta` table is not ours: {e})"
            ))
        })
    };
    match meta("schema")? {
        Some(Sql::Text(s)) if s == SCHEMA_NAME => {}
        other => {
            return Err(StoreError::Incompatible(format!(
                "{shown} is a SQLite database but not a workflow-rs store \
                 (its `workflow_meta` table names schema {})",
                describe(other.as_ref())
            )))
        }
    }
    let version = match meta("version")? {
        Some(Sql::Integer(v)) => Some(v),
        Some(Sql::Text(s)) => s.trim().parse().ok(),
        _ => None,
    };
    let version = match version {
        Some(v) if (1..=SCHEMA_VERSION).contains(&v) => v,
        Some(v) if v > SCHEMA_VERSION => {
            return Err(StoreError::Incompatible(format!(
                "{shown} holds a workflow-rs store of schema version {v}, written by a newer \
                 workflow-rs; this build reads schema versions up to {SCHEMA_VERSION}; \
                 upgrade workflow-rs to open it"
            )))
        }
        _ => {
            return Err(StoreError::Incompatible(format!(
                "{shown} holds a workflow-rs store with an unknown schema version \
                 (this build reads schema versions 1 to {SCHEMA_VERSION})"
            )))
        }
    };
    for (needed, since) in TABLES {
        if *since <= version && !tables.iter().any(|t| t == needed) {
            return Err(StoreError::Incompatible(format!(
                "{shown} holds a damaged workflow-rs store: table `{needed}` is missing"
            )));
        }
    }
    migrate(tx, version, path)
}

/// Brings a file of schema version `from` to `SCHEMA_VERSION`, inside the caller's
/// transaction: another process opening the file meanwhile waits, then sees it migrated.
fn migrate(tx: &Transaction<'_>, from: i64, path: &Path) -> Result<(), StoreError> {
    if from == SCHEMA_VERSION {
        return Ok(());
    }
    let first = usize::try_from(from).unwrap_or(usize::MAX);
    for (step, ddl) in (from + 1..).zip(MIGRATIONS.iter().skip(first)) {
        tx.execute_batch(ddl).map_err(|e| {
            StoreError::Database(format!(
                "{}: cannot migrate the workflow-rs store to schema version {step}: {e}",
                path.display()
            ))
        })?;
    }
    tx.execute(
        "INSERT INTO workflow_meta (key, value) VALUES ('schema', ?1), ('version', ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        params![SCHEMA_NAME, SCHEMA_VERSION],
    )
    .map_err(|e| open_error(path, e))?;
    if from > 0 {
        tracing::info!(
            path = %path.display(),
            from,
            to = SCHEMA_VERSION,
            "migrated the workflow-rs store"
        );
    }
    Ok(())
}

fn describe(v: Option<&Sql>) -> String {
    match v {
        None => "nothing".to_owned(),
        Some(Sql::Text(s)) => format!("`{s}`"),
        Some(Sql::Integer(i)) => format!("`{i}`"),
        Some(Sql::Real(r)) => format!("`{r}`"),
        Some(Sql::Null) => "NULL".to_owned(),
        Some(Sql::Blob(_)) => "a blob".to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// The writer thread

/// A write request as the writer thread sees it: run inside the transaction, then, once the
/// transaction's fate is known, answer.
trait WriteJob: Send {
    /// Runs the request; false if it failed (its savepoint is then rolled back).
    fn run(&mut self, tx: &Transaction<'_>) -> bool;
    /// Answers the caller. `commit` is how the whole transaction ended.
    fn finish(self: Box<Self>, commit: Result<(), &str>);
}

struct Job<F, R> {
    work: Option<F>,
    result: Option<Result<R, StoreError>>,
    reply: oneshot::Sender<Result<R, StoreError>>,
}

impl<F, R> WriteJob for Job<F, R>
where
    F: FnOnce(&Transaction<'_>) -> Result<R, StoreError> + Send,
    R: Send,
{
    fn run(&mut self, tx: &Transaction<'_>) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let result = catch_unwind(AssertUnwindSafe(|| work(tx))).unwrap_or_else(|p| {
            Err(StoreError::Database(format!(
                "internal error: a store write panicked: {}",
                panic_message(p.as_ref())
            )))
        });
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn finish(self: Box<Self>, commit: Result<(), &str>) {
        let answer = match (self.result, commit) {
            // A refused request wrote nothing, so its own answer holds whatever the commit did.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (_, Err(why)) => Err(StoreError::Database(why.to_owned())),
            (None, Ok(())) => Err(StoreError::Database(
                "internal error: a store write was never run".to_owned(),
            )),
        };
        // The caller may have stopped waiting; the write stands either way.
        let _ = self.reply.send(answer);
    }
}

fn writer_loop(conn: Connection, jobs: mpsc::Receiver<Box<dyn WriteJob>>, stats: Arc<Stats>) {
    // Ends when every sender (every store clone) is gone and the queue is empty.
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let outcome = run_batch(&conn, &mut batch);
        match &outcome {
            Ok(()) => {
                stats.commits.fetch_add(1, Ordering::Relaxed);
            }
            Err(why) => tracing::error!(requests = batch.len(), error = %why, "store write failed"),
        }
        let commit = outcome.as_ref().map(|_| ()).map_err(String::as_str);
        for job in batch {
            job.finish(commit);
        }
    }
}

/// One group transaction. Err only when the transaction as a whole did not commit.
fn run_batch(conn: &Connection, batch: &mut [Box<dyn WriteJob>]) -> Result<(), String> {
    let failed = |e: rusqlite::Error| format!("the write transaction failed: {e}");
    let tx = begin_immediate(conn).map_err(failed)?;
    for job in batch.iter_mut() {
        tx.prepare_cached("SAVEPOINT request")
            .and_then(|mut s| s.execute([]))
            .map_err(failed)?;
        let ok = job.run(&tx);
        if tx.is_autocommit() {
            // Some errors (disk full, I/O) make SQLite roll back the whole transaction.
            return Err("the write transaction was rolled back by SQLite".to_owned());
        }
        let end = if ok {
            "RELEASE request"
        } else {
            "ROLLBACK TO request; RELEASE request"
        };
        tx.execute_batch(end).map_err(failed)?;
    }
    // On any error return, dropping `tx` rolls back whatever is left.
    retry_busy("COMMIT", || tx.execute_batch("COMMIT")).map_err(failed)
}

fn begin_immediate(conn: &Connection) -> rusqlite::Result<Transaction<'_>> {
    retry_busy("BEGIN IMMEDIATE", || {
        Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
    })
}

/// `busy_timeout` already waits inside SQLite; this covers a lock held longer than that by
/// another process, up to `LOCK_WAIT`.
fn retry_busy<T>(what: &str, mut f: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
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

// ---------------------------------------------------------------------------------------------
// The reader threads

type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

fn reader_loop(conn: Connection, jobs: Arc<Mutex<mpsc::Receiver<ReadJob>>>, _stats: Arc<Stats>) {
    loop {
        // The lock is held only while waiting for the next job, never while running one.
        let job = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
        match job {
            Ok(job) => job(&conn),
            Err(_) => return,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rows

/// A `runs` row as stored; decoded separately so a bad value is reported, not a type error.
struct RawRun {
    id: Sql,
    workflow: Sql,
    status: Sql,
    input: Sql,
    output: Sql,
    error: Sql,
    created_at: Sql,
    updated_at: Sql,
    hook_token: Sql,
}

impl RawRun {
    /// How many `RUN_COLUMNS` there are.
    const COLUMNS: usize = 9;

    /// Reads the `RUN_COLUMNS` at the start of `row`.
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawRun {
            id: row.get(0)?,
            workflow: row.get(1)?,
            status: row.get(2)?,
            input: row.get(3)?,
            output: row.get(4)?,
            error: row.get(5)?,
            created_at: row.get(6)?,
            updated_at: row.get(7)?,
            hook_token: row.get(8)?,
        })
    }

    /// The run id for messages, readable or not.
    fn label(&self) -> String {
        match &self.id {
            Sql::Text(s) => s.clone(),
            other => format!("<unreadable id {}>", describe(Some(other))),
        }
    }

    fn decode(self) -> Result<RunRecord, StoreError> {
        let label = self.label();
        let run = label.as_str();
        let id = label.parse::<RunId>().map_err(|e| corrupt(run, "id", e))?;
        Ok(RunRecord {
            id,
            workflow: text(self.workflow, run, "workflow")?,
            status: decode_status(self.status, run)?,
            input: json(self.input, run, "input")?,
            output: match self.output {
                Sql::Null => None,
                v => Some(json(v, run, "output")?),
            },
            error: match self.error {
                Sql::Null => None,
                v => Some(json(v, run, "error")?),
            },
            created_at: time(self.created_at, run, "created_at")?,
            updated_at: time(self.updated_at, run, "updated_at")?,
            hook_token: match self.hook_token {
                Sql::Null => None,
                v => Some(text(v, run, "hook_token")?),
            },
        })
    }
}

fn decode_leased(tx: &Transaction<'_>, raw: RawRun, epoch: Sql) -> Result<LeasedRun, StoreError> {
    let run = raw.decode()?;
    let key = run.id.to_string();
    let epoch = match epoch {
        Sql::Integer(e) => u64::try_from(e).map_err(|err| corrupt(&key, "epoch", err))?,
        other => {
            return Err(corrupt(
                &key,
                "epoch",
                format!("{} is not an integer", describe(Some(&other))),
            ))
        }
    };
    let events = load_events(tx, &key)?;
    Ok(LeasedRun {
        lease: Lease {
            run_id: run.id,
            epoch,
        },
        run,
        events,
    })
}

fn order_key<'a>(wake_at: &Sql, id: &'a Sql) -> (i64, Option<&'a str>) {
    let wake = match wake_at {
        Sql::Integer(w) => *w,
        _ => i64::MAX,
    };
    let id = match id {
        Sql::Text(s) => Some(s.as_str()),
        _ => None,
    };
    (wake, id)
}

fn load_events(conn: &Connection, run: &str) -> Result<Vec<EventRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT seq, at, data FROM events WHERE run_id = ?1 ORDER BY seq")
        .map_err(db)?;
    let rows = stmt
        .query_map([run], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Sql>(1)?,
                row.get::<_, Sql>(2)?,
            ))
        })
        .map_err(db)?;
    let mut events = Vec::new();
    for row in rows {
        let (seq, at, data) = row.map_err(|e| match e {
            rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..) => corrupt(run, "events.seq", e),
            e => db(e),
        })?;
        let what = format!("event {seq}");
        let seq = u64::try_from(seq).map_err(|e| corrupt(run, &what, e))?;
        events.push(EventRecord {
            seq,
            at: time(at, run, &what)?,
            event: json(data, run, &what)?,
        });
    }
    Ok(events)
}

/// True if `epoch` is the run's current lease and the run may still be written.
/// The number of the run's last event while `epoch` holds its lease; `None` when the lease
/// is lost (one statement for the fence and the numbering).
fn held(tx: &Transaction<'_>, run: &str, epoch: u64) -> Result<Option<i64>, StoreError> {
    tx.prepare_cached(
        "SELECT (SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1) FROM runs
         WHERE id = ?1 AND epoch = ?2 AND status = 'running' AND lease_until IS NOT NULL",
    )
    .map_err(db)?
    .query_row(params![run, sql_epoch(epoch)], |row| row.get(0))
    .optional()
    .map_err(db)
}

/// Appends after the run's last event.
fn insert_events(
    tx: &Transaction<'_>,
    run: &str,
    events: &[EncodedEvent],
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let last: i64 = tx
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1")
        .map_err(db)?
        .query_row([run], |row| row.get(0))
        .map_err(db)?;
    insert_events_after(tx, run, last, events)
}

/// Appends `events` numbered from `last + 1`.
fn insert_events_after(
    tx: &Transaction<'_>,
    run: &str,
    last: i64,
    events: &[EncodedEvent],
) -> Result<(), StoreError> {
    let mut insert = tx
        .prepare_cached(
            "INSERT INTO events (run_id, seq, at, kind, data) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(db)?;
    for (seq, e) in (last + 1..).zip(events) {
        insert
            .execute(params![run, seq, e.at, e.kind, e.data])
            .map_err(db)?;
    }
    Ok(())
}

/// Claims `token` for `run` at time `at` if it is free: no row, or a row neither active nor
/// retained past `at`. The decision is the upsert's own WHERE clause on the token's primary
/// key, so of any number of claims, in any process, exactly one takes a free token. Returns
/// the owner when the token is taken (and then writes nothing).
fn claim_token(
    tx: &Transaction<'_>,
    token: &str,
    run: &str,
    at: i64,
    retain_until: Option<i64>,
) -> Result<Option<RunId>, StoreError> {
    let claimed = tx
        .prepare_cached(
            "INSERT INTO hooks (token, run_id, created_at, active, retain_until)
             VALUES (?1, ?2, ?3, 1, ?4)
             ON CONFLICT (token) DO UPDATE SET
                 run_id = excluded.run_id, created_at = excluded.created_at, active = 1,
                 retain_until = excluded.retain_until
             WHERE hooks.active = 0 AND COALESCE(hooks.retain_until, 0) <= excluded.created_at",
        )
        .map_err(db)?
        .execute(params![token, run, at, retain_until])
        .map_err(db)?;
    if claimed > 0 {
        return Ok(None);
    }
    let owner: Sql = tx
        .prepare_cached("SELECT run_id FROM hooks WHERE token = ?1")
        .map_err(db)?
        .query_row([token], |row| row.get(0))
        .map_err(db)?;
    Ok(Some(hook_owner(owner, token)?.1))
}

/// Gives up `token` if `run` owns it: the row stays (inactive) while retained past `now`, and
/// goes otherwise, freeing the token at once.
fn release_token(tx: &Transaction<'_>, run: &str, token: &str, now: i64) -> Result<(), StoreError> {
    tx.prepare_cached(
        "DELETE FROM hooks
         WHERE token = ?1 AND run_id = ?2 AND active = 1 AND COALESCE(retain_until, 0) <= ?3",
    )
    .map_err(db)?
    .execute(params![token, run, now])
    .map_err(db)?;
    tx.prepare_cached(
        "UPDATE hooks SET active = 0 WHERE token = ?1 AND run_id = ?2 AND active = 1",
    )
    .map_err(db)?
    .execute(params![token, run])
    .map_err(db)?;
    Ok(())
}

/// [`release_token`] for every token `run` owns.
fn release_all(tx: &Transaction<'_>, run: &str, now: i64) -> Result<(), StoreError> {
    tx.prepare_cached(
        "DELETE FROM hooks WHERE run_id = ?1 AND active = 1 AND COALESCE(retain_until, 0) <= ?2",
    )
    .map_err(db)?
    .execute(params![run, now])
    .map_err(db)?;
    tx.prepare_cached("UPDATE hooks SET active = 0 WHERE run_id = ?1 AND active = 1")
        .map_err(db)?
        .execute([run])
        .map_err(db)?;
    Ok(())
}

/// The owner recorded in a `hooks` row: as stored (for SQL) and parsed.
fn hook_owner(v: Sql, token: &str) -> Result<(String, RunId), StoreError> {
    let bad = |why: String| StoreError::Corrupt(format!("hook {token:?}: run_id: {why}"));
    match v {
        Sql::Text(s) => {
            let id = s.parse::<RunId>().map_err(|e| bad(e.to_string()))?;
            Ok((s, id))
        }
        other => Err(bad(format!("{} is not text", describe(Some(&other))))),
    }
}

/// An event ready for its row.
struct EncodedEvent {
    at: i64,
    kind: String,
    data: String,
}

impl EncodedEvent {
    fn new(e: &NewEvent) -> Result<Self, StoreError> {
        let (at, kind, data) = event_columns(e)?;
        Ok(EncodedEvent { at, kind, data })
    }
}

// ---------------------------------------------------------------------------------------------
// Values

fn text(v: Sql, run: &str, what: &str) -> Result<String, StoreError> {
    match v {
        Sql::Text(s) => Ok(s),
        other => Err(corrupt(
            run,
            what,
            format!("{} is not text", describe(Some(&other))),
        )),
    }
}

fn json<T: serde::de::DeserializeOwned>(v: Sql, run: &str, what: &str) -> Result<T, StoreError> {
    let s = text(v, run, what)?;
    serde_json::from_str(&s).map_err(|e| corrupt(run, what, e))
}

fn time(v: Sql, run: &str, what: &str) -> Result<SystemTime, StoreError> {
    match v {
        Sql::Integer(ms) => time_of(ms, run, what),
        other => Err(corrupt(
            run,
            what,
            format!("{} is not a time", describe(Some(&other))),
        )),
    }
}

fn decode_status(v: Sql, run: &str) -> Result<RunStatus, StoreError> {
    status_of(&text(v, run, "status")?, run)
}

fn db(e: rusqlite::Error) -> StoreError {
    StoreError::Database(e.to_string())
}

fn thread_gone(which: &str) -> StoreError {
    StoreError::Database(format!("the store's {which} thread has stopped"))
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::from_millis;
    use super::*;
    use crate::testing::store::{
        acquire, ap, conformance_tests, create, lease_one, names, owner, start, step_done, storm,
        t, within, Damage, Inspect,
    };

    async fn fresh() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = within(SqliteStore::open(dir.path().join("wf.db")))
            .await
            .unwrap();
        (dir, store)
    }

    fn raw(path: &Path) -> Connection {
        Connection::open(path).unwrap()
    }

    fn count(path: &Path, table: &str) -> i64 {
        raw(path)
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    impl Inspect for SqliteStore {
        async fn count(&self, table: &str) -> i64 {
            count(self.path(), table)
        }

        async fn wake_at(&self, run: RunId) -> SystemTime {
            let ms: i64 = raw(self.path())
                .query_row(
                    "SELECT wake_at FROM runs WHERE id = ?1",
                    [run.to_string()],
                    |r| r.get(0),
                )
                .unwrap();
            from_millis(u64::try_from(ms).unwrap())
        }

        async fn event_kinds(&self, run: RunId) -> Option<Vec<String>> {
            let conn = raw(self.path());
            let kinds = conn
                .prepare("SELECT kind FROM events WHERE run_id = ?1 ORDER BY seq")
                .unwrap()
                .query_map([run.to_string()], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            Some(kinds)
        }
    }

    impl Damage for SqliteStore {
        async fn corrupt_input(&self, run: RunId) {
            raw(self.path())
                .execute(
                    "UPDATE runs SET input = 'not json' WHERE id = ?1",
                    [run.to_string()],
                )
                .unwrap();
        }

        async fn add_undecodable_event(&self, run: RunId) {
            raw(self.path())
                .execute(
                    "INSERT INTO events (run_id, seq, at, kind, data) VALUES (?1, 1, 0, 'x', '{}')",
                    [run.to_string()],
                )
                .unwrap();
        }
    }

    conformance_tests! {
        groups: [contract, inspect, compared, damage],
        one: {
            let (_dir, store) = fresh().await;
        } => store,
        shared: {
            let (dir, a) = fresh().await;
            let path = dir.path().join("wf.db");
            let b = within(SqliteStore::open(&path)).await.unwrap();
            let c = within(SqliteStore::open(&path)).await.unwrap();
            // Three stores, three writer connections, one file.
            let stores = [a, b, c];
        } => stores,
    }

    // -----------------------------------------------------------------------------------------
    // The file: format, opening, migrations

    #[tokio::test]
    async fn the_write_ahead_log_is_preallocated_and_its_padding_is_invisible() {
        let (dir, store) = fresh().await;
        let path = dir.path().join("wf.db");
        let wal = dir.path().join("wf.db-wal");
        let target = 32 + WAL_FRAMES * (24 + 4096);
        assert!(std::fs::metadata(&wal).unwrap().len() >= target);
        let ids = [
            within(create(&store, "orders", t(0))).await,
            within(create(&store, "orders", t(1))).await,
        ];
        // Another connection reads the log while the store has it open: it sees every
        // commit and nothing of the zeros after them.
        let conn = raw(&path);
        let count: i64 = conn
            .query_row("SELECT COUNT(*) FROM runs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count, 2);
        assert_eq!(
            std::fs::metadata(&wal).unwrap().len(),
            target,
            "commits overwrote the padding instead of growing the file"
        );
        drop(conn);
        drop(store);
        // Reopened: the log is padded again and nothing was lost.
        let store = within(SqliteStore::open(&path)).await.unwrap();
        assert!(std::fs::metadata(&wal).unwrap().len() >= target);
        for id in ids {
            assert!(within(store.get_run(&id)).await.unwrap().is_some());
        }
        let check: String = raw(&path)
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }

    #[tokio::test]
    async fn creates_the_schema_and_reopens_it() {
        let (dir, store) = fresh().await;
        let path = dir.path().join("wf.db");
        let id = within(create(&store, "orders", t(0))).await;
        drop(store);

        let conn = raw(&path);
        let meta: Vec<(String, Sql)> = conn
            .prepare("SELECT key, value FROM workflow_meta ORDER BY key")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            meta,
            vec![
                ("schema".to_owned(), Sql::Text("workflow-rs".to_owned())),
                ("version".to_owned(), Sql::Integer(2)),
            ]
        );
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        drop(conn);

        let store = within(SqliteStore::open(&path)).await.unwrap();
        let (synchronous, busy): (i64, i64) = within(store.write(|tx| {
            let pragma = |name: &str| tx.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0));
            Ok((
                pragma("synchronous").map_err(db)?,
                pragma("busy_timeout").map_err(db)?,
            ))
        }))
        .await
        .unwrap();
        assert_eq!(
            (synchronous, busy),
            (2, 5_000),
            "synchronous=FULL, busy_timeout=5s"
        );
        let run = within(store.get_run(&id)).await.unwrap().unwrap();
        assert_eq!(run.workflow, "orders");
        assert_eq!(run.status, RunStatus::Pending);
        assert_eq!(run.input, json!([1, "two"]));
        assert_eq!(run.created_at, t(0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_opens_of_a_new_file_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wf.db");
        let opens: Vec<_> = (0..4)
            .map(|_| tokio::spawn(SqliteStore::open(path.clone())))
            .collect();
        let mut stores = Vec::new();
        for open in opens {
            stores.push(within(open).await.unwrap().unwrap());
        }
        let id = within(create(&stores[0], "orders", t(0))).await;
        for store in &stores {
            assert!(within(store.get_run(&id)).await.unwrap().is_some());
        }
        let conn = raw(&path);
        let metas: i64 = conn
            .query_row("SELECT count(*) FROM workflow_meta", [], |r| r.get(0))
            .unwrap();
        assert_eq!(metas, 2);
    }

    #[tokio::test]
    async fn acquire_uses_the_ready_index() {
        let (dir, _store) = fresh().await;
        let conn = raw(&dir.path().join("wf.db"));
        let plan: Vec<String> = conn
            .prepare(
                "EXPLAIN QUERY PLAN SELECT id FROM runs
                 WHERE status IN ('pending', 'running')
                   AND wake_at <= 1 AND (lease_until IS NULL OR lease_until <= 1)
                   AND workflow IN (SELECT value FROM json_each('[\"a\"]'))
                 ORDER BY wake_at, id LIMIT 5",
            )
            .unwrap()
            .query_map([], |r| r.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains("runs_ready"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE FOR ORDER BY"), "{plan}");
    }

    #[tokio::test]
    async fn rejects_a_foreign_database_without_touching_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        let conn = raw(&path);
        conn.execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
             CREATE TABLE orders (id INTEGER PRIMARY KEY);
             INSERT INTO users (name) VALUES ('ada');",
        )
        .unwrap();
        drop(conn);
        let before = std::fs::read(&path).unwrap();

        let err = within(SqliteStore::open(&path)).await.unwrap_err();
        let StoreError::Incompatible(msg) = &err else {
            panic!("expected Incompatible, got {err:?}");
        };
        assert!(msg.starts_with(&path.display().to_string()), "{msg}");
        assert!(
            msg.contains("is a SQLite database but not a workflow-rs store (it has tables `orders`, `users`)"),
            "{msg}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[tokio::test]
    async fn rejects_a_file_that_is_not_a_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("junk.db");
        let junk: Vec<u8> = (0..8192u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(&path, &junk).unwrap();

        let err = within(SqliteStore::open(&path)).await.unwrap_err();
        let StoreError::Incompatible(msg) = &err else {
            panic!("expected Incompatible, got {err:?}");
        };
        assert!(
            msg.starts_with(&format!(
                "{} is not a SQLite database (or is corrupt): ",
                path.display()
            )),
            "{msg}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), junk);

        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "just some notes\n").unwrap();
        let err = within(SqliteStore::open(&text)).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Incompatible(m) if m.contains("is not a SQLite database")),
            "{err:?}"
        );
        assert_eq!(std::fs::read(&text).unwrap(), b"just some notes\n");
    }

    #[tokio::test]
    async fn rejects_a_newer_schema_without_touching_it() {
        let (dir, store) = fresh().await;
        drop(store);
        let path = dir.path().join("wf.db");
        let conn = raw(&path);
        conn.execute(
            "UPDATE workflow_meta SET value = 3 WHERE key = 'version'",
            [],
        )
        .unwrap();
        conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
            .unwrap();
        drop(conn);
        let before = std::fs::read(&path).unwrap();

        let err = within(SqliteStore::open(&path)).await.unwrap_err();
        let StoreError::Incompatible(msg) = &err else {
            panic!("expected Incompatible, got {err:?}");
        };
        assert!(msg.contains("schema version 3"), "{msg}");
        assert!(msg.contains("schema versions up to 2"), "{msg}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[tokio::test]
    async fn reports_an_unopenable_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = within(SqliteStore::open(dir.path().join("missing/dir/wf.db")))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Database(m) if m.contains("cannot open")),
            "{err:?}"
        );
    }

    /// The version 1 file format, as released (do not edit).
    const V1_DDL: &str = "
        CREATE TABLE workflow_meta (key TEXT PRIMARY KEY NOT NULL, value NOT NULL);
        CREATE TABLE runs (
            id TEXT PRIMARY KEY NOT NULL, workflow TEXT NOT NULL, status TEXT NOT NULL,
            input TEXT NOT NULL, output TEXT, error TEXT, created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL, wake_at INTEGER NOT NULL,
            epoch INTEGER NOT NULL DEFAULT 0, lease_until INTEGER
        );
        CREATE INDEX runs_ready ON runs (wake_at, id) WHERE status IN ('pending', 'running');
        CREATE TABLE events (
            run_id TEXT NOT NULL, seq INTEGER NOT NULL, at INTEGER NOT NULL, kind TEXT NOT NULL,
            data TEXT NOT NULL, PRIMARY KEY (run_id, seq)
        ) WITHOUT ROWID;
        INSERT INTO workflow_meta (key, value) VALUES ('schema', 'workflow-rs'), ('version', 1);
    ";

    #[tokio::test]
    async fn migrates_a_version_1_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        let old = RunId::new();
        let conn = raw(&path);
        conn.execute_batch(V1_DDL).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute(
            "INSERT INTO runs (id, workflow, status, input, created_at, updated_at, wake_at)
             VALUES (?1, 'hooked', 'pending', '[7]', ?2, ?2, ?2)",
            params![old.to_string(), sql_time(t(0))],
        )
        .unwrap();
        let event = EncodedEvent::new(&step_done(t(1), 1)).unwrap();
        conn.execute(
            "INSERT INTO events (run_id, seq, at, kind, data) VALUES (?1, 1, ?2, ?3, ?4)",
            params![old.to_string(), event.at, event.kind, event.data],
        )
        .unwrap();
        drop(conn);

        let store = within(SqliteStore::open(&path)).await.unwrap();
        let run = within(store.get_run(&old)).await.unwrap().unwrap();
        assert_eq!(
            (run.status, run.input, run.hook_token),
            (RunStatus::Pending, json!([7]), None)
        );
        assert_eq!(
            within(store.events(&old)).await.unwrap(),
            [EventRecord {
                seq: 1,
                at: t(1),
                event: step_done(t(1), 1).event,
            }]
        );
        // The old run works with the new operations.
        let lease = within(lease_one(&store, old, t(2))).await;
        assert_eq!(
            within(store.claim_hook(&lease, "hk_1", "migrated", t(3)))
                .await
                .unwrap(),
            ClaimOutcome::Claimed
        );
        assert_eq!(
            within(store.resume_hook("migrated", json!("hi"), t(4)))
                .await
                .unwrap(),
            Some((old, 1))
        );
        let (new, admitted) = within(start(&store, "fresh", None, t(5))).await;
        assert_eq!(admitted, Admission::Admitted);
        drop(store);

        let version: i64 = raw(&path)
            .query_row(
                "SELECT value FROM workflow_meta WHERE key = 'version'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        assert_eq!(count(&path, "workflow_meta"), 2);
        // Reopening a migrated file migrates nothing.
        let store = within(SqliteStore::open(&path)).await.unwrap();
        assert_eq!(within(owner(&store, "fresh")).await, Some(new));
        assert_eq!(within(owner(&store, "migrated")).await, Some(old));
    }

    #[tokio::test]
    async fn a_new_file_gets_every_migration() {
        let (dir, store) = fresh().await;
        drop(store);
        let conn = raw(&dir.path().join("wf.db"));
        let objects: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_schema
                 WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            objects,
            [
                "events",
                "hook_inbox",
                "hook_inbox_run",
                "hooks",
                "hooks_run",
                "runs",
                "runs_ready",
                "workflow_meta"
            ]
        );
        let has_token: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info('runs') WHERE name = 'hook_token'")
            .unwrap()
            .exists([])
            .unwrap();
        assert!(has_token);
    }

    #[tokio::test]
    async fn rejects_a_version_2_file_missing_a_hook_table_without_touching_it() {
        let (dir, store) = fresh().await;
        drop(store);
        let path = dir.path().join("wf.db");
        let conn = raw(&path);
        conn.execute_batch("DROP TABLE hook_inbox").unwrap();
        conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
            .unwrap();
        drop(conn);
        let before = std::fs::read(&path).unwrap();
        let err = within(SqliteStore::open(&path)).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Incompatible(m) if m.contains("table `hook_inbox` is missing")),
            "{err:?}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    // -----------------------------------------------------------------------------------------
    // The writer thread: group commit and isolation of batched requests

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_share_commits_and_all_land() {
        let (_dir, store) = fresh().await;
        let wf = names(&["bulk"]);
        let creates: Vec<_> = (0..200)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { within(create(&store, "bulk", t(i))).await })
            })
            .collect();
        for c in creates {
            within(c).await.unwrap();
        }
        let leased = within(acquire(
            &store,
            &wf,
            t(1_000),
            Duration::from_secs(600),
            1_000,
        ))
        .await;
        assert_eq!(leased.len(), 200);

        let commits_before = store.inner.stats.commits.load(Ordering::Relaxed);
        let appends: Vec<_> = leased
            .iter()
            .map(|r| {
                let store = store.clone();
                let lease = r.lease.clone();
                tokio::spawn(async move {
                    store
                        .append(
                            &lease,
                            ap(vec![step_done(t(2_000), 1), step_done(t(2_001), 2)], None),
                        )
                        .await
                })
            })
            .collect();
        for a in appends {
            within(a).await.unwrap().unwrap();
        }
        let commits = store.inner.stats.commits.load(Ordering::Relaxed) - commits_before;
        assert!(
            commits < 200,
            "200 appends took {commits} commits: no group commit"
        );

        for r in &leased {
            let events = within(store.events(&r.run.id)).await.unwrap();
            assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_request_does_not_undo_its_batch_neighbours() {
        let (_dir, store) = fresh().await;
        let wf = names(&["mix"]);
        for i in 0..20 {
            within(create(&store, "mix", t(i))).await;
        }
        let leased = within(acquire(&store, &wf, t(100), Duration::from_secs(600), 100)).await;
        let tasks: Vec<_> = leased
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let store = store.clone();
                let mut lease = r.lease.clone();
                if i % 2 == 1 {
                    lease.epoch += 7;
                }
                tokio::spawn(async move {
                    store
                        .append(&lease, ap(vec![step_done(t(200), 1)], None))
                        .await
                })
            })
            .collect();
        for (i, task) in tasks.into_iter().enumerate() {
            let result = within(task).await.unwrap();
            if i % 2 == 1 {
                assert!(
                    matches!(result, Err(StoreError::LeaseLost(_))),
                    "{result:?}"
                );
            } else {
                result.unwrap();
            }
        }
        for (i, r) in leased.iter().enumerate() {
            let n = within(store.events(&r.run.id)).await.unwrap().len();
            assert_eq!(n, usize::from(i % 2 == 0));
        }
    }

    #[tokio::test]
    async fn a_panicking_write_fails_alone() {
        let (_dir, store) = fresh().await;
        let result: Result<(), _> = within(store.write(|_| panic!("boom"))).await;
        assert!(
            matches!(&result, Err(StoreError::Database(m)) if m.contains("boom")),
            "{result:?}"
        );
        let id = within(create(&store, "orders", t(0))).await;
        assert!(within(store.get_run(&id)).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn dropping_the_last_clone_ends_the_threads() {
        let (_dir, store) = fresh().await;
        let other = store.clone();
        within(create(&store, "orders", t(0))).await;
        let threads = Arc::downgrade(&store.inner.stats);
        drop(store);
        assert!(threads.upgrade().is_some(), "a clone still holds the store");
        drop(other);
        within(async {
            while threads.upgrade().is_some() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_starts_share_commits() {
        let (dir, a) = fresh().await;
        let b = within(SqliteStore::open(dir.path().join("wf.db")))
            .await
            .unwrap();
        let commits = |s: &SqliteStore| s.inner.stats.commits.load(Ordering::Relaxed);

        // From tasks on one store.
        let before = commits(&a);
        within(storm(std::slice::from_ref(&a), "solo", 200)).await;
        let used = commits(&a) - before;
        assert!(
            used < 200,
            "200 starts took {used} commits: no group commit"
        );

        // From two stores (two writer connections) on one file.
        let before = commits(&a) + commits(&b);
        within(storm(&[a.clone(), b.clone()], "shared", 200)).await;
        let used = commits(&a) + commits(&b) - before;
        assert!(
            used < 200,
            "200 starts took {used} commits: no group commit"
        );
    }

    // -----------------------------------------------------------------------------------------
    // Decoding what another hand wrote

    #[tokio::test]
    async fn listing_reports_an_unknown_status() {
        let (dir, store) = fresh().await;
        within(create(&store, "orders", t(1))).await;
        raw(&dir.path().join("wf.db"))
            .execute("UPDATE runs SET status = 'lost'", [])
            .unwrap();
        let err = within(store.list_runs(&RunFilter::new()))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Corrupt(m) if m.contains("unknown status `lost`")),
            "{err:?}"
        );
    }
}
