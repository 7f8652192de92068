#![deny(warnings)]
//! A worker binary may only register a workflow (the runtime finds it through the registry)
//! and never call the fn itself: that is not dead code.

use workflow_core::prelude::*;

#[step]
async fn ship(order_id: String) -> Result<String> {
    Ok(order_id)
}

#[workflow]
async fn fulfil(order_id: String) -> Result<String> {
    ship(order_id).await
}

fn main() {}
