//! The metrics example: the runtime's metrics reach the application's Prometheus exporter and
//! are served in the text format, counted as the orders went (19 completed, order 13 failed,
//! one retried attempt).

#[allow(dead_code)]
#[path = "../metrics.rs"]
mod metrics_example;

use std::time::Duration;

use workflow_core::Runtime;

/// The value of the first sample of `text` whose series starts with `name` and holds every
/// one of `labels`.
fn value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|p| l.contains(p)))
        .find_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_serves_the_runtime_s_counts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    metrics_example::install_exporter(addr).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .sqlite(dir.path().join("metrics.db"))
        .queue(metrics_example::orders_queue())
        .retry_backoff(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let completed = tokio::time::timeout(
        Duration::from_secs(60),
        metrics_example::run_orders(&rt, 20),
    )
    .await
    .expect("the orders ran in time")
    .unwrap();
    assert_eq!(completed, 19);
    let text = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match metrics_example::scrape(addr).await {
                Ok(t) if t.contains("workflow_runs_ended_total") => return t,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("the exporter answered");
    let fulfil = "fulfil\"";
    assert_eq!(
        value(&text, "workflow_runs_started_total", &[fulfil]),
        Some(20.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "workflow_runs_ended_total",
            &[fulfil, "status=\"completed\""]
        ),
        Some(19.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "workflow_runs_ended_total",
            &[fulfil, "status=\"failed\""]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "workflow_step_attempts_total",
            &["reserve_stock\"", "outcome=\"error\""]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "workflow_queue_wait_seconds_count",
            &["queue=\"orders\""]
        ),
        Some(20.0),
        "{text}"
    );
}
