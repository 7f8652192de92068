//! Transactional steps: per step, a `#[step(transactional)]` inserting a row in the
//! store's own database (one commit: the row and the step's result) against a plain step
//! making the same insert on a connection of its own (two commits: the row, then the result),
//! both in one 100-step run, sequential. SQLite and PostgreSQL.

use std::time::Instant;

use workflow_core::prelude::*;

use crate::report::{median, Report, Row, Unit};
use crate::scenarios::{progress, Ctx};
use crate::stores::StoreKind;
use crate::BoxResult;

const STEPS: u32 = 100;

#[step(transactional, name = "bench.tx_insert")]
async fn tx_insert(tx: &mut Tx<'_>, table: String, n: u32) -> Result<u32> {
    let step_id = step_metadata().step_id;
    if table.contains('"') {
        #[cfg(feature = "postgres")]
        {
            workflow_core::sqlx::query(&format!("INSERT INTO {table} VALUES ($1, $2)"))
                .bind(step_id)
                .bind(i64::from(n))
                .execute(tx.postgres()?)
                .await?;
            return Ok(n);
        }
    }
    tx.sqlite(move |c| {
        c.execute(
            &format!("INSERT INTO {table} VALUES (?1, ?2)"),
            workflow_core::rusqlite::params![step_id, n],
        )?;
        Ok(n)
    })
}

/// The same insert, outside the step's record: its own connection and commit.
#[step(name = "bench.plain_insert")]
async fn plain_insert(target: String, table: String, n: u32) -> Result<u32> {
    let step_id = step_metadata().step_id;
    if table.contains('"') {
        #[cfg(feature = "postgres")]
        {
            let conn = pg_pool(&target).await?;
            workflow_core::sqlx::query(&format!("INSERT INTO {table} VALUES ($1, $2)"))
                .bind(step_id)
                .bind(i64::from(n))
                .execute(&conn)
                .await?;
            return Ok(n);
        }
    }
    tokio::task::spawn_blocking(move || -> Result<u32> {
        let c = workflow_core::rusqlite::Connection::open(&target)?;
        c.busy_timeout(std::time::Duration::from_secs(10))?;
        c.pragma_update(None, "synchronous", "FULL")?;
        c.execute(
            &format!("INSERT INTO {table} VALUES (?1, ?2)"),
            workflow_core::rusqlite::params![step_id, n],
        )?;
        Ok(n)
    })
    .await?
}

#[cfg(feature = "postgres")]
async fn pg_pool(url: &str) -> Result<workflow_core::sqlx::PgPool> {
    static POOL: tokio::sync::OnceCell<workflow_core::sqlx::PgPool> =
        tokio::sync::OnceCell::const_new();
    Ok(POOL
        .get_or_try_init(|| workflow_core::sqlx::PgPool::connect(url))
        .await?
        .clone())
}

#[workflow(name = "bench.tx_steps")]
async fn tx_steps(table: String, steps: u32) -> Result<u32> {
    let mut sum = 0;
    for n in 0..steps {
        sum += tx_insert(table.clone(), n).await?;
    }
    Ok(sum)
}

#[workflow(name = "bench.plain_steps")]
async fn plain_steps(target: String, table: String, steps: u32) -> Result<u32> {
    let mut sum = 0;
    for n in 0..steps {
        sum += plain_insert(target.clone(), table.clone(), n).await?;
    }
    Ok(sum)
}

pub async fn transactional(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    // The memory store has no transactions (a transactional step on it is a fatal error).
    let stores = ctx.stores(&[Sqlite, Postgres], rep);
    for kind in stores.into_iter().filter(|k| *k != Memory) {
        progress(format!("transactional {}", kind.name()));
        let (mut tx_per, mut plain_per) = (Vec::new(), Vec::new());
        for _ in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().build().await?;
            // The user's tables, beside the store's.
            let (target, tx_table, plain_table) = match fresh.sqlite_path() {
                Some(path) => {
                    let c = workflow_core::rusqlite::Connection::open(&path)?;
                    c.execute_batch(
                        "CREATE TABLE t_rows (step_id TEXT PRIMARY KEY, n INTEGER);
                         CREATE TABLE p_rows (step_id TEXT PRIMARY KEY, n INTEGER);",
                    )?;
                    (path.display().to_string(), "t_rows".into(), "p_rows".into())
                }
                None => pg_tables(ctx, &fresh).await?,
            };
            let t = Instant::now();
            rt.start(tx_steps, (tx_table, STEPS))
                .await?
                .return_value()
                .await?;
            tx_per.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(STEPS));
            let t = Instant::now();
            rt.start(plain_steps, (target, plain_table, STEPS))
                .await?
                .return_value()
                .await?;
            plain_per.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(STEPS));
            rt.shutdown();
            fresh.cleanup().await?;
        }
        let s = kind.name();
        let (tx, plain) = (median(&tx_per), median(&plain_per));
        println!(
            "transactional {s}: transactional step {tx:.0} us/step, plain step + separate \
             write {plain:.0} us/step, ratio {:.2}",
            tx / plain
        );
        rep.push(
            Row::new(
                "transactional",
                s,
                "transactional step, per step",
                Unit::Micros,
            )
            .samples(tx_per),
        );
        rep.push(
            Row::new(
                "transactional",
                s,
                "plain step + separate write, per step",
                Unit::Micros,
            )
            .samples(plain_per),
        );
    }
    Ok(())
}

#[cfg(feature = "postgres")]
async fn pg_tables(ctx: &Ctx, fresh: &crate::stores::Fresh) -> BoxResult<(String, String, String)> {
    let url = ctx.pg_url.clone().ok_or("no PostgreSQL URL")?;
    let env = fresh.child_env();
    let schema = env
        .iter()
        .find(|(k, _)| *k == "WF_BENCH_SCHEMA")
        .map(|(_, v)| v.clone())
        .ok_or("no schema")?;
    let (t, p) = (
        format!("\"{schema}\".t_rows"),
        format!("\"{schema}\".p_rows"),
    );
    let pool = workflow_core::sqlx::PgPool::connect(&url).await?;
    workflow_core::sqlx::raw_sql(&format!(
        "CREATE TABLE {t} (step_id TEXT PRIMARY KEY, n BIGINT);
         CREATE TABLE {p} (step_id TEXT PRIMARY KEY, n BIGINT);"
    ))
    .execute(&pool)
    .await?;
    Ok((url, t, p))
}

#[cfg(not(feature = "postgres"))]
async fn pg_tables(_: &Ctx, _: &crate::stores::Fresh) -> BoxResult<(String, String, String)> {
    Err("built without the `postgres` feature".into())
}
