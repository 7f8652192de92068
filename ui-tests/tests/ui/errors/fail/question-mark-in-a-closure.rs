//! A closure inside a step has its own return type: its `?` is the plain one, which converts
//! only `workflow_core::Error` and this crate's own errors; other errors need `Error::new`.

use workflow_core::prelude::*;

#[step]
async fn parse_all(texts: Vec<String>) -> Result<Vec<u64>> {
    texts
        .iter()
        .map(|t| -> Result<u64> { Ok(t.parse::<u64>()?) })
        .collect()
}

fn main() {}
