use workflow_core::prelude::*;

#[step]
async fn charge(#[cfg(unix)] tip: u64, cents: u64) -> Result<u64> {
    #[cfg(unix)]
    let cents = cents + tip;
    Ok(cents)
}

fn main() {}
