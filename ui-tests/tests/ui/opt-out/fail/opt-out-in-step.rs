use std::time::SystemTime;
use workflow_core::prelude::*;

#[step]
async fn stamp(order_id: String) -> Result<String> {
    #[workflow::allow(nondeterministic)]
    let at = SystemTime::now();
    Ok(format!("{order_id} {at:?}"))
}

fn main() {}
