//! `?` in a step on an error that is not a `std::error::Error` (here a `String`): the message
//! says what `?` converts and how to convert the rest.

use workflow_core::prelude::*;

fn lookup(key: &str) -> std::result::Result<u64, String> {
    Err(format!("no {key}"))
}

#[step]
async fn read(key: String) -> Result<u64> {
    let value = lookup(&key)?;
    Ok(value)
}

fn main() {}
