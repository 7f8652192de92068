use std::time::Duration;
use workflow_core::prelude::*;

// A scheduled workflow takes one argument, the tick: this one takes an order id.
#[workflow]
async fn nightly(order_id: String) -> Result<u64> {
    Ok(order_id.len() as u64)
}

fn main() {
    let _ = Schedule::cron("nightly", nightly, "0 2 * * *");
    let _ = Schedule::every("heartbeat", nightly, Duration::from_secs(60));
}
