//! The order flow: charge the card with the step id as the idempotency key, wait
//! durably, ship, and print what happened — on the embedded SQLite store.
//!
//! ```text
//! cargo run --example orders
//! ```
//!
//! The database is `orders.db` in the current directory (`WORKFLOW_DB` overrides it). Stop the
//! program during the wait and start it again: the run resumes where it was, without charging
//! twice.
//!
//! `cargo run --example orders -- --export examples/tests/histories` also writes the run's
//! history to `<dir>/<run id>.json`, as `workflow export <id>` does: the replay test
//! (`examples/tests/replay_histories.rs`) checks every such file against the current code.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use workflow_core::prelude::*;
use workflow_core::store::Event;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum OrderResult {
    Shipped { receipt: Receipt, tracking: String },
}

/// A stand-in for a payment provider that deduplicates by idempotency key, as real ones do.
fn payments() -> &'static Mutex<HashMap<String, Receipt>> {
    static P: OnceLock<Mutex<HashMap<String, Receipt>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

// The names are pinned: they identify the runs' workflow and steps in their histories, so
// moving or renaming the functions must not change them.
#[step(name = "orders.charge_card", max_retries = 5)]
async fn charge_card(order_id: String, amount_cents: u64) -> Result<Receipt> {
    let StepMetadata {
        step_id, attempt, ..
    } = step_metadata();
    println!("  charge_card attempt {attempt}, idempotency key {step_id}");
    if attempt == 1 {
        // The first call times out after the provider charged: retrying with the same key
        // must not charge again.
        payments()
            .lock()
            .unwrap()
            .entry(step_id.clone())
            .or_insert_with(|| Receipt {
                charge_id: format!("ch_{order_id}"),
                amount_cents,
            });
        return Err(
            Error::retryable("payment provider timed out").retry_after(Duration::from_millis(200))
        );
    }
    let receipt = payments()
        .lock()
        .unwrap()
        .entry(step_id)
        .or_insert_with(|| Receipt {
            charge_id: format!("ch_{order_id}"),
            amount_cents,
        })
        .clone();
    Ok(receipt)
}

#[step(name = "orders.ship")]
async fn ship(order_id: String) -> Result<String> {
    println!("  shipping {order_id}");
    Ok(format!("TRACK-{order_id}"))
}

#[workflow(name = "orders.process")]
pub async fn process_order(order_id: String, amount_cents: u64) -> Result<OrderResult> {
    let receipt = charge_card(order_id.clone(), amount_cents).await?;
    // Durable: a restart during the wait resumes here without charging again.
    sleep(Duration::from_secs(2)).await;
    let tracking = ship(order_id).await?;
    Ok(OrderResult::Shipped { receipt, tracking })
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let db = std::env::var("WORKFLOW_DB").unwrap_or_else(|_| "orders.db".into());
    let rt = Runtime::builder().sqlite(&db).build().await?;

    let order_id = format!("o-{}", &RunId::new().to_string()[20..]);
    let run = rt.start(process_order, (order_id.clone(), 4_200)).await?;
    println!(
        "started run {} for order {order_id} (database {db})",
        run.id()
    );

    let result = run.return_value().await?;
    println!("run {} {}: {result:?}", run.id(), run.status().await?);
    println!(
        "charges made by the provider: {}",
        payments().lock().unwrap().len()
    );

    println!("history:");
    for e in rt.store().events(&run.id()).await? {
        let what = match &e.event {
            Event::StepScheduled { name, step_id, .. } => {
                format!("step scheduled  {name} ({step_id})")
            }
            Event::StepAttemptStarted { attempt, .. } => format!("attempt {attempt} started"),
            Event::StepAttemptFailed { attempt, error, .. } => {
                format!("attempt {attempt} failed: {error}")
            }
            Event::StepCompleted { result, .. } => format!("step completed  ok={}", result.is_ok()),
            Event::TimerScheduled { timer_id, .. } => format!("sleep scheduled {timer_id}"),
            Event::TimerFired { timer_id } => format!("sleep ended     {timer_id}"),
            Event::RunCompleted { .. } => "run completed".into(),
            Event::RunFailed { error } => format!("run failed: {error}"),
            Event::RunCancelled => "run cancelled".into(),
            other => format!("{other:?}"),
        };
        println!("  #{:<2} {what}", e.seq);
    }

    let mut args = std::env::args().skip_while(|a| a != "--export");
    if let Some(dir) = args.nth(1) {
        let path = std::path::Path::new(&dir).join(format!("{}.json", run.id()));
        let history = serde_json::to_string_pretty(&run.export().await?)?;
        std::fs::write(&path, history + "\n")?;
        println!("history written to {}", path.display());
    }
    Ok(())
}
