//! Traces exported with OTLP (feature `otel`): a run is one trace. The start of the
//! run is a `workflow.start` span inside the caller's span (here `checkout`), and every step
//! attempt, in whatever process and after whatever crash, is a `step` span under it, with
//! `workflow.run_id`, `workflow.name`, `step.name`, `step.id`, `step.attempt` and
//! `step.outcome`. Replayed steps have no span; waits are not spans.
//!
//! ```text
//! cargo run -p workflow-examples --features otel --example otel
//! ```
//!
//! It sends OTLP over HTTP/protobuf to `OTEL_EXPORTER_OTLP_ENDPOINT` (default
//! `http://localhost:4318`, path `/v1/traces`), e.g. a Jaeger all-in-one or an OpenTelemetry
//! Collector. Without one it runs all the same: the exporter's errors are logged, nothing
//! fails.

use std::future::IntoFuture;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use workflow_core::prelude::*;

#[step(max_retries = 2)]
async fn reserve(item: String) -> Result<u32> {
    if step_metadata().attempt == 1 {
        // A failed attempt: its span says `step.outcome = "error"`; the retry is in the trace.
        return Err(Error::retryable("stock service busy").retry_after(Duration::from_millis(50)));
    }
    tracing::info!(%item, "reserved");
    Ok(1)
}

#[step]
async fn charge(cents: u64) -> Result<String> {
    Ok(format!("receipt-{cents}"))
}

#[workflow]
async fn checkout(item: String, cents: u64) -> Result<String> {
    reserve(item).await?;
    // A durable wait: no span is open while the run waits.
    sleep(Duration::from_millis(100)).await;
    charge(cents).await
}

#[tokio::main]
pub async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .unwrap_or_else(|_| "http://localhost:4318".to_owned());
    let exporter = SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .with_timeout(Duration::from_secs(2))
        .build()?;
    // The batch processor exports from a thread of its own; an unreachable collector costs
    // a logged error per batch, never the application.
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name("workflow-otel-example")
                .build(),
        )
        .build();
    let tracer = provider.tracer("workflow-otel-example");
    tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(tracing_subscriber::fmt::layer().with_target(false))
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .init();
    println!("sending traces with OTLP/HTTP to {endpoint}/v1/traces");

    let rt = Runtime::builder().in_memory().build().await?;
    // The caller's own span: the run's trace continues it (an HTTP handler's span, say).
    let request = tracing::info_span!("checkout_request");
    let run = rt
        .start(checkout, ("book".to_string(), 1_999u64))
        .into_future()
        .instrument(request)
        .await?;
    let receipt = run.return_value().await?;
    let info = run.info().await?;
    let trace = info
        .trace_context
        .map(|t| t.traceparent)
        .unwrap_or_default();
    println!("run {} -> {receipt}; its trace: {trace}", run.id());

    rt.shutdown();
    // Sends what is left; with no collector, says so and goes on.
    if let Err(e) = provider.shutdown() {
        eprintln!("exporting the last spans failed (is a collector listening?): {e}");
    }
    Ok(())
}
