use workflow_core::prelude::*;

#[workflow]
async fn checksum(data: Vec<u8>) -> Result<u64> {
    let sum = tokio::task::spawn_blocking(move || data.iter().map(|b| u64::from(*b)).sum::<u64>())
        .await
        .map_err(|e| Error::fatal(e.to_string()))?;
    Ok(sum)
}

fn main() {}
