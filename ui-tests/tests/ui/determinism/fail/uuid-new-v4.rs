use workflow_core::prelude::*;

#[workflow]
async fn new_order() -> Result<String> {
    let id = uuid::Uuid::new_v4();
    Ok(id.to_string())
}

fn main() {}
