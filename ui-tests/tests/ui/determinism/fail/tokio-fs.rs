use workflow_core::prelude::*;

#[workflow]
async fn load_config() -> Result<String> {
    let config = tokio::fs::read_to_string("config.toml").await?;
    Ok(config)
}

fn main() {}
