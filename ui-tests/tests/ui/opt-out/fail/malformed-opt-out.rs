use std::time::SystemTime;
use workflow_core::prelude::*;

#[workflow]
async fn stamp(order_id: String) -> Result<String> {
    #[workflow::allow]
    let a = SystemTime::now();
    #[workflow::allow(random)]
    let b = SystemTime::now();
    #[workflow::alow(nondeterministic)]
    let c = SystemTime::now();
    Ok(format!("{order_id} {a:?} {b:?} {c:?}"))
}

fn main() {}
