//! `GET /metrics`: the store's state in the Prometheus text exposition format (0.0.4), for a
//! Prometheus server to scrape beside the applications' own metrics. Every value is read from
//! the store at the scrape, so any process pointed at the database serves the same numbers:
//! runs by workflow and status, blocked runs, queue depths and their oldest waiting run's age,
//! schedules' next ticks.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use workflow_core::{RunStatus, Runtime};

use crate::error::CliError;

/// The `Content-Type` of the exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The text served at `/metrics`.
pub async fn render(rt: &Runtime) -> Result<String, CliError> {
    let counts = rt.store().run_counts().await?;
    let now = rt.store().now().await?.unwrap_or_else(SystemTime::now);
    let queues = rt.store().list_queues(now).await?;
    let schedules = rt.schedules().await?;
    let mut out = Exposition::default();

    out.family("workflow_runs", "Runs in the store by workflow and status.");
    for c in &counts {
        out.sample(
            "workflow_runs",
            &[("workflow", &c.workflow), ("status", c.status.as_str())],
            c.runs as f64,
        );
    }
    let blocked: u64 = counts
        .iter()
        .filter(|c| c.status == RunStatus::Blocked)
        .map(|c| c.runs)
        .sum();
    out.family(
        "workflow_blocked_runs",
        "Runs blocked until a build that can replay them takes them.",
    );
    out.sample("workflow_blocked_runs", &[], blocked as f64);

    out.family(
        "workflow_queue_waiting",
        "Runs of the queue waiting to begin.",
    );
    for q in &queues {
        out.sample(
            "workflow_queue_waiting",
            &[("queue", &q.def.name)],
            q.waiting as f64,
        );
    }
    out.family(
        "workflow_queue_running",
        "Runs of the queue begun and not ended (each holds a slot).",
    );
    for q in &queues {
        out.sample(
            "workflow_queue_running",
            &[("queue", &q.def.name)],
            q.occupied as f64,
        );
    }
    out.family(
        "workflow_queue_oldest_waiting_age_seconds",
        "How long the queue's longest-waiting run has waited since its admission (absent when \
         none waits).",
    );
    for q in &queues {
        if let Some(oldest) = q.oldest_waiting {
            out.sample(
                "workflow_queue_oldest_waiting_age_seconds",
                &[("queue", &q.def.name)],
                now.duration_since(oldest).unwrap_or_default().as_secs_f64(),
            );
        }
    }

    out.family(
        "workflow_schedule_next_tick_timestamp_seconds",
        "When the schedule fires next, in seconds since the Unix epoch (absent while paused).",
    );
    for s in &schedules {
        if let (Some(next), false) = (s.next, s.paused) {
            out.sample(
                "workflow_schedule_next_tick_timestamp_seconds",
                &[("schedule", &s.name)],
                unix_seconds(next),
            );
        }
    }
    out.family(
        "workflow_schedule_paused",
        "1 when the schedule is paused, 0 otherwise.",
    );
    for s in &schedules {
        out.sample(
            "workflow_schedule_paused",
            &[("schedule", &s.name)],
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

/// Text in the exposition format, every family a gauge.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} gauge");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
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
        out.sample("m", &[("workflow", "a\"b\\c\nd")], 2.0);
        assert_eq!(out.text, "m{workflow=\"a\\\"b\\\\c\\nd\"} 2\n");
    }

    #[test]
    fn a_sample_without_labels_has_no_braces() {
        let mut out = Exposition::default();
        out.sample("workflow_blocked_runs", &[], 0.0);
        assert_eq!(out.text, "workflow_blocked_runs 0\n");
    }
}
