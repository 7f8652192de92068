#![deny(warnings)]
//! Steps run once per invocation and their results are recorded, so they may read the clock,
//! draw random numbers, spawn tasks and do I/O: nothing in a step is scanned.

use std::collections::HashMap;
use std::time::{Instant, SystemTime};
use workflow_core::prelude::*;

#[step]
async fn stamp(order_id: String) -> Result<String> {
    let started = Instant::now();
    let at = SystemTime::now();
    let nonce: u64 = rand::random();
    let region = std::env::var("REGION").unwrap_or_default();
    let task = tokio::spawn(async { 1 }).await.unwrap_or(0);
    let mut counts = HashMap::new();
    counts.insert(order_id.clone(), task);
    for (id, count) in &counts {
        let _ = (id, count);
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    Ok(format!("{order_id} {at:?} {nonce} {region} {:?}", started.elapsed()))
}

#[workflow]
async fn process(order_id: String) -> Result<String> {
    stamp(order_id).await
}

fn main() {}
