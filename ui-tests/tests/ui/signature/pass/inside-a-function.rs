#![deny(warnings)]
//! Steps and workflows defined inside a function (as in a test) expand and register like any
//! other, explicit names included.

use workflow_core::prelude::*;

fn main() {
    #[step(name = "local.double")]
    async fn double(n: u64) -> Result<u64> {
        Ok(n * 2)
    }

    #[workflow(name = "local.twice")]
    async fn twice(n: u64) -> Result<u64> {
        let once = double(n).await?;
        double(once).await
    }

    let _ = twice;
}
