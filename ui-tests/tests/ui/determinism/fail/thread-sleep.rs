use std::time::Duration;
use workflow_core::prelude::*;

#[workflow]
async fn wait_for_payment(order_id: String) -> Result<()> {
    std::thread::sleep(Duration::from_secs(60));
    let _ = order_id;
    Ok(())
}

fn main() {}
