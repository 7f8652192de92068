//! The approval example under real HTTP requests over loopback: start a review, read its
//! state, approve it, read its outcome; an unknown id is a 404.

#[allow(dead_code)]
#[path = "../approval.rs"]
mod approval;

mod common;

use std::time::Duration;

use common::request;
use serde_json::json;
use workflow_core::Runtime;

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
