use workflow_core::prelude::*;

#[workflow]
async fn new_order() -> Result<String> {
    let id = ulid::Ulid::new();
    Ok(id.to_string())
}

fn main() {}
