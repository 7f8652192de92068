//! The approval example under real HTTP requests over loopback: start a review, read its
//! state, approve it, read its outcome; an unknown id is a 404.

#[allow(dead_code)]
#[path = "../approval.rs"]
mod approval;

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use workflow_core::Runtime;

/// One HTTP/1.1 request on a fresh connection; returns (status, JSON body).
async fn request(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_is_started_approved_and_read_over_http() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::builder()
            .sqlite(dir.path().join("approval.db"))
            .build()
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = approval::app(rt.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });

        let (status, started) = request(
            addr,
            "POST",
            "/approvals",
            Some(json!({"document": "budget-2027.pdf"})),
        )
        .await;
        assert_eq!(status, 200, "{started}");
        let id = started["runId"].as_str().unwrap().to_owned();
        // Waiting for the approval, as the run published.
        loop {
            let (status, state) = request(addr, "GET", &format!("/approvals/{id}"), None).await;
            assert_eq!(status, 200, "{state}");
            if state["state"] == "waiting" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (status, sent) = request(
            addr,
            "POST",
            &format!("/approvals/{id}/approve"),
            Some(json!({"by": "ana"})),
        )
        .await;
        assert_eq!(status, 200, "{sent}");
        let run = rt.get_run(&id.parse().unwrap()).typed::<String>();
        assert_eq!(run.return_value().await.unwrap(), "approved by ana");
        let (_, done) = request(addr, "GET", &format!("/approvals/{id}"), None).await;
        assert_eq!(done["status"], "completed");
        assert_eq!(done["outcome"], "approved by ana");
        assert_eq!(done["state"], "done");
        // Approving an ended review is refused; an unknown id is not found.
        let (status, _) = request(
            addr,
            "POST",
            &format!("/approvals/{id}/approve"),
            Some(json!({"by": "bo"})),
        )
        .await;
        assert_eq!(status, 409);
        let unknown = workflow_core::RunId::new();
        let (status, _) = request(addr, "GET", &format!("/approvals/{unknown}"), None).await;
        assert_eq!(status, 404);
        rt.shutdown();
    })
    .await
    .expect("the test finished in time");
}
