use workflow_core::prelude::*;

#[step]
fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

fn main() {}
