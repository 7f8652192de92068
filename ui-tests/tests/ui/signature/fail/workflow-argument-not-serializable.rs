use workflow_core::prelude::*;

pub struct Card {
    number: String,
}

#[derive(serde::Serialize)]
pub struct Address {
    street: String,
}

#[workflow]
async fn checkout(order_id: String, card: Card, address: Address) -> Result<u64> {
    Ok((order_id.len() + card.number.len() + address.street.len()) as u64)
}

async fn client(rt: Runtime, card: Card, address: Address) {
    // The start call itself type-checks: only the types are reported.
    let _ = rt.start(checkout, ("o-1".to_string(), card, address)).await;
}

fn main() {
    let _ = client;
}
