//! The file's schema: the DDL of each version, the migrations that apply them on open, and
//! the checks that reject a file which is not ours (or is newer) before anything is written
//! to it. It runs on the writer's connection inside the opening transaction; it must not
//! hold the statements of the capabilities (those are in `statements.rs`).

use std::path::Path;
use std::time::SystemTime;

use rusqlite::types::Value as Sql;
use rusqlite::{params, ErrorCode, OptionalExtension, Transaction};

use super::database_error;
use super::statements::SQL;
use super::tx::now;
use crate::error::StoreError;
use crate::store::sql::migrations::{self, Migration, Others, Place};
use crate::store::sql::sql_time;

/// The file format's history, applied on open in the transaction that checks the file.
pub(super) const MIGRATIONS: &[Migration] = &[
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
    MIGRATION_8,
    MIGRATION_9,
    MIGRATION_10,
    MIGRATION_11,
    MIGRATION_CHAINS,
    MIGRATION_TRACES,
    MIGRATION_TICK_INDEXES,
    MIGRATION_LIVE_PREDICATE,
    MIGRATION_NUMBERED_FROM_EVENTS,
    MIGRATION_HELD_SLOTS,
    MIGRATION_HELD_WITHOUT_TRIGGERS,
];

/// Chains of runs (`continue_as_new`): a run names the run it continues and the run that
/// continues it, and the chain's first run (`origin`, NULL for a first run), which is the
/// id a parent awaits and a child's end names.
const MIGRATION_CHAINS: Migration = Migration {
    version: 12,
    name: "chains of runs: continue-as-new",
    ddl: "
ALTER TABLE runs ADD COLUMN previous_run TEXT;
ALTER TABLE runs ADD COLUMN next_run TEXT;
ALTER TABLE runs ADD COLUMN origin TEXT;
-- 1 while the run that continued a chain owns a token it inherited and has not claimed.
ALTER TABLE hooks ADD COLUMN inherited INTEGER NOT NULL DEFAULT 0;
",
};

/// Traces and takeovers: each run keeps the W3C trace context it was started in (feature
/// `otel`; plain text, it holds no user data), and `acquire` notes whether the lease it
/// replaced had expired while set (a takeover), for its RETURNING to read: SQLite's RETURNING
/// sees only the updated row.
const MIGRATION_TRACES: Migration = Migration {
    version: 13,
    name: "each run's trace context; whether its current lease took over an expired one",
    ddl: "
ALTER TABLE runs ADD COLUMN trace_context TEXT;                 -- NULL: started in no trace
ALTER TABLE runs ADD COLUMN took_over INTEGER NOT NULL DEFAULT 0; -- set by each acquire
",
};

/// What listing the schedules reads of their ticks, found without reading the ticks: each
/// schedule's latest started tick and its earliest buffered one. Without these, every look of
/// a firing loop read every kept tick of every schedule (up to 1,000 each).
const MIGRATION_TICK_INDEXES: Migration = Migration {
    version: 14,
    name: "indexes of each schedule's started and buffered ticks",
    ddl: "
CREATE INDEX schedule_ticks_started ON schedule_ticks (schedule, nominal)
    WHERE outcome = 'started' AND backfill = 0;
CREATE INDEX schedule_ticks_buffered ON schedule_ticks (schedule, nominal)
    WHERE outcome = 'buffered';
",
};

/// The live runs' indexes say "live" as `(status IN ('pending', 'running') OR status =
/// 'blocked')`: SQLite codes an IN list of three or more constants as a temporary b-tree,
/// built again each time an UPDATE evaluates the index's predicate for a run's old and new
/// row (a run's status change evaluated eight), where two constants and an OR are compared
/// in place. The queries that use these indexes repeat the new term word for word.
const MIGRATION_LIVE_PREDICATE: Migration = Migration {
    version: 15,
    name: "the live runs' indexes test the status without a temporary b-tree",
    ddl: "
DROP INDEX runs_ready;
CREATE INDEX runs_ready ON runs (wake_at, id)
    WHERE (status IN ('pending', 'running') OR status = 'blocked');
DROP INDEX runs_queue_waiting;
CREATE INDEX runs_queue_waiting ON runs (queue, priority DESC, created_at, id)
    WHERE queue IS NOT NULL AND began_at IS NULL
      AND (status IN ('pending', 'running') OR status = 'blocked');
DROP INDEX runs_queue_keyed;
CREATE INDEX runs_queue_keyed ON runs (queue, partition_key, created_at, id)
    WHERE queue IS NOT NULL AND partition_key IS NOT NULL AND began_at IS NULL
      AND (status IN ('pending', 'running') OR status = 'blocked');
DROP INDEX runs_queue_holding;
CREATE INDEX runs_queue_holding ON runs (queue, partition_key)
    WHERE queue IS NOT NULL AND began_at IS NOT NULL
      AND (status IN ('pending', 'running') OR status = 'blocked');
",
};

