#![deny(warnings)]
//! `workflow_core::now`, `sleep`, `sleep_until` and `random`, by path or from the prelude, and
//! `SystemTime` as a type (of an argument, a binding, a constant) are what a workflow should use.

use std::time::SystemTime;
use workflow_core::prelude::*;

#[workflow]
async fn remind(order_id: String, due: SystemTime) -> Result<String> {
    let started: SystemTime = workflow_core::now();
    workflow_core::sleep(Duration::from_secs(1)).await;
    sleep(Duration::from_secs(1)).await;
    sleep_until(due).await;
    workflow_core::sleep_until(now() + Duration::from_secs(60)).await;
    let jitter = workflow_core::random::<u64>() % 10;
    let coin: bool = random();
    let waited = now().duration_since(started).unwrap_or_default();
    let since_epoch = started.duration_since(SystemTime::UNIX_EPOCH);
    Ok(format!("{order_id} {jitter} {coin} {waited:?} {since_epoch:?}"))
}

fn main() {}
