use workflow_core::prelude::*;

#[workflow]
async fn audit(order_id: String) -> Result<()> {
    std::thread::spawn(move || println!("audit {order_id}"));
    Ok(())
}

fn main() {}
