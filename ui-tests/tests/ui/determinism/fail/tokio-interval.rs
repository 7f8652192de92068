use workflow_core::prelude::*;

#[workflow]
async fn poll_payment(order_id: String) -> Result<()> {
    let mut ticks = tokio::time::interval(Duration::from_secs(60));
    ticks.tick().await;
    let _ = order_id;
    Ok(())
}

fn main() {}
