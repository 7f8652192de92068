use workflow_core::prelude::*;

#[workflow(queue = payments)]
async fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

#[workflow(queue = 10)]
async fn refund(cents: u64) -> Result<u64> {
    Ok(cents)
}

#[workflow(queue = "")]
async fn ship(cents: u64) -> Result<u64> {
    Ok(cents)
}

fn main() {}
