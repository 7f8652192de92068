use workflow_core::prelude::*;

#[step]
const unsafe extern "C" fn ping() -> Result<()> {
    Ok(())
}

fn main() {}
