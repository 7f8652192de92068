use workflow_core::prelude::*;

#[workflow]
async fn coin_flip(order_id: String) -> Result<bool> {
    let _ = order_id;
    Ok(rand::random())
}

fn main() {}
