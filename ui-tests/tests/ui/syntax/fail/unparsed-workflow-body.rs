use workflow_core::prelude::*;

// Half-typed: the body does not parse. The one error is the syntax error; starting the workflow
// elsewhere adds none.
#[workflow]
async fn process(order_id: String) -> Result<u64> {
    let total = order_id.len() as u64 +;
    Ok(total)
}

async fn client(rt: Runtime) -> Result<u64> {
    let run = rt.start(process, ("o-1".to_string(),)).await?;
    let total: u64 = run.return_value().await?;
    Ok(total)
}

fn main() {
    let _ = client;
}
