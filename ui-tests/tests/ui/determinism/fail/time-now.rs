use workflow_core::prelude::*;

#[workflow]
async fn stamp(order_id: String) -> Result<String> {
    let at = time::OffsetDateTime::now_utc();
    Ok(format!("{order_id} at {at}"))
}

fn main() {}
