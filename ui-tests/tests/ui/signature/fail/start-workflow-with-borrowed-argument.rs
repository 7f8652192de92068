use workflow_core::prelude::*;

// The borrowed argument is rejected; starting the workflow with a `&str` adds no error (the
// stand-in takes any argument in its place), and the declared result is still a `String`.
#[workflow]
async fn greet(name: &str) -> Result<String> {
    Ok(format!("hello {name}"))
}

async fn client(rt: Runtime) -> Result<String> {
    let run = rt.start(greet, ("ada",)).await?;
    let greeting: String = run.return_value().await?;
    Ok(greeting)
}

fn main() {
    let _ = client;
}
