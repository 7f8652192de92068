use workflow_core::prelude::*;

pub struct Card {
    number: String,
}

#[step]
async fn charge(card: Card) -> Result<u64> {
    Ok(card.number.len() as u64)
}

fn main() {}
