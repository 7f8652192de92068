//! [`SqliteStore`]: the embedded default store, one SQLite file in WAL mode that several
//! processes may share. It owns the SQLite statements (`Statements`), the file's schema
//! and its migrations, and the threads that talk to SQLite; what it decides in each
//! transaction is the shared SQL layer's (`store::sql`).
//!
//! SQLite allows one writer at a time, and with `synchronous=FULL` each commit costs an fsync.
//! So all writes go to one thread that drains every request queued while it was busy and runs
//! them in one transaction, each inside its own savepoint (group commit: many runs share one
//! fsync, and one refused request rolls back only itself). Callers hear back only after the
//! commit. Reads run beside it on a few reader threads; WAL lets them see the last commit
//! without waiting for the writer. Between processes, `BEGIN IMMEDIATE` and `busy_timeout`
//! serialize the writers, and every check-then-write happens inside one such transaction.

use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use rusqlite::types::Value as Sql;
use rusqlite::{
    params, Connection, ErrorCode, OpenFlags, OptionalExtension, Params, Row, Transaction,
    TransactionBehavior,
};
use serde_json::Value;
use tokio::sync::oneshot;

use super::sql::migrations::{self, Migration, Place};
use super::sql::policy::{
    self, ChunkAppend, EncodedCancel, EncodedChunk, EncodedFailure, NewRunRow, Tx,
};
use super::sql::rows::{
    decode_events, ChunkRow, EventRow, HookRow, InboxRow, LeasedRow, PayloadRow, Picked,
    QueueLimits, QueueRow, RunRow, StreamRow, StreamStateRow,
};
use super::sql::{
    lease_end, sql_epoch, sql_id, sql_time, to_json, EncodedAppend, EncodedEnd, EncodedEvents,
};
use super::{
    AcquireRequest, AdminStore, Admission, AdmitOrResume, Append, CancelOutcome, ClaimOutcome,
    EventRecord, FailureOutcome, HookFilter, HookRecord, HookStore, Lease, LeasedRun, NewEvent,
    NewRun, Payload, PruneStats, QueueDef, QueueInfo, QueueStore, RetryOutcome, RunFilter,
    RunRecord, RunStore, StreamInfo, StreamPage, StreamStore, CHILD_NOTICE_TOKEN,
};
use crate::error::{DatabaseError, Error, StoreError};
use crate::ids::RunId;

/// How long one SQLite call waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a write keeps retrying when the lock is still held after `BUSY_TIMEOUT`.
const LOCK_WAIT: Duration = Duration::from_secs(30);
/// Requests per transaction at most, so one burst cannot hold the lock for long.
const MAX_BATCH: usize = 1024;
/// Reader threads, each with its own connection.
const READERS: usize = 4;

/// The file format's history, applied on open in the transaction that checks the file.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "runs and events",
        ddl: SCHEMA_V1,
    },
    Migration {
        version: 2,
        name: "hooks, the hook inbox and the token claimed at admission",
        ddl: SCHEMA_V2,
    },
    Migration {
        version: 3,
        name: "each run keeps the number of its last event; migrations are recorded one per row",
        ddl: SCHEMA_V3,
    },
    Migration {
        version: 4,
        name: "failed tries and blocks counted per run; blocked runs",
        ddl: SCHEMA_V4,
    },
    Migration {
        version: 5,
        name: "child runs: each run names the run that started it",
        ddl: SCHEMA_V5,
    },
    Migration {
        version: 6,
        name: "queues: their limits, and each run's queue, partition key, priority and begin",
        ddl: SCHEMA_V6,
    },
    Migration {
        version: 7,
        name: "streams from runs and their chunks",
        ddl: SCHEMA_V7,
    },
];
/// The tables each version must have (from the version that created them on), checked
/// before migrating so a damaged file is reported, not half-migrated.
const TABLES: &[(&str, i64)] = &[
    ("runs", 1),
    ("events", 1),
    ("hooks", 2),
    ("hook_inbox", 2),
    ("streams", 7),
    ("stream_chunks", 7),
    ("queues", 6),
];

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

/// The layout PostgreSQL has: appends number their events from the run's row, which the
/// fence reads anyway, and `workflow_migrations` (filled before this runs) replaces the
/// key-value `workflow_meta`.
const SCHEMA_V3: &str = "
ALTER TABLE runs ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET last_seq = (SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = runs.id);
DROP TABLE workflow_meta;
";

/// Poison runs end (SPEC 8): a run counts the tries at it that failed in a row. A run whose
/// replay diverged is `blocked` (SPEC 9) and counts its blocks for its backoff; it is
/// acquirable when due, so the ready index takes it in.
const SCHEMA_V4: &str = "
ALTER TABLE runs ADD COLUMN failed_tries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN blocked_tries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN deadline INTEGER;  -- NULL: none (`start(..).timeout(d)`)
DROP INDEX runs_ready;
CREATE INDEX runs_ready ON runs (wake_at, id) WHERE status IN ('pending', 'running', 'blocked');
";

/// Child runs (SPEC 10): a run started with `start_child` names its parent, and whether
/// a cancellation of the parent reaches it.
const SCHEMA_V5: &str = "
ALTER TABLE runs ADD COLUMN parent_id TEXT;  -- NULL: started from outside a workflow
ALTER TABLE runs ADD COLUMN detached INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_parent ON runs (parent_id) WHERE parent_id IS NOT NULL;
";

/// Streams from runs (SPEC 12): a row per stream holds its length, which is the index the
/// next chunk gets (drawn by the append's upsert), and whether it is closed; a row per chunk.
const SCHEMA_V7: &str = "
CREATE TABLE streams (
    run_id TEXT NOT NULL,
    name   TEXT NOT NULL,
    len    INTEGER NOT NULL,
    closed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, name)
) WITHOUT ROWID;
CREATE TABLE stream_chunks (
    run_id  TEXT NOT NULL,
    name    TEXT NOT NULL,
    idx     INTEGER NOT NULL,   -- from 0 per run and stream, in write order
    attempt INTEGER NOT NULL,   -- of the step that wrote it
    at      INTEGER NOT NULL,
    value   TEXT NOT NULL,      -- JSON
    PRIMARY KEY (run_id, name, idx)
) WITHOUT ROWID;
";

/// Flow control (SPEC 11): the queues every process enforces, and where each run stands in
/// its queue. A queued run holds a slot from its first lease (`began_at`) until it ends.
const SCHEMA_V6: &str = "
ALTER TABLE runs ADD COLUMN queue TEXT;             -- NULL: not in a queue
ALTER TABLE runs ADD COLUMN partition_key TEXT;     -- one run at a time per key and queue
ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN began_at INTEGER;       -- queued runs: when it took its slot
CREATE TABLE queues (
    name        TEXT PRIMARY KEY NOT NULL,
    concurrency INTEGER,            -- NULL: no limit
    rate_limit  INTEGER,            -- runs begun per window; NULL: no limit
    rate_period INTEGER,            -- the window, ms
    updated_at  INTEGER NOT NULL
);
-- The runs waiting for a slot, in the order they begin.
CREATE INDEX runs_queue_waiting ON runs (queue, priority DESC, created_at, id)
    WHERE queue IS NOT NULL AND began_at IS NULL AND status IN ('pending', 'running', 'blocked');
-- The waiting runs of each partition key, in start order.
CREATE INDEX runs_queue_keyed ON runs (queue, partition_key, created_at, id)
    WHERE queue IS NOT NULL AND partition_key IS NOT NULL AND began_at IS NULL
      AND status IN ('pending', 'running', 'blocked');
