#![deny(warnings)]
//! A `BTreeMap` iterates in key order on every replay; a `HashMap` may be built, looked up and
//! consumed order-independently (sum, count, collecting into a `BTreeMap`).

use std::collections::{BTreeMap, HashMap};
use workflow_core::prelude::*;

#[step]
async fn charge(customer: String, cents: u64) -> Result<u64> {
    let _ = customer;
    Ok(cents)
}

#[workflow]
async fn charge_all(orders: Vec<(String, u64)>) -> Result<u64> {
    let mut by_customer = BTreeMap::new();
    let mut seen = HashMap::new();
    for (customer, cents) in orders {
        *by_customer.entry(customer.clone()).or_insert(0) += cents;
        *seen.entry(customer).or_insert(0u64) += 1;
    }
    let mut total = 0;
    for (customer, cents) in &by_customer {
        total += charge(customer.clone(), *cents).await?;
    }
    let orders: u64 = seen.values().sum();
    let customers = seen.keys().count() as u64;
    let sorted: BTreeMap<_, _> = seen.into_iter().collect();
    Ok(total + orders + customers + sorted.len() as u64)
}

fn main() {}
