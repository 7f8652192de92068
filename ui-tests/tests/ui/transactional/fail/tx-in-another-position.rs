use workflow_core::prelude::*;

#[step(transactional)]
async fn debit(account: String, tx: &mut Tx<'_>, cents: i64) -> Result<i64> {
    let _ = (account, tx);
    Ok(cents)
}

#[step]
async fn credit(tx: &mut Tx<'_>, cents: i64) -> Result<i64> {
    let _ = tx;
    Ok(cents)
}

fn main() {}
