use workflow_core::prelude::*;

#[step(timeout = "30")]
async fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

#[step(timeout = 30)]
async fn refund(cents: u64) -> Result<u64> {
    Ok(cents)
}

#[step(timeout = "0s")]
async fn ship(cents: u64) -> Result<u64> {
    Ok(cents)
}

#[step(timeout = "1 month")]
async fn restock(cents: u64) -> Result<u64> {
    Ok(cents)
}

fn main() {}
