use workflow_core::prelude::*;

#[step]
async fn log_event(event: String) {
    println!("{event}");
}

fn main() {}
