use workflow_core::prelude::*;

#[step]
async fn notify(message: impl Into<String>) -> Result<()> {
    let _ = message.into();
    Ok(())
}

fn main() {}
