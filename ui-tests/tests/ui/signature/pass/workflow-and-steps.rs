use workflow_core::prelude::*;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Order {
    id: String,
}

/// Docs and visibility are kept.
#[step(name = "billing.charge", max_retries = 5)]
pub async fn charge(order: Order, mut cents: u64) -> Result<u64> {
    cents += order.id.len() as u64;
    Ok(cents)
}

#[step]
async fn nothing() -> Result<()> {
    Ok(())
}

#[workflow(name = "orders.process")]
pub async fn process(order: Order) -> Result<u64> {
    nothing().await?;
    charge(order, 100).await
}

#[workflow]
async fn no_args() -> Result<Vec<String>> {
    Ok(Vec::new())
}

async fn client(rt: Runtime) -> std::result::Result<(), StartError> {
    let run: Run<u64> = rt.start(process, (Order { id: "o-1".into() },)).await?;
    let _ = run.id();
    let _ = rt.start(no_args, ()).await?;
    Ok(())
}

fn main() {
    let _ = client;
}