-- The runs holding a slot, by partition key.
CREATE INDEX runs_queue_holding ON runs (queue, partition_key)
    WHERE queue IS NOT NULL AND began_at IS NOT NULL
      AND status IN ('pending', 'running', 'blocked');
-- Begins, for the rate window.
CREATE INDEX runs_queue_begun ON runs (queue, began_at) WHERE began_at IS NOT NULL;
";

/// Every statement the store runs (beside the schema's), as SQLite spells it; read it side
/// by side with PostgreSQL's. `?n` are the arguments in the order bound.
type Statements = super::sql::Statements<&'static str, SqliteOnly>;

/// The statements PostgreSQL does without: it inserts events with the append (and chunks
/// with theirs), wakes the
/// owner inside `resume`, and keeps its catalog queries with its migrations.
struct SqliteOnly {
    insert_event: &'static str,
    insert_chunk: &'static str,
    wake: &'static str,
    child_notice: &'static str,
    tables: &'static str,
    migration_version: &'static str,
    record_migration: &'static str,
    legacy_meta: &'static str,
    ended_among: &'static str,
}

const SQL: Statements = Statements {
    run_exists: "SELECT 1 FROM runs WHERE id = ?1",
    insert_run: "INSERT INTO runs (id, workflow, status, input, created_at, updated_at, wake_at,
                                   hook_token, deadline, parent_id, detached, queue,
                                   partition_key, priority)
                 VALUES (?1, ?2, 'pending', ?3, ?4, ?4, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (id) DO NOTHING",
    insert_leased_run: "INSERT INTO runs (id, workflow, status, input, created_at, updated_at,
                                          wake_at, hook_token, epoch, lease_until, deadline,
                                          parent_id, detached)
                        VALUES (?1, ?2, 'running', ?3, ?4, ?4, ?4, ?5, 1, ?6, ?7, ?8, ?9)
                        ON CONFLICT (id) DO NOTHING",
    claim: "INSERT INTO hooks (token, run_id, created_at, active, retain_until)
            VALUES (?1, ?2, ?3, 1, ?4)
            ON CONFLICT (token) DO UPDATE SET
                run_id = excluded.run_id, created_at = excluded.created_at, active = 1,
                retain_until = excluded.retain_until
            WHERE hooks.active = 0 AND COALESCE(hooks.retain_until, 0) <= excluded.created_at",
    hook_owner: "SELECT run_id, active FROM hooks WHERE token = ?1",
    get_run: "SELECT id, workflow, status, input, output, error, created_at, updated_at,
                     hook_token, deadline, parent_id, queue, partition_key, priority
              FROM runs WHERE id = ?1",
    events: "SELECT run_id, seq, at, data FROM events WHERE run_id = ?1 ORDER BY seq",
    // `?1`: the run ids as a JSON array.
    events_of: "SELECT run_id, seq, at, data FROM events
                WHERE run_id IN (SELECT value FROM json_each(?1)) ORDER BY run_id, seq",
    // One statement picks and leases; the IMMEDIATE transaction around it keeps every other
    // connection, in any process, from leasing the same rows meanwhile.
    // Queued runs waiting for a slot are left to `begin_queued`, unless their deadline has
    // passed: handed out without a slot, they fail at once.
    acquire: "UPDATE runs SET epoch = epoch + 1, status = 'running', lease_until = ?1,
                  error = NULL
              WHERE id IN (
                  SELECT id FROM runs
                  WHERE status IN ('pending', 'running', 'blocked')
                    AND wake_at <= ?2
                    AND (lease_until IS NULL OR lease_until <= ?2)
                    AND workflow IN (SELECT value FROM json_each(?3))
                    AND (queue IS NULL OR began_at IS NOT NULL OR deadline <= ?2)
                  ORDER BY wake_at, id
                  LIMIT ?4)
              RETURNING id, workflow, status, input, output, error, created_at, updated_at,
                        hook_token, deadline, parent_id, queue, partition_key, priority,
                        epoch, wake_at",
    // Fences (with epoch `?3`, unless NULL) and numbers in one statement: the base to number
    // `?2` events from, or no row when the lease is lost.
    append: "UPDATE runs SET last_seq = last_seq + ?2
             WHERE id = ?1
               AND (?3 IS NULL OR (epoch = ?3 AND status = 'running' AND lease_until IS NOT NULL))
             RETURNING last_seq - ?2",
    run_status: "SELECT status FROM runs WHERE id = ?1",
    // The parent, if any, is told next (`SqliteOnly::child_notice`).
    end_run: "UPDATE runs SET status = ?2, output = ?3, error = ?4, updated_at = ?5,
                  lease_until = NULL
              WHERE id = ?1
              RETURNING parent_id",
    children_to_cancel: "SELECT id FROM runs
                         WHERE parent_id = ?1 AND detached = 0
                           AND status NOT IN ('completed', 'failed', 'cancelled')",
    // `?3`: the tokens as a JSON array, or NULL for all the run's.
    release_tokens: [
        "DELETE FROM hooks
         WHERE run_id = ?1 AND active = 1 AND COALESCE(retain_until, 0) <= ?2
           AND (?3 IS NULL OR token IN (SELECT value FROM json_each(?3)))",
        "UPDATE hooks SET active = 0
         WHERE run_id = ?1 AND active = 1
           AND (?2 IS NULL OR token IN (SELECT value FROM json_each(?2)))",
    ],
    // A payload committed after the worker last looked wakes the run at once; the check and
    // the release are one statement, so none slips in between.
    release: "UPDATE runs SET lease_until = NULL, failed_tries = 0,
                  wake_at = CASE
                      WHEN EXISTS (SELECT 1 FROM hook_inbox WHERE run_id = ?1 AND id > ?4)
                      THEN ?5 ELSE ?3 END
              WHERE id = ?1 AND epoch = ?2 AND status = 'running' AND lease_until IS NOT NULL",
    count_failure: "UPDATE runs SET failed_tries = failed_tries + 1, lease_until = NULL
                    WHERE id = ?1 AND epoch = ?2 AND status = 'running'
                      AND lease_until IS NOT NULL
                    RETURNING failed_tries",
    retry_at: "UPDATE runs SET wake_at = ?2 WHERE id = ?1",
    block: "UPDATE runs SET status = 'blocked', error = ?3, updated_at = ?4, lease_until = NULL,
                blocked_tries = blocked_tries + 1
            WHERE id = ?1 AND epoch = ?2 AND status = 'running' AND lease_until IS NOT NULL
            RETURNING blocked_tries",
    // A failed run re-opened waits for a slot of its queue again.
    retry: "UPDATE runs SET status = CASE status WHEN 'failed' THEN 'pending' ELSE status END,
                error = CASE status WHEN 'failed' THEN NULL ELSE error END,
                began_at = CASE status WHEN 'failed' THEN NULL ELSE began_at END,
                updated_at = ?2, wake_at = ?2, failed_tries = 0, blocked_tries = 0
            WHERE id = ?1 AND status IN ('failed', 'blocked')",
    wake_blocked: "UPDATE runs SET wake_at = MIN(wake_at, ?1) WHERE status = 'blocked'",
    // `?2`: the payload ids as a JSON array.
    forget_payloads: "DELETE FROM hook_inbox
                      WHERE run_id = ?1 AND id IN (SELECT value FROM json_each(?2))",
    // Finding the owner and queueing the payload is one statement: no row, no payload.
    resume: "INSERT INTO hook_inbox (run_id, token, payload, at)
             SELECT run_id, token, ?2, ?3 FROM hooks WHERE token = ?1 AND active = 1
             RETURNING id, run_id",
    payloads: "SELECT id, token, payload FROM hook_inbox WHERE run_id = ?1 AND id > ?2 ORDER BY id",
    payloads_since: "SELECT id, run_id FROM hook_inbox WHERE id > ?1 ORDER BY id LIMIT ?2",
    last_payload_id: "SELECT COALESCE(MAX(id), 0) FROM hook_inbox",
    get_hook: "SELECT token, run_id, created_at FROM hooks WHERE token = ?1 AND active = 1",
    // `?1`: the leases as a JSON array of `[id, epoch]`.
    heartbeat: "UPDATE runs SET lease_until = ?2
                FROM (SELECT value ->> 0 AS held_id, value ->> 1 AS held_epoch
                      FROM json_each(?1)) AS l
                WHERE id = l.held_id AND epoch = l.held_epoch AND status = 'running'
                  AND lease_until IS NOT NULL
                RETURNING id, epoch",
    // A NULL filter matches everything.
    list_runs: "SELECT id, workflow, status, input, output, error, created_at, updated_at,
                       hook_token, deadline, parent_id, queue, partition_key, priority
                FROM runs
                WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR workflow = ?2)
                  AND (?4 IS NULL OR queue = ?4) AND (?5 IS NULL OR parent_id = ?5)
                  AND (?6 IS NULL OR created_at >= ?6) AND (?7 IS NULL OR created_at < ?7)
                  AND (?8 IS NULL OR (created_at, id) < (SELECT created_at, id FROM runs WHERE id = ?8))
                ORDER BY created_at DESC, id DESC LIMIT ?3",
    list_hooks: "SELECT token, run_id, created_at FROM hooks
                 WHERE active = 1 AND (?1 IS NULL OR token = ?1) AND (?2 IS NULL OR run_id = ?2)
                 ORDER BY created_at DESC, token LIMIT ?3",
    // `?1` ended before, `?2` now; then `?1`: the pruned ids as a JSON array.
    prune_runs: "DELETE FROM runs
                 WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < ?1
                   AND NOT EXISTS (SELECT 1 FROM hooks WHERE run_id = runs.id AND retain_until > ?2)
                 RETURNING id",
    prune_records: [
        "DELETE FROM events WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM hook_inbox WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM hooks WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM streams WHERE run_id IN (SELECT value FROM json_each(?1))",
        "DELETE FROM stream_chunks WHERE run_id IN (SELECT value FROM json_each(?1))",
    ],
    // After the fence (`append` of no events). The stream's row is the counter: a closed
    // stream's row is not updated, so no row.
    append_chunk: "INSERT INTO streams (run_id, name, len, closed) VALUES (?1, ?2, 1, 0)
                   ON CONFLICT (run_id, name) DO UPDATE SET len = len + 1 WHERE closed = 0
                   RETURNING len - 1",
    close_stream: "INSERT INTO streams (run_id, name, len, closed) VALUES (?1, ?2, 0, 1)
                   ON CONFLICT (run_id, name) DO UPDATE SET closed = 1",
    stream_state: "SELECT (SELECT status FROM runs WHERE id = ?1),
                          (SELECT len FROM streams WHERE run_id = ?1 AND name = ?2),
                          (SELECT closed FROM streams WHERE run_id = ?1 AND name = ?2)",
    stream_chunks: "SELECT idx, attempt, at, value FROM stream_chunks
                    WHERE run_id = ?1 AND name = ?2 AND idx >= ?3 ORDER BY idx LIMIT ?4",
    list_streams: "SELECT name, len, closed FROM streams WHERE run_id = ?1 ORDER BY name",
    // `?5` now.
    define_queue: "INSERT INTO queues (name, concurrency, rate_limit, rate_period, updated_at)
                   VALUES (?1, ?2, ?3, ?4, ?5)
                   ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency,
                       rate_limit = excluded.rate_limit, rate_period = excluded.rate_period,
                       updated_at = excluded.updated_at",
    // `?1` now.
    list_queues: "SELECT q.name, q.concurrency, q.rate_limit, q.rate_period,
                         (SELECT COUNT(*) FROM runs INDEXED BY runs_queue_holding
                          WHERE queue = q.name AND began_at IS NOT NULL
                            AND status IN ('pending', 'running', 'blocked')),
                         (SELECT COUNT(*) FROM runs
                          WHERE queue = q.name AND began_at IS NULL
                            AND status IN ('pending', 'running', 'blocked')),
                         (SELECT COUNT(*) FROM runs
                          WHERE q.rate_period IS NOT NULL AND queue = q.name
                            AND began_at > ?1 - q.rate_period)
                  FROM queues q ORDER BY q.name",
    // `?1` now. The window's oldest begin leaves it at `began_at + rate_period`.
    queue_opening: "SELECT MIN(opening) FROM (
                        SELECT (SELECT MIN(began_at) FROM runs r
                                WHERE r.queue = q.name AND r.began_at > ?1 - q.rate_period)
                               + q.rate_period AS opening
                        FROM queues q
                        WHERE q.rate_limit IS NOT NULL AND q.rate_period IS NOT NULL
                          AND EXISTS (SELECT 1 FROM runs w
                                      WHERE w.queue = q.name AND w.queue IS NOT NULL
                                        AND w.began_at IS NULL
                                        AND w.status IN ('pending', 'running', 'blocked'))
                          AND (SELECT COUNT(*) FROM runs r
                               WHERE r.queue = q.name AND r.began_at > ?1 - q.rate_period)
                              >= q.rate_limit)",
    // `?1` now, `?2` the workflows as a JSON array.
    waiting_queues: "SELECT DISTINCT queue FROM runs
                     WHERE queue IS NOT NULL AND began_at IS NULL
                       AND status IN ('pending', 'running', 'blocked')
                       AND wake_at <= ?1 AND (lease_until IS NULL OR lease_until <= ?1)
                       AND workflow IN (SELECT value FROM json_each(?2))
                     ORDER BY queue",
    // The writer is serial (and `BEGIN IMMEDIATE` between processes): no lock needed.
    lock_queue: "SELECT concurrency, rate_limit, rate_period FROM queues WHERE name = ?1",
    // The planner would count the holding runs on `runs_queue_begun`, which keeps every
    // begin, the ended runs' too: `INDEXED BY` keeps it on the live ones.
    queue_counts: "SELECT
                       (SELECT COUNT(*) FROM runs INDEXED BY runs_queue_holding
                        WHERE queue = ?1 AND began_at IS NOT NULL
                          AND status IN ('pending', 'running', 'blocked')),
                       (SELECT COUNT(*) FROM runs WHERE queue = ?1 AND began_at > ?2)",
    // `?1` queue, `?2` now, `?3` the workflows as a JSON array, `?4` limit. Walks the
    // waiting runs in the order they begin and stops at the limit. Of a key, only the
    // earliest started waiting run may begin, and only while none of the key holds a slot.
    queue_candidates: "SELECT id FROM runs w
                       WHERE queue = ?1 AND queue IS NOT NULL AND began_at IS NULL
                         AND status IN ('pending', 'running', 'blocked')
                         AND wake_at <= ?2 AND (lease_until IS NULL OR lease_until <= ?2)
                         AND workflow IN (SELECT value FROM json_each(?3))
                         AND (partition_key IS NULL OR (
                             NOT EXISTS (
                                 SELECT 1 FROM runs e
                                 WHERE e.queue = ?1 AND e.partition_key = w.partition_key
                                   AND e.queue IS NOT NULL AND e.partition_key IS NOT NULL
                                   AND e.began_at IS NULL
                                   AND e.status IN ('pending', 'running', 'blocked')
                                   AND (e.created_at, e.id) < (w.created_at, w.id))
                             AND NOT EXISTS (
                                 SELECT 1 FROM runs h INDEXED BY runs_queue_holding
                                 WHERE h.queue = ?1 AND h.partition_key = w.partition_key
                                   AND h.queue IS NOT NULL AND h.began_at IS NOT NULL
                                   AND h.status IN ('pending', 'running', 'blocked'))))
                       ORDER BY priority DESC, created_at, id
                       LIMIT ?4",
    // `?1` lease until, `?2` now, `?3` the run ids as a JSON array.
    begin_queued: "UPDATE runs SET epoch = epoch + 1, status = 'running', lease_until = ?1,
                       error = NULL, began_at = ?2
                   WHERE id IN (SELECT value FROM json_each(?3)) AND began_at IS NULL
                     AND status IN ('pending', 'running', 'blocked')
                     AND (lease_until IS NULL OR lease_until <= ?2)
                   RETURNING id, workflow, status, input, output, error, created_at,
                             updated_at, hook_token, deadline, parent_id, queue, partition_key,
                             priority, epoch, wake_at",
    dialect: SqliteOnly {
        insert_event:
            "INSERT INTO events (run_id, seq, at, kind, data) VALUES (?1, ?2, ?3, ?4, ?5)",
        insert_chunk: "INSERT INTO stream_chunks (run_id, name, idx, attempt, at, value)
                       VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        // A blocked run waits for a build that fits, not for payloads.
        wake: "UPDATE runs SET wake_at = MIN(wake_at, ?2) WHERE id = ?1 AND status <> 'blocked'",
        // A child's end, queued to its parent (`?1`) as a `ChildNotice` (`?3`) under the
        // notice token (`?2`).
        child_notice: "INSERT INTO hook_inbox (run_id, token, payload, at) VALUES (?1, ?2, ?3, ?4)",
        tables: "SELECT name FROM sqlite_schema
                 WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'
                 ORDER BY name",
        migration_version: "SELECT COALESCE(MAX(version), 0) FROM workflow_migrations",
        record_migration: "INSERT INTO workflow_migrations (version, name, applied_at)
                           VALUES (?1, ?2, ?3)",
        legacy_meta: "SELECT value FROM workflow_meta WHERE key = ?1",
        // `?1`: run ids as a JSON array; those not live.
        ended_among: "SELECT value FROM json_each(?1)
                      WHERE NOT EXISTS (SELECT 1 FROM runs WHERE id = value
                                        AND status IN ('pending', 'running', 'blocked'))",
    },
};

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
        let (path2, stats2) = (path.clone(), stats.clone());
        start_thread(
            "workflow-sqlite-writer".to_owned(),
            move || open_writer(&path2),
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
        self.write(move |tx| now(policy::admit(&mut Lite(tx), &row)))
            .await
    }
}

