//! Chaos for transactional steps: three worker processes share one store (SQLite file, or a
//! PostgreSQL schema) holding a ledger of 20 accounts, while a random worker is SIGKILLed
//! every 300 ms (and replaced) for 30 s. 300 runs make 10 transfers each, every transfer a
//! `#[step(transactional)]` that debits, credits and inserts a ledger row keyed by its step
//! id. Afterwards: every run completed, the sum of the balances is unchanged, each of the
//! 3,000 transfers is applied exactly once (one ledger row each, and each account's balance
//! is what the planned transfers make it). The test prints its figures.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

mod common;

use std::time::{Duration, Instant};

use common::{Place, Worker};
use workflow_core::prelude::*;
use workflow_core::store::{Event, RunFilter};

const RUNS: usize = 300;
const TRANSFERS: usize = 10;
const ACCOUNTS: usize = 20;
const OPENING: i64 = 1_000;
const WORKERS: usize = 3;
const LEASE: Duration = Duration::from_millis(2000);
const KILL_EVERY: Duration = Duration::from_millis(300);
const CHAOS: Duration = Duration::from_secs(30);
/// How long the runs may take to end once the chaos is over.
const DRAIN: Duration = Duration::from_secs(60);

/// Transfer `i` of run `run`: from, to, cents (from and to differ).
fn planned(run: usize, i: usize) -> (usize, usize, i64) {
    let from = (run * 7 + i * 3) % ACCOUNTS;
    let to = (from + 1 + (run + i) % (ACCOUNTS - 1)) % ACCOUNTS;
    (from, to, 1 + ((run + i) % 5) as i64)
}

fn account(i: usize) -> String {
    format!("a{i:02}")
}

/// `prefix` is where the tables are: empty on SQLite (the store's file), `"schema".` on
/// PostgreSQL. An attempt cut short by a kill commits nothing, its start included.
#[step(transactional, max_retries = 1000)]
async fn move_cents(
    tx: &mut Tx<'_>,
    prefix: String,
    from: String,
    to: String,
    cents: i64,
) -> Result<i64> {
    let step_id = step_metadata().step_id;
    if prefix.is_empty() {
        on_sqlite(tx, step_id, from, to, cents)
    } else {
        on_postgres(tx, prefix, step_id, from, to, cents).await
    }
}

#[cfg(feature = "sqlite")]
fn on_sqlite(
    tx: &mut Tx<'_>,
    step_id: String,
    from: String,
    to: String,
    cents: i64,
) -> Result<i64> {
    tx.sqlite(move |c| {
        use workflow_core::rusqlite::params;
        c.execute(
            "UPDATE accounts SET balance = balance - ?1 WHERE id = ?2",
            params![cents, from],
        )?;
        c.execute(
            "UPDATE accounts SET balance = balance + ?1 WHERE id = ?2",
            params![cents, to],
        )?;
        c.execute(
            "INSERT INTO ledger (step_id, cents) VALUES (?1, ?2)",
            params![step_id, cents],
        )?;
        Ok(cents)
    })
}

#[cfg(not(feature = "sqlite"))]
fn on_sqlite(_: &mut Tx<'_>, _: String, _: String, _: String, _: i64) -> Result<i64> {
    Err(Error::fatal("built without SQLite"))
}

#[cfg(feature = "postgres")]
async fn on_postgres(
    tx: &mut Tx<'_>,
    prefix: String,
    step_id: String,
    from: String,
    to: String,
    cents: i64,
) -> Result<i64> {
    use workflow_core::sqlx::query;
    // Rows locked in id order, so transfers in opposite directions rarely deadlock.
    let (first, second) = if from < to {
        (&from, &to)
    } else {
        (&to, &from)
    };
    for id in [first, second] {
        query(&format!(
            "SELECT 1 FROM {prefix}accounts WHERE id = $1 FOR UPDATE"
        ))
        .bind(id)
        .execute(tx.postgres()?)
        .await?;
    }
    let update = format!("UPDATE {prefix}accounts SET balance = balance + $1 WHERE id = $2");
    query(&update)
        .bind(-cents)
        .bind(&from)
        .execute(tx.postgres()?)
        .await?;
    query(&update)
        .bind(cents)
        .bind(&to)
        .execute(tx.postgres()?)
        .await?;
    query(&format!(
        "INSERT INTO {prefix}ledger (step_id, cents) VALUES ($1, $2)"
    ))
    .bind(&step_id)
    .bind(cents)
    .execute(tx.postgres()?)
    .await?;
    Ok(cents)
}

