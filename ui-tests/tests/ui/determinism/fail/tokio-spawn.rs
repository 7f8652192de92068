use workflow_core::prelude::*;

#[workflow]
async fn audit(order_id: String) -> Result<()> {
    tokio::spawn(async move { println!("audit {order_id}") });
    Ok(())
}

fn main() {}
