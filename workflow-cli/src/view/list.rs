//! Runs, queues and hooks as listed: one row each.

use serde::Serialize;
use serde_json::Value;
use workflow_core::store::{HookRecord, QueueEntry, QueueInfo, RunRecord};
use workflow_core::{Error, RunId, RunStatus};

use super::*;
use crate::text;

/// One run, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub id: RunId,
    pub workflow: String,
    pub status: RunStatus,
    pub created_at: Time,
    pub updated_at: Time,
    /// From admission to the end, for ended runs.
    pub duration_ms: Option<u64>,
    pub hook_token: Option<String>,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<Error>,
    /// The run that started this one with `start_child`.
    pub parent: Option<RunId>,
    /// The queue it was started in, with its partition key and priority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueEntry>,
    /// Not begun before this time: started with `.delay(d)` or `.start_at(t)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_at: Option<Time>,
    /// The version of the build that started it (`Runtime::builder().version(v)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The run this one continues (`continue_as_new`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_run: Option<RunId>,
    /// The run that continues this one, once it ended as `continued_as_new`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_run: Option<RunId>,
    /// The W3C `traceparent` of the span that started it (feature `otel` of the
    /// application), whose trace holds every attempt's span.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl RunSummary {
    pub fn new(r: RunRecord) -> Self {
        let created_at = Time(r.created_at);
        let updated_at = Time(r.updated_at);
        RunSummary {
            id: r.id,
            workflow: r.workflow,
            status: r.status,
            duration_ms: r.status.is_terminal().then(|| created_at.until(updated_at)),
            created_at,
            updated_at,
            hook_token: r.hook_token,
            input: r.input,
            output: r.output,
            error: r.error,
            parent: r.parent,
            previous_run: r.previous_run,
            next_run: r.next_run,
            queue: r.queue,
            start_at: r.start_at.map(Time),
            version: r.version,
            traceparent: r.trace_context.map(|t| t.traceparent),
        }
    }

    /// When a pending run begins, if it was started with a delay that is still ahead at
    /// `now`: it waits for its time, not for a worker.
    pub fn starts_later(&self, now: Time) -> Option<Time> {
        self.start_at
            .filter(|t| self.status == RunStatus::Pending && *t > now)
    }

    /// `pending, starts at <time>` for a delayed run waiting for its time at `now`; the
    /// status otherwise.
    pub fn status_text(&self, now: Time) -> String {
        match self.starts_later(now) {
            Some(t) => format!("{}, starts at {t}", self.status),
            None => self.status.to_string(),
        }
    }
}

/// A queue's limits and occupancy, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    pub name: String,
    /// At most this many runs begun and not ended; `None`: no limit.
    pub concurrency: Option<u32>,
    /// At most `runs` begin per `period_ms`; `None`: no limit.
    pub rate_limit: Option<RateView>,
    /// Runs begun and not ended (each holds a slot).
    pub occupied: u64,
    /// Runs waiting to begin.
    pub waiting: u64,
    /// Runs begun within the last rate window.
    pub begun_in_window: u64,
}

/// A rate limit: at most `runs` begin in any window of `period_ms`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RateView {
    pub runs: u32,
    pub period_ms: u64,
}

impl QueueView {
    pub fn new(q: QueueInfo) -> Self {
        QueueView {
            name: q.def.name,
            concurrency: q.def.concurrency,
            rate_limit: q.def.rate_limit.map(|(runs, p)| RateView {
                runs,
                period_ms: u64::try_from(p.as_millis()).unwrap_or(u64::MAX),
            }),
            occupied: q.occupied,
            waiting: q.waiting,
            begun_in_window: q.begun_in_window,
        }
    }

    /// `slots 3/10`, `rate 42/100 per 1m`, or `no limits`.
    pub fn limits(&self) -> String {
        let mut parts = Vec::new();
        match self.concurrency {
            Some(c) => parts.push(format!("slots {}/{c}", self.occupied)),
            None => parts.push(format!("slots {}/unlimited", self.occupied)),
        }
        if let Some(r) = self.rate_limit {
            parts.push(format!(
                "rate {}/{} per {}",
                self.begun_in_window,
                r.runs,
                text::duration_ms(r.period_ms)
            ));
        }
        parts.join(", ")
    }
}

/// A run of a queue, as `workflow runs --queue` lists it: where it stands.
#[derive(Debug, Clone, Serialize)]
pub struct QueuedRun {
    #[serde(flatten)]
    pub run: RunSummary,
    /// For a run waiting to begin: its place in the order the queue begins runs in (1 is
    /// next: higher priority first, then start order); `None` once begun.
    pub position: Option<usize>,
}

/// The runs of one queue with the waiting ones numbered in the order they begin: higher
/// priority first, then start order. (A waiting run of a partition key whose earlier run
/// holds the key keeps its number but begins only after that run.)
pub fn positions(runs: Vec<RunSummary>) -> Vec<QueuedRun> {
    let mut waiting: Vec<(i32, Time, RunId)> = runs
        .iter()
        .filter(|r| r.status == RunStatus::Pending)
        .map(|r| {
            let priority = r.queue.as_ref().map_or(0, |q| q.priority);
            (priority, r.created_at, r.id)
        })
        .collect();
    waiting.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    runs.into_iter()
        .map(|run| QueuedRun {
            position: waiting
                .iter()
                .position(|w| w.2 == run.id && run.status == RunStatus::Pending)
                .map(|i| i + 1),
            run,
        })
        .collect()
}

/// An active hook, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct HookSummary {
    pub token: String,
    pub run_id: RunId,
    pub created_at: Time,
}

impl From<HookRecord> for HookSummary {
    fn from(h: HookRecord) -> Self {
        HookSummary {
            token: h.token,
            run_id: h.run_id,
            created_at: Time(h.created_at),
        }
    }
}