/// Events are numbered from the run's last event (found at the end of its primary key), not
/// from a count kept in the run's row: with the count, every append also wrote the run's row,
/// one more page in each step's commit (a third of a sequential step's WAL frames).
const MIGRATION_NUMBERED_FROM_EVENTS: Migration = Migration {
    version: 16,
    name: "events numbered from the run's last event; runs.last_seq dropped",
    ddl: "
ALTER TABLE runs DROP COLUMN last_seq;
",
};

/// Each queue keeps the number of slots its runs hold (`queues.held`), kept (until version
/// 18) by triggers on `runs` in the statement that changes a run's hold (its begin, its end,
/// its deletion),
/// whichever path writes it: a queued admission and an acquire read one row instead of
/// counting the queue's holding runs (up to its concurrency) in the writer's transaction.
/// The status is tested with two constants and an OR, as the live indexes' predicates are
/// (see version 15).
const MIGRATION_HELD_SLOTS: Migration = Migration {
    version: 17,
    name: "each queue keeps the number of slots its runs hold",
    ddl: "
ALTER TABLE queues ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
UPDATE queues SET held = (
    SELECT COUNT(*) FROM runs INDEXED BY runs_queue_holding
    WHERE queue = queues.name AND began_at IS NOT NULL
      AND (status IN ('pending', 'running') OR status = 'blocked'));
CREATE TRIGGER runs_hold_inserted AFTER INSERT ON runs
WHEN NEW.queue IS NOT NULL AND NEW.began_at IS NOT NULL
  AND (NEW.status IN ('pending', 'running') OR NEW.status = 'blocked')
BEGIN
    UPDATE queues SET held = held + 1 WHERE name = NEW.queue;
END;
CREATE TRIGGER runs_hold_updated AFTER UPDATE OF status, began_at, queue ON runs
WHEN (OLD.queue IS NOT NULL OR NEW.queue IS NOT NULL)
  AND (OLD.queue IS NOT NEW.queue
       OR (OLD.began_at IS NOT NULL
           AND (OLD.status IN ('pending', 'running') OR OLD.status = 'blocked'))
          IS NOT (NEW.began_at IS NOT NULL
                  AND (NEW.status IN ('pending', 'running') OR NEW.status = 'blocked')))
BEGIN
    UPDATE queues SET held = held - 1
    WHERE name = OLD.queue AND OLD.began_at IS NOT NULL
      AND (OLD.status IN ('pending', 'running') OR OLD.status = 'blocked');
    UPDATE queues SET held = held + 1
    WHERE name = NEW.queue AND NEW.began_at IS NOT NULL
      AND (NEW.status IN ('pending', 'running') OR NEW.status = 'blocked');
END;
CREATE TRIGGER runs_hold_deleted AFTER DELETE ON runs
WHEN OLD.queue IS NOT NULL AND OLD.began_at IS NOT NULL
  AND (OLD.status IN ('pending', 'running') OR OLD.status = 'blocked')
BEGIN
    UPDATE queues SET held = held - 1 WHERE name = OLD.queue;
END;
",
};

/// `queues.held` kept by the statements that begin and end queued runs (`held_add`, see
/// `statements.rs`) instead of version 17's triggers, whose sub-program ran on every insert
/// and status change of `runs`, queued or not (about 0.8 us each, a few percent of a
/// one-step run's writer time). The held slots are counted again.
const MIGRATION_HELD_WITHOUT_TRIGGERS: Migration = Migration {
    version: 18,
    name: "each queue's held slots kept by the statements that begin and end its runs",
    ddl: "
DROP TRIGGER IF EXISTS runs_hold_inserted;
DROP TRIGGER IF EXISTS runs_hold_updated;
DROP TRIGGER IF EXISTS runs_hold_deleted;
UPDATE queues SET held = (
    SELECT COUNT(*) FROM runs INDEXED BY runs_queue_holding
    WHERE queue = queues.name AND began_at IS NOT NULL
      AND (status IN ('pending', 'running') OR status = 'blocked'));
",
};

/// Delayed starts and run versions: a run started with `.delay(d)` or `.start_at(t)` keeps
/// its start (its wake time is set to it at admission), and every run the version of the
/// build that started it.
const MIGRATION_9: Migration = Migration {
    version: 9,
    name: "each run's start time (delayed starts) and the version of the build that started it",
    ddl: "
ALTER TABLE runs ADD COLUMN start_at INTEGER;  -- NULL: from admission on
ALTER TABLE runs ADD COLUMN version TEXT;      -- NULL: the build named none
",
};

