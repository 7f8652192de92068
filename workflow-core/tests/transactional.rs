//! Transactional steps on SQLite and PostgreSQL: the body's writes to the user's own
//! table commit with the step's recorded result, exactly once; a body error rolls them back
//! and counts as a failed attempt; a busy database or a serialization failure runs the
//! attempt again without counting it; a worker whose lease was taken commits nothing; misuse
//! (the memory store, the wrong accessor, a step call or stream write in the body) is an
//! error naming it.

mod common;

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use common::{bounded, Backend, TestDb};
use workflow_core::prelude::*;
use workflow_core::store::Event;

/// How many times each body ran, by the key the test passes in.
static ENTRIES: LazyLock<Mutex<HashMap<String, u32>>> = LazyLock::new(Default::default);

fn entered(key: &str) -> u32 {
    let mut entries = ENTRIES.lock().unwrap();
    let n = entries.entry(key.to_owned()).or_insert(0);
    *n += 1;
    *n
}

fn entries(key: &str) -> u32 {
    ENTRIES.lock().unwrap().get(key).copied().unwrap_or(0)
}

/// Where a test's user table lives: SQLite's file, or the test's schema in PostgreSQL.
struct Table {
    /// The table's name as the steps write it.
    name: String,
    backend: Backend,
}

impl Table {
    /// Creates `ledger(step_id PRIMARY KEY, run, cents)` beside the store's tables.
    async fn create(db: &TestDb) -> Table {
        match db.backend {
            Backend::Sqlite => {
                let conn = workflow_core::rusqlite::Connection::open(db.sqlite_path()).unwrap();
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                conn.execute_batch(
                    "CREATE TABLE ledger (step_id TEXT PRIMARY KEY, run TEXT NOT NULL,
                                          cents INTEGER NOT NULL)",
                )
                .unwrap();
                Table {
                    name: "ledger".into(),
                    backend: Backend::Sqlite,
                }
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                let name = format!("\"{}\".ledger", db.schema);
                let pool = pg_pool().await;
                workflow_core::sqlx::query(&format!(
                    "CREATE TABLE {name} (step_id TEXT PRIMARY KEY, run TEXT NOT NULL,
                                          cents BIGINT NOT NULL)"
                ))
                .execute(&pool)
                .await
                .unwrap();
                Table {
                    name,
                    backend: Backend::Postgres,
                }
            }
            other => panic!("no user table on {other:?}"),
        }
    }
}

