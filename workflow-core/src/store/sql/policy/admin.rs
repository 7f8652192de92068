//! Cancellation down a run's tree, pruning, and the arguments of the listing statements.

use std::time::SystemTime;

use super::Tx;
use crate::error::{Error, StoreError};
use crate::ids::RunId;
use crate::store::sql::{sql_id, sql_time, status_of, to_json, EncodedEnd, EncodedEvents};
use crate::store::{
    CancelOutcome, Event, HookFilter, NewEvent, PruneStats, RunFilter, RunRecord, RunStatus,
    RunStore,
};

/// What [`cancel`] writes, encoded before the transaction.
pub(in crate::store) struct EncodedCancel {
    pub id: RunId,
    pub event: EncodedEvents,
    pub end: EncodedEnd,
    pub now: i64,
}

impl EncodedCancel {
    pub fn new(id: &RunId, now: SystemTime) -> Result<Self, StoreError> {
        Ok(EncodedCancel {
            id: *id,
            event: EncodedEvents::new(&[NewEvent {
                at: now,
                event: Event::RunCancelled,
            }])?,
            end: EncodedEnd {
                status: RunStatus::Cancelled,
                output: None,
                error: Some(to_json(&Error::cancelled(id), "the cancellation error")?),
            },
            now: sql_time(now),
        })
    }
}

/// Cancels the run unless it already ended, and then its children that are not detached,
/// down the tree, in the same transaction. The status is read with the row locked (where
/// the dialect locks rows), so this and the worker's own writes are ordered: whichever
/// commits second sees the other.
pub(in crate::store) async fn cancel(
    tx: &mut impl Tx,
    c: &EncodedCancel,
) -> Result<CancelOutcome, StoreError> {
    let key = c.id.to_string();
    tx.lock_inbox_for_end(None).await?;
    let status = tx.run_status(&key).await?;
    let status = status_of(&status.ok_or(StoreError::RunNotFound(c.id))?, &key)?;
    if status.is_terminal() {
        return Ok(CancelOutcome::AlreadyEnded(status));
    }
    end_cancelled(tx, &key, c, c.end.error.as_deref()).await?;
    // The tree is read first, unlocked (a run's parent never changes), and its runs are then
    // locked in id order, the order group transactions lock rows in: locking them as the
    // tree was walked could take two siblings in the other order from a group appending to
    // both, and each would wait for the other. A child is started by its parent, so it has
    // the greater id and comes after it (unless clocks apart gave it a smaller one: then it
    // is cancelled even if its parent ended meanwhile, as it would have been a moment before).
    let mut tree: Vec<(String, String)> = Vec::new();
    let mut walk = vec![key];
    while let Some(parent) = walk.pop() {
        for child in tx.children_to_cancel(&parent).await? {
            walk.push(child.clone());
            tree.push((child, parent.clone()));
        }
    }
    tree.sort();
    // Runs this cancellation did not cancel (they ended on their own meanwhile): their
    // subtrees are left as they are.
    let mut passed = std::collections::HashSet::new();
    for (child, parent) in tree {
        if passed.contains(&parent) {
            passed.insert(child);
            continue;
        }
        // Read with its row locked, like the run's: a child ending on its own meanwhile is
        // left as it ended.
        let status = tx.run_status(&child).await?;
        if status.is_none_or(|s| status_of(&s, &child).is_ok_and(RunStatus::is_terminal)) {
            passed.insert(child);
            continue;
        }
        let id: RunId = child
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("run {child}: id: {e}")))?;
        let error = to_json(
            &Error::cancelled_with_parent(&id, &c.id),
            "the cancellation error",
        )?;
        end_cancelled(tx, &child, c, Some(&error)).await?;
    }
    Ok(CancelOutcome::Cancelled)
}

/// Records the cancellation of `run` and ends it, with `error` as its error.
async fn end_cancelled(
    tx: &mut impl Tx,
    run: &str,
    c: &EncodedCancel,
    error: Option<&str>,
) -> Result<(), StoreError> {
    let end = EncodedEnd {
        status: RunStatus::Cancelled,
        output: None,
        error: error.map(str::to_owned),
    };
    tx.append_events(run, None, &c.event).await?;
    tx.end_run_releasing(run, &end, c.now).await
}

/// Deletes the runs that ended before `before`, except those retaining a token past `now`,
/// and then what was recorded for them (by id: the same runs, whatever ends meanwhile). Only
/// ended runs are deleted, so no worker writes to them any more: an append finds no run, and
/// their hooks, released when they ended, take no payloads.
pub(in crate::store) async fn prune(
    tx: &mut impl Tx,
    before: SystemTime,
    now: SystemTime,
) -> Result<PruneStats, StoreError> {
    let runs = tx.prune_runs(sql_time(before), sql_time(now)).await?;
    if runs.is_empty() {
        return Ok(PruneStats::default());
    }
    let deleted = tx.prune_records(&runs).await?;
    Ok(PruneStats {
        runs: runs.len() as u64,
        events: deleted.first().copied().unwrap_or(0),
    })
}

/// A [`RunFilter`] as statement arguments, in the order of the `list_runs` statements'
/// parameters: status, workflow (NULL matches every run), the limit, the queue, the parent,
/// created at or after (ms), created before (ms), the cursor run, and the version.
/// Inspection, not a hot path: one statement serves every combination.
pub(in crate::store) fn run_filter(f: &RunFilter) -> RunFilterArgs {
    (
        f.status.map(RunStatus::as_str),
        f.workflow.clone(),
        sql_id(f.limit),
        f.queue.clone(),
        f.parent.map(|p| p.to_string()),
        f.created_after.map(sql_time),
        f.created_before.map(sql_time),
        f.after.map(|p| p.to_string()),
        f.version.clone(),
    )
}

/// See [`run_filter`].
pub(in crate::store) type RunFilterArgs = (
    Option<&'static str>,
    Option<String>,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// A page of [`RunFilter`] results: an empty page after a cursor run that the store does not
/// hold is [`StoreError::RunNotFound`], not the end of the listing.
pub(in crate::store) async fn listed(
    store: &impl RunStore,
    filter: &RunFilter,
    runs: Vec<RunRecord>,
) -> Result<Vec<RunRecord>, StoreError> {
    if let (true, Some(cursor)) = (runs.is_empty(), filter.after) {
        if store.get_run(&cursor).await?.is_none() {
            return Err(StoreError::RunNotFound(cursor));
        }
    }
    Ok(runs)
}

/// A [`HookFilter`] as statement arguments: token, run (NULL matches every hook) and the
/// limit.
pub(in crate::store) fn hook_filter(f: &HookFilter) -> (Option<String>, Option<String>, i64) {
    (
        f.token.clone(),
        f.run_id.map(|id| id.to_string()),
        sql_id(f.limit),
    )
}

/// The rows of the `run_counts` statement (workflow, status, count) as counts.
pub(in crate::store) fn counted(
    rows: Vec<(String, String, i64)>,
) -> Result<Vec<crate::store::RunCount>, StoreError> {
    rows.into_iter()
        .map(|(workflow, status, n)| {
            Ok(crate::store::RunCount {
                status: status_of(&status, &workflow)?,
                workflow,
                runs: u64::try_from(n).unwrap_or(0),
            })
        })
        .collect()
}
