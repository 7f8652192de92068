use std::time::SystemTime;
use workflow_core::prelude::*;

#[workflow]
async fn stamp(order_id: String) -> Result<String> {
    let at = SystemTime::now();
    Ok(format!("{order_id} at {at:?}"))
}

fn main() {}