/// `(rows, sum of cents)` of the ledger, of all runs or of one.
async fn ledger_totals(db: &TestDb, table: &Table, run: Option<RunId>) -> (i64, i64) {
    let run = run.map(|r| r.to_string());
    match table.backend {
        Backend::Sqlite => {
            let conn = workflow_core::rusqlite::Connection::open(db.sqlite_path()).unwrap();
            conn.busy_timeout(Duration::from_secs(10)).unwrap();
            conn.query_row(
                "SELECT count(*), COALESCE(sum(cents), 0) FROM ledger
                 WHERE ?1 IS NULL OR run = ?1",
                [run],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres => {
            let pool = pg_pool().await;
            workflow_core::sqlx::query_as::<_, (i64, i64)>(&format!(
                "SELECT count(*), COALESCE(sum(cents), 0)::BIGINT FROM {}
                 WHERE $1::TEXT IS NULL OR run = $1",
                table.name
            ))
            .bind(run)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
        other => panic!("no user table on {other:?}"),
    }
}

#[cfg(feature = "postgres")]
async fn pg_pool() -> workflow_core::sqlx::PgPool {
    workflow_core::sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&common::postgres_url().unwrap())
        .await
        .unwrap()
}

/// Inserts a ledger row keyed by the step id, on whichever store the runtime has; `fail_first`
/// makes the first attempt fail after its write.
async fn write_row(tx: &mut Tx<'_>, table: &str, cents: i64, fail_first: bool) -> Result<i64> {
    let meta = step_metadata();
    let (step_id, run) = (meta.step_id.clone(), meta.run_id.to_string());
    let sql_table = table.to_owned();
    let written = if table.contains('"') {
        #[cfg(feature = "postgres")]
        {
            workflow_core::sqlx::query(&format!(
                "INSERT INTO {sql_table} (step_id, run, cents) VALUES ($1, $2, $3)"
            ))
            .bind(&step_id)
            .bind(&run)
            .bind(cents)
            .execute(tx.postgres()?)
            .await?;
            cents
        }
        #[cfg(not(feature = "postgres"))]
        unreachable!("a PostgreSQL table without the feature")
    } else {
        tx.sqlite(move |c| {
            c.execute(
                &format!("INSERT INTO {sql_table} (step_id, run, cents) VALUES (?1, ?2, ?3)"),
                workflow_core::rusqlite::params![step_id, run, cents],
            )?;
            Ok(cents)
        })?
    };
    if fail_first && meta.attempt == 1 {
        return Err(Error::retryable("the first attempt fails after its write"));
    }
    Ok(written)
}

#[step(transactional)]
async fn book(tx: &mut Tx<'_>, table: String, cents: i64) -> Result<i64> {
    write_row(tx, &table, cents, false).await
}

#[step(transactional, name = "tests.book_flaky", max_retries = 2)]
async fn book_flaky(tx: &mut Tx<'_>, table: String, key: String) -> Result<i64> {
    entered(&key);
    set_event("booked by attempt", &step_metadata().attempt)?;
    write_row(tx, &table, 7, true).await
}

#[workflow]
async fn three_bookings(table: String) -> Result<i64> {
    let a = book(table.clone(), 1).await?;
    let b = book(table.clone(), 10).await?;
    let c = book(table, 100).await?;
    Ok(a + b + c)
}

#[workflow]
async fn flaky_booking(table: String, key: String) -> Result<i64> {
    book_flaky(table, key).await
}

fn completed_steps(events: &[workflow_core::store::EventRecord]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
        .count()
}

fn failed_attempts(events: &[workflow_core::store::EventRecord]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e.event, Event::StepAttemptFailed { .. }))
        .count()
}

/// 200 runs of three transactional steps each: 600 ledger rows, each once, and each run's
/// history records three results.
async fn counts_are_exact_over_200_runs(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db.runtime().await;
    let table = Table::create(&db).await;
    let mut runs = Vec::new();
    for _ in 0..200 {
        runs.push(
            rt.start(three_bookings, (table.name.clone(),))
                .await
                .unwrap(),
        );
    }
    for run in &runs {
        assert_eq!(run.return_value().await.unwrap(), 111);
    }
    assert_eq!(ledger_totals(&db, &table, None).await, (600, 200 * 111));
    for run in &runs {
        let events = rt.store().events(&run.id()).await.unwrap();
        assert_eq!(completed_steps(&events), 3, "run {}", run.id());
        assert_eq!(
            ledger_totals(&db, &table, Some(run.id())).await,
            (3, 111),
            "run {}",
            run.id()
        );
    }
}

/// The first attempt writes its row and fails: its write is rolled back, the attempt is
/// recorded as failed, and the second attempt's row is the only one. Each attempt's
/// `set_event` is recorded with its outcome: the successful one in the step's own commit.
async fn a_body_error_rolls_back_and_the_retry_counts_once(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db.runtime().await;
    let table = Table::create(&db).await;
    let key = format!("flaky-{}", db.schema);
    let run = rt
        .start(flaky_booking, (table.name.clone(), key.clone()))
        .await
        .unwrap();
    assert_eq!(run.return_value().await.unwrap(), 7);
    assert_eq!(entries(&key), 2);
    assert_eq!(ledger_totals(&db, &table, None).await, (1, 7));
    let events = rt.store().events(&run.id()).await.unwrap();
    assert_eq!(failed_attempts(&events), 1);
    assert_eq!(completed_steps(&events), 1);
    let kinds: Vec<&str> = events.iter().map(|e| e.event.kind()).collect();
    let at = kinds.iter().position(|k| *k == "step_completed").unwrap();
    assert_eq!(kinds[at - 1], "event_set", "{kinds:?}");
    let sets = events
        .iter()
        .filter(|e| matches!(e.event, Event::EventSet { .. }))
        .count();
    assert_eq!(sets, 2, "{kinds:?}");
    assert_eq!(
        run.event::<u32>("booked by attempt")
            .latest()
            .await
            .unwrap(),
        Some(2)
    );
}

