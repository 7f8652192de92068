use workflow_core::prelude::*;

#[workflow]
async fn new_order() -> Result<String> {
    let id = uuid::Uuid::now_v7();
    Ok(id.to_string())
}

fn main() {}