#[async_trait::async_trait]
impl RunStore for SqliteStore {
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
        let id = id.to_string();
        let row = self
            .read(move |conn| one(conn, SQL.get_run, [id], RunRow::from_sqlite))
            .await?;
        row.map(RunRow::decode).transpose()
    }

    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        let id = id.to_string();
        self.read(move |conn| decode_events(all(conn, SQL.events, [id], EventRow::from_sqlite)?))
            .await
    }

    /// Leases in the writer's transaction, then reads the histories on a reader connection:
    /// the write lock, which every other writer (heartbeats included) waits for, is held only
    /// for the lease itself, not for reading whole histories. The leases are committed first,
    /// so nobody else writes to these runs meanwhile.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Vec<LeasedRun>, StoreError> {
        if req.limit == 0 || req.workflows.is_empty() {
            return Ok(Vec::new());
        }
        let workflows = to_json(&req.workflows, "workflow names")?;
        let until = lease_end(req.now, req.lease);
        let (at, limit) = (sql_time(req.now), sql_id(req.limit));
        let names = req.workflows.to_vec();
        let picked = self
            .write(move |tx| {
                let args = params![until, at, &workflows, limit];
                let mut rows = all(tx, SQL.acquire, args, leased_row)?;
                let room = limit - rows.len() as i64;
                let begin = now(policy::queued_to_begin(&mut Lite(tx), at, &names, room))?;
                if !begin.is_empty() {
                    let ids = to_json(&begin, "run ids")?;
                    let args = params![until, at, ids];
                    rows.extend(all(tx, SQL.begin_queued, args, leased_row)?);
                }
                Ok(Picked::new(rows))
            })
            .await?;
        let ids = picked.ids();
        // An idle worker's poll leases nothing: no histories to read.
        let events = if ids.is_empty() {
            Vec::new()
        } else {
            let ids = to_json(&ids, "run ids")?;
            self.read(move |conn| all(conn, SQL.events_of, [ids], EventRow::from_sqlite))
                .await?
        };
        let acquired = picked.attach(events);
        for (lease, why) in acquired.failed {
            policy::undecodable(self, &lease, &why, req.now).await;
        }
        Ok(acquired.runs)
    }

    async fn append(&self, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        let lease = lease.clone();
        let write = EncodedAppend::new(write)?;
        self.write(move |tx| now(policy::append(&mut Lite(tx), &lease, &write)))
            .await
    }

    async fn release(
        &self,
        lease: &Lease,
        wake_at: SystemTime,
        payloads_seen: u64,
    ) -> Result<(), StoreError> {
        let lease = lease.clone();
        let (wake_at, seen) = (sql_time(wake_at), sql_id(payloads_seen));
        let now = sql_time(SystemTime::now());
        self.write(move |tx| {
            let (run, epoch) = (lease.run_id.to_string(), sql_epoch(lease.epoch));
            match exec(tx, SQL.release, params![run, epoch, wake_at, seen, now])? {
                0 => Err(StoreError::LeaseLost(lease.run_id)),
                _ => Ok(()),
            }
        })
        .await
    }

    async fn ended_among(&self, runs: &[RunId]) -> Result<Vec<RunId>, StoreError> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let ids = to_json(&runs, "run ids")?;
        let ended: Vec<String> = self
            .read(move |conn| all(conn, SQL.dialect.ended_among, [ids], |r| r.get(0)))
            .await?;
        ended
            .iter()
            .map(|id| {
                id.parse()
                    .map_err(|e| StoreError::Corrupt(format!("run id {id:?}: {e}")))
            })
            .collect()
    }

    async fn block(
        &self,
        lease: &Lease,
        divergence: &Error,
        now: SystemTime,
    ) -> Result<SystemTime, StoreError> {
        let error = to_json(divergence, "the divergence")?;
        let (run, epoch) = (lease.run_id, sql_epoch(lease.epoch));
        self.write(move |tx| self::now(policy::block(&mut Lite(tx), &run, epoch, &error, now)))
            .await
    }

    async fn retry(&self, id: &RunId, now: SystemTime) -> Result<RetryOutcome, StoreError> {
        let id = *id;
        self.write(move |tx| self::now(policy::retry(&mut Lite(tx), &id, now)))
            .await
    }

    async fn wake_blocked(&self, now: SystemTime) -> Result<u64, StoreError> {
        let at = sql_time(now);
        let woken = self
            .write(move |tx| exec(tx, SQL.wake_blocked, [at]))
            .await?;
        Ok(woken as u64)
    }

    async fn create_run_with_history(
        &self,
        run: NewRun,
        history: &[NewEvent],
    ) -> Result<(), StoreError> {
        let row = NewRunRow::new(run, None)?;
        let events = EncodedEvents::new(history)?;
        self.write(move |tx| self::now(policy::create_with_history(&mut Lite(tx), &row, &events)))
            .await
    }

    async fn start_child(
        &self,
        lease: &Lease,
        child_key: &str,
        child: NewRun,
    ) -> Result<Admission, StoreError> {
        let row = NewRunRow::new(child, None)?;
        let (lease, key) = (lease.clone(), child_key.to_owned());
        self.write(move |tx| self::now(policy::start_child(&mut Lite(tx), &lease, &key, &row)))
            .await
    }

    async fn record_failure(
        &self,
        lease: &Lease,
        cause: &Error,
        now: SystemTime,
    ) -> Result<FailureOutcome, StoreError> {
        let failure = EncodedFailure::new(cause, now)?;
        let (run, epoch) = (lease.run_id, sql_epoch(lease.epoch));
        self.write(move |tx| {
            self::now(policy::record_failure(&mut Lite(tx), &run, epoch, &failure))
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
        let held: Vec<_> = leases
            .iter()
            .map(|l| (l.run_id.to_string(), sql_epoch(l.epoch)))
            .collect();
        let (held, until) = (to_json(&held, "the leases")?, lease_end(now, lease));
        let renewed = self
            .write(move |tx| {
                all(tx, SQL.heartbeat, params![held, until], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
            })
            .await?;
        Ok(policy::lost(leases, renewed))
    }

    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        let cancel = EncodedCancel::new(id, now)?;
        self.write(move |tx| self::now(policy::cancel(&mut Lite(tx), &cancel)))
            .await
    }
}

#[async_trait::async_trait]
impl HookStore for SqliteStore {
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: Value,
    ) -> Result<AdmitOrResume, StoreError> {
        let row = NewRunRow::new(run, lease)?;
        let payload = to_json(&payload, "the payload")?;
        self.write(move |tx| {
            // The transaction holds the database's write lock from its start, so no hook
            // takes the token between the resume and the claim: the policy always decides.
            now(policy::admit_or_resume(&mut Lite(tx), &row, &payload))?.ok_or_else(|| {
                StoreError::database("internal error: a token changed hands inside a transaction")
            })
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
        let (key, token) = (hook_key.to_owned(), token.to_owned());
        self.write(move |tx| now(policy::claim_hook(&mut Lite(tx), &lease, &key, &token, at)))
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
            let queued = now(Lite(tx).resume(&token, &payload, at))?;
            queued
                .map(|q| q.decode().map(|(id, run)| (run, id)))
                .transpose()
        })
        .await
    }

    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<Payload>, StoreError> {
        let run = run.to_string();
        let after = sql_id(after);
        self.read(move |conn| {
            let rows = all(
                conn,
                SQL.payloads,
                params![run, after],
                PayloadRow::from_sqlite,
            )?;
            rows.into_iter().map(|p| p.decode(&run)).collect()
        })
        .await
    }

    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError> {
        let (after, limit) = (sql_id(after), sql_id(limit));
        let rows = self
            .read(move |conn| {
                all(
                    conn,
                    SQL.payloads_since,
                    [after, limit],
                    InboxRow::from_sqlite,
                )
            })
            .await?;
        rows.into_iter().map(InboxRow::decode).collect()
    }

    async fn last_payload_id(&self) -> Result<u64, StoreError> {
        let last = self
            .read(|conn| one(conn, SQL.last_payload_id, [], |r| r.get(0)))
            .await?;
        super::sql::payload_id_of(last.unwrap_or(0))
    }

    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError> {
        let token = token.to_owned();
        let row = self
            .read(move |conn| one(conn, SQL.get_hook, [token], HookRow::from_sqlite))
            .await?;
        row.map(HookRow::decode).transpose()
    }

    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        let args = policy::hook_filter(filter);
        let rows = self
            .read(move |conn| all(conn, SQL.list_hooks, args, HookRow::from_sqlite))
            .await?;
        rows.into_iter().map(HookRow::decode).collect()
    }
}

