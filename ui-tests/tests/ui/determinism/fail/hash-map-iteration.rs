use std::collections::HashMap;
use workflow_core::prelude::*;

#[workflow]
async fn charge_all(orders: Vec<(String, u64)>) -> Result<u64> {
    let mut by_customer = HashMap::new();
    for (customer, cents) in orders {
        *by_customer.entry(customer).or_insert(0) += cents;
    }
    let mut total = 0;
    for (customer, cents) in &by_customer {
        total += charge(customer.clone(), *cents).await?;
    }
    Ok(total)
}

#[step]
async fn charge(customer: String, cents: u64) -> Result<u64> {
    let _ = customer;
    Ok(cents)
}

fn main() {}
