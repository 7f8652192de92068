//! Shared by the example tests that drive an example's HTTP routes over loopback.

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request on a fresh connection; returns (status, JSON body).
pub async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).await.unwrap();
    let text = String::from_utf8(resp).unwrap();
    let status: u16 = text.split(' ').nth(1).unwrap().parse().unwrap();
    let json = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}
