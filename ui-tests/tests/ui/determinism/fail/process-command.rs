use workflow_core::prelude::*;

#[workflow]
async fn archive(order_id: String) -> Result<()> {
    std::process::Command::new("tar").arg(order_id).status()?;
    Ok(())
}

fn main() {}
