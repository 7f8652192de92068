use workflow_core::prelude::*;

#[workflow]
async fn process(order_id: String) -> Result<()> {
    let _ = order_id;
    Ok(())
}

async fn client(rt: Runtime) {
    let _ = rt.start(process, (42u32,)).await;
}

fn main() {
    let _ = client;
}
