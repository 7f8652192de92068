use workflow_core::prelude::*;

#[workflow]
async fn generic<T: serde::Serialize>(value: T) -> Result<()> {
    let _ = value;
    Ok(())
}

fn main() {}
