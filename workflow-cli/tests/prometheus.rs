//! A real Prometheus server (Debian's `prometheus`, 2.42) scrapes the metrics example
//! (`cargo run --example metrics`, the application's own exporter) and `workflow web`'s
//! `/metrics` every second, and the test reads back through Prometheus's HTTP query API
//! (`/api/v1/query`) the runs the example ended (`workflow_runs_ended_total`) and a queue's
//! waiting runs (`workflow_queue_waiting`) as the store holds them. On SQLite and PostgreSQL
//! (the store `workflow web` reads). Without the `prometheus` binary the test is skipped with
//! a line on stderr; under `CI=true` it fails.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::http::{dashboard, get};
use common::{skip, welcome, Backend, TestDb, WAIT};
use workflow_core::Queue;

on_both_stores!(prometheus_scrapes_the_example_and_the_dashboard);

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// Kills and reaps a child process when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The metrics example's binary, which `cargo test --workspace` builds beside this test's
/// (`target/<profile>/examples/metrics`).
fn example_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile = exe.parent()?.parent()?;
    let path = profile.join("examples").join("metrics");
    path.exists().then_some(path)
}

/// `s` percent-encoded for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Polls `check` every 200 ms until it gives a value, for at most [`WAIT`]; `what` names the
/// wait in the failure.
async fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The samples of an instant query's answer: (labels, value).
fn vector(answer: &serde_json::Value) -> Vec<(serde_json::Value, f64)> {
    assert_eq!(answer["status"], "success", "{answer}");
    answer["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let v = s["value"][1].as_str().unwrap_or("NaN").parse().unwrap();
            (s["metric"].clone(), v)
        })
        .collect()
}

/// `GET path` from Prometheus over HTTP/1.0 (no chunked answers): status and body; `None`
/// when it does not answer (yet).
fn prom_get(prom: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&prom, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {prom}\r\n\r\n").as_bytes())
        .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Prometheus's answer to the instant query `q`.
fn query(prom: SocketAddr, q: &str) -> serde_json::Value {
    let (status, body) = prom_get(prom, &format!("/api/v1/query?query={}", encode(q)))
        .unwrap_or_else(|| panic!("prometheus did not answer the query {q}"));
    assert_eq!(status, 200, "{q}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Starts Prometheus on `port`, its storage in `dir`, scraping `example` and `web` every
/// second.
fn start_prometheus(dir: &Path, port: u16, example: SocketAddr, web: SocketAddr) -> Killed {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n\
             \x20 - job_name: example\n    static_configs:\n      - targets: ['{example}']\n\
             \x20 - job_name: web\n    static_configs:\n      - targets: ['{web}']\n"
        ),
    )
    .unwrap();
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start prometheus");
    Killed(child)
}

async fn prometheus_scrapes_the_example_and_the_dashboard(b: Backend) {
    if !Path::new(PROMETHEUS).exists() {
        skip(&format!(
            "{PROMETHEUS} is missing (Debian's `prometheus` package)"
        ));
        return;
    }
    let Some(example) = example_binary() else {
        skip("the metrics example is not built (`cargo test --workspace` builds it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();

    // The example: 20 orders (19 complete, order 13 fails), then it keeps serving.
    let example_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let _example = Killed(
        Command::new(example)
            .env("METRICS_ADDR", example_addr.to_string())
            .env("METRICS_SERVE_SECS", "300")
            .env("TMPDIR", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start the metrics example"),
    );

    // A store with three runs waiting in queue "mail", nobody driving them.
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .worker(false)
        .queue(Queue::new("mail").concurrency(1))
        .build()
        .await
        .unwrap();
    for who in ["ana", "bo", "cy"] {
        rt.start(welcome, (who.to_owned(),))
            .queue("mail")
            .await
            .unwrap();
    }
    let web = dashboard(&db.args(), &["--port", "0"], &[]);
    let direct = get(web.addr, "/metrics", &web.addr.to_string());
    let waiting_line = r#"workflow_queue_waiting{queue="mail"} 3"#;
    assert!(direct.body.contains(waiting_line), "{}", direct.body);

    let prom: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let _prometheus = start_prometheus(dir.path(), prom.port(), example_addr, web.addr);
    until("prometheus ready", || {
        (prom_get(prom, "/-/ready")?.0 == 200).then_some(())
    })
    .await;

    let ended = until(
        "workflow_runs_ended_total of the example's 20 orders",
        || {
            let got = vector(&query(prom, r#"workflow_runs_ended_total{job="example"}"#));
            let total: f64 = got.iter().map(|(_, v)| v).sum();
            (total == 20.0).then_some(got)
        },
    )
    .await;
    for (labels, value) in &ended {
        let (workflow, status) = (&labels["workflow"], &labels["status"]);
        println!("prometheus ({b:?}): workflow_runs_ended_total{{workflow={workflow}, status={status}}} = {value}");
        assert_eq!(workflow, "metrics::fulfil", "{labels}");
        match status.as_str() {
            Some("completed") => assert_eq!(*value, 19.0),
            Some("failed") => assert_eq!(*value, 1.0),
            other => panic!("an unexpected status {other:?}"),
        }
    }

    let waiting = until("workflow_queue_waiting of queue mail", || {
        let got = vector(&query(
            prom,
            r#"workflow_queue_waiting{job="web",queue="mail"}"#,
        ));
        got.first().map(|(_, v)| *v)
    })
    .await;
    println!("prometheus ({b:?}): workflow_queue_waiting{{queue=\"mail\"}} = {waiting}");
    assert_eq!(waiting, 3.0);
}
