//! An application exporting its own metrics, the runtime's among them, with
//! `metrics-exporter-prometheus`: the recorder is installed once at start-up, and every metric
//! the runtime emits (docs/metrics.md) is served at `http://<addr>/metrics` for Prometheus to
//! scrape, beside the store-wide gauges `workflow web` serves.
//!
//! ```text
//! cargo run --example metrics
//! METRICS_ADDR=127.0.0.1:9464 METRICS_SERVE_SECS=600 cargo run --example metrics
//! ```
//!
//! It runs a few orders through a queue (one fails on purpose, one retries), prints the
//! `workflow_*` lines of its own endpoint, and keeps serving for `METRICS_SERVE_SECS` seconds
//! (default 0) so a Prometheus server can scrape it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use workflow_core::prelude::*;
use workflow_core::Queue;

/// Failures left for `reserve_stock` before it succeeds (one retry, to see it counted).
static FLAKY: AtomicU32 = AtomicU32::new(1);

#[step]
async fn reserve_stock(order: u32) -> Result<u32> {
    if FLAKY
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return Err(Error::retryable("the stock service is busy"));
    }
    Ok(order)
}

#[step]
async fn charge(order: u32) -> Result<u32> {
    if order == 13 {
        return Err(Error::fatal("card declined"));
    }
    Ok(order * 100)
}

#[workflow]
pub async fn fulfil(order: u32) -> Result<u32> {
    let order = reserve_stock(order).await?;
    charge(order).await
}

/// The queue the orders go through.
pub fn orders_queue() -> Queue {
    Queue::new("orders").concurrency(4)
}

/// Installs the Prometheus recorder serving `addr` (the process's one recorder).
pub fn install_exporter(addr: SocketAddr) -> std::result::Result<(), Box<dyn std::error::Error>> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()?;
    Ok(())
}

/// Runs `n` orders through the queue, order 13 failing; how many completed.
pub async fn run_orders(
    rt: &Runtime,
    n: u32,
) -> std::result::Result<u32, Box<dyn std::error::Error>> {
    let mut runs = Vec::new();
    for order in 1..=n {
        runs.push(rt.start(fulfil, (order,)).queue("orders").await?);
    }
    let mut completed = 0;
    for run in runs {
        if run.return_value().await.is_ok() {
            completed += 1;
        }
    }
    Ok(completed)
}

/// The body of `GET /metrics` at `addr`, over plain HTTP/1.0.
pub async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut text = String::new();
    conn.read_to_string(&mut text).await?;
    Ok(text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned()))
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9464".to_owned())
        .parse()?;
    let serve_for: u64 = std::env::var("METRICS_SERVE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    install_exporter(addr)?;
    let dir = tempfile_dir()?;
    let rt = Runtime::builder()
        .sqlite(dir.join("metrics-example.db"))
        .queue(orders_queue())
        .retry_backoff(Duration::from_millis(50))
        .build()
        .await?;
    let completed = run_orders(&rt, 20).await?;
    println!("{completed} of 20 orders completed; serving metrics at http://{addr}/metrics");
    for line in scrape(addr).await?.lines() {
        if line.starts_with("workflow_") {
            println!("{line}");
        }
    }
    if serve_for > 0 {
        tokio::time::sleep(Duration::from_secs(serve_for)).await;
    }
    Ok(())
}

/// A directory of its own under the system's temporary directory for the example's database.
fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("workflow-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
