use workflow_core::prelude::*;

// The step is rejected; awaiting it in a workflow adds no error.
#[step]
fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

#[workflow]
async fn checkout(cents: u64) -> Result<u64> {
    let charged = charge(cents).await?;
    Ok(charged)
}

fn main() {}
