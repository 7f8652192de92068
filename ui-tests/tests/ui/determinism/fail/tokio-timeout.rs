use workflow_core::prelude::*;

#[workflow]
async fn wait_for_payment(order_id: String) -> Result<bool> {
    let paid = tokio::time::timeout(Duration::from_secs(60), async move { !order_id.is_empty() })
        .await
        .unwrap_or(false);
    Ok(paid)
}

fn main() {}
