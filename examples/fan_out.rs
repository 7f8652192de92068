//! Fan-out and fan-in with child runs, and a start that begins later.
//!
//! `price_basket` starts one child run per item (`start_child`), then waits for all of them
//! (`child.return_value()`): each child is a run of its own, with its own history and retries,
//! and the parent is suspended (and may be evicted from memory) until each child's end wakes
//! it, also when the children run on other workers. A start is recorded, so a replay of the
//! parent finds the same children instead of starting them twice. Then a reminder run is
//! admitted now and begins a little later (`.delay(..)`): it is listed as `Pending` meanwhile.
//!
//! ```text
//! cargo run --example fan_out
//! ```
//!
//! The database is a fresh SQLite file in the temporary directory (`WORKFLOW_DB` overrides it).

use std::time::Duration;

use workflow_core::prelude::*;

/// A stand-in for a price service.
#[step(name = "fan_out.quote")]
async fn quote(item: String) -> Result<u64> {
    Ok(item.len() as u64 * 100)
}

/// One child per item: asks for its price.
#[workflow(name = "fan_out.price_item")]
pub async fn price_item(item: String) -> Result<u64> {
    quote(item).await
}

/// Starts a child per item, then adds up what they return, in the order they were started.
#[workflow(name = "fan_out.price_basket")]
pub async fn price_basket(items: Vec<String>) -> Result<u64> {
    let mut children = Vec::new();
    for item in items {
        children.push(start_child(price_item, (item,)).await?);
    }
    let mut total = 0;
    for child in children {
        total += child.return_value().await?;
    }
    Ok(total)
}

/// A reminder that a delayed start begins later.
#[workflow(name = "fan_out.remind")]
pub async fn remind(who: String) -> Result<String> {
    Ok(format!("reminded {who}"))
}

/// What the demo saw: the basket's total, its children's ids, the reminder's status before
/// it began and its output.
#[derive(Debug)]
pub struct Outcome {
    pub total: u64,
    pub children: usize,
    pub reminder_before: RunStatus,
    pub reminder: String,
}

/// Prices a basket of three items through three child runs, then starts a reminder that
/// begins after `delay`.
pub async fn demo(rt: &Runtime, delay: Duration) -> anyhow::Result<Outcome> {
    let items = vec!["apple".to_string(), "fig".to_string(), "banana".to_string()];
    let run = rt.start(price_basket, (items,)).await?;
    let total = run.return_value().await?;
    let children = rt
        .runs(RunFilter::new().workflow("fan_out.price_item"))
        .await?
        .len();

    let reminder = rt.start(remind, ("ana".to_string(),)).delay(delay).await?;
    let reminder_before = reminder.status().await?;
    let reminder = reminder.return_value().await?;
    Ok(Outcome {
        total,
        children,
        reminder_before,
        reminder,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::var("WORKFLOW_DB").unwrap_or_else(|_| {
        let file = format!("fan_out-{}.db", std::process::id());
        std::env::temp_dir().join(file).display().to_string()
    });
    let rt = Runtime::builder().sqlite(&path).build().await?;
    let out = demo(&rt, Duration::from_secs(2)).await?;
    println!(
        "basket total {} from {} child runs; the reminder was {:?} before it began, then: {}",
        out.total, out.children, out.reminder_before, out.reminder
    );
    Ok(())
}
