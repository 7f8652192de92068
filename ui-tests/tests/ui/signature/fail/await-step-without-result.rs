use workflow_core::prelude::*;

// The missing return type is rejected; the workflow that uses `?` on the step, as it would once
// the step returns `Result<()>`, adds no error.
#[step]
async fn log_event(event: String) {
    println!("{event}");
}

#[workflow]
async fn checkout(order_id: String) -> Result<()> {
    log_event(order_id).await?;
    Ok(())
}

fn main() {}
