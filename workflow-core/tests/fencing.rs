//! Fencing of transactional steps with a real stopped process: a worker is frozen
//! with SIGSTOP inside a transactional step's body, after its write and before its commit,
//! past the end of its lease, while another worker process polls the same store; then it is
//! resumed with SIGCONT.
//!
//! - PostgreSQL: the second worker takes the run over and runs the step again; its write
//!   waits on the frozen transaction's row. The resumed worker finds its lease taken at commit
//!   and commits nothing; the second worker's write and result are the only ones.
//! - SQLite: the frozen body holds the database's write lock, so no other worker can take the
//!   run while it is stopped (documented in docs/guide/transactional.md); once resumed,
//!   exactly one attempt's write and result are committed.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

mod common;

use std::time::{Duration, Instant};

use common::{Place, Worker};
use workflow_core::prelude::*;
use workflow_core::store::Event;

const LEASE: Duration = Duration::from_millis(1000);
const WAIT: Duration = Duration::from_secs(30);

/// Writes a row keyed by the step id holding this process's id, says so on stdout, and
/// lingers before its commit. `prefix` is where the table is (empty on SQLite).
#[step(transactional, max_retries = 10)]
async fn fenced_write(tx: &mut Tx<'_>, prefix: String) -> Result<u32> {
    let pid = std::process::id();
    let step_id = step_metadata().step_id;
    println!("ENTERED {pid}");
    write(tx, &prefix, step_id, pid).await?;
    println!("WROTE {pid}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Ok(pid)
}

#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
async fn write(tx: &mut Tx<'_>, prefix: &str, step_id: String, pid: u32) -> Result<()> {
    if prefix.is_empty() {
        #[cfg(feature = "sqlite")]
        return tx.sqlite(move |c| {
            c.execute(
                "INSERT INTO fence (step_id, pid) VALUES (?1, ?2)",
                workflow_core::rusqlite::params![step_id, pid],
            )?;
            Ok(())
        });
        #[cfg(not(feature = "sqlite"))]
        return Err(Error::fatal("built without SQLite"));
    }
    #[cfg(feature = "postgres")]
    {
        workflow_core::sqlx::query(&format!(
            "INSERT INTO {prefix}fence (step_id, pid) VALUES ($1, $2)"
        ))
        .bind(step_id)
        .bind(i64::from(pid))
        .execute(tx.postgres()?)
        .await?;
        Ok(())
    }
    #[cfg(not(feature = "postgres"))]
    Err(Error::fatal("built without PostgreSQL"))
}

#[workflow]
async fn fenced(prefix: String) -> Result<u32> {
    fenced_write(prefix).await
}

#[test]
#[ignore = "a worker process of the fencing tests, started by them"]
fn child_main() {
    common::serve_worker(|b| {
        b.lease(LEASE)
            .poll_interval(Duration::from_millis(50))
            .retry_backoff(Duration::from_millis(10))
    });
}

/// The table beside the store's, and the prefix the step finds it under.
async fn create_table(place: &Place) -> String {
    match place {
        #[cfg(feature = "sqlite")]
        Place::Sqlite { path } => {
            let conn = workflow_core::rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(10)).unwrap();
            conn.execute_batch(
                "CREATE TABLE fence (step_id TEXT PRIMARY KEY, pid INTEGER NOT NULL)",
            )
            .unwrap();
            String::new()
        }
        #[cfg(feature = "postgres")]
        Place::Postgres { url, schema } => {
            let prefix = format!("\"{schema}\".");
            let pool = workflow_core::sqlx::PgPool::connect(url).await.unwrap();
            workflow_core::sqlx::raw_sql(&format!(
                "CREATE TABLE {prefix}fence (step_id TEXT PRIMARY KEY, pid BIGINT NOT NULL)"
            ))
            .execute(&pool)
            .await
            .unwrap();
            prefix
        }
    }
}