/// A run whose transactional step committed is picked up by another runtime (the first one
/// shut down while the run waited): the step's result is replayed, its body not run again.
async fn a_replayed_step_never_runs_its_body(backend: Backend) {
    let db = TestDb::new(backend);
    let key = format!("replayed-{}", db.schema);
    let first = db.runtime_with_lease(Duration::from_millis(500)).await;
    let table = Table::create(&db).await;
    let run = first
        .start(book_then_wait, (table.name.clone(), key.clone()))
        .await
        .unwrap();
    // Until the step committed.
    while completed_steps(&first.store().events(&run.id()).await.unwrap()) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.shutdown();
    drop(first);
    let second = db.runtime_with_lease(Duration::from_millis(500)).await;
    second.get_run(&run.id()).send("go", true).await.unwrap();
    let (out, replayed): (i64, u64) = second
        .get_run(&run.id())
        .typed::<(i64, u64)>()
        .return_value()
        .await
        .unwrap();
    assert_eq!(out, 5);
    let live = second
        .get_run(&run.id())
        .event::<u64>("history after the booking")
        .await
        .unwrap();
    assert_eq!(
        replayed, live,
        "the replay counts the step's commit as the live run did"
    );
    assert_eq!(entries(&key), 1, "the body ran again on replay");
    assert_eq!(ledger_totals(&db, &table, None).await, (1, 5));
}

#[step(transactional)]
async fn book_counted(tx: &mut Tx<'_>, table: String, key: String) -> Result<i64> {
    entered(&key);
    set_event("booked", &true)?;
    write_row(tx, &table, 5, false).await
}

/// Books, publishes the size of its history after the booking as this execution sees it,
/// waits for "go", and returns the booking and that size as the execution that ends sees it.
#[workflow]
async fn book_then_wait(table: String, key: String) -> Result<(i64, u64)> {
    let booked = book_counted(table, key).await?;
    let seen = workflow_metadata().history_events;
    set_event("history after the booking", &seen)?;
    let _go: bool = recv::<bool>("go").await?;
    Ok((booked, seen))
}

macro_rules! on_sql_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    crate::common::bounded(super::$name(crate::common::Backend::Sqlite)).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if crate::common::available(crate::common::Backend::Postgres) {
                        crate::common::bounded(super::$name(crate::common::Backend::Postgres)).await
                    }
                }
            )*
        }
    };
}

on_sql_stores!(
    counts_are_exact_over_200_runs,
    a_body_error_rolls_back_and_the_retry_counts_once,
    a_replayed_step_never_runs_its_body,
);

// ---------------------------------------------------------------------------------------------
// Misuse

#[workflow]
async fn book_anywhere() -> Result<i64> {
    book("ledger".into(), 1).await
}

/// On the memory store a transactional step fails, fatally, naming "memory".
#[tokio::test]
async fn a_transactional_step_on_the_memory_store_is_a_fatal_error_naming_it() {
    bounded(async {
        let db = TestDb::new(Backend::Memory);
        let rt = db.runtime().await;
        let run = rt.start(book_anywhere, ()).await.unwrap();
        let e = run.return_value().await.unwrap_err();
        assert!(e.message().contains("memory"), "{e}");
        let events = rt.store().events(&run.id()).await.unwrap();
        assert_eq!(failed_attempts(&events), 0, "a fatal error is not retried");
    })
    .await
}

/// Called outside any workflow there is no transaction: an error, not a panic.
#[tokio::test]
async fn a_transactional_step_outside_a_workflow_is_an_error() {
    let e = book("ledger".into(), 1).await.unwrap_err();
    assert!(e.is_fatal());
    assert!(e.message().contains("outside a workflow"), "{e}");
}

