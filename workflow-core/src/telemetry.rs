//! The runtime's metrics, emitted through the [`metrics`] facade where each event happens:
//! whatever recorder the application installs (a Prometheus exporter, a StatsD client, a test
//! recorder) receives them, and without one they cost a relaxed atomic load each. Label values
//! are registered names and fixed words, never a run id, so a metric's series stay few.
//!
//! This module is the only one that names a metric or calls the facade: the rest of the crate
//! reports each fact through one of its functions (`run_started`, `step_attempt`, ...). The
//! constants here are the one place the names are spelled, and one table gives each metric's
//! type, labels and help, including the gauges `workflow web` serves at `/metrics` from the
//! store. The names, types, labels and meanings are listed in `docs/metrics.md`, which a test
//! checks against that table.
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

/// The type of a metric's series.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only ever increases.
    Counter,
    /// Set, increased and decreased.
    Gauge,
    /// A distribution of samples.
    Histogram,
}

impl MetricKind {
    /// As `docs/metrics.md` and the Prometheus `# TYPE` line say it.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// Who produces a metric.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricSource {
    /// Emitted through the facade by every worker and client, by the functions of this module.
    Runtime,
    /// Read from the store at each scrape and served by `workflow web` at `/metrics`.
    Store,
}

/// One metric: its name, type, label names (in the order they are emitted), one-line help
/// and source.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// The name, as the recorder receives it.
    pub name: &'static str,
    /// The type of its series.
    pub kind: MetricKind,
    /// Its label names.
    pub labels: &'static [&'static str],
    /// What it counts, in one line (the Prometheus `# HELP` text of the store's gauges).
    pub help: &'static str,
    /// Who produces it.
    pub source: MetricSource,
}

/// Every metric of workflow-rs, the runtime's and `workflow web`'s: the table
/// `docs/metrics.md` documents. It is an item for this workspace's crates (the CLI serves the
/// store's gauges from it), not a stable interface.
#[doc(hidden)]
pub const METRICS: &[Metric] = &[
    emitted(
        RUNS_STARTED,
        MetricKind::Counter,
        &["workflow"],
        "Runs admitted by this process.",
    ),
    emitted(
        RUNS_ENDED,
        MetricKind::Counter,
        &["workflow", "status"],
        "Runs this process ended.",
    ),
    emitted(
        STEP_ATTEMPTS,
        MetricKind::Counter,
        &["step", "outcome"],
        "Step attempts finished here.",
    ),
    emitted(
        STEP_DURATION,
        MetricKind::Histogram,
        &["step"],
        "How long each step attempt ran.",
    ),
    emitted(
        ACTIVE_RUNS,
        MetricKind::Gauge,
        &[],
        "Runs this process is driving now.",
    ),
    emitted(
        LEASE_TAKEOVERS,
        MetricKind::Counter,
        &[],
        "Runs acquired here whose previous lease had expired while set.",
    ),
    emitted(
        QUEUE_WAIT,
        MetricKind::Histogram,
        &["queue"],
        "How long a queued run waited from its admission to its begin.",
    ),
    emitted(
        STORE_COMMIT,
        MetricKind::Histogram,
        &["store"],
        "How long one commit of the store took.",
    ),
    emitted(
        REPLAY,
        MetricKind::Histogram,
        &[],
        "How long a driver took to replay a run's recorded history.",
    ),
    emitted(
        SCHEDULE_TICKS,
        MetricKind::Counter,
        &["schedule", "outcome"],
        "Schedule ticks this process recorded.",
    ),
    served::RUNS,
    served::BLOCKED_RUNS,
    served::QUEUE_WAITING,
    served::QUEUE_RUNNING,
    served::QUEUE_OLDEST_WAITING_AGE,
    served::SCHEDULE_NEXT_TICK,
    served::SCHEDULE_PAUSED,
];

const fn emitted(
    name: &'static str,
    kind: MetricKind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        labels,
        help,
        source: MetricSource::Runtime,
    }
}

/// The gauges `workflow web` reads from the store at each scrape and serves at `/metrics`
/// (all in [`METRICS`]); their help is the exposition's `# HELP` text.
#[doc(hidden)]
pub mod served {
    use super::{Metric, MetricKind, MetricSource};