#[async_trait::async_trait]
impl StreamStore for SqliteStore {
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let lease = lease.clone();
        let chunk = EncodedChunk::new(stream, attempt, &value, at)?;
        self.write(move |tx| now(policy::append_chunk(&mut Lite(tx), &lease, &chunk)))
            .await
    }

    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        _at: SystemTime,
    ) -> Result<(), StoreError> {
        let (lease, stream) = (lease.clone(), stream.to_owned());
        self.write(move |tx| now(policy::close_stream(&mut Lite(tx), &lease, &stream)))
            .await
    }

    /// The state first, then the chunks, each statement reading the last commit: what the
    /// state says was true before the chunks were read (see [`StreamPage`]).
    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        let (run, stream) = (run.to_string(), stream.to_owned());
        let (from, limit) = (sql_id(from), sql_id(limit));
        self.read(move |conn| {
            let state = one(conn, SQL.stream_state, [&run, &stream], |r| {
                StreamStateRow::from_sqlite(r)
            })?
            .unwrap_or(StreamStateRow {
                status: None,
                len: None,
                closed: None,
            });
            let args = params![run, stream, from, limit];
            let chunks = all(conn, SQL.stream_chunks, args, ChunkRow::from_sqlite)?;
            state.page(&run, &stream, chunks)
        })
        .await
    }

    async fn list_streams(&self, run: &RunId) -> Result<Vec<StreamInfo>, StoreError> {
        let run = run.to_string();
        self.read(move |conn| {
            let rows = all(conn, SQL.list_streams, [&run], StreamRow::from_sqlite)?;
            rows.into_iter().map(|r| r.decode(&run)).collect()
        })
        .await
    }
}