#[cfg(not(feature = "postgres"))]
async fn on_postgres(
    _: &mut Tx<'_>,
    _: String,
    _: String,
    _: String,
    _: String,
    _: i64,
) -> Result<i64> {
    Err(Error::fatal("built without PostgreSQL"))
}

#[workflow]
async fn ten_transfers(prefix: String, run: u64) -> Result<i64> {
    let mut moved = 0;
    for i in 0..TRANSFERS {
        let (from, to, cents) = planned(run as usize, i);
        moved += move_cents(prefix.clone(), account(from), account(to), cents).await?;
    }
    Ok(moved)
}

#[test]
#[ignore = "a worker process of the chaos tests, started by them"]
fn child_main() {
    common::serve_worker(|b| {
        b.lease(LEASE)
            .poll_interval(Duration::from_millis(50))
            .retry_backoff(Duration::from_millis(10))
    });
}

/// The tables beside the store's, and where the steps find them.
async fn create_tables(place: &Place) -> String {
    let accounts: Vec<String> = (0..ACCOUNTS).map(account).collect();
    match place {
        #[cfg(feature = "sqlite")]
        Place::Sqlite { path } => {
            let conn = workflow_core::rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(10)).unwrap();
            conn.execute_batch(
                "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
                 CREATE TABLE ledger (step_id TEXT PRIMARY KEY, cents INTEGER NOT NULL);",
            )
            .unwrap();
            for id in accounts {
                conn.execute(
                    "INSERT INTO accounts VALUES (?1, ?2)",
                    workflow_core::rusqlite::params![id, OPENING],
                )
                .unwrap();
            }
            String::new()
        }
        #[cfg(feature = "postgres")]
        Place::Postgres { url, schema } => {
            let prefix = format!("\"{schema}\".");
            let pool = workflow_core::sqlx::PgPool::connect(url).await.unwrap();
            workflow_core::sqlx::raw_sql(&format!(
                "CREATE TABLE {prefix}accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
                 CREATE TABLE {prefix}ledger (step_id TEXT PRIMARY KEY, cents BIGINT NOT NULL);"
            ))
            .execute(&pool)
            .await
            .unwrap();
            for id in accounts {
                workflow_core::sqlx::query(&format!(
                    "INSERT INTO {prefix}accounts VALUES ($1, $2)"
                ))
                .bind(id)
                .bind(OPENING)
                .execute(&pool)
                .await
                .unwrap();
            }
            prefix
        }
    }
}

/// The balances by account (in id order) and the ledger's rows.
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
async fn read_tables(place: &Place, prefix: &str) -> (Vec<i64>, i64) {
    match place {
        #[cfg(feature = "sqlite")]
        Place::Sqlite { path } => {
            let conn = workflow_core::rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(10)).unwrap();
            let mut stmt = conn
                .prepare("SELECT balance FROM accounts ORDER BY id")
                .unwrap();
            let balances = stmt
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<Vec<i64>, _>>()
                .unwrap();
            let rows = conn
                .query_row("SELECT count(*) FROM ledger", [], |r| r.get(0))
                .unwrap();
            (balances, rows)
        }
        #[cfg(feature = "postgres")]
        Place::Postgres { url, .. } => {
            let pool = workflow_core::sqlx::PgPool::connect(url).await.unwrap();
            let balances: Vec<(i64,)> = workflow_core::sqlx::query_as(&format!(
                "SELECT balance FROM {prefix}accounts ORDER BY id"
            ))
            .fetch_all(&pool)
            .await
            .unwrap();
            let (rows,): (i64,) =
                workflow_core::sqlx::query_as(&format!("SELECT count(*) FROM {prefix}ledger"))
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            (balances.into_iter().map(|b| b.0).collect(), rows)
        }
    }
}

