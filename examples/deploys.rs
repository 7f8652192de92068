//! Deploying new code while runs are in flight: a run that failed on a bug is retried after
//! the fix without repeating what it recorded, a copy of it is forked from a chosen step, and
//! a new code path is introduced with `patched` so runs that started before it keep replaying
//! the old one.
//!
//! ```text
//! cargo run --example deploys
//! ```
//!
//! "The fix" is a flag here ([`deploy_the_fix`]); in a service it is a new build taking over
//! the database. The database is a fresh SQLite file in the temporary directory
//! (`WORKFLOW_DB` overrides it).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use workflow_core::prelude::*;

static FIXED: AtomicBool = AtomicBool::new(false);
static RESERVATIONS: AtomicU32 = AtomicU32::new(0);
static RECEIPTS: AtomicU32 = AtomicU32::new(0);

/// Ships the fix of the charge step's bug.
pub fn deploy_the_fix() {
    FIXED.store(true, Ordering::SeqCst);
}

/// How many times the stock was reserved and receipts were sent.
pub fn counts() -> (u32, u32) {
    (
        RESERVATIONS.load(Ordering::SeqCst),
        RECEIPTS.load(Ordering::SeqCst),
    )
}

#[step(name = "deploys.reserve")]
async fn reserve(order: String) -> Result<String> {
    RESERVATIONS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("R-{order}"))
}

/// Fails until the fix is deployed (one attempt: no retries).
#[step(name = "deploys.charge", max_retries = 0)]
async fn charge(order: String) -> Result<u64> {
    if !FIXED.load(Ordering::SeqCst) {
        return Err(Error::retryable(format!(
            "charging {order}: the amount was sent in euros, not cents"
        )));
    }
    Ok(4_200)
}

#[step(name = "deploys.receipt")]
async fn send_receipt(order: String) -> Result<()> {
    RECEIPTS.fetch_add(1, Ordering::SeqCst);
    let _ = order;
    Ok(())
}

/// Reserves, charges, and (since the patch "receipts") sends a receipt.
#[workflow(name = "deploys.ship")]
pub async fn ship(order: String) -> Result<String> {
    let reservation = reserve(order.clone()).await?;
    let cents = charge(order.clone()).await?;
    // Runs recorded before this patch replay without it; runs that reach it live take it.
    if patched("receipts") {
        send_receipt(order).await?;
    }
    Ok(format!("{reservation}: charged {cents} cents"))
}

/// What the demo saw.
#[derive(Debug)]
pub struct Outcome {
    pub failed_with: String,
    pub retried: String,
    pub forked: String,
    pub forked_from: RunId,
    pub reservations: u32,
    pub receipts: u32,
}

/// A run fails on the bug; the fix is deployed; `retry()` re-opens the run, which goes on
/// from its failed step (the reservation is not made again); `fork(1)` copies the run's first
/// step's result into a new run that executes the rest again with the current code.
pub async fn demo(rt: &Runtime) -> anyhow::Result<Outcome> {
    let run = rt.start(ship, ("o-7".to_string(),)).await?;
    let failed_with = match run.return_value().await {
        Ok(out) => anyhow::bail!("the run should have failed on the bug, got {out:?}"),
        Err(e) => e.to_string(),
    };
    deploy_the_fix();
    run.retry().await?;
    let retried = run.return_value().await?;
    let copy = run.fork(1).await?;
    let forked = copy.return_value().await?;
    let (reservations, receipts) = counts();
    Ok(Outcome {
        failed_with,
        retried,
        forked,
        forked_from: run.id(),
        reservations,
        receipts,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::var("WORKFLOW_DB").unwrap_or_else(|_| {
        let file = format!("deploys-{}.db", std::process::id());
        std::env::temp_dir().join(file).display().to_string()
    });
    let rt = Runtime::builder().sqlite(&path).build().await?;
    let out = demo(&rt).await?;
    println!("failed on the bug: {}", out.failed_with);
    println!("retried after the fix: {}", out.retried);
    println!("forked from {} at step 1: {}", out.forked_from, out.forked);
    println!(
        "stock reserved {} time(s), {} receipt(s) sent",
        out.reservations, out.receipts
    );
    Ok(())
}
