use std::borrow::Cow;
use workflow_core::prelude::*;

#[step]
async fn greet(name: Cow<'static, str>, nick: Cow<'_, str>) -> Result<String> {
    Ok(format!("{name} {nick}"))
}

fn main() {}
