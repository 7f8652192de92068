//! The runtime's metrics, emitted through the [`metrics`] facade where each event happens:
//! whatever recorder the application installs (a Prometheus exporter, a StatsD client, a test
//! recorder) receives them, and without one they cost a relaxed atomic load each. Label values
//! are registered names and fixed words, never a run id, so a metric's series stay few.
//!
//! The names, types, labels and meanings are listed in `docs/metrics.md`; the constants here
//! are the one place the names are spelled.
//!
//! ```
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//! use workflow_core::prelude::*;
//! use workflow_core::telemetry::RUNS_ENDED;
//!
//! #[step]
//! async fn add_one(n: u32) -> Result<u32> {
//!     Ok(n + 1)
//! }
//!
//! #[workflow]
//! async fn count(n: u32) -> Result<u32> {
//!     add_one(n).await
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
//! // The application's recorder; a Prometheus exporter is installed the same way.
//! let recorder = DebuggingRecorder::new();
//! let snapshot = recorder.snapshotter();
//! recorder.install()?;
//!
//! let rt = Runtime::builder().in_memory().build().await?;
//! rt.start(count, (1,)).await?.return_value().await?;
//!
//! let ended: u64 = snapshot
//!     .snapshot()
//!     .into_vec()
//!     .into_iter()
//!     .filter(|(key, ..)| key.key().name() == RUNS_ENDED)
//!     .map(|(.., value)| match value {
//!         DebugValue::Counter(n) => n,
//!         _ => 0,
//!     })
//!     .sum();
//! assert_eq!(ended, 1);
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use crate::model::RunStatus;

/// Counter: runs admitted by this process, by `workflow`.
pub const RUNS_STARTED: &str = "workflow_runs_started_total";
/// Counter: runs this process ended, by `workflow` and `status`.
pub const RUNS_ENDED: &str = "workflow_runs_ended_total";
/// Counter: step attempts finished, by `step` and `outcome` (`ok`, `error`, `timeout`, `panic`).
pub const STEP_ATTEMPTS: &str = "workflow_step_attempts_total";
/// Histogram (seconds): how long each step attempt ran, by `step`.
pub const STEP_DURATION: &str = "workflow_step_duration_seconds";
/// Gauge: runs this process is driving now.
pub const ACTIVE_RUNS: &str = "workflow_active_runs";
/// Histogram (seconds): how long a queued run waited from its admission to its begin, by
/// `queue`.
pub const QUEUE_WAIT: &str = "workflow_queue_wait_seconds";
/// Histogram (seconds): how long one commit of the store took, by `store`.
pub const STORE_COMMIT: &str = "workflow_store_commit_seconds";
/// Histogram (seconds): how long a driver took to replay a run's recorded history, from
/// the run's lease to its first live decision (runs with no history are not replays).
pub const REPLAY: &str = "workflow_replay_seconds";
/// Counter: runs this process's worker acquired whose previous lease had expired while set
/// (the worker holding it stopped renewing it without giving the run back).
pub const LEASE_TAKEOVERS: &str = "workflow_lease_takeovers_total";
/// Counter: schedule ticks this process recorded, by `schedule` and `outcome` (`started`,
/// `buffered`, `skipped:overlap`, `skipped:paused`, `skipped:missed`).
pub const SCHEDULE_TICKS: &str = "workflow_schedule_ticks_total";

/// The target of the `workflow_run` span, the DEBUG span a run's body is polled in (with
/// `workflow.run_id` and `workflow.name`). At INFO a run's spans are its step attempts'
/// (`step`, INFO, each with the run's id and workflow) and, with the feature `otel`, its
/// start's (`workflow.start`); enable this target alone to have the body's own log lines
/// carry the run's id too:
///
/// ```
/// use tracing_subscriber::filter::Targets;
/// use tracing_subscriber::prelude::*;
/// use workflow_core::telemetry::RUN_SPAN_TARGET;
///
/// let filter = Targets::new()
///     .with_default(tracing::Level::INFO)
///     .with_target(RUN_SPAN_TARGET, tracing::Level::DEBUG);
/// let _guard = tracing_subscriber::registry()
///     .with(tracing_subscriber::fmt::layer().with_filter(filter))
///     .set_default();
/// ```
pub const RUN_SPAN_TARGET: &str = "workflow_core::run";

/// A run of `workflow` was admitted.
pub(crate) fn run_started(workflow: &str) {
    metrics::counter!(RUNS_STARTED, "workflow" => workflow.to_owned()).increment(1);
}

/// A run of `workflow` ended with `status`.
pub(crate) fn run_ended(workflow: &'static str, status: RunStatus) {
    metrics::counter!(RUNS_ENDED, "workflow" => workflow, "status" => status.as_str()).increment(1);
}

/// A run of `workflow` was cancelled by a client (`run.cancel()`).
pub(crate) fn run_cancelled(workflow: &str) {
    metrics::counter!(
        RUNS_ENDED,
        "workflow" => workflow.to_owned(),
        "status" => RunStatus::Cancelled.as_str()
    )
    .increment(1);
}

/// A worker took over a run whose lease had expired while set (see
/// [`crate::store::LeasedRun::took_over`]).
pub(crate) fn lease_taken_over() {
    metrics::counter!(LEASE_TAKEOVERS).increment(1);
}

/// How a step attempt ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptOutcome {
    Ok,
    Error,
    Timeout,
    Panic,
}

impl AttemptOutcome {
    /// As the `outcome` label and the `step.outcome` span attribute say it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            AttemptOutcome::Ok => "ok",
            AttemptOutcome::Error => "error",
            AttemptOutcome::Timeout => "timeout",
            AttemptOutcome::Panic => "panic",
        }
    }
}

/// An attempt of step `step` ended with `outcome` after running `took`.
pub(crate) fn step_attempt(step: &'static str, outcome: AttemptOutcome, took: Duration) {
    metrics::counter!(STEP_ATTEMPTS, "step" => step, "outcome" => outcome.label()).increment(1);
    metrics::histogram!(STEP_DURATION, "step" => step).record(took.as_secs_f64());
}

/// A queued run of `queue` began after waiting `waited` since its admission.
pub(crate) fn queue_waited(queue: &str, waited: Duration) {
    metrics::histogram!(QUEUE_WAIT, "queue" => queue.to_owned()).record(waited.as_secs_f64());
}

/// A commit of store `store` (`sqlite`, `postgres`) took `took`.
pub(crate) fn store_commit(store: &'static str, took: Duration) {
    metrics::histogram!(STORE_COMMIT, "store" => store).record(took.as_secs_f64());
}

/// A driver replayed a run's recorded history in `took`.
pub(crate) fn replayed(took: Duration) {
    metrics::histogram!(REPLAY).record(took.as_secs_f64());
}

/// A tick of schedule `schedule` was recorded with `outcome` (as `TickOutcome::as_str`
/// spells it).
pub(crate) fn schedule_tick(schedule: &str, outcome: &'static str) {
    metrics::counter!(SCHEDULE_TICKS, "schedule" => schedule.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// Counts a run as driven here from its creation to its drop ([`ACTIVE_RUNS`]).
pub(crate) struct ActiveRun(());

impl ActiveRun {
    pub(crate) fn new() -> Self {
        metrics::gauge!(ACTIVE_RUNS).increment(1.0);
        ActiveRun(())
    }
}

impl Drop for ActiveRun {
    fn drop(&mut self) {
        metrics::gauge!(ACTIVE_RUNS).decrement(1.0);
    }
}
