//! The SQLite store's own tests: the conformance suite on a file, and what only a file shows
//! (opening, migrations, the write-ahead log, group commit and the threads).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection};
use serde_json::json;

use super::schema::MIGRATIONS;
use super::statements::SQL;
use super::writer::WAL_FRAMES;
use super::*;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::sql::{sql_time, EncodedEvents};
use crate::store::{
    from_millis, AdminStore, Admission, ClaimOutcome, EventRecord, HookStore, RunFilter, RunStatus,
    RunStore,
};
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
    }

    async fn rewrite_inbox(&self, run: RunId, json: &str) {
        raw(self.path())
            .execute(
                "UPDATE hook_inbox SET payload = ?2 WHERE run_id = ?1",
                [run.to_string(), json.to_owned()],
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

/// Column `col` of what `EXPLAIN [QUERY PLAN]` (`how`) says of `sql`, its parameters NULL.
fn explain(conn: &Connection, how: &str, sql: &str, col: usize) -> Vec<String> {
    let mut stmt = conn
        .prepare(&format!("{how} {sql}"))
        .unwrap_or_else(|e| panic!("cannot explain {sql}: {e}"));
    let nulls = std::iter::repeat_n(rusqlite::types::Null, stmt.parameter_count());
    stmt.query_map(rusqlite::params_from_iter(nulls), |r| {
        r.get::<_, String>(col)
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// The plan SQLite makes for `sql` on the store's own file, one line per step.
fn plan_of(conn: &Connection, sql: &str) -> String {
    explain(conn, "EXPLAIN QUERY PLAN", sql, 3).join("\n")
}

/// A partial index serves a query only when the query's WHERE repeats the index's predicate
/// word for word; a statement that drifted from it scans every run ever kept, silently. Each
/// statement that walks the live runs is planned here on the store's own statements and
/// schema.
#[tokio::test]
async fn the_statements_over_live_runs_use_their_partial_indexes() {
    let (dir, _store) = fresh().await;
    let conn = raw(&dir.path().join("wf.db"));
    let uses = |plan: &str, index: &str| {
        plan.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.windows(2).any(|w| w == ["INDEX", index])
        })
    };
    // A step that reads a table without any index: for `runs` (under any alias) every run
    // ever kept. The queues' rows and JSON arguments may be scanned.
    let full_scan = |l: &str| {
        let l = l.trim_start();
        l.starts_with("SCAN ")
            && !l.contains(" USING ")
            && !l.contains("VIRTUAL TABLE")
            && !l.starts_with("SCAN q ")
            && l != "SCAN q"
            && !l.starts_with("SCAN queues")
            && !l.starts_with("SCAN CONSTANT ROW")
    };
    let cases: [(&str, &str, &[&str]); 7] = [
        ("acquire", SQL.acquire, &["runs_ready"]),
        (
            "waiting_queues",
            SQL.waiting_queues,
            &["runs_queue_waiting"],
        ),
        (
            "queue_candidates",
            SQL.queue_candidates,
            &[
                "runs_queue_waiting",
                "runs_queue_keyed",
                "runs_queue_holding",
            ],
        ),
        (
            "list_queues",
            SQL.list_queues,
            &["runs_queue_waiting", "runs_queue_holding"],
        ),
        ("queue_opening", SQL.queue_opening, &["runs_queue_waiting"]),
        ("queue_counts", SQL.queue_counts, &[]),
        (
            "may_begin",
            SQL.dialect.may_begin,
            &["runs_queue_waiting", "runs_queue_holding"],
        ),
    ];
    for (name, sql, indexes) in cases {
        let plan = plan_of(&conn, sql);
        for index in indexes {
            assert!(uses(&plan, index), "{name} does not use {index}:\n{plan}");
        }
        assert!(
            !plan.lines().any(full_scan),
            "{name} scans a table of runs:\n{plan}"
        );
    }
    let acquire = plan_of(&conn, SQL.acquire);
    assert!(!acquire.contains("TEMP B-TREE FOR ORDER BY"), "{acquire}");
}

/// Each queue's `held` (kept by the statements that begin and end queued runs) and the runs
/// holding a slot of it, counted: `(queue, held, counted)`.
fn held_and_holding(path: &Path) -> Vec<(String, i64, i64)> {
    raw(path)
        .prepare(
            "SELECT q.name, q.held,
                    (SELECT COUNT(*) FROM runs
                     WHERE queue = q.name AND began_at IS NOT NULL
                       AND status IN ('pending', 'running', 'blocked'))
             FROM queues q ORDER BY q.name",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn assert_held_is_counted(path: &Path) {
    let rows = held_and_holding(path);
    assert!(!rows.is_empty());
    for (queue, held, counted) in rows {
        assert_eq!(
            held, counted,
            "queue {queue}: held slots against holding runs"
        );
    }
}

/// Every queue's held slots stay equal to its holding runs through the queue contract's
/// begins and ends, and the migration to version 18 counts the slots of a file that had runs
/// holding them.
#[tokio::test]
async fn each_queue_s_held_slots_are_its_runs_holding_one() {
    use crate::testing::store as c;
    // Each case on a fresh file, its counts checked after it.
    macro_rules! counted_after {
        ($($case:ident),* $(,)?) => {$(
            let (dir, store) = fresh().await;
            c::$case(&store).await;
            assert_held_is_counted(&dir.path().join("wf.db"));
        )*};
    }
    counted_after!(
        a_queue_s_concurrency_counts_runs_begun_and_not_ended,
        a_queue_s_slots_follow_every_begin_and_end,
        a_continued_run_keeps_its_queue_slot,
        a_waiting_run_past_its_deadline_is_handed_out_without_a_slot,
        whether_a_run_waits_for_a_slot_is_known,
        a_partition_key_runs_one_at_a_time_in_start_order,
        a_queue_s_rate_window_counts_begins,
    );
    let (dir, store) = fresh().await;
    let path = dir.path().join("wf.db");
    c::a_queued_run_begins_at_admission_only_with_room_and_nobody_waiting(&store).await;
    assert_held_is_counted(&path);
    let holding: i64 = held_and_holding(&path).iter().map(|r| r.2).sum();
    assert!(holding > 0, "some runs hold slots");

    // A file of version 17 whose count went wrong, with those runs holding their slots.
    drop(store);
    let conn = raw(&path);
    conn.execute_batch(
        "UPDATE queues SET held = held + 7;
         DELETE FROM workflow_migrations WHERE version = 18;",
    )
    .unwrap();
    drop(conn);
    let store = within(SqliteStore::open(&path)).await.unwrap();
    assert_eq!(migrations(&raw(&path)), recorded(MIGRATIONS.len()));
    assert_held_is_counted(&path);
    drop(store);
}

/// What the migration to version 15 is for: a run's status change, which evaluates every
/// live index's predicate for the old and the new row, builds no temporary b-tree; nor does
/// a queued admission's insert.
#[tokio::test]
async fn a_status_change_or_a_queued_admission_builds_no_temporary_b_tree() {
    let (dir, _store) = fresh().await;
    let conn = raw(&dir.path().join("wf.db"));
    // How many temporary b-trees `sql`'s program opens, and the program.
    let ephemeral = |sql: &str| {
        let program = explain(&conn, "EXPLAIN", sql, 1);
        let n = program.iter().filter(|op| *op == "OpenEphemeral").count();
        (n, program)
    };
    let (n, program) = ephemeral(SQL.end_run);
    // One for RETURNING, which SQLite buffers; none for the indexes' predicates.
    assert!(n <= 1, "{n} OpenEphemeral in end_run:\n{program:?}");
    for (name, sql) in [
        ("append_end", SQL.dialect.append_end),
        ("insert_begun", SQL.dialect.insert_begun),
    ] {
        let (n, program) = ephemeral(sql);
        assert_eq!(n, 0, "{name}:\n{program:?}");
    }
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
        msg.contains(
            "is a SQLite database but not a workflow-rs store (it has tables `orders`, `users`)"
        ),
        "{msg}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[tokio::test]
async fn a_shared_open_creates_the_store_beside_the_application_s_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    raw(&path)
        .execute_batch(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
             CREATE INDEX accounts_by_balance ON accounts (balance);
             INSERT INTO accounts VALUES ('ada', 100);",
        )
        .unwrap();
    let err = within(SqliteStore::open(&path)).await.unwrap_err();
    assert!(
        err.to_string().contains(
            "(it has tables `accounts`); give the store a file of its own, or open it with \
             `SqliteStore::open_shared`"
        ),
        "{err}"
    );

    let store = within(SqliteStore::open_shared(&path)).await.unwrap();
    let id = within(create(&store, "orders", t(0))).await;
    drop(store);
    let conn = raw(&path);
    let balance: i64 = conn
        .query_row("SELECT balance FROM accounts WHERE id = 'ada'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(balance, 100);
    drop(conn);
    // From now on the file is a store: the plain open takes it, the run still there.
    let store = within(SqliteStore::open(&path)).await.unwrap();
    let run = within(store.get_run(&id)).await.unwrap().unwrap();
    assert_eq!(run.workflow, "orders");
}

#[tokio::test]
async fn a_shared_open_refuses_tables_named_like_the_store_s_without_touching_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    raw(&path)
        .execute_batch(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY);
             CREATE TABLE events (id INTEGER PRIMARY KEY, what TEXT);
             CREATE TABLE schedule_ticks (id INTEGER PRIMARY KEY);
             INSERT INTO events (what) VALUES ('launch');",
        )
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    let err = within(SqliteStore::open_shared(&path)).await.unwrap_err();
    let StoreError::Incompatible(msg) = &err else {
        panic!("expected Incompatible, got {err:?}");
    };
    assert!(
        msg.contains("has tables the store would create (`events`, `schedule_ticks`)"),
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
            "message_keys",
            "queues",
            "run_events",
            "run_requests",
            "run_requests_key",
            "runs",
            "runs_parent",
            "runs_queue_begun",
            "runs_queue_holding",
            "runs_queue_keyed",
            "runs_queue_waiting",
            "runs_ready",
            "schedule_ticks",
            "schedule_ticks_buffered",
            "schedule_ticks_started",
            "schedules",
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
    // Version 3 added it; version 16 numbers events from the events and drops it.
    assert!(!has_last_seq);
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

/// A group runs without savepoints; a request that wrote and then failed makes the writer
/// roll the group back and write it again with a savepoint per request: what the failing
/// request wrote is gone, its neighbours' writes and answers stand, in one commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_failing_after_it_wrote_is_undone_alone_in_its_group() {
    let (_dir, store) = fresh().await;
    within(store.write(|tx| Ok(tx.execute_batch("CREATE TABLE probe (n INTEGER NOT NULL)")?)))
        .await
        .unwrap();
    let commits = |s: &SqliteStore| s.inner.stats.commits.load(Ordering::Relaxed);
    let before = commits(&store);
    // Holds the writer, in a group of its own, while the requests queue up behind it, so
    // that they form the next group.
    let (held, hold) = std::sync::mpsc::channel::<()>();
    let (holding, writer_held) = std::sync::mpsc::channel::<()>();
    let blocker = {
        let store = store.clone();
        let hold = std::sync::Mutex::new((holding, hold));
        tokio::spawn(async move {
            store
                .write(move |_| {
                    if let Ok((holding, hold)) = hold.lock().as_deref() {
                        let _ = holding.send(());
                        let _ = hold.recv_timeout(Duration::from_secs(10));
                    }
                    Ok(())
                })
                .await
        })
    };
    within(tokio::task::spawn_blocking(move || {
        writer_held.recv_timeout(Duration::from_secs(10))
    }))
    .await
    .unwrap()
    .expect("the writer ran the blocker");
    let requests: Vec<_> = (0..10_i64)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(move |tx| {
                        tx.execute("INSERT INTO probe (n) VALUES (?1)", [n])?;
                        if n == 3 {
                            return Err(StoreError::database("refused after writing"));
                        }
                        Ok(n * 10)
                    })
                    .await
            })
        })
        .collect();
    // Every request is queued once the writer has answered none of them for a while.
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.send(()).unwrap();
    within(blocker).await.unwrap().unwrap();
    for (n, request) in requests.into_iter().enumerate() {
        let answer = within(request).await.unwrap();
        if n == 3 {
            assert!(
                matches!(&answer, Err(StoreError::Database(m)) if m.message().contains("refused")),
                "{answer:?}"
            );
        } else {
            assert_eq!(answer.unwrap(), n as i64 * 10);
        }
    }
    assert_eq!(
        commits(&store) - before,
        2,
        "the ten requests were not one group behind the blocker"
    );
    let mut written: Vec<i64> = within(store.read(|conn| {
        let mut stmt = conn.prepare("SELECT n FROM probe")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<Vec<i64>, _>>()?)
    }))
    .await
    .unwrap();
    written.sort_unstable();
    assert_eq!(written, [0, 1, 2, 4, 5, 6, 7, 8, 9]);
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

