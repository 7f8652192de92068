//! One compile shows every problem: the options, the signature and the body.

use std::collections::HashMap;
use workflow_core::prelude::*;

#[workflow(nmae = "orders.process")]
async fn process(order_id: &str, (a, b): (u32, u32)) -> Result<String> {
    use std::time::SystemTime as Clock;
    let started = Clock::now();
    let nonce: u64 = rand::random();
    let mut totals = HashMap::new();
    totals.insert(order_id.to_owned(), a + b);
    for (id, total) in &totals {
        println!("{id}: {total} at {:?}", std::time::Instant::now());
    }
    tokio::spawn(async move { nonce });
    let reply = tokio::select! {
        _ = sleep(Duration::from_secs(1)) => "late",
        _ = async {} => "now",
    };
    Ok(format!("{started:?} {reply}"))
}

fn main() {}
