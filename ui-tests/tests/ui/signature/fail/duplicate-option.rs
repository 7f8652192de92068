use workflow_core::prelude::*;

#[step(name = "billing.charge", max_retries = 1, name = "billing.charge_v2")]
async fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

fn main() {}