async fn chaos(place: Place) {
    let began = Instant::now();
    let client = place
        .builder()
        .worker(false)
        .build()
        .await
        .expect("client runtime");
    let prefix = create_tables(&place).await;
    let mut ids = Vec::with_capacity(RUNS);
    for run in 0..RUNS {
        let started = client
            .start(ten_transfers, (prefix.clone(), run as u64))
            .await
            .unwrap();
        ids.push(started.id());
    }
    let env = place.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut workers: Vec<Worker> = (0..WORKERS).map(|_| Worker::spawn(&env)).collect();
    for w in &workers {
        w.line("READY", Duration::from_secs(30));
    }
    let mut kills = 0;
    let chaos_until = Instant::now() + CHAOS;
    while Instant::now() < chaos_until {
        tokio::time::sleep(KILL_EVERY).await;
        let victim = workers.swap_remove(rand::random_range(0..workers.len()));
        victim.kill();
        kills += 1;
        workers.push(Worker::spawn(&env));
    }
    let drain_until = Instant::now() + DRAIN;
    let completed = loop {
        let done = client
            .runs(
                RunFilter::new()
                    .status(RunStatus::Completed)
                    .limit(RUNS + 1),
            )
            .await
            .unwrap()
            .len();
        if done == RUNS || Instant::now() >= drain_until {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drop(workers);
    let (balances, rows) = read_tables(&place, &prefix).await;
    let mut expected = vec![OPENING; ACCOUNTS];
    for run in 0..RUNS {
        for i in 0..TRANSFERS {
            let (from, to, cents) = planned(run, i);
            expected[from] -= cents;
            expected[to] += cents;
        }
    }
    let mut attempts = 0;
    for id in &ids {
        let events = client.store().events(id).await.unwrap();
        let results = events
            .iter()
            .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
            .count();
        assert_eq!(results, TRANSFERS, "run {id}");
        attempts += events
            .iter()
            .filter(|e| matches!(e.event, Event::StepAttemptStarted { .. }))
            .count();
    }
    println!(
        "transactional chaos on {}: {kills} kills in {} s; {completed}/{RUNS} runs completed; \
         {rows} ledger rows for {} transfers; sum of balances {} (opening {}); {attempts} \
         retry starts recorded (an attempt cut short by a kill leaves none); {:.1} s in all",
        place.name(),
        CHAOS.as_secs(),
        RUNS * TRANSFERS,
        balances.iter().sum::<i64>(),
        OPENING * ACCOUNTS as i64,
        began.elapsed().as_secs_f64()
    );
    assert_eq!(completed, RUNS, "every run completed");
    assert_eq!(balances.iter().sum::<i64>(), OPENING * ACCOUNTS as i64);
    assert_eq!(
        rows,
        (RUNS * TRANSFERS) as i64,
        "one ledger row per transfer"
    );
    assert_eq!(balances, expected, "each transfer applied once");
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_transfers_apply_once_under_kills() {
    let dir = tempfile::tempdir().unwrap();
    let place = Place::Sqlite {
        path: dir.path().join("wf.db"),
    };
    tokio::time::timeout(Duration::from_secs(150), chaos(place))
        .await
        .expect("the chaos test finished in time");
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_transfers_apply_once_under_kills() {
    let Some(url) = common::postgres_url() else {
        return;
    };
    let schema = common::fresh_schema();
    let place = Place::Postgres {
        url: url.clone(),
        schema: schema.clone(),
    };
    tokio::time::timeout(Duration::from_secs(150), chaos(place))
        .await
        .expect("the chaos test finished in time");
    if let Ok(s) = workflow_core::store::postgres::PostgresStore::connect(&url, &schema).await {
        let _ = s.drop_schema().await;
    }
}
