use workflow_core::prelude::*;

struct Billing;

impl Billing {
    #[step]
    async fn charge(&self, cents: u64) -> Result<u64> {
        Ok(cents)
    }
}

fn main() {}
