use std::time::Instant;
use workflow_core::prelude::*;

#[workflow]
async fn timed(order_id: String) -> Result<u64> {
    let started = Instant::now();
    let _ = order_id;
    Ok(started.elapsed().as_secs())
}

fn main() {}
