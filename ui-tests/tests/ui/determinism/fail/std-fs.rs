use std::fs;
use workflow_core::prelude::*;

#[workflow]
async fn load_config() -> Result<String> {
    let config = fs::read_to_string("config.toml")?;
    Ok(config)
}

fn main() {}
