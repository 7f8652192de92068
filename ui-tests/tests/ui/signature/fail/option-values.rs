use workflow_core::prelude::*;

#[step(name = "", max_retries = -1)]
async fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

fn main() {}
