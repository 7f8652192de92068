#![deny(warnings)]
//! One explicit name under mutually exclusive `#[cfg]`s is one step in any build.

use workflow_core::prelude::*;

#[cfg(unix)]
#[step(name = "platform.probe")]
async fn probe() -> Result<String> {
    Ok("unix".into())
}

#[cfg(not(unix))]
#[step(name = "platform.probe")]
async fn probe() -> Result<String> {
    Ok("other".into())
}

#[workflow(name = "platform.check")]
async fn check() -> Result<String> {
    probe().await
}

fn main() {}
