use workflow_core::prelude::*;

const NAME: &str = "billing.charge";

#[step(name(NAME), max_retries = 5u8)]
async fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

#[workflow(name = NAME)]
async fn checkout(cents: u64) -> Result<u64> {
    charge(cents).await
}

fn main() {}
