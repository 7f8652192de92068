use rand::{Rng, SeedableRng};
use workflow_core::prelude::*;

#[workflow]
async fn pick_warehouse(order_id: String) -> Result<u32> {
    let _ = order_id;
    let mut rng = rand::rngs::StdRng::from_os_rng();
    Ok(rng.random_range(0..4))
}

fn main() {}
