use std::time::Duration;
use workflow_core::prelude::*;

// A scheduled workflow takes the tick as its one argument.
#[workflow]
async fn nightly(tick: ScheduleTick) -> Result<u64> {
    Ok(tick.schedule.len() as u64)
}

fn main() {
    let _ = Schedule::cron("nightly", nightly, "0 2 * * *");
    let _ = Schedule::every("heartbeat", nightly, Duration::from_secs(60));
}
