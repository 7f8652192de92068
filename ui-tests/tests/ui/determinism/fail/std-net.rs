use workflow_core::prelude::*;

#[workflow]
async fn ping() -> Result<()> {
    let stream = std::net::TcpStream::connect("example.com:80")?;
    drop(stream);
    Ok(())
}

fn main() {}
