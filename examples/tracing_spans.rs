//! Every step attempt is a `tracing` span at INFO (`step`, with `workflow.run_id`,
//! `workflow.name`, `step.name`, `step.id`, `step.attempt` and, once it ended,
//! `step.outcome`), so logs and traces say which run, step and try they come from. The run's
//! body is polled in a DEBUG span (`workflow_run`, with `workflow.run_id` and
//! `workflow.name`) under the target `workflow_core::telemetry::RUN_SPAN_TARGET`, which this
//! example enables, so the steps are inside it too. It prints the spans as they close, with
//! their fields and timings:
//!
//! ```text
//! cargo run --example tracing_spans
//! ```
//!
//! ```text
//! INFO workflow_run{workflow.run_id=01J.. workflow.name=tracing_spans::convert_invoice}:
//!   step{workflow.run_id=01J.. workflow.name=.. step.name=tracing_spans::fetch_rate
//!   step.id=stp_.._0 step.attempt=1}: fetching the rate
//! WARN ..:step{.. step.attempt=1}: step attempt failed error=rate service busy
//! INFO ..:step{.. step.attempt=1 step.outcome="error" otel.status_code="error"}: close ..
//! INFO ..:step{.. step.attempt=2 step.outcome="ok"}: close ..
//! ```
//!
//! To export to OpenTelemetry instead, build with the feature `otel` and put the
//! `tracing-opentelemetry` layer where the `fmt` layer is (`cargo run --features otel
//! --example otel`): each run becomes one trace, each step attempt a span in it, across
//! processes and restarts.

use std::time::Duration;

use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::prelude::*;
use workflow_core::prelude::*;
use workflow_core::telemetry::RUN_SPAN_TARGET;

#[step(max_retries = 2)]
async fn fetch_rate(currency: String) -> Result<f64> {
    tracing::info!(%currency, "fetching the rate");
    if step_metadata().attempt == 1 {
        return Err(Error::retryable("rate service busy").retry_after(Duration::from_millis(50)));
    }
    Ok(1.08)
}

#[step]
async fn convert(amount_cents: u64, rate: f64) -> Result<u64> {
    Ok((amount_cents as f64 * rate).round() as u64)
}

#[workflow]
pub async fn convert_invoice(amount_cents: u64, currency: String) -> Result<u64> {
    let rate = fetch_rate(currency).await?;
    sleep(Duration::from_millis(100)).await;
    convert(amount_cents, rate).await
}

/// Runs one invoice conversion on `rt` and returns its result.
pub async fn run(rt: &Runtime) -> std::result::Result<u64, Box<dyn std::error::Error>> {
    let run = rt
        .start(convert_invoice, (10_000u64, "EUR".to_string()))
        .await?;
    Ok(run.return_value().await?)
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    // INFO, and the run's own span (DEBUG, under its own target) too.
    let filter = Targets::new()
        .with_default(Level::INFO)
        .with_target(RUN_SPAN_TARGET, Level::DEBUG);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_span_events(FmtSpan::CLOSE)
                .with_target(false)
                .with_filter(filter),
        )
        .init();
    let rt = Runtime::builder().in_memory().build().await?;
    let cents = run(&rt).await?;
    println!("converted: {cents} cents");
    Ok(())
}
