//! `GET /metrics`: the store's state in the Prometheus text exposition format (0.0.4), for a
//! Prometheus server to scrape beside the applications' own metrics. Every value is read from
//! the store at the scrape, so any process pointed at the database serves the same numbers:
//! runs by workflow and status, blocked runs, queue depths and their oldest waiting run's age,
//! schedules' next ticks.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use workflow_core::telemetry::{served, Metric};
use workflow_core::{RunStatus, Runtime};

use crate::error::CliError;

/// The `Content-Type` of the exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The text served at `/metrics`.
pub async fn render(rt: &Runtime) -> Result<String, CliError> {
    let counts = rt.run_counts().await?;
    let now = crate::ops::store_now(rt).await?;
    let queues = rt.queues().await?;
    let schedules = rt.schedules().await?;
    let mut out = Exposition::default();

    out.family(&served::RUNS);
    for c in &counts {
        out.sample(
            &served::RUNS,
            &[&c.workflow, c.status.as_str()],
            c.runs as f64,
        );
    }
    let blocked: u64 = counts
        .iter()
        .filter(|c| c.status == RunStatus::Blocked)
        .map(|c| c.runs)
        .sum();
    out.family(&served::BLOCKED_RUNS);
    out.sample(&served::BLOCKED_RUNS, &[], blocked as f64);

    out.family(&served::QUEUE_WAITING);
    for q in &queues {
        out.sample(&served::QUEUE_WAITING, &[&q.def.name], q.waiting as f64);
    }
    out.family(&served::QUEUE_RUNNING);
    for q in &queues {
        out.sample(&served::QUEUE_RUNNING, &[&q.def.name], q.occupied as f64);
    }
    out.family(&served::QUEUE_OLDEST_WAITING_AGE);
    for q in &queues {
        if let Some(oldest) = q.oldest_waiting {
            out.sample(
                &served::QUEUE_OLDEST_WAITING_AGE,
                &[&q.def.name],
                now.duration_since(oldest).unwrap_or_default().as_secs_f64(),
            );
        }
    }

    out.family(&served::SCHEDULE_NEXT_TICK);
    for s in &schedules {
        if let (Some(next), false) = (s.next, s.paused) {
            out.sample(&served::SCHEDULE_NEXT_TICK, &[&s.name], unix_seconds(next));
        }
    }
    out.family(&served::SCHEDULE_PAUSED);
    for s in &schedules {
        out.sample(
            &served::SCHEDULE_PAUSED,
            &[&s.name],
            f64::from(u8::from(s.paused)),
        );
    }
    Ok(out.text)
}

fn unix_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// Text in the exposition format, every family one of the store's gauges.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, m: &Metric) {
        let _ = writeln!(self.text, "# HELP {} {}", m.name, escape_help(m.help));
        let _ = writeln!(self.text, "# TYPE {} {}", m.name, m.kind.as_str());
    }

    /// A sample of `m` with the values of its labels, in the order the table names them.
    fn sample(&mut self, m: &Metric, values: &[&str], value: f64) {
        debug_assert_eq!(values.len(), m.labels.len(), "{}", m.name);
        self.text.push_str(m.name);
        if !values.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in m.labels.iter().zip(values).enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape_label(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }
}

/// A label value as the format quotes it: backslash, double quote and line feed escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A help text as the format needs it: backslash and line feed escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut out = Exposition::default();
        out.sample(&served::QUEUE_WAITING, &["a\"b\\c\nd"], 2.0);
        assert_eq!(
            out.text,
            "workflow_queue_waiting{queue=\"a\\\"b\\\\c\\nd\"} 2\n"
        );
    }

    #[test]
    fn a_sample_without_labels_has_no_braces() {
        let mut out = Exposition::default();
        out.sample(&served::BLOCKED_RUNS, &[], 0.0);
        assert_eq!(out.text, "workflow_blocked_runs 0\n");
    }

    #[test]
    fn the_families_are_announced_with_their_help_and_type() {
        let mut out = Exposition::default();
        for m in [
            &served::RUNS,
            &served::BLOCKED_RUNS,
            &served::QUEUE_WAITING,
            &served::QUEUE_RUNNING,
            &served::QUEUE_OLDEST_WAITING_AGE,
            &served::SCHEDULE_NEXT_TICK,
            &served::SCHEDULE_PAUSED,
        ] {
            out.family(m);
        }
        assert_eq!(
            out.text,
            "\
# HELP workflow_runs Runs in the store by workflow and status.
# TYPE workflow_runs gauge
# HELP workflow_blocked_runs Runs blocked until a build that can replay them takes them.
# TYPE workflow_blocked_runs gauge
# HELP workflow_queue_waiting Runs of the queue waiting to begin.
# TYPE workflow_queue_waiting gauge
# HELP workflow_queue_running Runs of the queue begun and not ended (each holds a slot).
# TYPE workflow_queue_running gauge
# HELP workflow_queue_oldest_waiting_age_seconds How long the queue's longest-waiting run has \
waited since its admission (absent when none waits).
# TYPE workflow_queue_oldest_waiting_age_seconds gauge
# HELP workflow_schedule_next_tick_timestamp_seconds When the schedule fires next, in seconds \
since the Unix epoch (absent while paused).
# TYPE workflow_schedule_next_tick_timestamp_seconds gauge
# HELP workflow_schedule_paused 1 when the schedule is paused, 0 otherwise.
# TYPE workflow_schedule_paused gauge
"
        );
    }
}
