use workflow_core::prelude::*;

#[workflow]
async fn ping() -> Result<()> {
    let stream = tokio::net::TcpStream::connect("example.com:80").await?;
    drop(stream);
    Ok(())
}

fn main() {}
