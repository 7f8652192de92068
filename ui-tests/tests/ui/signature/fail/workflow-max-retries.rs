use workflow_core::prelude::*;

#[workflow(max_retries = 3)]
async fn process(order_id: String) -> Result<String> {
    Ok(order_id)
}

fn main() {}
