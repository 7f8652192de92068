//! Transactional steps: a ledger whose accounts live in the workflow store's own SQLite file.
//! Each transfer is a `#[step(transactional)]`: its writes to `accounts` and `transfers`
//! commit in one transaction with the step's recorded result, so a transfer takes effect
//! exactly once whatever crashes, retries and takeovers happen.
//!
//! ```text
//! cargo run --example ledger
//! ```
//!
//! The database is a fresh SQLite file in the temporary directory (`WORKFLOW_DB` overrides
//! it). The program opens 5 accounts of 1,000 cents, runs 20 payment runs of 3 transfers each
//! between them, and prints the balances: their sum is still 5,000 and the `transfers` table
//! holds one row per transfer step.
//!
//! With PostgreSQL (feature `postgres`), the same step writes with `tx.postgres()`:
//!
//! ```ignore
//! #[step(transactional)]
//! async fn transfer(tx: &mut Tx<'_>, from: String, to: String, cents: i64) -> Result<i64> {
//!     let conn = tx.postgres()?;
//!     sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = $2")
//!         .bind(cents).bind(&from).execute(&mut *conn).await?;
//!     sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
//!         .bind(cents).bind(&to).execute(&mut *conn).await?;
//!     Ok(cents)
//! }
//! ```

use std::path::{Path, PathBuf};

use workflow_core::prelude::*;
use workflow_core::rusqlite::{params, Connection};

/// Moves `cents` from one account to the other, refusing to overdraw (a fatal error: the
/// transfer is declined, not retried). The `transfers` row keyed by the step id shows that
/// each transfer step applied once.
#[step(transactional, name = "ledger.transfer")]
pub async fn transfer(tx: &mut Tx<'_>, from: String, to: String, cents: i64) -> Result<i64> {
    let step_id = step_metadata().step_id;
    let balance = tx.sqlite(move |c| {
        let balance: i64 = c.query_row(
            "UPDATE accounts SET balance = balance - ?1 WHERE id = ?2 RETURNING balance",
            params![cents, from],
            |r| r.get(0),
        )?;
        if balance < 0 {
            return Ok(None);
        }
        c.execute(
            "UPDATE accounts SET balance = balance + ?1 WHERE id = ?2",
            params![cents, to],
        )?;
        c.execute(
            "INSERT INTO transfers (step_id, from_account, to_account, cents)
             VALUES (?1, ?2, ?3, ?4)",
            params![step_id, from, to, cents],
        )?;
        Ok(Some(balance))
    })?;
    // Declined: returning the error rolls the debit back.
    balance.ok_or_else(|| Error::fatal(format!("insufficient funds for {cents} cents")))
}

/// Three transfers in a row: `payer` pays each of `payees` `cents`.
#[workflow(name = "ledger.payments")]
pub async fn payments(payer: String, payees: Vec<String>, cents: i64) -> Result<i64> {
    let mut left = 0;
    for payee in payees {
        left = transfer(payer.clone(), payee, cents).await?;
    }
    Ok(left)
}

/// Creates the ledger's tables (beside the store's, if any), with `accounts` accounts of 1,000 cents.
pub fn open_accounts(db: &Path, accounts: usize) -> workflow_core::rusqlite::Result<()> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS transfers (step_id TEXT PRIMARY KEY, from_account TEXT,
                                               to_account TEXT, cents INTEGER NOT NULL);",
    )?;
    for i in 0..accounts {
        conn.execute(
            "INSERT OR IGNORE INTO accounts (id, balance) VALUES (?1, 1000)",
            [account(i)],
        )?;
    }
    Ok(())
}

/// Account number `i`'s id.
pub fn account(i: usize) -> String {
    format!("acct-{i}")
}

/// The balances by account, and the number of recorded transfers.
pub fn balances(db: &Path) -> workflow_core::rusqlite::Result<(Vec<(String, i64)>, i64)> {
    let conn = Connection::open(db)?;
    let mut stmt = conn.prepare("SELECT id, balance FROM accounts ORDER BY id")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<workflow_core::rusqlite::Result<Vec<_>>>()?;
    let transfers = conn.query_row("SELECT count(*) FROM transfers", [], |r| r.get(0))?;
    Ok((rows, transfers))
}

/// Runs `runs` payment runs of 3 transfers of 10 cents among `accounts` accounts and waits
/// for them all.
pub async fn run_payments(
    rt: &Runtime,
    accounts: usize,
    runs: usize,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut started = Vec::new();
    for r in 0..runs {
        let payer = account(r % accounts);
        let payees = (1..=3).map(|k| account((r + k) % accounts)).collect();
        started.push(rt.start(payments, (payer, payees, 10)).await?);
    }
    for run in started {
        run.return_value().await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let db: PathBuf = std::env::var_os("WORKFLOW_DB").map_or_else(
        || std::env::temp_dir().join(format!("ledger-{}.db", std::process::id())),
        PathBuf::from,
    );
    // The application's database first; the store creates its tables beside the ledger's.
    open_accounts(&db, 5)?;
    let rt = Runtime::builder().sqlite_shared(&db).build().await?;
    run_payments(&rt, 5, 20).await?;
    let (rows, transfers) = balances(&db)?;
    for (id, balance) in &rows {
        println!("{id}: {balance} cents");
    }
    let sum: i64 = rows.iter().map(|(_, b)| b).sum();
    println!("sum: {sum} cents; transfers recorded: {transfers}");
    Ok(())
}