#[step]
async fn plain(n: i64) -> Result<i64> {
    Ok(n)
}

#[step(transactional)]
async fn calls_a_step(tx: &mut Tx<'_>) -> Result<i64> {
    let _ = tx;
    plain(1).await
}

/// Out of the macro's sight: the runtime refuses the write.
async fn write_progress() -> Result<u64> {
    stream::<i64>("progress").write(1).await
}

#[step(transactional)]
async fn writes_a_stream(tx: &mut Tx<'_>) -> Result<i64> {
    let _ = tx;
    write_progress().await.map(|_| 0)
}

#[workflow]
async fn misuses_its_body(which: String) -> Result<i64> {
    match which.as_str() {
        "step" => calls_a_step().await,
        _ => writes_a_stream().await,
    }
}

/// A step call or a stream write inside the body is a fatal error of the step, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_call_or_stream_write_in_the_body_is_a_fatal_error() {
    bounded(async {
        let db = TestDb::new(Backend::Sqlite);
        let rt = db.runtime().await;
        for (which, named) in [("step", "plain"), ("stream", "stream(\"progress\")")] {
            let run = rt.start(misuses_its_body, (which.into(),)).await.unwrap();
            let e = run.return_value().await.unwrap_err();
            assert!(e.message().contains(named), "{e}");
            assert!(e.message().contains("inside transactional step"), "{e}");
            let events = rt.store().events(&run.id()).await.unwrap();
            assert_eq!(failed_attempts(&events), 0, "a fatal error is not retried");
        }
    })
    .await
}

#[cfg(feature = "postgres")]
#[step(transactional)]
async fn uses_postgres(tx: &mut Tx<'_>) -> Result<i64> {
    tx.postgres()?;
    Ok(0)
}

#[step(transactional)]
async fn uses_sqlite(tx: &mut Tx<'_>) -> Result<i64> {
    tx.sqlite(|c| c.query_row("SELECT 1", [], |r| r.get(0)))
}

#[workflow]
async fn with_accessor(which: String) -> Result<i64> {
    #[cfg(feature = "postgres")]
    if which == "postgres" {
        return uses_postgres().await;
    }
    let _ = which;
    uses_sqlite().await
}

/// The accessor of the other store is a fatal error naming both stores.
#[cfg(feature = "postgres")]
async fn the_wrong_accessor_is_a_fatal_error_naming_both_stores(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db.runtime().await;
    let (wrong, right) = match backend {
        Backend::Sqlite => ("postgres", "sqlite"),
        _ => ("sqlite", "postgres"),
    };
    let run = rt.start(with_accessor, (wrong.into(),)).await.unwrap();
    let e = run.return_value().await.unwrap_err();
    assert!(e.is_fatal(), "{e}");
    assert!(
        e.message().contains("SQLite") && e.message().contains("PostgreSQL"),
        "{e}"
    );
    let run = rt.start(with_accessor, (right.into(),)).await.unwrap();
    if backend == Backend::Sqlite {
        assert_eq!(run.return_value().await.unwrap(), 1);
    } else {
        assert_eq!(run.return_value().await.unwrap(), 0);
    }
}

