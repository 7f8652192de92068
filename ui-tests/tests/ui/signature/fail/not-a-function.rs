use workflow_core::prelude::*;

#[step]
struct Charge {
    cents: u64,
}

fn main() {}
