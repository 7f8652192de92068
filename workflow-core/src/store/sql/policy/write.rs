//! A leased run's writes: fenced appends (events, delivered payloads leaving the inbox, token
//! releases, the run's end), failed tries, blocks, retries, and which leases a heartbeat lost.

use std::time::SystemTime;

use super::Tx;
use crate::error::{Error, StoreError};
use crate::history::after;
use crate::ids::RunId;
use crate::store::sql::{
    sql_epoch, sql_time, status_of, to_json, EncodedAppend, EncodedEnd, EncodedEvents,
};
use crate::store::{
    block_backoff, failure_backoff, gave_up, Event, FailureOutcome, Lease, NewEvent, RetryOutcome,
    RunStatus, Store, MAX_FAILED_TRIES,
};

/// The worker's write under `lease`: all of it, or [`StoreError::LeaseLost`] and nothing.
pub(in crate::store) async fn append(
    tx: &mut impl Tx,
    lease: &Lease,
    write: &EncodedAppend,
) -> Result<(), StoreError> {
    let run = lease.run_id.to_string();
    let fence = Some(sql_epoch(lease.epoch));
    if let Some(end) = &write.end {
        tx.lock_inbox_for_end(Some(&run)).await?;
        // The usual end (no payload delivered, no token given up by itself): one write.
        if write.plain_end() {
            return match tx
                .append_and_end(&run, fence, &write.events, end, write.now, write.hint)
                .await?
            {
                true => Ok(()),
                false => Err(StoreError::LeaseLost(lease.run_id)),
            };
        }
    }
    if !tx.append_events(&run, fence, &write.events).await? {
        return Err(StoreError::LeaseLost(lease.run_id));
    }
    if !write.events.received.is_empty() {
        tx.forget_payloads(&run, &write.events.received).await?;
    }
    for (key, value) in &write.events.published {
        tx.publish_event(&run, key, value, write.now).await?;
    }
    for (id, reply) in &write.events.replies {
        tx.record_reply(&run, *id, reply, write.now).await?;
    }
    if !write.release_tokens.is_empty() {
        tx.release_tokens(&run, Some(&write.release_tokens), write.now)
            .await?;
    }
    if let Some(end) = &write.end {
        tx.end_run_releasing(&run, end, write.now).await?;
    }
    Ok(())
}

/// A failed try at a run (see [`crate::store::Store::record_failure`]), encoded before the
/// transaction: the event and the end written should it be the last.
pub(in crate::store) struct EncodedFailure {
    pub now: SystemTime,
    pub event: EncodedEvents,
    pub end: EncodedEnd,
}

impl EncodedFailure {
    pub fn new(cause: &Error, now: SystemTime) -> Result<Self, StoreError> {
        let error = gave_up(cause);
        Ok(EncodedFailure {
            now,
            event: EncodedEvents::new(&[NewEvent {
                at: now,
                event: Event::RunFailed {
                    error: error.clone(),
                },
            }])?,
            end: EncodedEnd {
                status: RunStatus::Failed,
                output: None,
                error: Some(to_json(&error, "the run's error")?),
            },
        })
    }
}

/// Counts a failed try at the run `epoch` leased: gives it back until it is due again, or,
/// on the last try, fails it. [`StoreError::LeaseLost`] when `epoch` no longer holds it.
pub(in crate::store) async fn record_failure(
    tx: &mut impl Tx,
    run: &RunId,
    epoch: i64,
    failure: &EncodedFailure,
) -> Result<FailureOutcome, StoreError> {
    let key = run.to_string();
    let Some(tries) = tx.count_failure(&key, epoch).await? else {
        return Err(StoreError::LeaseLost(*run));
    };
    let tries = u32::try_from(tries).unwrap_or(u32::MAX);
    let now = sql_time(failure.now);
    if tries >= MAX_FAILED_TRIES {
        tx.append_events(&key, None, &failure.event).await?;
        tx.end_run_releasing(&key, &failure.end, now).await?;
        return Ok(FailureOutcome::Failed);
    }
    let at = after(failure.now, failure_backoff(tries));
    tx.retry_at(&key, sql_time(at)).await?;
    Ok(FailureOutcome::Retrying { tries, at })
}

/// Records the failed try at a run `acquire` leased but cannot hand out, because its row or
/// history cannot be decoded. Logged, not returned: the other runs of the call go on.
pub(in crate::store) async fn undecodable(
    store: &impl Store,
    lease: &Lease,
    why: &StoreError,
    now: SystemTime,
) {
    let cause = Error::fatal(why.to_string());
    match store.record_failure(lease, &cause, now).await {
        Ok(outcome) => tracing::error!(
            run_id = %lease.run_id,
            error = %why,
            ?outcome,
            "a leased run cannot be decoded"
        ),
        Err(e) => tracing::error!(
            run_id = %lease.run_id,
            error = %why,
            record_error = %e,
            "a leased run cannot be decoded, and its failed try could not be recorded"
        ),
    }
}

/// Blocks the run `epoch` leased, with `divergence` as its error; when it is due again.
pub(in crate::store) async fn block(
    tx: &mut impl Tx,
    run: &RunId,
    epoch: i64,
    divergence: &str,
    now: SystemTime,
) -> Result<SystemTime, StoreError> {
    let key = run.to_string();
    let Some(tries) = tx.block(&key, epoch, divergence, sql_time(now)).await? else {
        return Err(StoreError::LeaseLost(*run));
    };
    let at = after(now, block_backoff(u32::try_from(tries).unwrap_or(u32::MAX)));
    tx.retry_at(&key, sql_time(at)).await?;
    Ok(at)
}

/// `run.retry()`: re-opens a failed run (recording `RunRetried`) or makes a blocked one due.
pub(in crate::store) async fn retry(
    tx: &mut impl Tx,
    run: &RunId,
    now: SystemTime,
) -> Result<RetryOutcome, StoreError> {
    let retried = EncodedEvents::new(&[NewEvent {
        at: now,
        event: Event::RunRetried,
    }])?;
    let key = run.to_string();
    let status = tx.run_status(&key).await?;
    let outcome = match status_of(&status.ok_or(StoreError::RunNotFound(*run))?, &key)? {
        RunStatus::Failed => {
            tx.append_events(&key, None, &retried).await?;
            RetryOutcome::Reopened
        }
        RunStatus::Blocked => RetryOutcome::Unblocked,
        other => return Ok(RetryOutcome::NotRetryable(other)),
    };
    tx.retry(&key, sql_time(now)).await?;
    Ok(outcome)
}

/// The runs among `leases` a heartbeat did not renew (`renewed`: the `(id, epoch)` of each
/// row its statement updated): their worker no longer holds them.
pub(in crate::store) fn lost(leases: &[Lease], renewed: Vec<(String, i64)>) -> Vec<RunId> {
    let renewed: std::collections::HashSet<(String, i64)> = renewed.into_iter().collect();
    leases
        .iter()
        .filter(|l| !renewed.contains(&(l.run_id.to_string(), sql_epoch(l.epoch))))
        .map(|l| l.run_id)
        .collect()
}