/// The rows of the table: the process ids that committed a write.
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
async fn committed(place: &Place, prefix: &str) -> Vec<u32> {
    match place {
        #[cfg(feature = "sqlite")]
        Place::Sqlite { path } => {
            let conn = workflow_core::rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(10)).unwrap();
            let mut stmt = conn.prepare("SELECT pid FROM fence").unwrap();
            stmt.query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<Vec<u32>, _>>()
                .unwrap()
        }
        #[cfg(feature = "postgres")]
        Place::Postgres { url, .. } => {
            let pool = workflow_core::sqlx::PgPool::connect(url).await.unwrap();
            let rows: Vec<(i64,)> =
                workflow_core::sqlx::query_as(&format!("SELECT pid FROM {prefix}fence"))
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            rows.into_iter().map(|r| r.0 as u32).collect()
        }
    }
}

/// Whether `worker` prints a line containing `prefix` within `within`.
fn prints(worker: &Worker, prefix: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match worker.lines.recv_timeout(left) {
            Ok(l) if l.contains(prefix) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Freezes the worker that wrote inside the step past its lease while another polls, resumes
/// it; returns (the frozen worker's pid, the other's pid, the run's value, the committed
/// rows, whether the other entered the step while the first was frozen).
async fn freeze_inside_the_body(place: &Place) -> (u32, u32, u32, Vec<u32>, bool) {
    let client = place
        .builder()
        .worker(false)
        .build()
        .await
        .expect("client runtime");
    let prefix = create_table(place).await;
    let env = place.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // Both workers are up before the run starts (on SQLite a new worker could not even open
    // the store while the frozen body holds the write lock); whichever writes first is frozen.
    let mut workers = [Worker::spawn(&env), Worker::spawn(&env)];
    for w in &workers {
        w.line("READY", WAIT);
    }
    let run = client.start(fenced, (prefix.clone(),)).await.unwrap();
    let deadline = Instant::now() + WAIT;
    let first = 'found: loop {
        assert!(Instant::now() < deadline, "no worker wrote within {WAIT:?}");
        for (i, w) in workers.iter().enumerate() {
            while let Ok(line) = w.lines.try_recv() {
                if line.contains("WROTE") {
                    break 'found i;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    if first == 1 {
        workers.swap(0, 1);
    }
    let [frozen, other] = &workers;
    frozen.signal("-STOP");
    // Past the lease, with the other worker polling for the run.
    let took_over = prints(other, "ENTERED", LEASE * 5);
    frozen.signal("-CONT");
    let value = tokio::time::timeout(WAIT, run.return_value())
        .await
        .expect("the run ended in time")
        .expect("the run completed");
    let events = client.store().events(&run.id()).await.unwrap();
    let results = events
        .iter()
        .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
        .count();
    assert_eq!(results, 1, "one recorded result: {events:?}");
    let rows = committed(place, &prefix).await;
    (frozen.pid(), other.pid(), value, rows, took_over)
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_whose_lease_was_taken_commits_nothing_on_postgres() {
    let Some(url) = common::postgres_url() else {
        return;
    };
    let schema = common::fresh_schema();
    let place = Place::Postgres {
        url: url.clone(),
        schema: schema.clone(),
    };
    let (frozen, other, value, rows, took_over) =
        tokio::time::timeout(Duration::from_secs(120), freeze_inside_the_body(&place))
            .await
            .expect("the test finished in time");
    println!(
        "fencing on PostgreSQL: worker {frozen} frozen after its write; worker {other} took the \
         run over: {took_over}; the run returned {value}; committed rows by {rows:?}"
    );
    assert!(took_over, "the other worker took the run over");
    assert_eq!(value, other, "the result is the other worker's");
    assert_eq!(rows, vec![other], "only the other worker's write committed");
    if let Ok(s) = workflow_core::store::postgres::PostgresStore::connect(&url, &schema).await {
        let _ = s.drop_schema().await;
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_holds_sqlite_s_write_lock_and_one_attempt_commits() {
    let dir = tempfile::tempdir().unwrap();
    let place = Place::Sqlite {
        path: dir.path().join("wf.db"),
    };
    let (frozen, other, value, rows, took_over) =
        tokio::time::timeout(Duration::from_secs(120), freeze_inside_the_body(&place))
            .await
            .expect("the test finished in time");
    println!(
        "fencing on SQLite: worker {frozen} frozen after its write; worker {other} entered the \
         step meanwhile: {took_over}; the run returned {value}; committed rows by {rows:?}"
    );
    assert!(
        !took_over,
        "no worker can take the run while the body holds the write lock"
    );
    assert_eq!(
        rows,
        vec![value],
        "exactly one attempt's write committed, with its result"
    );
}
