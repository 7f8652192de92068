use workflow_core::prelude::*;

#[step(timeout = "1m30s", max_retries = 2)]
async fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

#[workflow]
async fn checkout(cents: u64) -> Result<u64> {
    charge(cents).await
}

fn main() {}
