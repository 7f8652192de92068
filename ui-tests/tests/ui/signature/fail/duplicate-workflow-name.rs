use workflow_core::prelude::*;

#[workflow(name = "orders.process")]
async fn process(order_id: String) -> Result<String> {
    Ok(order_id)
}

#[workflow(name = "orders.process")]
async fn process_v2(order_id: String) -> Result<String> {
    Ok(order_id)
}

fn main() {}