/// A schedule with thousands of ticks lists its latest `TICKS_KEPT` and keeps only a few
/// dozen records more between trims (one recorded tick in 32 trims, so that a tick does not
/// pay for walking 1,000 records).
#[tokio::test]
async fn a_schedule_s_tick_records_stay_near_the_kept_count() {
    use crate::store::{ScheduleStore, SkipReason, TickOutcome, TICKS_KEPT};
    use crate::testing::store::{schedule_def, tick};
    let (dir, store) = fresh().await;
    store
        .define_schedule(&schedule_def("many"), Some(t(0)), t(0))
        .await
        .unwrap();
    let missed = |i: u64| {
        tick(
            "many",
            t(i * 1000),
            TickOutcome::Skipped(SkipReason::Missed),
        )
    };
    let conn = raw(&dir.path().join("wf.db"));
    let (mut most, mut trimmed) = (0, 0);
    for chunk in 0..300u64 {
        store
            .fire_ticks((chunk * 10..chunk * 10 + 10).map(missed).collect())
            .await
            .unwrap();
        let n: usize = conn
            .query_row("SELECT count(*) FROM schedule_ticks", [], |r| r.get(0))
            .unwrap();
        most = most.max(n);
        trimmed += usize::from(n == TICKS_KEPT);
    }
    assert!(
        most > TICKS_KEPT && most <= TICKS_KEPT + 320,
        "{most} records"
    );
    assert!(
        trimmed > 10,
        "trimmed back to {TICKS_KEPT} only {trimmed} times"
    );
    let listed = store.schedule_ticks("many", 5000).await.unwrap();
    assert_eq!(listed.len(), TICKS_KEPT);
    assert_eq!(listed[0].nominal, t(2999 * 1000));
    assert_eq!(listed[TICKS_KEPT - 1].nominal, t(2000 * 1000));
}

