//! Flow control: a burst of orders against a payment API that takes at most 10 calls
//! at once and 100 per minute, and at most one order at a time per customer — enforced by the
//! store, so it would hold across any number of worker processes.
//!
//! ```text
//! cargo run --example queued_orders
//! ```
//!
//! The database is a fresh SQLite file in the temporary directory (`WORKFLOW_DB` overrides
//! it). The program starts 60 orders of 12 customers at once, some of them marked urgent,
//! and prints how many payment calls were in flight at most, and each customer's orders in
//! the order they were charged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use workflow_core::prelude::*;

/// Payment calls in flight now, and the most at once.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static MOST: AtomicUsize = AtomicUsize::new(0);

/// Each customer's orders in the order they were charged.
pub fn charged() -> &'static Mutex<HashMap<String, Vec<u32>>> {
    static C: OnceLock<Mutex<HashMap<String, Vec<u32>>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// The most payment calls that were in flight at once.
pub fn most_in_flight() -> usize {
    MOST.load(Ordering::SeqCst)
}

/// A stand-in for the payment API: 30 ms per call.
#[step(name = "queued_orders.charge")]
async fn charge(customer: String, order: u32, cents: u64) -> Result<String> {
    let now = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    MOST.fetch_max(now, Ordering::SeqCst);
    charged()
        .lock()
        .unwrap()
        .entry(customer.clone())
        .or_default()
        .push(order);
    tokio::time::sleep(Duration::from_millis(30)).await;
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    Ok(format!(
        "charged {customer} {cents} cents for order {order}"
    ))
}

/// Every run of this workflow enters the `payments` queue unless its start names another.
#[workflow(name = "queued_orders.process", queue = "payments")]
pub async fn process_order(customer: String, order: u32, cents: u64) -> Result<String> {
    charge(customer, order, cents).await
}

/// The payment API's limits: at most 10 calls at once, at most 100 per minute.
pub fn payments_queue() -> Queue {
    Queue::new("payments")
        .concurrency(10)
        .rate_limit(100, Duration::from_secs(60))
}

/// Starts `orders` orders of `customers` customers at once, one at a time per customer
/// (`partition_key`), every seventh urgent (`priority`), and waits for them all.
pub async fn burst(
    rt: &Runtime,
    orders: u32,
    customers: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut runs = Vec::new();
    for order in 0..orders {
        let customer = format!("customer-{}", order % customers);
        let urgent = order % 7 == 0;
        let run = rt
            .start(
                process_order,
                (customer.clone(), order, 1_000 + u64::from(order)),
            )
            .partition_key(customer)
            .priority(if urgent { 10 } else { 0 })
            .await?;
        runs.push(run);
    }
    for run in runs {
        run.return_value().await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = std::env::var("WORKFLOW_DB").map_or_else(
        |_| std::env::temp_dir().join(format!("queued-orders-{}.db", RunId::new())),
        Into::into,
    );
    let rt = Runtime::builder()
        .sqlite(&db)
        .queue(payments_queue())
        .build()
        .await?;
    println!("60 orders of 12 customers, on {}", db.display());
    burst(&rt, 60, 12).await?;
    println!(
        "at most {} payment calls in flight (limit 10)",
        most_in_flight()
    );
    let charged = charged().lock().unwrap().clone();
    let mut customers: Vec<_> = charged.into_iter().collect();
    customers.sort();
    for (customer, orders) in customers {
        println!("  {customer}: orders {orders:?}");
    }
    Ok(())
}
