//! A leased run's writes: fenced appends (events, delivered payloads leaving the inbox, token
//! releases, the run's end), failed tries, blocks, retries, and which leases a heartbeat lost.

use std::time::SystemTime;

use super::{admit, admit_many, Admitted, NewRunRow, Tx};
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
    if !write.release_tokens.is_empty() {
        tx.release_tokens(&run, Some(&write.release_tokens), write.now)
            .await?;
    }
    if let Some(end) = &write.end {
        tx.end_run_releasing(&run, end, write.now).await?;
    }
    Ok(())
}

/// A write of a group transaction ([`group`]): an append, or an admission without a token.
pub(in crate::store) enum GroupWrite<'a> {
    Append(&'a Lease, &'a EncodedAppend),
    Admit(&'a NewRunRow),
}

impl GroupWrite<'_> {
    /// The append, when it only adds events (a step's result and the next step, say).
    fn events_only(&self) -> Option<(&Lease, &EncodedAppend)> {
        match self {
            GroupWrite::Append(lease, write) if write.events_only() => Some((lease, write)),
            _ => None,
        }
    }
}

/// The answer of one write of a group.
#[derive(Debug)]
pub(in crate::store) enum Answer {
    Append(Result<(), StoreError>),
    Admit(Result<Admitted, StoreError>),
}

impl Answer {
    /// The error, if the write failed.
    pub fn error(&self) -> Option<&StoreError> {
        match self {
            Answer::Append(r) => r.as_ref().err(),
            Answer::Admit(r) => r.as_ref().err(),
        }
    }
}

/// Why a group transaction cannot give its writes their own answers: it is rolled back.
#[derive(Debug)]
pub(in crate::store) enum GroupError {
    /// A statement failed in a way that may have aborted the transaction (PostgreSQL aborts
    /// it on any failed statement): each write is redone alone.
    Redo(StoreError),
    /// The transaction cannot go on: every write fails with this.
    Failed(StoreError),
}

/// The writes of several runs in one transaction, in the order given (the caller's order of
/// locking rows): each write's own answer. A write refused without writing (lease lost)
/// answers only its caller; any other error of a write is the group's
/// ([`GroupError::Redo`]). No savepoints: a refusal of these policies (`append`: the fenced
/// first statement; `admit` without a token: its one insert) writes nothing.
///
/// Where the dialect can, one statement does the work of several writes: the admissions,
/// which insert new rows no other writer waits for, go first and together
/// ([`Tx::insert_many`]); neighbours that only add events go together
/// ([`Tx::append_many`]), locking their rows in the given order. A group ending runs takes
/// the inbox lock first ([`Tx::lock_inbox_for_ends`]), before any row lock, as every writer
/// that queues a child's end does.
pub(in crate::store) async fn group(
    tx: &mut impl Tx,
    writes: &[GroupWrite<'_>],
) -> Result<Vec<Answer>, GroupError> {
    let ending: Vec<String> = writes
        .iter()
        .filter_map(|w| match w {
            GroupWrite::Append(lease, write) if write.end.is_some() => {
                Some(lease.run_id.to_string())
            }
            _ => None,
        })
        .collect();
    if !ending.is_empty() {
        tx.lock_inbox_for_ends(&ending)
            .await
            .map_err(GroupError::Failed)?;
    }
    let admitting: Vec<&NewRunRow> = writes
        .iter()
        .filter_map(|w| match w {
            GroupWrite::Admit(row) => Some(*row),
            GroupWrite::Append(..) => None,
        })
        .collect();
    let together = admitting.len() >= 2;
    let mut admitted = if together {
        admit_many(tx, &admitting).await.map_err(GroupError::Redo)?
    } else {
        Vec::new()
    }
    .into_iter();
    let mut answers = Vec::with_capacity(writes.len());
    let mut rest = writes;
    while let Some(write) = rest.first() {
        let plain = rest
            .iter()
            .take_while(|w| w.events_only().is_some())
            .count();
        if plain >= 2 {
            let (these, after) = rest.split_at(plain);
            rest = after;
            answers.extend(append_many(tx, these).await.map_err(GroupError::Redo)?);
            continue;
        }
        rest = &rest[1..];
        let answer = match write {
            // Answered by `admit_many`, an id that existed included (that statement wrote
            // the others).
            GroupWrite::Admit(_) if together => match admitted.next() {
                Some(answer) => Answer::Admit(answer),
                None => {
                    return Err(GroupError::Redo(StoreError::database(
                        "internal error: an admission of a group went unanswered",
                    )))
                }
            },
            GroupWrite::Admit(row) => Answer::Admit(admit(tx, row).await),
            GroupWrite::Append(lease, write) => Answer::Append(append(tx, lease, write).await),
        };
        if let Some(StoreError::Database(why)) = answer.error() {
            return Err(GroupError::Redo(StoreError::Database(why.clone())));
        }
        answers.push(answer);
    }
    Ok(answers)
}

/// The events of `writes` (appends that only add events, of distinct runs, in the order
/// their rows are to be locked), each fenced by its lease: each one's answer.
async fn append_many(
    tx: &mut impl Tx,
    writes: &[GroupWrite<'_>],
) -> Result<Vec<Answer>, StoreError> {
    let (mut runs, mut fences, mut events, mut ids) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (lease, write) in writes.iter().filter_map(GroupWrite::events_only) {
        runs.push(lease.run_id.to_string());
        fences.push(sql_epoch(lease.epoch));
        events.push(&write.events);
        ids.push(lease.run_id);
    }
    let written = tx.append_many(&runs, &fences, &events).await?;
    Ok(ids
        .into_iter()
        .zip(written)
        .map(|(id, written)| {
            Answer::Append(match written {
                true => Ok(()),
                false => Err(StoreError::LeaseLost(id)),
            })
        })
        .collect())
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
