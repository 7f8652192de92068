use workflow_core::prelude::*;

pub struct Receipt {
    id: String,
}

#[step]
async fn charge(cents: u64) -> Result<Receipt> {
    Ok(Receipt { id: cents.to_string() })
}

#[workflow]
async fn checkout(cents: u64) -> Result<Receipt> {
    charge(cents).await
}

fn main() {}