/// SQLite has no fused statement for a group's admissions: the policy's default composes
/// them, inserting each run and appending a leased run's first events (numbered from 1); a
/// run nobody leased gets none, and of an id given twice the second is refused without
/// writing its events.
#[tokio::test]
async fn admissions_with_first_events_are_composed_from_plain_statements() {
    use crate::store::sql::policy::{self, NewRunRow};
    use crate::testing::store::new_run;
    use futures::FutureExt as _;

    let (_dir, store) = fresh().await;
    let (a, b) = (RunId::new(), RunId::new());
    let run = |id: RunId| new_run(id, "orders");
    let lease = Some(Duration::from_secs(600));
    let answers = within(store.write(move |conn| {
        let rows = [
            NewRunRow::new(run(a), lease)?,
            NewRunRow::new(run(b), None)?,
            NewRunRow::new(run(a), lease)?,
        ];
        let events = EncodedEvents::new(&[step_done(t(1), 1), step_done(t(2), 2)])?;
        let others = EncodedEvents::new(&[step_done(t(3), 3)])?;
        let rows: Vec<&NewRunRow> = rows.iter().collect();
        let first = [Some(&events), Some(&events), Some(&others)];
        let answers = policy::admit_many(&mut tx::Lite(conn), &rows, &first)
            .now_or_never()
            .ok_or_else(|| StoreError::database("SQLite's statements waited"))??;
        Ok(answers
            .iter()
            .map(|answer| answer.as_ref().map(|(_, lease)| lease.is_some()).ok())
            .collect::<Vec<_>>())
    }))
    .await
    .unwrap();
    assert_eq!(answers, [Some(true), Some(false), None]);
    let seen = within(store.events(&a)).await.unwrap();
    let seen: Vec<(u64, crate::store::Event)> =
        seen.into_iter().map(|e| (e.seq, e.event)).collect();
    let expected = vec![(1, step_done(t(1), 1).event), (2, step_done(t(2), 2).event)];
    assert_eq!(seen, expected);
    assert!(within(store.events(&b)).await.unwrap().is_empty());
    let run = within(store.get_run(&a)).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Running);
}

