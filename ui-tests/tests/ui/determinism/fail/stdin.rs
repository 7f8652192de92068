use std::io::BufRead;
use workflow_core::prelude::*;

#[workflow]
async fn confirm() -> Result<String> {
    let line = std::io::stdin().lock().lines().next().unwrap_or(Ok(String::new()))?;
    Ok(line)
}

fn main() {}
