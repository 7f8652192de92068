//! `workflow schedules`: every schedule in the store with its workflow, spec, state and its
//! last and next nominal times, read through the runtime's schedule calls.

use serde::Serialize;
use workflow_core::{Runtime, ScheduleError, ScheduleInfo, ScheduleSpec};

use crate::error::CliError;
use crate::text::{self, Table};

/// A schedule, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleView {
    pub name: String,
    pub workflow: String,
    /// The cron expression and zone, or the period.
    pub spec: String,
    pub paused: bool,
    /// The latest recorded tick's nominal time (RFC 3339).
    pub last: Option<String>,
    /// The next nominal time (RFC 3339); `None`: it never ticks again.
    pub next: Option<String>,
}

impl ScheduleView {
    fn new(s: ScheduleInfo) -> Self {
        ScheduleView {
            spec: match &s.spec {
                ScheduleSpec::Cron { expr, zone } => format!("{expr} ({zone})"),
                ScheduleSpec::Every { period_ms } => {
                    format!("every {}", text::duration_ms(*period_ms))
                }
            },
            name: s.name,
            workflow: s.workflow,
            paused: s.paused,
            last: s.last.map(text::rfc3339),
            next: s.next.map(text::rfc3339),
        }
    }
}

impl From<ScheduleError> for CliError {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::Store(e) => e.into(),
            e @ ScheduleError::NotFound { .. } => CliError::NotFound(format!(
                "{e} (`workflow schedules` lists the schedules in this database)"
            )),
            e => CliError::Usage(e.to_string()),
        }
    }
}

/// Every schedule, by name.
pub async fn list_schedules(rt: &Runtime) -> Result<Vec<ScheduleView>, CliError> {
    Ok(rt
        .schedules()
        .await?
        .into_iter()
        .map(ScheduleView::new)
        .collect())
}

/// The schedules as a table for people.
pub fn table(schedules: &[ScheduleView]) -> String {
    let mut t = Table::new(["SCHEDULE", "WORKFLOW", "SPEC", "STATE", "LAST", "NEXT"]);
    for s in schedules {
        t.row(vec![
            s.name.clone(),
            s.workflow.clone(),
            s.spec.clone(),
            if s.paused { "paused" } else { "active" }.to_owned(),
            s.last.clone().unwrap_or_else(|| "-".to_owned()),
            s.next.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    if t.is_empty() {
        "no schedules\n".to_owned()
    } else {
        t.to_string()
    }
}
