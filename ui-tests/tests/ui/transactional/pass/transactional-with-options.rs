use workflow_core::prelude::*;

#[step(transactional, name = "ledger.debit", max_retries = 1, timeout = "5s")]
async fn debit(tx: &mut Tx<'_>, account: String, cents: i64) -> Result<i64> {
    let StepMetadata { attempt, .. } = step_metadata();
    let balance = tx.sqlite(move |c| {
        c.query_row(
            "UPDATE accounts SET balance = balance - ?1 WHERE id = ?2 RETURNING balance",
            workflow_core::rusqlite::params![cents, account],
            |r| r.get::<_, i64>(0),
        )
    })?;
    Ok(balance + i64::from(attempt) * 0)
}

#[step(transactional)]
async fn no_arguments(tx: &mut Tx<'_>) -> Result<()> {
    tx.sqlite(|c| c.execute_batch("SELECT 1"))
}

#[workflow]
async fn transfer(account: String) -> Result<i64> {
    no_arguments().await?;
    // The transaction is not an argument of the call.
    debit(account, 500).await
}

fn main() {
    let _ = transfer;
}
