//! What the SQL stores ([`super::sqlite`], [`super::postgres`]) share: how values become
//! columns and back, and how a bad column is reported.

use std::fmt;
use std::time::{Duration, SystemTime};

use super::{from_millis, to_millis, NewEvent, RunOutcome, RunStatus};
use crate::error::StoreError;

/// A time column: milliseconds since the Unix epoch.
pub(super) fn sql_time(t: SystemTime) -> i64 {
    i64::try_from(to_millis(t)).unwrap_or(i64::MAX)
}

/// The end of a lease taken at `now`, as a time column.
pub(super) fn lease_end(now: SystemTime, lease: Duration) -> i64 {
    let lease = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    sql_time(now).saturating_add(lease)
}

pub(super) fn sql_epoch(epoch: u64) -> i64 {
    // An epoch past i64::MAX cannot be stored, so it matches no row: the lease is lost.
    i64::try_from(epoch).unwrap_or(-1)
}

pub(super) fn sql_id(id: u64) -> i64 {
    // Ids never exceed i64::MAX, so "above" a larger id matches nothing either way.
    i64::try_from(id).unwrap_or(i64::MAX)
}

pub(super) fn payload_id_of(id: i64) -> Result<u64, StoreError> {
    u64::try_from(id).map_err(|e| StoreError::Corrupt(format!("payload id {id}: {e}")))
}

pub(super) fn to_json<T: serde::Serialize>(v: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Database(format!("cannot encode {what}: {e}")))
}

/// A column of run `run` that does not hold what this crate writes there.
pub(super) fn corrupt(run: &str, what: &str, why: impl fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("run {run}: {what}: {why}"))
}

/// A time column read back.
pub(super) fn time_of(ms: i64, run: &str, what: &str) -> Result<SystemTime, StoreError> {
    Ok(from_millis(
        u64::try_from(ms).map_err(|e| corrupt(run, what, e))?,
    ))
}

/// A status column read back.
pub(super) fn status_of(s: &str, run: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(s).ok_or_else(|| corrupt(run, "status", format!("unknown status `{s}`")))
}

/// An event as its columns: time, kind (the serde tag, for SQL inspection) and JSON.
pub(super) fn event_columns(e: &NewEvent) -> Result<(i64, String, String), StoreError> {
    let data = to_json(&e.event, "an event")?;
    Ok((sql_time(e.at), e.event.kind().to_owned(), data))
}

/// A run's end as the columns of its row: status, output JSON, error JSON.
pub(super) fn outcome_columns(
    outcome: &RunOutcome,
) -> Result<(RunStatus, Option<String>, Option<String>), StoreError> {
    Ok(match outcome {
        RunOutcome::Completed(v) => (
            RunStatus::Completed,
            Some(to_json(v, "the run's output")?),
            None,
        ),
        RunOutcome::Failed(e) => (
            RunStatus::Failed,
            None,
            Some(to_json(e, "the run's error")?),
        ),
    })
}
