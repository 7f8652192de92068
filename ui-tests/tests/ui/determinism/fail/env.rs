use workflow_core::prelude::*;

#[workflow]
async fn region() -> Result<String> {
    let region = std::env::var("REGION")?;
    Ok(region)
}

fn main() {}
