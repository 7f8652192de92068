//! The schema of a PostgreSQL store: the DDL of each migration, the tables each version must
//! have, and the connect-time work around them (checking the schema's name, quoting it, naming
//! the connections, creating or migrating the tables under an advisory lock). It runs no
//! statement of the store's operations and knows nothing of runs, leases or notices.

use std::time::SystemTime;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, Executor, PgConnection};

use super::with_source;
use crate::error::StoreError;
use crate::ids::stable_hash;
use crate::store::sql::migrations::{self, Migration, Others, Place};
use crate::store::sql::sql_time;

/// The schema's history, applied in order on connect. `{schema}` stands for the quoted
/// schema name.
pub(super) const MIGRATIONS: &[Migration] = &[
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
    MIGRATION_7,
    MIGRATION_8,
    MIGRATION_9,
    MIGRATION_10,
    MIGRATION_CHAINS,
    MIGRATION_TRACES,
    MIGRATION_TICK_INDEXES,
];

/// Chains of runs (see SQLite's migration of the same name).
const MIGRATION_CHAINS: Migration = Migration {
    version: 11,
    name: "chains of runs: continue-as-new",
    ddl: r#"
ALTER TABLE {schema}.runs DROP CONSTRAINT runs_status_check;
ALTER TABLE {schema}.runs
    ADD CONSTRAINT runs_status_check CHECK (status IN
        ('pending', 'running', 'completed', 'failed', 'cancelled', 'blocked', 'continued_as_new')),
    ADD COLUMN previous_run TEXT COLLATE "C",
    ADD COLUMN next_run TEXT COLLATE "C",
    ADD COLUMN origin TEXT COLLATE "C";
ALTER TABLE {schema}.hooks ADD COLUMN inherited BOOLEAN NOT NULL DEFAULT FALSE;
"#,
};

/// Each run's trace context (see SQLite's migration of the same name; PostgreSQL's `acquire`
/// reads the lease it replaces in the same statement, so it needs no column for takeovers).
const MIGRATION_TRACES: Migration = Migration {
    version: 12,
    name: "each run's trace context",
    ddl: r#"
ALTER TABLE {schema}.runs ADD COLUMN trace_context TEXT;   -- NULL: started in no trace
"#,
};

/// Indexes of each schedule's started and buffered ticks (see SQLite's migration of the same
/// name).
const MIGRATION_TICK_INDEXES: Migration = Migration {
    version: 13,
    name: "indexes of each schedule's started and buffered ticks",
    ddl: r#"
CREATE INDEX schedule_ticks_started ON {schema}.schedule_ticks (schedule, nominal)
    WHERE outcome = 'started' AND NOT backfill;
CREATE INDEX schedule_ticks_buffered ON {schema}.schedule_ticks (schedule, nominal)
    WHERE outcome = 'buffered';
"#,
};

/// Delayed starts and run versions (see SQLite's migration of the same name).
const MIGRATION_8: Migration = Migration {
    version: 8,
    name: "each run's start time (delayed starts) and the version of the build that started it",
    ddl: r#"
ALTER TABLE {schema}.runs
    ADD COLUMN start_at BIGINT,   -- NULL: from admission on
    ADD COLUMN version TEXT;      -- NULL: the build named none
"#,
};

