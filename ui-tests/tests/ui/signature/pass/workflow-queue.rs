use workflow_core::prelude::*;

#[workflow(queue = "payments", name = "orders.charge")]
async fn charge(cents: u64) -> Result<u64> {
    Ok(cents)
}

fn main() {
    use workflow_core::WorkflowDef as _;
    let _ = charge;
    assert_eq!(__WorkflowDef_charge::QUEUE, Some("payments"));
}