    const fn gauge(
        name: &'static str,
        labels: &'static [&'static str],
        help: &'static str,
    ) -> Metric {
        Metric {
            name,
            kind: MetricKind::Gauge,
            labels,
            help,
            source: MetricSource::Store,
        }
    }

    /// Runs in the store by workflow and status.
    pub const RUNS: Metric = gauge(
        "workflow_runs",
        &["workflow", "status"],
        "Runs in the store by workflow and status.",
    );
    /// Runs blocked until a build that can replay them takes them.
    pub const BLOCKED_RUNS: Metric = gauge(
        "workflow_blocked_runs",
        &[],
        "Runs blocked until a build that can replay them takes them.",
    );
    /// Runs of a queue waiting to begin.
    pub const QUEUE_WAITING: Metric = gauge(
        "workflow_queue_waiting",
        &["queue"],
        "Runs of the queue waiting to begin.",
    );
    /// Runs of a queue begun and not ended.
    pub const QUEUE_RUNNING: Metric = gauge(
        "workflow_queue_running",
        &["queue"],
        "Runs of the queue begun and not ended (each holds a slot).",
    );
    /// How long a queue's longest-waiting run has waited.
    pub const QUEUE_OLDEST_WAITING_AGE: Metric = gauge(
        "workflow_queue_oldest_waiting_age_seconds",
        &["queue"],
        "How long the queue's longest-waiting run has waited since its admission (absent when \
         none waits).",
    );
    /// When a schedule fires next.
    pub const SCHEDULE_NEXT_TICK: Metric = gauge(
        "workflow_schedule_next_tick_timestamp_seconds",
        &["schedule"],
        "When the schedule fires next, in seconds since the Unix epoch (absent while paused).",
    );
    /// Whether a schedule is paused.
    pub const SCHEDULE_PAUSED: Metric = gauge(
        "workflow_schedule_paused",
        &["schedule"],
        "1 when the schedule is paused, 0 otherwise.",
    );
}

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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::time::Duration;

    use metrics_util::debugging::DebuggingRecorder;

    use super::*;

    /// The page that documents the metrics, relative to the repository's root.
    const METRICS_DOC: &str = "docs/metrics.md";

    /// A metric's shape: its type and its label names in order.
    type Shape = (MetricKind, Vec<String>);

    fn table(source: Option<MetricSource>) -> BTreeMap<String, Shape> {
        let mut out = BTreeMap::new();
        for m in METRICS
            .iter()
            .filter(|m| source.is_none_or(|s| m.source == s))
        {
            let labels = m.labels.iter().map(|l| l.to_string()).collect();
            let before = out.insert(m.name.to_owned(), (m.kind, labels));
            assert!(before.is_none(), "{} is in METRICS twice", m.name);
        }
        out
    }

    #[test]
    fn every_function_emits_its_metric_with_the_table_s_type_and_labels() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let took = Duration::from_millis(3);
        metrics::with_local_recorder(&recorder, || {
            run_started("wf");
            run_ended("wf", RunStatus::Completed);
            run_cancelled("wf");
            lease_taken_over();
            for outcome in [
                AttemptOutcome::Ok,
                AttemptOutcome::Error,
                AttemptOutcome::Timeout,
                AttemptOutcome::Panic,
            ] {
                step_attempt("st", outcome, took);
            }
            queue_waited("q", took);
            store_commit("sqlite", took);
            replayed(took);
            schedule_tick("sch", "started");
            drop(ActiveRun::new());
        });

        let mut emitted: BTreeMap<String, Shape> = BTreeMap::new();
        for (key, ..) in snapshotter.snapshot().into_vec() {
            let kind = match key.kind() {
                metrics_util::MetricKind::Counter => MetricKind::Counter,
                metrics_util::MetricKind::Gauge => MetricKind::Gauge,
                metrics_util::MetricKind::Histogram => MetricKind::Histogram,
            };
            let labels = key.key().labels().map(|l| l.key().to_owned()).collect();
            let name = key.key().name().to_owned();
            let shape = (kind, labels);
            // Every series of one name (`run_ended` and `run_cancelled` both count
            // RUNS_ENDED) has the same type and label names.
            if let Some(other) = emitted.insert(name.clone(), shape.clone()) {
                assert_eq!(other, shape, "two series of {name} differ");
            }
        }
        assert_eq!(emitted, table(Some(MetricSource::Runtime)));
    }

    /// The metrics a page documents, by name: every row of a Markdown table whose `Name`
    /// cell is one backticked `workflow_...` name, its type from the table's `Type` column and
    /// its label names from the `Labels` column (the backticked words outside parentheses,
    /// which list a label's values; `none` for no label). Columns are found by their title.
    fn documented(page: &str) -> BTreeMap<String, Shape> {
        let cells = |line: &str| -> Vec<String> {
            let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
            inner.split('|').map(|c| c.trim().to_owned()).collect()
        };
        let mut out = BTreeMap::new();
        let mut header: Option<Vec<String>> = None;
        for line in page.lines() {
            if !line.trim_start().starts_with('|') {
                header = None;
                continue;
            }
            let row = cells(line);
            let Some(head) = &header else {
                header = Some(row.iter().map(|c| c.to_lowercase()).collect());
                continue;
            };
            let cell = |title: &str| {
                let i = head.iter().position(|h| h == title)?;
                Some(row.get(i).map(String::as_str).unwrap_or_default())
            };
            let Some(name) = cell("name")
                .and_then(|c| c.strip_prefix('`'))
                .and_then(|c| c.strip_suffix('`'))
                .filter(|n| n.starts_with("workflow_") && !n.contains('`'))
            else {
                continue;
            };
            let kind = match cell("type") {
                Some("counter") => MetricKind::Counter,
                Some("gauge") => MetricKind::Gauge,
                Some("histogram") => MetricKind::Histogram,
                other => panic!("{name}: no known type in a `Type` column: {other:?}"),
            };
            let labels = match cell("labels") {
                Some("none") => Vec::new(),
                Some(text) => {
                    let mut depth = 0usize;
                    let outside: String = text
                        .chars()
                        .filter(|c| {
                            match c {
                                '(' => depth += 1,
                                ')' => depth = depth.saturating_sub(1),
                                _ => return depth == 0,
                            }
                            false
                        })
                        .collect();
                    outside
                        .split('`')
                        .skip(1)
                        .step_by(2)
                        .map(str::to_owned)
                        .collect()
                }
                None => panic!("the table listing {name} has no `Labels` column"),
            };
            let before = out.insert(name.to_owned(), (kind, labels));
            assert!(before.is_none(), "{name} is listed twice");
        }
        out
    }

    #[test]
    fn the_metrics_page_lists_exactly_the_table_s_metrics() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(METRICS_DOC);
        let page = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let page = documented(&page);
        let table = table(None);
        let mut wrong = Vec::new();
        for (name, shape) in &table {
            match page.get(name) {
                None => wrong.push(format!("{name} is not listed")),
                Some(listed) if listed != shape => {
                    wrong.push(format!("{name} is listed as {listed:?}, not {shape:?}"))
                }
                Some(_) => {}
            }
        }
        for name in page.keys().filter(|n| !table.contains_key(*n)) {
            wrong.push(format!("{name} is listed but not in telemetry::METRICS"));
        }
        assert!(wrong.is_empty(), "{METRICS_DOC}: {wrong:#?}");
    }

    /// The `.rs` files under `dir`, recursively.
    fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn no_other_source_file_names_a_metric_or_calls_the_facade() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&root)
            .expect("the repository's root")
            .flatten()
        {
            sources(&entry.path().join("src"), &mut files);
        }
        assert!(
            files.len() > 10,
            "no sources found under {}",
            root.display()
        );
        let mut wrong = Vec::new();
        let this = Path::new("workflow-core/src/telemetry.rs");
        for file in files.iter().filter(|f| !f.ends_with(this)) {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            for call in ["counter!(", "gauge!(", "histogram!("] {
                if text.contains(call) {
                    wrong.push(format!("{} calls {call}..)", file.display()));
                }
            }
            for m in METRICS {
                if text.contains(&format!("\"{}\"", m.name)) {
                    wrong.push(format!("{} spells {}", file.display(), m.name));
                }
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn the_page_reader_takes_names_types_and_labels_from_the_columns() {
        let page = "\
| Name | Type | Labels | Meaning |
|---|---|---|---|
| `workflow_a_total` | counter | `step`, `outcome` (`ok`, `error`) | A. |
| `workflow_b` | gauge | none | B. |
| `other` | gauge | `x` | Not a metric of ours. |

Between the tables.

| Labels | Type | Name |
|---|---|---|
| `queue` | histogram | `workflow_c_seconds` |
";
        let got = documented(page);
        let want: BTreeMap<String, Shape> = [
            (
                "workflow_a_total",
                MetricKind::Counter,
                vec!["step", "outcome"],
            ),
            ("workflow_b", MetricKind::Gauge, vec![]),
            ("workflow_c_seconds", MetricKind::Histogram, vec!["queue"]),
        ]
        .into_iter()
        .map(|(n, k, l)| (n.to_owned(), (k, l.into_iter().map(String::from).collect())))
        .collect();
        assert_eq!(got, want);
    }
}
