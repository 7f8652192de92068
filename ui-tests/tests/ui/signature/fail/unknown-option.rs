use workflow_core::prelude::*;

#[step(max_retry = 3)]
async fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

fn main() {}
