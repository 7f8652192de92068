#![deny(warnings)]
//! `select!` with `biased;` polls its branches in order, and `join!` polls every future: both
//! take the same path on every replay.

use workflow_core::prelude::*;

#[step]
async fn ask_customer(order_id: String) -> Result<String> {
    Ok(order_id)
}

#[step]
async fn reserve(order_id: String) -> Result<u32> {
    Ok(order_id.len() as u32)
}

#[workflow]
async fn first_reply(order_id: String) -> Result<String> {
    let reply = tokio::select! {
        biased;
        reply = ask_customer(order_id.clone()) => reply?,
        _ = sleep(Duration::from_secs(3600)) => format!("{order_id}: no reply"),
    };
    let (a, b) = futures::join!(reserve(order_id.clone()), reserve(reply.clone()));
    let (c, d) = futures::try_join!(reserve(order_id.clone()), reserve(reply.clone()))?;
    let e = futures::select_biased! {
        e = futures::FutureExt::fuse(Box::pin(reserve(order_id))) => e?,
        default => 0,
    };
    Ok(format!("{reply} {} {c} {d} {e}", a? + b?))
}

fn main() {}