/// Nor for a group's usual ends: the policy's default ends each run as `append_and_end`
/// does, and a run whose fence no longer holds is answered false, unwritten.
#[tokio::test]
async fn ends_of_many_runs_are_composed_from_plain_statements() {
    use crate::store::sql::policy::Tx as _;
    use crate::store::sql::{EncodedEnd, EncodedEvents};
    use futures::FutureExt as _;

    let (_dir, store) = fresh().await;
    let (a, b) = (
        create(&store, "orders", t(0)).await,
        create(&store, "orders", t(0)).await,
    );
    let got = acquire(
        &store,
        &names(&["orders"]),
        t(1),
        Duration::from_secs(600),
        10,
    )
    .await;
    let lease = |id: RunId| got.iter().find(|r| r.run.id == id).unwrap().lease.clone();
    let (a, b) = (lease(a), lease(b));
    let runs = [a.run_id.to_string(), b.run_id.to_string()];
    let fences = [a.epoch as i64, b.epoch as i64 + 1];
    let ended = within(store.write(move |conn| {
        let events = EncodedEvents::new(&[step_done(t(5), 1)])?;
        let end = EncodedEnd {
            status: RunStatus::Completed,
            output: Some("7".to_owned()),
            error: None,
        };
        tx::Lite(conn)
            .end_many_alone(&runs, &fences, &[&events, &events], &[(&end, 5), (&end, 5)])
            .now_or_never()
            .ok_or_else(|| StoreError::database("SQLite's statements waited"))?
    }))
    .await
    .unwrap();
    assert_eq!(ended, [true, false]);
    let (ra, rb) = (
        within(store.get_run(&a.run_id)).await.unwrap().unwrap(),
        within(store.get_run(&b.run_id)).await.unwrap().unwrap(),
    );
    assert_eq!(
        (ra.status, ra.output),
        (RunStatus::Completed, Some(json!(7)))
    );
    assert_eq!(rb.status, RunStatus::Running);
    assert_eq!(event_count(&store, a.run_id).await, 1);
    assert_eq!(event_count(&store, b.run_id).await, 0);
}

async fn event_count(store: &SqliteStore, id: RunId) -> usize {
    within(store.events(&id)).await.unwrap().len()
}
