//! The OTLP example runs to its end with no collector listening: the export fails, is logged,
//! and nothing else fails.
#![cfg(feature = "otel")]

#[allow(dead_code)]
#[path = "../otel.rs"]
mod otel_example;

use std::time::Duration;

#[test]
fn the_example_runs_without_a_collector() {
    // A port nobody listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::env::set_var(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{port}"),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ended = otel_example::main().map_err(|e| e.to_string());
        let _ = tx.send(ended);
    });
    let ended = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the example ends within 60 s");
    assert_eq!(ended, Ok(()));
}
