use workflow_core::prelude::*;

// The workflow is rejected; starting it elsewhere, and reading its result, adds no error.
#[workflow]
fn process(order_id: String) -> Result<u64> {
    Ok(order_id.len() as u64)
}

async fn client(rt: Runtime) -> Result<u64> {
    let run = rt.start(process, ("o-1".to_string(),)).await?;
    let total: u64 = run.return_value().await?;
    Ok(total)
}

fn main() {
    let _ = client;
}
