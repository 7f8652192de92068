use workflow_core::prelude::*;

// Half-typed: the step's body does not parse. The one error is the syntax error; the workflow
// that awaits the step adds none.
#[step]
async fn charge(cents: u64) -> Result<u64> {
    let fee = match cents { 0 => , _ => 30 };
    Ok(cents + fee)
}

#[workflow]
async fn checkout(cents: u64) -> Result<u64> {
    let charged = charge(cents).await?;
    Ok(charged)
}

fn main() {}