#[cfg(feature = "postgres")]
mod wrong_accessor {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_sqlite() {
        let backend = crate::common::Backend::Sqlite;
        crate::common::bounded(
            super::the_wrong_accessor_is_a_fatal_error_naming_both_stores(backend),
        )
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_postgres() {
        let backend = crate::common::Backend::Postgres;
        if crate::common::available(backend) {
            crate::common::bounded(
                super::the_wrong_accessor_is_a_fatal_error_naming_both_stores(backend),
            )
            .await
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Busy databases and serialization failures

#[step(transactional)]
async fn busy_once(tx: &mut Tx<'_>, path: String, key: String) -> Result<i64> {
    let n = entered(&key);
    let meta = step_metadata();
    let (step_id, run) = (meta.step_id.clone(), meta.run_id.to_string());
    tx.sqlite(move |c| {
        if n == 1 {
            // Another connection's write meets this transaction's lock: "busy", at once.
            let other = workflow_core::rusqlite::Connection::open(&path)?;
            other.busy_timeout(Duration::ZERO)?;
            other.execute_batch("BEGIN IMMEDIATE")?;
        }
        c.execute(
            "INSERT INTO ledger (step_id, run, cents) VALUES (?1, ?2, 3)",
            workflow_core::rusqlite::params![step_id, run],
        )?;
        Ok(i64::from(meta.attempt))
    })
}

#[workflow]
async fn busy_booking(path: String, key: String) -> Result<i64> {
    busy_once(path, key).await
}

/// A "database is busy" error in the body runs the whole attempt again, uncounted: the same
/// attempt number, no failed attempt recorded, one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_database_runs_the_attempt_again_uncounted() {
    bounded(async {
        let db = TestDb::new(Backend::Sqlite);
        let rt = db.runtime().await;
        let table = Table::create(&db).await;
        let key = format!("busy-{}", db.schema);
        let path = db.sqlite_path().display().to_string();
        let run = rt.start(busy_booking, (path, key.clone())).await.unwrap();
        assert_eq!(run.return_value().await.unwrap(), 1, "the attempt number");
        assert_eq!(entries(&key), 2);
        assert_eq!(ledger_totals(&db, &table, None).await, (1, 3));
        let events = rt.store().events(&run.id()).await.unwrap();
        assert_eq!(failed_attempts(&events), 0);
    })
    .await
}

#[cfg(feature = "postgres")]
mod postgres_only {
    //! What only PostgreSQL can show: two bodies deadlocked on the user's rows (one is
    //! aborted with 40P01 and runs again, uncounted), and a lease taken over while a body
    //! holds its transaction open (the old worker commits nothing).

    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    use std::time::{Duration, SystemTime};

    use super::common::{self, Backend, TestDb};
    use super::{
        completed_steps, entered, entries, failed_attempts, ledger_totals, pg_pool, Table,
    };
    use workflow_core::prelude::*;
    use workflow_core::store::AcquireRequest;

    fn barrier() -> &'static tokio::sync::Barrier {
        static BARRIER: OnceLock<tokio::sync::Barrier> = OnceLock::new();
        BARRIER.get_or_init(|| tokio::sync::Barrier::new(2))
    }

    #[step(transactional)]
    async fn cross_transfer(
        tx: &mut Tx<'_>,
        accounts: String,
        first: String,
        second: String,
        key: String,
    ) -> Result<i64> {
        let n = entered(&key);
        let add = format!("UPDATE {accounts} SET balance = balance + 1 WHERE id = $1");
        workflow_core::sqlx::query(&add)
            .bind(&first)
            .execute(tx.postgres()?)
            .await?;
        if n <= 2 {
            // Both first attempts hold their first row before either takes its second.
            let _ = tokio::time::timeout(Duration::from_secs(20), barrier().wait()).await;
        }
        workflow_core::sqlx::query(&add)
            .bind(&second)
            .execute(tx.postgres()?)
            .await?;
        Ok(i64::from(step_metadata().attempt))
    }

    #[workflow]
    async fn crossing(accounts: String, first: String, second: String, key: String) -> Result<i64> {
        cross_transfer(accounts, first, second, key).await
    }

    /// Two bodies lock two rows in opposite orders: PostgreSQL aborts one (deadlock,
    /// 40P01), which runs again from a new transaction without counting as an attempt; both
    /// apply once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deadlock_runs_the_attempt_again_uncounted() {
        if !common::available(Backend::Postgres) {
            return;
        }
        common::bounded(async {
            let db = TestDb::new(Backend::Postgres);
            let rt = db.runtime().await;
            let accounts = format!("\"{}\".accounts", db.schema);
            let pool = pg_pool().await;
            workflow_core::sqlx::raw_sql(&format!(
                "CREATE TABLE {accounts} (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
                 INSERT INTO {accounts} VALUES ('a', 0), ('b', 0)"
            ))
            .execute(&pool)
            .await
            .unwrap();
            let key = format!("deadlock-{}", db.schema);
            let x = rt
                .start(
                    crossing,
                    (accounts.clone(), "a".into(), "b".into(), key.clone()),
                )
                .await
                .unwrap();
            let y = rt
                .start(
                    crossing,
                    (accounts.clone(), "b".into(), "a".into(), key.clone()),
                )
                .await
                .unwrap();
            assert_eq!(x.return_value().await.unwrap(), 1, "the attempt number");
            assert_eq!(y.return_value().await.unwrap(), 1, "the attempt number");
            assert_eq!(entries(&key), 3, "two bodies, one of them twice");
            let balances: Vec<(String, i64)> = workflow_core::sqlx::query_as(&format!(
                "SELECT id, balance FROM {accounts} ORDER BY id"
            ))
            .fetch_all(&pool)
            .await
            .unwrap();
            assert_eq!(balances, vec![("a".into(), 2), ("b".into(), 2)]);
            for run in [&x, &y] {
                let events = rt.store().events(&run.id()).await.unwrap();
                assert_eq!(failed_attempts(&events), 0);
            }
        })
        .await
    }

