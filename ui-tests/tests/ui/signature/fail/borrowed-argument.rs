use workflow_core::prelude::*;

#[workflow]
async fn greet(name: &str) -> Result<String> {
    Ok(name.to_owned())
}

fn main() {}
