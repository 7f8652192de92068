use workflow_core::prelude::*;

#[step(transactional)]
async fn debit(account: String, cents: i64) -> Result<i64> {
    let _ = account;
    Ok(cents)
}

fn main() {}
