//! What the commands and the dashboard do, on a client-only runtime: list, show, cancel and
//! resume. Both front ends call these, so a run looks the same in a terminal and a browser.

use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;
use workflow_core::store::{CancelOutcome, HookFilter, RunFilter};
use workflow_core::{HookError, RunId, RunStatus, Runtime};

use crate::error::CliError;
use crate::view::{EventView, HookSummary, RunDetail, RunSummary};

/// A run id typed by a person.
pub fn parse_run_id(s: &str) -> Result<RunId, CliError> {
    s.trim()
        .parse()
        .map_err(|e| CliError::Usage(format!("invalid run id: {e}")))
}

/// A status name typed by a person.
pub fn parse_status(s: &str) -> Result<RunStatus, CliError> {
    RunStatus::parse(s).ok_or_else(|| {
        CliError::Usage(format!(
            "unknown status `{s}` (expected pending, running, completed, failed or cancelled)"
        ))
    })
}

/// A hook payload typed by a person: JSON, or a clear error pointing at the mistake.
pub fn parse_payload(s: &str) -> Result<Value, CliError> {
    if s.trim().is_empty() {
        return Err(CliError::Usage(
            "empty payload: a payload is JSON, e.g. {\"approved\": true}, \"text\" or null"
                .to_owned(),
        ));
    }
    serde_json::from_str(s).map_err(|e| {
        CliError::Usage(format!(
            "malformed JSON payload: {e} (in `{}`); a payload is JSON, e.g. \
             {{\"approved\": true}}, \"text\" (with the quotes) or null",
            crate::text::cut(s, 60)
        ))
    })
}

pub async fn list_runs(rt: &Runtime, filter: &RunFilter) -> Result<Vec<RunSummary>, CliError> {
    let runs = rt.store().list_runs(filter).await?;
    Ok(runs.into_iter().map(RunSummary::new).collect())
}

pub async fn run_detail(rt: &Runtime, id: RunId) -> Result<RunDetail, CliError> {
    Ok(run_with_events(rt, id).await?.0)
}

/// The run's view and its history, from one read of each.
pub async fn run_with_events(
    rt: &Runtime,
    id: RunId,
) -> Result<(RunDetail, Vec<EventView>), CliError> {
    let store = rt.store();
    let run = store.get_run(&id).await?.ok_or_else(|| not_found(id))?;
    let events = store.events(&id).await?;
    let hooks = store.list_hooks(&HookFilter::new().run_id(id)).await?;
    let detail = RunDetail::new(run, &events, &hooks, SystemTime::now());
    Ok((detail, events.into_iter().map(EventView::new).collect()))
}

pub async fn events(rt: &Runtime, id: RunId) -> Result<Vec<EventView>, CliError> {
    let store = rt.store();
    // An unknown run has no history either; say which it is.
    if store.get_run(&id).await?.is_none() {
        return Err(not_found(id));
    }
    let events = store.events(&id).await?;
    Ok(events.into_iter().map(EventView::new).collect())
}

pub async fn list_hooks(rt: &Runtime, filter: &HookFilter) -> Result<Vec<HookSummary>, CliError> {
    let hooks = rt.store().list_hooks(filter).await?;
    Ok(hooks.into_iter().map(HookSummary::from).collect())
}

/// What `cancel` did.
#[derive(Debug, Clone, Serialize)]
pub struct Cancelled {
    pub run_id: RunId,
    /// False when the run had already ended.
    pub cancelled: bool,
    /// The run's status now.
    pub status: RunStatus,
}

pub async fn cancel(rt: &Runtime, id: RunId) -> Result<Cancelled, CliError> {
    // The store's answer says whether this call ended the run or it had ended before.
    let outcome = rt.store().cancel(&id, SystemTime::now()).await?;
    Ok(match outcome {
        CancelOutcome::Cancelled => Cancelled {
            run_id: id,
            cancelled: true,
            status: RunStatus::Cancelled,
        },
        CancelOutcome::AlreadyEnded(status) => Cancelled {
            run_id: id,
            cancelled: false,
            status,
        },
    })
}

/// Where `resume` delivered a payload.
#[derive(Debug, Clone, Serialize)]
pub struct Resumed {
    pub token: String,
    pub run_id: RunId,
}

pub async fn resume(rt: &Runtime, token: &str, payload: Value) -> Result<Resumed, CliError> {
    match rt.resume_hook(token, payload).await {
        Ok(h) => Ok(Resumed {
            token: h.token,
            run_id: h.run_id,
        }),
        Err(HookError::NotFound(e)) => Err(CliError::NotFound(format!(
            "{e}: the run has not created that hook yet, released it, or ended \
             (`workflow hooks` lists the open ones)"
        ))),
        Err(HookError::InvalidToken(why)) => {
            Err(CliError::Usage(format!("invalid hook token: {why}")))
        }
        Err(HookError::Store(e)) => Err(e.into()),
        Err(e) => Err(CliError::Other(e.to_string())),
    }
}

fn not_found(id: RunId) -> CliError {
    CliError::NotFound(format!(
        "run {id} not found (`workflow runs` lists the runs in this database)"
    ))
}