/// Messages sent to runs by id (see SQLite's migration of the same name).
const MIGRATION_9: Migration = Migration {
    version: 9,
    name: "messages to runs (the topic of an inbox row, idempotency keys); values runs publish",
    ddl: r#"
ALTER TABLE {schema}.hook_inbox ADD COLUMN topic TEXT;
CREATE TABLE {schema}.message_keys (
    run_id     TEXT COLLATE "C" NOT NULL,
    key        TEXT NOT NULL,
    payload_id BIGINT NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE {schema}.run_events (
    run_id TEXT COLLATE "C" NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    at     BIGINT NOT NULL,
    PRIMARY KEY (run_id, key)
);
"#,
};

/// Requests to runs and their replies (see SQLite's migration of the same name).
const MIGRATION_10: Migration = Migration {
    version: 10,
    name: "requests to runs and their replies",
    ddl: r#"
CREATE TABLE {schema}.run_requests (
    run_id     TEXT COLLATE "C" NOT NULL,
    id         BIGINT NOT NULL,
    name       TEXT NOT NULL,
    key        TEXT,
    at         BIGINT NOT NULL,
    reply      TEXT,
    replied_at BIGINT,
    PRIMARY KEY (run_id, id)
);
CREATE UNIQUE INDEX run_requests_key ON {schema}.run_requests (run_id, key)
    WHERE key IS NOT NULL;
"#,
};

/// Schedules and the records of their ticks (see SQLite's migration of the same name).
const MIGRATION_7: Migration = Migration {
    version: 7,
    name: "schedules and the records of their ticks",
    ddl: r#"
CREATE TABLE {schema}.schedules (
    name       TEXT COLLATE "C" PRIMARY KEY,
    def        TEXT NOT NULL,
    paused     BOOLEAN NOT NULL DEFAULT FALSE,
    next_at    BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE TABLE {schema}.schedule_ticks (
    schedule    TEXT COLLATE "C" NOT NULL,
    nominal     BIGINT NOT NULL,
    outcome     TEXT NOT NULL,
    run_id      TEXT COLLATE "C",
    backfill    BOOLEAN NOT NULL DEFAULT FALSE,
    recorded_at BIGINT NOT NULL,
    PRIMARY KEY (schedule, nominal)
);
"#,
};
/// The tables each version must have (from the version that created them on).
pub(super) const TABLES: &[(&str, i64)] = &[
    ("runs", 1),
    ("events", 1),
    ("hooks", 1),
    ("hook_inbox", 1),
    ("streams", 6),
    ("stream_chunks", 6),
    ("queues", 5),
    ("schedules", 7),
    ("schedule_ticks", 7),
    ("message_keys", 8),
    ("run_events", 8),
    ("run_requests", 10),
];

pub(super) const MIGRATION_1: &str = r#"
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
pub(super) const MIGRATION_2: &str = r#"
ALTER TABLE {schema}.runs ADD COLUMN last_seq BIGINT NOT NULL DEFAULT 0;
UPDATE {schema}.runs AS r SET last_seq = e.seq
FROM (SELECT run_id, MAX(seq) AS seq FROM {schema}.events GROUP BY run_id) AS e
WHERE e.run_id = r.id;
-- Room on each page for the appends' row updates to stay heap-only (no index writes).
ALTER TABLE {schema}.runs SET (fillfactor = 80);
"#;

/// Poison runs end: a run counts the tries at it that failed in a row. A run whose
/// replay diverged is `blocked` and counts its blocks for its backoff; it is
/// acquirable when due, so the ready index takes it in.
pub(super) const MIGRATION_3: &str = r#"
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

/// Child runs: a run started with `start_child` names its parent, and whether a
/// cancellation of the parent reaches it.
pub(super) const MIGRATION_4: &str = r#"
ALTER TABLE {schema}.runs
    ADD COLUMN parent_id TEXT COLLATE "C",  -- NULL: started from outside a workflow
    ADD COLUMN detached BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX runs_parent ON {schema}.runs (parent_id) WHERE parent_id IS NOT NULL;
"#;

/// Streams from runs: a row per stream holds its length, which is the index the
/// next chunk gets (drawn by the append's upsert, under the row's lock), and whether it is
/// closed; a row per chunk.
pub(super) const MIGRATION_6: &str = r#"
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

/// Flow control: the queues every process enforces, and where each run stands in
/// its queue. A queued run holds a slot from its first lease (`began_at`) until it ends. An
/// acquirer locks a queue's row while it begins runs of the queue, so acquirers in every
/// process take turns per queue.
pub(super) const MIGRATION_5: &str = r#"
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

/// Serializes migrations of one schema; released at commit. (`resume_hook` takes the same
/// kind of lock on its own key inside its statement.)
pub(super) const XACT_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// Accepts what is safe to spell inside double quotes and to use as a channel name.
pub(super) fn check_schema_name(schema: &str) -> Result<(), StoreError> {
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
pub(super) fn application_name(schema: &str) -> String {
    format!("workflow-rs {schema}")
}

/// The identifier in double quotes; callers have checked it contains none.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Where `options` point, for messages: user, host, port and database; no password.
pub(super) fn describe_target(options: &PgConnectOptions) -> String {
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
pub(super) fn lock_key(what: &str, schema: &str) -> i64 {
    let key = format!("workflow-rs:{what}:{schema}");
    stable_hash(key.as_bytes()) as i64
}

/// Creates or migrates the schema (see [`migrations::migrate`]) in one transaction that holds
/// an advisory lock keyed by the schema: processes connecting at once take turns, and each
/// later one finds the work done.
pub(super) async fn migrate(
    conn: &mut PgConnection,
    schema: &str,
    target: &str,
) -> Result<(), StoreError> {
    let place = Place {
        shown: format!("schema `{schema}` at {target}"),
        kind: "schema",
        foreign: "is not a workflow-rs store",
        others: Others::Refused { hint: "" },
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
pub(super) struct Migrating<'a> {
    pub(super) conn: &'a mut PgConnection,
    pub(super) schema: &'a str,
    pub(super) quoted: String,
    /// Whether `CREATE SCHEMA` ran: only a store that needs migrating needs that right.
    pub(super) created: bool,
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
        // general, https://github.com/launchbadge/sqlx/issues/3150.)
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
