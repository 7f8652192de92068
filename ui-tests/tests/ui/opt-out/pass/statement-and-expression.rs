#![deny(warnings)]
//! `#[workflow::allow(nondeterministic)]` accepts the statement or expression it marks, and is
//! gone from the code the compiler sees (an attribute on an expression would be unstable).

use std::time::{Instant, SystemTime};
use workflow_core::prelude::*;

#[workflow]
async fn process(order_id: String) -> Result<String> {
    // Timing for a log line only: it never decides what the workflow does.
    #[workflow::allow(nondeterministic, reason = "log timing only")]
    let started = Instant::now();

    #[workflow::allow(nondeterministic)]
    println!("{order_id} replayed at {:?}", SystemTime::now());

    let label = format!(
        "{order_id}-{}",
        #[workflow::allow(nondeterministic)]
        std::process::id()
    );
    let elapsed = started.elapsed();
    Ok(format!("{label} {elapsed:?}"))
}

fn main() {}