#[async_trait::async_trait]
impl QueueStore for SqliteStore {
    async fn define_queues(&self, queues: &[QueueDef]) -> Result<(), StoreError> {
        let rows = policy::queue_rows(queues);
        let at = sql_time(SystemTime::now());
        self.write(move |tx| {
            for (name, concurrency, rate, period) in &rows {
                exec(
                    tx,
                    SQL.define_queue,
                    params![name, concurrency, rate, period, at],
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        let at = sql_time(now);
        let opening: Option<i64> = self
            .read(move |conn| one(conn, SQL.queue_opening, [at], |r| r.get(0)))
            .await?
            .flatten();
        opening
            .map(|ms| super::sql::time_of(ms, "-", "queue opening"))
            .transpose()
    }

    async fn list_queues(&self, now: SystemTime) -> Result<Vec<QueueInfo>, StoreError> {
        let at = sql_time(now);
        let rows = self
            .read(move |conn| all(conn, SQL.list_queues, [at], QueueRow::from_sqlite))
            .await?;
        rows.into_iter().map(QueueRow::decode).collect()
    }
}

#[async_trait::async_trait]
impl AdminStore for SqliteStore {
    async fn prune(&self, before: SystemTime, now: SystemTime) -> Result<PruneStats, StoreError> {
        self.write(move |tx| self::now(policy::prune(&mut Lite(tx), before, now)))
            .await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let args = policy::run_filter(filter);
        let rows = self
            .read(move |conn| all(conn, SQL.list_runs, args, RunRow::from_sqlite))
            .await?;
        let runs = rows
            .into_iter()
            .map(RunRow::decode)
            .collect::<Result<_, _>>()?;
        policy::listed(self, filter, runs).await
    }
}

// ---------------------------------------------------------------------------------------------
// Statements

/// The policies' statements on the writer's transaction. They run synchronously, so every
/// future they return is ready at once; [`now`] takes its value.
struct Lite<'a>(&'a Connection);

impl Tx for Lite<'_> {
    async fn run_exists(&mut self, id: &str) -> Result<bool, StoreError> {
        Ok(self.0.prepare_cached(SQL.run_exists)?.exists([id])?)
    }

    async fn insert_run(&mut self, run: &NewRunRow) -> Result<bool, StoreError> {
        let token = run.hook.as_ref().map(|h| &h.0);
        let (id, wf, input, at) = (&run.key, &run.workflow, &run.input, run.created_at);
        let deadline = run.deadline;
        let (parent, detached) = match &run.parent {
            Some((p, detached)) => (Some(p.as_str()), *detached),
            None => (None, false),
        };
        let inserted = match run.lease_until {
            None => exec(
                self.0,
                SQL.insert_run,
                params![
                    id,
                    wf,
                    input,
                    at,
                    token,
                    deadline,
                    parent,
                    detached,
                    run.queue,
                    run.partition_key,
                    run.priority
                ],
            )?,
            Some(until) => exec(
                self.0,
                SQL.insert_leased_run,
                params![id, wf, input, at, token, until, deadline, parent, detached],
            )?,
        };
        Ok(inserted > 0)
    }

    async fn claim(
        &mut self,
        token: &str,
        run: &str,
        at: i64,
        retain_until: Option<i64>,
    ) -> Result<bool, StoreError> {
        Ok(exec(self.0, SQL.claim, params![token, run, at, retain_until])? > 0)
    }

    async fn hook_owner(&mut self, token: &str) -> Result<(String, bool), StoreError> {
        Ok(self
            .0
            .prepare_cached(SQL.hook_owner)?
            .query_row([token], |r| Ok((r.get(0)?, r.get(1)?)))?)
    }

    async fn resume(
        &mut self,
        token: &str,
        payload: &str,
        at: i64,
    ) -> Result<Option<InboxRow>, StoreError> {
        // Finding the owner and queueing are one statement; the wake follows in the same
        // transaction.
        let queued = one(
            self.0,
            SQL.resume,
            params![token, payload, at],
            InboxRow::from_sqlite,
        )?;
        if let Some(q) = &queued {
            exec(self.0, SQL.dialect.wake, params![q.run_id, at])?;
        }
        Ok(queued)
    }

    async fn append_events(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
    ) -> Result<bool, StoreError> {
        let n = sql_id(events.len());
        let Some(base) = one(self.0, SQL.append, params![run, n, fence], |r| {
            r.get::<_, i64>(0)
        })?
        else {
            return Ok(false);
        };
        let mut insert = self.0.prepare_cached(SQL.dialect.insert_event)?;
        for (i, seq) in (base + 1..).take(events.len()).enumerate() {
            insert.execute(params![
                run,
                seq,
                events.at[i],
                events.kind[i],
                events.data[i]
            ])?;
        }
        Ok(true)
    }

    async fn release_tokens(
        &mut self,
        run: &str,
        tokens: Option<&[String]>,
        now: i64,
    ) -> Result<(), StoreError> {
        let tokens = tokens.map(|t| to_json(&t, "tokens")).transpose()?;
        exec(self.0, SQL.release_tokens[0], params![run, now, tokens])?;
        exec(self.0, SQL.release_tokens[1], params![run, tokens])?;
        Ok(())
    }

    async fn prune_runs(&mut self, before: i64, now: i64) -> Result<Vec<String>, StoreError> {
        all(self.0, SQL.prune_runs, [before, now], |r| r.get(0))
    }

    async fn prune_records(&mut self, runs: &[String]) -> Result<Vec<u64>, StoreError> {
        let runs = to_json(&runs, "run ids")?;
        let deleted = SQL.prune_records.map(|sql| exec(self.0, sql, [&runs]));
        deleted.into_iter().map(|n| Ok(n? as u64)).collect()
    }

    async fn forget_payloads(&mut self, run: &str, ids: &[i64]) -> Result<(), StoreError> {
        let ids = to_json(&ids, "payload ids")?;
        exec(self.0, SQL.forget_payloads, params![run, ids])?;
        Ok(())
    }

    async fn count_failure(&mut self, run: &str, epoch: i64) -> Result<Option<i64>, StoreError> {
        one(self.0, SQL.count_failure, params![run, epoch], |r| r.get(0))
    }

    async fn block(
        &mut self,
        run: &str,
        epoch: i64,
        error: &str,
        now: i64,
    ) -> Result<Option<i64>, StoreError> {
        one(self.0, SQL.block, params![run, epoch, error, now], |r| {
            r.get(0)
        })
    }

    async fn retry(&mut self, run: &str, now: i64) -> Result<(), StoreError> {
        exec(self.0, SQL.retry, params![run, now])?;
        Ok(())
    }

    async fn retry_at(&mut self, run: &str, at: i64) -> Result<(), StoreError> {
        exec(self.0, SQL.retry_at, params![run, at])?;
        Ok(())
    }

    async fn run_status(&mut self, run: &str) -> Result<Option<String>, StoreError> {
        one(self.0, SQL.run_status, [run], |r| r.get(0))
    }

    async fn append_chunk(
        &mut self,
        run: &str,
        fence: i64,
        chunk: &EncodedChunk,
    ) -> Result<ChunkAppend, StoreError> {
        if !self
            .append_events(run, Some(fence), &EncodedEvents::default())
            .await?
        {
            return Ok(ChunkAppend::LeaseLost);
        }
        let c = chunk;
        let Some(idx) = one(self.0, SQL.append_chunk, [run, &c.stream], |r| r.get(0))? else {
            return Ok(ChunkAppend::Closed);
        };
        let args = params![run, c.stream, idx, c.attempt, c.at, c.value];
        exec(self.0, SQL.dialect.insert_chunk, args)?;
        Ok(ChunkAppend::Appended(idx))
    }

    async fn close_stream(&mut self, run: &str, stream: &str) -> Result<(), StoreError> {
        exec(self.0, SQL.close_stream, [run, stream])?;
        Ok(())
    }

    async fn waiting_queues(
        &mut self,
        now: i64,
        workflows: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let workflows = to_json(&workflows, "workflow names")?;
        all(self.0, SQL.waiting_queues, params![now, workflows], |r| {
            r.get(0)
        })
    }

    async fn lock_queue(&mut self, name: &str) -> Result<Option<QueueLimits>, StoreError> {
        one(self.0, SQL.lock_queue, [name], QueueLimits::from_sqlite)
    }

    async fn queue_counts(&mut self, name: &str, since: i64) -> Result<(i64, i64), StoreError> {
        let counts = one(self.0, SQL.queue_counts, params![name, since], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
        Ok(counts.unwrap_or((0, 0)))
    }

    async fn queue_candidates(
        &mut self,
        name: &str,
        now: i64,
        workflows: &[String],
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        let workflows = to_json(&workflows, "workflow names")?;
        let args = params![name, now, workflows, limit];
        all(self.0, SQL.queue_candidates, args, |r| r.get(0))
    }

    async fn end_run(&mut self, run: &str, end: &EncodedEnd, now: i64) -> Result<(), StoreError> {
        let (status, output, error) = (end.status.as_str(), &end.output, &end.error);
        let parent = one(
            self.0,
            SQL.end_run,
            params![run, status, output, error, now],
            |r| r.get::<_, Option<String>>(0),
        )?
        .flatten();
        if let Some(parent) = parent {
            let notice = end.notice(run);
            exec(
                self.0,
                SQL.dialect.child_notice,
                params![parent, CHILD_NOTICE_TOKEN, notice, now],
            )?;
            exec(self.0, SQL.dialect.wake, params![parent, now])?;
        }
        Ok(())
    }

    async fn lock_inbox_for_end(&mut self, _run: Option<&str>) -> Result<(), StoreError> {
        // The writer's transaction holds the database's one write lock already.
        Ok(())
    }

    async fn children_to_cancel(&mut self, run: &str) -> Result<Vec<String>, StoreError> {
        all(self.0, SQL.children_to_cancel, params![run], |r| r.get(0))
    }
}

/// The value of a policy run on the writer thread, whose statements never wait.
fn now<T>(policy: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    policy.now_or_never().unwrap_or_else(|| {
        Err(StoreError::database(
            "internal error: a SQLite statement did not complete at once",
        ))
    })
}

fn exec(conn: &Connection, sql: &str, args: impl Params) -> Result<usize, StoreError> {
    Ok(conn.prepare_cached(sql)?.execute(args)?)
}

/// The first row `sql` returns, if any.
fn one<T>(
    conn: &Connection,
    sql: &str,
    args: impl Params,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> Result<Option<T>, StoreError> {
    Ok(conn.prepare_cached(sql)?.query_row(args, f).optional()?)
}

/// Every row `sql` returns.
fn all<T>(
    conn: &Connection,
    sql: &str,
    args: impl Params,
    f: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(args, f)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// A row `acquire` leased, or why it cannot even be read, with the run id for the log: such
/// a row is skipped like one that cannot be decoded.
fn leased_row(r: &Row<'_>) -> rusqlite::Result<Result<LeasedRow, (String, StoreError)>> {
    let row = RunRow::from_sqlite(r).and_then(|run| {
        let (epoch, wake_at) = (r.get(14)?, r.get(15)?);
        Ok(LeasedRow {
            run,
            epoch,
            wake_at,
        })
    });
    let id = || r.get(0).unwrap_or_else(|_| "<unreadable id>".to_owned());
    Ok(row.map_err(|e| (id(), e.into())))
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

// ---------------------------------------------------------------------------------------------
// Opening

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
        _ => StoreError::Database(database_error(
            format!("cannot open {}: {e}", path.display()),
            e,
        )),
    }
}

/// Creates or migrates the schema (see [`migrations::migrate`]) inside the caller's
/// transaction: another process opening the file meanwhile waits, then sees it migrated.
fn prepare_schema(tx: &Transaction<'_>, path: &Path) -> Result<(), StoreError> {
    let place = Place {
        shown: path.display().to_string(),
        kind: "file",
        foreign: "is a SQLite database but not a workflow-rs store",
    };
    let mut opening = Opening { tx, path };
    now(migrations::migrate(
        &mut opening,
        MIGRATIONS,
        TABLES,
        &place,
    ))
}

/// The statements of opening a file.
struct Opening<'a> {
    tx: &'a Transaction<'a>,
    path: &'a Path,
}

impl migrations::Schema for Opening<'_> {
    async fn tables(&mut self) -> Result<Vec<String>, StoreError> {
        // The first read of the file: where a file that is no database is found out.
        let tables = self
            .tx
            .prepare(SQL.dialect.tables)
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect());
        tables.map_err(|e| open_error(self.path, e))
    }

    async fn recorded(&mut self) -> Result<i64, StoreError> {
        Ok(self
            .tx
            .query_row(SQL.dialect.migration_version, [], |r| r.get(0))?)
    }

    /// A file from before `workflow_migrations` kept its version in the key-value table
    /// `workflow_meta`, next to the name marking the file as ours.
    async fn legacy(&mut self, tables: &[String]) -> Result<Option<i64>, StoreError> {
        if !tables.iter().any(|t| t == "workflow_meta") {
            return Ok(None);
        }
        let (tx, place) = (self.tx, self.path.display());
        let foreign = "is a SQLite database but not a workflow-rs store";
        let meta = |key: &str| -> Result<Option<Sql>, StoreError> {
            tx.query_row(SQL.dialect.legacy_meta, [key], |row| row.get(0))
                .optional()
                .map_err(|e| {
                    StoreError::Incompatible(format!(
                        "{place} {foreign} (its `workflow_meta` table is not ours: {e})"
                    ))
                })
        };
        match meta("schema")? {
            Some(Sql::Text(s)) if s == "workflow-rs" => {}
            other => {
                return Err(StoreError::Incompatible(format!(
                    "{place} {foreign} (its `workflow_meta` table names schema {other:?})"
                )))
            }
        }
        let version = match meta("version")? {
            Some(Sql::Integer(v)) => Some(v),
            Some(Sql::Text(s)) => s.trim().parse().ok(),
            _ => None,
        };
        let unknown = || {
            StoreError::Incompatible(format!(
                "{place} holds a workflow-rs store with an unknown schema version \
                 (this build reads schema versions 1 to {})",
                MIGRATIONS.last().map_or(0, |m| m.version)
            ))
        };
        version.filter(|v| *v >= 1).map(Some).ok_or_else(unknown)
    }

    async fn execute(&mut self, ddl: &str) -> Result<(), StoreError> {
        Ok(self.tx.execute_batch(&ddl.replace("{schema}", "main"))?)
    }

    async fn record(&mut self, m: &Migration) -> Result<(), StoreError> {
        let args = params![m.version, m.name, sql_time(SystemTime::now())];
        self.tx.execute(SQL.dialect.record_migration, args)?;
        Ok(())
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
    fn finish(self: Box<Self>, commit: Result<(), &DatabaseError>);
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
            Err(StoreError::database(format!(
                "internal error: a store write panicked: {}",
                panic_message(p.as_ref())
            )))
        });
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn finish(self: Box<Self>, commit: Result<(), &DatabaseError>) {
        let answer = match (self.result, commit) {
            // A refused request wrote nothing, so its own answer holds whatever the commit did.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (_, Err(why)) => Err(StoreError::Database(why.clone())),
            (None, Ok(())) => Err(StoreError::database(
                "internal error: a store write was never run",
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
        let commit = outcome.as_ref().map(|_| ());
        for job in batch {
            job.finish(commit);
        }
    }
}

/// One group transaction. Err only when the transaction as a whole did not commit.
fn run_batch(conn: &Connection, batch: &mut [Box<dyn WriteJob>]) -> Result<(), DatabaseError> {
    let failed =
        |e: rusqlite::Error| database_error(format!("the write transaction failed: {e}"), e);
    let tx = begin_immediate(conn).map_err(failed)?;
    for job in batch.iter_mut() {
        tx.prepare_cached("SAVEPOINT request")
            .and_then(|mut s| s.execute([]))
            .map_err(failed)?;
        let ok = job.run(&tx);
        if tx.is_autocommit() {
            // Some errors (disk full, I/O) make SQLite roll back the whole transaction.
            return Err(DatabaseError::new(
                "the write transaction was rolled back by SQLite",
            ));
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

fn thread_gone(which: &str) -> StoreError {
    StoreError::database(format!("the store's {which} thread has stopped"))
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

    use super::super::{from_millis, RunStatus};
    use super::*;
    use crate::testing::store::{
        acquire, ap, conformance_tests, create, lease_one, names, owner, previous_release_is_kept,
        start, step_done, storm, t, within, Damage, Inspect,
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

    /// The migrations a file records, by version and name.
    fn migrations(conn: &Connection) -> Vec<(i64, String)> {
        conn.prepare("SELECT version, name FROM workflow_migrations ORDER BY version")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// What [`migrations`] reads from a file of version `n`.
    fn recorded(n: usize) -> Vec<(i64, String)> {
        MIGRATIONS[..n]
            .iter()
            .map(|m| (m.version, m.name.to_owned()))
            .collect()
    }

    /// The newest schema version this build knows.
    fn newest() -> i64 {
        MIGRATIONS.last().map_or(0, |m| m.version)
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
            let conn = raw(self.path());
            let id = run.to_string();
            conn.execute(
                "INSERT INTO events (run_id, seq, at, kind, data) VALUES (?1, 1, 0, 'x', '{}')",
                [&id],
            )
            .unwrap();
            conn.execute("UPDATE runs SET last_seq = 1 WHERE id = ?1", [&id])
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
        assert_eq!(migrations(&conn), recorded(MIGRATIONS.len()));
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        drop(conn);

        let store = within(SqliteStore::open(&path)).await.unwrap();
        let (synchronous, busy): (i64, i64) = within(store.write(|tx| {
            let pragma = |name: &str| tx.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0));
            Ok((pragma("synchronous")?, pragma("busy_timeout")?))
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
        assert_eq!(migrations(&conn), recorded(MIGRATIONS.len()));
    }

    #[tokio::test]
    async fn acquire_uses_the_ready_index() {
        let (dir, _store) = fresh().await;
        let conn = raw(&dir.path().join("wf.db"));
        let plan: Vec<String> = conn
            .prepare(
                "EXPLAIN QUERY PLAN SELECT id FROM runs
                 WHERE status IN ('pending', 'running', 'blocked')
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
            "INSERT INTO workflow_migrations (version, name, applied_at)
             VALUES (?1, 'from the future', 0)",
            [newest() + 1],
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
        let newest = newest();
        assert!(
            msg.contains(&format!("schema version {}", newest + 1)),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("schema versions up to {newest}")),
            "{msg}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[tokio::test]
    async fn reports_an_unopenable_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = within(SqliteStore::open(dir.path().join("missing/dir/wf.db")))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Database(m) if m.message().contains("cannot open")),
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
        let event = EncodedEvents::new(&[step_done(t(1), 1)]).unwrap();
        conn.execute(
            "INSERT INTO events (run_id, seq, at, kind, data) VALUES (?1, 1, ?2, ?3, ?4)",
            params![old.to_string(), event.at[0], event.kind[0], event.data[0]],
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

        assert_eq!(migrations(&raw(&path)), recorded(MIGRATIONS.len()));
        // Reopening a migrated file migrates nothing.
        let store = within(SqliteStore::open(&path)).await.unwrap();
        assert_eq!(within(owner(&store, "fresh")).await, Some(new));
        assert_eq!(within(owner(&store, "migrated")).await, Some(old));
    }

    /// The version 2 file format, key-value bookkeeping in `workflow_meta` included, as the
    /// release before `workflow_migrations` wrote it (do not edit).
    const V2_DDL: &str = "
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
        ALTER TABLE runs ADD COLUMN hook_token TEXT;
        CREATE TABLE hooks (
            token TEXT PRIMARY KEY NOT NULL, run_id TEXT NOT NULL, created_at INTEGER NOT NULL,
            active INTEGER NOT NULL, retain_until INTEGER
        );
        CREATE INDEX hooks_run ON hooks (run_id);
        CREATE TABLE hook_inbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, token TEXT NOT NULL,
            payload TEXT NOT NULL, at INTEGER NOT NULL
        );
        CREATE INDEX hook_inbox_run ON hook_inbox (run_id, id);
        INSERT INTO workflow_meta (key, value) VALUES ('schema', 'workflow-rs'), ('version', 2);
    ";

    /// A file of the previous layout (version 2, `workflow_meta`) opens: its bookkeeping
    /// becomes `workflow_migrations` rows, and its runs, events, hooks and payloads are kept,
    /// with each run's events numbered on from its last.
    #[tokio::test]
    async fn migrates_a_version_2_file_to_the_migrations_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v2.db");
        let (done, live) = (RunId::new(), RunId::new());
        let conn = raw(&path);
        conn.execute_batch(V2_DDL).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        let event = EncodedEvents::new(&[step_done(t(1), 1), step_done(t(2), 2)]).unwrap();
        for (run, status) in [(done, "completed"), (live, "running")] {
            conn.execute(
                "INSERT INTO runs (id, workflow, status, input, output, created_at, updated_at,
                                   wake_at, epoch, lease_until, hook_token)
                 VALUES (?1, 'orders', ?2, '[1]', '7', ?3, ?3, ?3, 1, NULL, 'tok-' || ?2)",
                params![run.to_string(), status, sql_time(t(0))],
            )
            .unwrap();
            for i in 0..2 {
                conn.execute(
                    "INSERT INTO events (run_id, seq, at, kind, data) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![
                        run.to_string(),
                        i + 1,
                        event.at[i],
                        event.kind[i],
                        event.data[i]
                    ],
                )
                .unwrap();
            }
        }
        conn.execute(
            "INSERT INTO hooks (token, run_id, created_at, active) VALUES ('tok-running', ?1, 0, 1)",
            [live.to_string()],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO hook_inbox (run_id, token, payload, at)
             VALUES (?1, 'tok-running', '\"early\"', 0)",
            [live.to_string()],
        )
        .unwrap();
        drop(conn);

        let store = within(SqliteStore::open(&path)).await.unwrap();
        let conn = raw(&path);
        assert_eq!(migrations(&conn), recorded(MIGRATIONS.len()));
        let meta: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name = 'workflow_meta'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(meta, 0, "the old bookkeeping is gone");
        drop(conn);

        let lease = previous_release_is_kept(&store, done, live).await;
        assert_eq!(lease.epoch, 2);
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
                "queues",
                "runs",
                "runs_parent",
                "runs_queue_begun",
                "runs_queue_holding",
                "runs_queue_keyed",
                "runs_queue_waiting",
                "runs_ready",
                "stream_chunks",
                "streams",
                "workflow_migrations"
            ]
        );
        let has_token: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info('runs') WHERE name = 'hook_token'")
            .unwrap()
            .exists([])
            .unwrap();
        assert!(has_token);
        let has_last_seq: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info('runs') WHERE name = 'last_seq'")
            .unwrap()
            .exists([])
            .unwrap();
        assert!(has_last_seq);
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
                            &ap(vec![step_done(t(2_000), 1), step_done(t(2_001), 2)], None),
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
                        .append(&lease, &ap(vec![step_done(t(200), 1)], None))
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
            matches!(&result, Err(StoreError::Database(m)) if m.message().contains("boom")),
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

    #[tokio::test]
    async fn a_database_error_keeps_rusqlite_s_error_as_its_source() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        let err = within(SqliteStore::open(dir.path().join("missing/dir/wf.db")))
            .await
            .unwrap_err();
        let source = err.source().expect("a source");
        assert!(
            source.downcast_ref::<rusqlite::Error>().is_some(),
            "{source:?}"
        );
        assert!(err.to_string().ends_with(&source.to_string()), "{err}");
        assert!(!err.is_transient());
        // Converted to a step's error, the message names the cause once.
        let cause = source.to_string();
        let step = crate::Error::from(err);
        assert_eq!(step.message().matches(&cause).count(), 1);
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
