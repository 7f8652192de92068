use workflow_core::prelude::*;

#[workflow]
async fn wait_for_payment(order_id: String) -> Result<()> {
    tokio::time::sleep(Duration::from_secs(60)).await;
    let _ = order_id;
    Ok(())
}

fn main() {}
