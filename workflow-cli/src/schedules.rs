//! `workflow schedules`: every schedule in the store with its workflow, spec, state and its
//! last and next nominal times; `workflow schedule <name>`: one schedule with its next times
//! and latest ticks, or an action on it (pause, resume, trigger, backfill). All through the
//! runtime's schedule calls.

use std::time::SystemTime;

use clap::Subcommand;
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

/// What `workflow schedule <name>` does besides showing the schedule.
#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Pause it: its ticks are recorded as skipped until it is resumed.
    Pause,
    /// Resume it from its next nominal time (the paused span is not caught up).
    Resume,
    /// Start one run now (its nominal time: now).
    Trigger,
    /// Start a run for every nominal time from --from to --to (both included) that has none.
    Backfill {
        /// The first time, RFC 3339 (`2026-01-01T00:00:00Z`).
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        from: SystemTime,
        /// The last time, RFC 3339.
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        to: SystemTime,
    },
}

/// One schedule, its next nominal times and latest ticks, as shown.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleDetail {
    #[serde(flatten)]
    pub schedule: ScheduleView,
    pub overlap: String,
    pub catch_up: String,
    /// The next five nominal times (RFC 3339).
    pub upcoming: Vec<String>,
    /// The latest ticks, the latest first.
    pub ticks: Vec<TickView>,
}

/// A tick, as shown.
#[derive(Debug, Clone, Serialize)]
pub struct TickView {
    pub nominal: String,
    pub outcome: String,
    pub run_id: Option<String>,
    pub backfill: bool,
}

/// An RFC 3339 time given on the command line (clap's value parser of `--from` and `--to`,
/// whose message names the flag).
fn parse_time(s: &str) -> Result<SystemTime, String> {
    let ts: jiff::Timestamp = s
        .parse()
        .map_err(|e| format!("not an RFC 3339 time such as 2026-01-01T00:00:00Z: {e}"))?;
    SystemTime::try_from(ts).map_err(|e| e.to_string())
}

/// `workflow schedule <name> [action]`.
pub async fn command(
    rt: &Runtime,
    name: &str,
    action: Option<ScheduleAction>,
    json: bool,
) -> Result<String, CliError> {
    let done = match action {
        None => return show(rt, name, json).await,
        Some(ScheduleAction::Pause) => {
            rt.pause_schedule(name).await?;
            serde_json::json!({"schedule": name, "paused": true})
        }
        Some(ScheduleAction::Resume) => {
            rt.resume_schedule(name).await?;
            serde_json::json!({"schedule": name, "paused": false})
        }
        Some(ScheduleAction::Trigger) => {
            let run = rt.trigger_schedule(name).await?;
            serde_json::json!({"schedule": name, "run_id": run.to_string()})
        }
        Some(ScheduleAction::Backfill { from, to }) => {
            let started = rt.backfill_schedule(name, from, to).await?;
            serde_json::json!({"schedule": name, "started": started})
        }
    };
    if json {
        return Ok(format!("{done}\n"));
    }
    Ok(
        match (done.get("paused"), done.get("run_id"), done.get("started")) {
            (Some(p), _, _) if p == true => format!("paused {name}\n"),
            (Some(_), _, _) => format!("resumed {name}\n"),
            (_, Some(run), _) => format!("started run {}\n", run.as_str().unwrap_or_default()),
            (_, _, Some(n)) => format!("started {n} run(s)\n"),
            _ => String::new(),
        },
    )
}

/// Schedule `name`: its spec and policies, its next five nominal times and its latest ten
/// ticks.
pub async fn detail(rt: &Runtime, name: &str) -> Result<ScheduleDetail, CliError> {
    let info = rt
        .schedules()
        .await?
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| ScheduleError::NotFound {
            name: name.to_owned(),
        })?;
    let upcoming = info
        .upcoming(
            info.next.unwrap_or_else(SystemTime::now) - std::time::Duration::from_millis(1),
            5,
        )
        .into_iter()
        .map(text::rfc3339)
        .collect();
    let ticks = rt
        .schedule_ticks(name, 10)
        .await?
        .into_iter()
        .map(|t| TickView {
            nominal: text::rfc3339(t.nominal),
            outcome: t.outcome.to_string(),
            run_id: t.run_id.map(|r| r.to_string()),
            backfill: t.backfill,
        })
        .collect();
    Ok(ScheduleDetail {
        overlap: format!("{:?}", info.overlap),
        catch_up: format!("{:?}", info.catch_up),
        schedule: ScheduleView::new(info),
        upcoming,
        ticks,
    })
}

async fn show(rt: &Runtime, name: &str, json: bool) -> Result<String, CliError> {
    let detail = detail(rt, name).await?;
    if json {
        let mut s = serde_json::to_string_pretty(&detail)
            .map_err(|e| CliError::Other(format!("cannot encode the output as JSON: {e}")))?;
        s.push('\n');
        return Ok(s);
    }
    let s = &detail.schedule;
    let mut out = format!(
        "schedule {}: {} {}, {}\nspec      {}\noverlap   {}\ncatch-up  {}\nnext      {}\n",
        s.name,
        s.workflow,
        if s.paused { "paused" } else { "active" },
        s.last
            .as_deref()
            .map_or_else(|| "never ticked".to_owned(), |l| format!("last tick {l}")),
        s.spec,
        detail.overlap,
        detail.catch_up,
        detail.upcoming.join(", "),
    );
    let mut t = Table::new(["NOMINAL", "OUTCOME", "RUN", "BACKFILL"]);
    for tick in &detail.ticks {
        t.row(vec![
            tick.nominal.clone(),
            tick.outcome.clone(),
            tick.run_id.clone().unwrap_or_else(|| "-".to_owned()),
            if tick.backfill { "yes" } else { "" }.to_owned(),
        ]);
    }
    if t.is_empty() {
        out.push_str("no ticks yet\n");
    } else {
        out.push('\n');
        out.push_str(&t.to_string());
    }
    Ok(out)
}
