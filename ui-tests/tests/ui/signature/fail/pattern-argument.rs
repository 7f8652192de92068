use workflow_core::prelude::*;

#[workflow]
async fn total((price, quantity): (u64, u64)) -> Result<u64> {
    Ok(price * quantity)
}

fn main() {}
