//! The HTTP example under real HTTP requests over loopback.

#[allow(dead_code)]
#[path = "../orders_http.rs"]
mod orders_http;

mod common;

use std::time::Duration;

use common::request;
use serde_json::json;
use workflow_core::Runtime;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicate_posts_meet_one_run() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::builder()
            .sqlite(dir.path().join("http.db"))
            .build()
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = orders_http::app(rt.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });

        let order = format!("o-{}", workflow_core::RunId::new());
        let posts: Vec<_> = (0..100)
            .map(|i| {
                let order = order.clone();
                tokio::spawn(async move {
                    request(
                        addr,
                        "POST",
                        "/api/orders",
                        Some(json!({"orderId": order, "note": format!("note {i}")})),
                    )
                    .await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for p in posts {
            let (status, body) = p.await.unwrap();
            assert_eq!(status, 200, "{body}");
            answers.push(body);
        }
        let run_id = &answers[0]["runId"];
        assert!(
            answers.iter().all(|a| &a["runId"] == run_id),
            "one run for all"
        );
        assert_eq!(
            answers.iter().filter(|a| a["started"] == true).count(),
            1,
            "exactly one started it"
        );

        // A malformed request is answered with an error, not a crash.
        let (status, _) = request(addr, "POST", "/api/orders", Some(json!({"orderId": ""}))).await;
        assert!(status >= 400);
        // Sent after every note was accepted: the run ends once it has recorded them all.
        let (status, body) = request(
            addr,
            "POST",
            "/api/orders",
            Some(json!({"orderId": order, "note": "close"})),
        )
        .await;
        assert_eq!((status, &body["started"]), (200, &json!(false)));
        let id: workflow_core::RunId = serde_json::from_value(run_id.clone()).unwrap();
        let recorded = rt.get_run(&id).return_value().await.unwrap();
        assert_eq!(recorded, json!(100), "the run counted each note once");

        // The owner recorded all 100 notes, each once.
        let (_, body) = request(addr, "GET", &format!("/api/orders/{order}"), None).await;
        let mut notes: Vec<String> = serde_json::from_value(body["notes"].clone()).unwrap();
        notes.sort();
        let mut want: Vec<String> = (0..100).map(|i| format!("note {i}")).collect();
        want.sort();
        assert_eq!(notes, want, "each note recorded once");
    })
    .await
    .expect("test timed out");
}