/// Messages sent to runs by id (`run.send`): an inbox row under the message token carries its
/// topic; a message's idempotency key is a row whose primary key lets one message per run and
/// key in, kept after the message was delivered (and its inbox row deleted), until the run is
/// pruned.
const MIGRATION_10: Migration = Migration {
    version: 10,
    name: "messages to runs (the topic of an inbox row, idempotency keys); values runs publish",
    ddl: "
ALTER TABLE hook_inbox ADD COLUMN topic TEXT;  -- a message's topic; NULL for other rows
CREATE TABLE message_keys (
    run_id     TEXT NOT NULL,
    key        TEXT NOT NULL,
    payload_id INTEGER NOT NULL,   -- the message's inbox id
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
-- The latest value of each key a run published (`set_event`), set with the append that
-- records it.
CREATE TABLE run_events (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,          -- JSON
    at     INTEGER NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
",
};

/// Requests to runs (`run.request`): the request itself is an inbox row under the request
/// token (its name in `topic`); its row here keeps its idempotency key (one request per run
/// and key) and the workflow's reply, written by the append that records it, until the run is
/// pruned.
const MIGRATION_11: Migration = Migration {
    version: 11,
    name: "requests to runs and their replies",
    ddl: "
CREATE TABLE run_requests (
    run_id     TEXT NOT NULL,
    id         INTEGER NOT NULL,   -- the request's inbox id
    name       TEXT NOT NULL,
    key        TEXT,               -- its idempotency key
    at         INTEGER NOT NULL,
    reply      TEXT,               -- JSON of the reply (Ok or Err), once recorded
    replied_at INTEGER,
    PRIMARY KEY (run_id, id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX run_requests_key ON run_requests (run_id, key) WHERE key IS NOT NULL;
",
};

/// Schedules: a row per schedule (its definition as JSON, whether it is paused, the next
/// nominal time its ticks have not been recorded for), and a row per recorded tick, whose
/// primary key lets one firing of a tick win.
const MIGRATION_8: Migration = Migration {
    version: 8,
    name: "schedules and the records of their ticks",
    ddl: "
CREATE TABLE schedules (
    name       TEXT PRIMARY KEY NOT NULL,
    def        TEXT NOT NULL,          -- JSON of ScheduleDef
    paused     INTEGER NOT NULL DEFAULT 0,
    next_at    INTEGER,                -- NULL: it never ticks again
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE schedule_ticks (
    schedule    TEXT NOT NULL,
    nominal     INTEGER NOT NULL,
    outcome     TEXT NOT NULL,         -- TickOutcome::as_str
    run_id      TEXT,                  -- the run it started
    backfill    INTEGER NOT NULL DEFAULT 0,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (schedule, nominal)
) WITHOUT ROWID;
",
};
/// The tables each version must have (from the version that created them on), checked
/// before migrating so a damaged file is reported, not half-migrated.
pub(super) const TABLES: &[(&str, i64)] = &[
    ("runs", 1),
    ("events", 1),
    ("hooks", 2),
    ("hook_inbox", 2),
    ("streams", 7),
    ("stream_chunks", 7),
    ("queues", 6),
    ("schedules", 8),
    ("schedule_ticks", 8),
    ("message_keys", 9),
    ("run_events", 9),
    ("run_requests", 11),
];

pub(super) const SCHEMA_V1: &str = "
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

pub(super) const SCHEMA_V2: &str = "
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
pub(super) const SCHEMA_V3: &str = "
ALTER TABLE runs ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET last_seq = (SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = runs.id);
DROP TABLE workflow_meta;
";

/// Failures and blocks: a run counts the tries at it that failed in a row, and ends as failed
/// after too many. A run whose replay diverged from its history is `blocked` and counts its
/// blocks for its backoff; it is acquirable when due, so the ready index takes it in.
pub(super) const SCHEMA_V4: &str = "
ALTER TABLE runs ADD COLUMN failed_tries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN blocked_tries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN deadline INTEGER;  -- NULL: none (`start(..).timeout(d)`)
DROP INDEX runs_ready;
CREATE INDEX runs_ready ON runs (wake_at, id) WHERE status IN ('pending', 'running', 'blocked');
";

/// Child runs, started by a workflow: a run started with `start_child` names its parent, and
/// whether a cancellation of the parent reaches it.
pub(super) const SCHEMA_V5: &str = "
ALTER TABLE runs ADD COLUMN parent_id TEXT;  -- NULL: started from outside a workflow
ALTER TABLE runs ADD COLUMN detached INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_parent ON runs (parent_id) WHERE parent_id IS NOT NULL;
";

/// Streams from runs, the values a step writes for readers outside the run: a row per stream
/// holds its length, which is the index the next chunk gets (drawn by the append's upsert),
/// and whether it is closed; a row per chunk.
pub(super) const SCHEMA_V7: &str = "
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

/// Flow control, concurrency and rate limits per queue: the queues every process enforces, and
/// where each run stands in its queue. A queued run holds a slot from its first lease
/// (`began_at`) until it ends.
pub(super) const SCHEMA_V6: &str = "
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

pub(super) fn open_error(path: &Path, e: rusqlite::Error) -> StoreError {
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
/// `shared`: the store may be created beside the application's own tables.
pub(super) fn prepare_schema(
    tx: &Transaction<'_>,
    path: &Path,
    shared: bool,
) -> Result<(), StoreError> {
    let others = match shared {
        true => Others::Kept,
        false => Others::Refused {
            hint: ", or open it with `SqliteStore::open_shared` \
                   (`RuntimeBuilder::sqlite_shared`) to keep the store's tables beside yours",
        },
    };
    let place = Place {
        shown: path.display().to_string(),
        kind: "file",
        foreign: "is a SQLite database but not a workflow-rs store",
        others,
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
pub(super) struct Opening<'a> {
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