    /// Signals between a paused body and its test, by key.
    type Gate = Arc<(tokio::sync::Notify, tokio::sync::Notify)>;
    static GATES: Mutex<Option<HashMap<String, Gate>>> = Mutex::new(None);

    fn gate(key: &str) -> Gate {
        GATES
            .lock()
            .unwrap()
            .get_or_insert_with(HashMap::new)
            .entry(key.to_owned())
            .or_default()
            .clone()
    }

    #[step(transactional, max_retries = 0)]
    async fn paused_booking(tx: &mut Tx<'_>, table: String, key: String) -> Result<i64> {
        entered(&key);
        let meta = step_metadata();
        workflow_core::sqlx::query(&format!(
            "INSERT INTO {table} (step_id, run, cents) VALUES ($1, $2, 9)"
        ))
        .bind(&meta.step_id)
        .bind(meta.run_id.to_string())
        .execute(tx.postgres()?)
        .await?;
        let gate = gate(&key);
        gate.0.notify_one();
        gate.1.notified().await;
        Ok(9)
    }

    #[workflow]
    async fn fenced_booking(table: String, key: String) -> Result<i64> {
        paused_booking(table, key).await
    }

    /// A body holds its transaction open, written but not committed, while another worker
    /// takes the run over: its commit is refused by the fence and nothing of it is visible.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_whose_lease_was_taken_commits_nothing() {
        if !common::available(Backend::Postgres) {
            return;
        }
        common::bounded(async {
            let db = TestDb::new(Backend::Postgres);
            let rt = db.runtime().await;
            let table = Table::create(&db).await;
            let key = format!("fenced-{}", db.schema);
            let gate = gate(&key);
            let run = rt
                .start(fenced_booking, (table.name.clone(), key.clone()))
                .await
                .unwrap();
            gate.0.notified().await;
            // The thief: another worker, at a time past this worker's lease.
            let thief = db.open_store().await;
            let workflow = rt.get_run(&run.id()).info().await.unwrap().workflow;
            let later = SystemTime::now() + Duration::from_secs(3600);
            let taken = thief
                .acquire(AcquireRequest {
                    worker_id: "thief",
                    workflows: &[workflow],
                    lease: Duration::from_secs(3600),
                    limit: 10,
                    now: later,
                })
                .await
                .unwrap();
            assert!(
                taken.iter().any(|r| r.run.id == run.id()),
                "the run was taken over"
            );
            gate.1.notify_one();
            // The old worker stops driving the run once its commit is refused.
            common::until_no_active_runs(&rt, "the fenced worker stopped").await;
            assert_eq!(entries(&key), 1);
            assert_eq!(ledger_totals(&db, &table, None).await, (0, 0));
            let events = thief.events(&run.id()).await.unwrap();
            assert_eq!(completed_steps(&events), 0);
        })
        .await
    }
}
