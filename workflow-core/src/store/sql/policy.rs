//! The write policies of the SQL stores, written once over the statements each dialect
//! supplies ([`Tx`]): admission with its token claim, the claim of a token for a hook, fenced
//! appends (event numbering from `runs.last_seq`, delivered payloads leaving the inbox, token
//! releases, the run's end), failed tries, cancellation and pruning. Each policy runs inside
//! one transaction the dialect opened; the decisions that must be atomic across processes are
//! still single statements (the claim's upsert, the fence's `UPDATE`), so the database, not
//! this code, decides between contenders.

use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::error::{Error, StoreError};
use crate::history::after;
use crate::ids::RunId;
use crate::store::{
    block_backoff, failure_backoff, gave_up, no_token, Admission, AdmitOrResume, CancelOutcome,
    ClaimOutcome, Event, FailureOutcome, HookFilter, Lease, NewEvent, NewRun, PruneStats, QueueDef,
    RetryOutcome, RunFilter, RunRecord, RunStatus, RunStore, Store, MAX_FAILED_TRIES,
};

use super::rows::{InboxRow, QueueLimits};
use super::{
    lease_end, owner_of, sql_epoch, sql_id, sql_time, status_of, to_json, EncodedAppend,
    EncodedEnd, EncodedEvents,
};

/// A run to insert, as its columns.
#[derive(Debug)]
pub(in crate::store) struct NewRunRow {
    pub id: RunId,
    pub key: String,
    pub workflow: String,
    pub input: String,
    pub created_at: i64,
    /// The token to claim with the admission, and until when it stays retained.
    pub hook: Option<(String, Option<i64>)>,
    /// Leased to the admitting worker (epoch 1) until then.
    pub lease_until: Option<i64>,
    /// The run fails if it has not ended by then.
    pub deadline: Option<i64>,
    /// The parent that started it with `start_child`, and whether it is detached from it.
    pub parent: Option<(String, bool)>,
    /// The queue it waits in, its partition key and priority.
    pub queue: Option<String>,
    pub partition_key: Option<String>,
    pub priority: i32,
}

impl NewRunRow {
    /// `run`, leased to the admitting worker for `lease` if given.
    pub fn new(run: NewRun, lease: Option<Duration>) -> Result<Self, StoreError> {
        // A queued run waits for its slot, which only `acquire` gives.
        let lease = lease.filter(|_| run.queue.is_none());
        let (queue, partition_key, priority) = match run.queue {
            Some(q) => (Some(q.name), q.partition_key, q.priority),
            None => (None, None, 0),
        };
        Ok(NewRunRow {
            queue,
            partition_key,
            priority,
            id: run.id,
            key: run.id.to_string(),
            input: to_json(&run.input, "the run's input")?,
            workflow: run.workflow,
            created_at: sql_time(run.created_at),
            hook: run.hook.map(|h| (h.token, h.retain_until.map(sql_time))),
            lease_until: lease.map(|l| lease_end(run.created_at, l)),
            deadline: run.deadline.map(sql_time),
            parent: run.parent.map(|p| (p.run.to_string(), p.detached)),
        })
    }
}

/// The statements the policies run, inside one transaction of the dialect (SQLite's run
/// synchronously and are ready at once). Runs are named by their id as stored.
pub(in crate::store) trait Tx {
    /// True when a run has id `id`.
    fn run_exists(&mut self, id: &str) -> impl Future<Output = Result<bool, StoreError>>;

    /// Inserts `run` (status `pending`, or `running` with epoch 1 when it has a lease) unless
    /// its id exists; false then. A run nobody leased is announced as ready.
    fn insert_run(&mut self, run: &NewRunRow) -> impl Future<Output = Result<bool, StoreError>>;

    /// Claims `token` for `run` at `at` if it is free: no row, or a row neither active nor
    /// retained past `at` (one upsert on the token's primary key). True when claimed.
    fn claim(
        &mut self,
        token: &str,
        run: &str,
        at: i64,
        retain_until: Option<i64>,
    ) -> impl Future<Output = Result<bool, StoreError>>;

    /// The run recorded as the owner of `token` (which has a row), and whether its hook is
    /// active (not only retained).
    fn hook_owner(
        &mut self,
        token: &str,
    ) -> impl Future<Output = Result<(String, bool), StoreError>>;

    /// Queues `payload` (JSON) to the run whose active hook owns `token`, lowers that run's
    /// wake time to `at` (unless blocked) and announces it as `resume_hook` does; the payload
    /// row, or `None` (nothing written) when no active hook owns the token.
    fn resume(
        &mut self,
        token: &str,
        payload: &str,
        at: i64,
    ) -> impl Future<Output = Result<Option<InboxRow>, StoreError>>;

    /// Appends `events` numbered after the run's last (`runs.last_seq`, advanced by the same
    /// statement), only while `fence` (an epoch) holds the lease and the run may still be
    /// written, when given; false, writing nothing, when it does not. The statement updates
    /// the run's row, so where the dialect has row locks it stays locked until the
    /// transaction ends: no takeover, cancel or other write to the run interleaves.
    fn append_events(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
    ) -> impl Future<Output = Result<bool, StoreError>>;

    /// Gives up `tokens` if `run` owns them: a row retained past `now` stays, inactive; the
    /// others go, freeing their tokens at once. `None`: every token the run owns.
    fn release_tokens(
        &mut self,
        run: &str,
        tokens: Option<&[String]>,
        now: i64,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// Takes payloads `ids`, which an append delivered, out of the run's inbox.
    fn forget_payloads(
        &mut self,
        run: &str,
        ids: &[i64],
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// Counts a failed try at `run` if `epoch` holds its lease, and takes the lease; the
    /// run's count of failed tries in a row, or `None` when the lease is lost.
    fn count_failure(
        &mut self,
        run: &str,
        epoch: i64,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>>;

    /// Blocks `run` if `epoch` holds its lease: status `blocked`, `error` (JSON) as its error,
    /// the lease taken, at `now`; its count of blocks in a row, or `None` when the lease is
    /// lost.
    fn block(
        &mut self,
        run: &str,
        epoch: i64,
        error: &str,
        now: i64,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>>;

    /// Makes `run`, failed or blocked, due at `now`: a failed one becomes pending with its
    /// error cleared.
    fn retry(&mut self, run: &str, now: i64) -> impl Future<Output = Result<(), StoreError>>;

    /// Makes the run (given back) due at `at`.
    fn retry_at(&mut self, run: &str, at: i64) -> impl Future<Output = Result<(), StoreError>>;

    /// The run's status, the row locked against other writes where the dialect can.
    fn run_status(&mut self, run: &str)
        -> impl Future<Output = Result<Option<String>, StoreError>>;

    /// Deletes the runs that ended before `before` and own no hook row retained past `now`;
    /// their ids.
    fn prune_runs(
        &mut self,
        before: i64,
        now: i64,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// Deletes what was recorded for `runs`, one statement per table (events first); the
    /// number of rows each deleted.
    fn prune_records(
        &mut self,
        runs: &[String],
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>>;

    /// The queues with runs of `workflows` waiting to begin that are due at `now` and not
    /// leased, by name.
    fn waiting_queues(
        &mut self,
        now: i64,
        workflows: &[String],
    ) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// The limits of queue `name`, its row locked until the transaction ends where the
    /// dialect can (so one acquirer at a time begins runs of the queue); `None` for a queue
    /// nobody declared.
    fn lock_queue(
        &mut self,
        name: &str,
    ) -> impl Future<Output = Result<Option<QueueLimits>, StoreError>>;

    /// Of queue `name`: the runs holding a slot (begun, not ended), and the runs begun after
    /// `since`.
    fn queue_counts(
        &mut self,
        name: &str,
        since: i64,
    ) -> impl Future<Output = Result<(i64, i64), StoreError>>;

    /// Up to `limit` waiting runs of queue `name` that may begin at `now`: of `workflows`,
    /// due, not leased, and, with a partition key, the key's earliest started waiting run
    /// while no run of the key holds a slot. Higher priority first, then start order.
    fn queue_candidates(
        &mut self,
        name: &str,
        now: i64,
        workflows: &[String],
        limit: i64,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// Appends `chunk` to its stream of `run` while `fence` (an epoch) holds the run's lease:
    /// the run's row is locked until the transaction ends (no end or cancel of the run
    /// interleaves), the chunk's index is the stream's length (the stream's row, created if
    /// needed, is the counter, locked too), and the chunk is announced where the dialect can.
    /// Nothing is written when the lease is lost or the stream is closed.
    fn append_chunk(
        &mut self,
        run: &str,
        fence: i64,
        chunk: &EncodedChunk,
    ) -> impl Future<Output = Result<ChunkAppend, StoreError>>;

    /// Closes stream `stream` of `run`, creating it (empty) if needed, and announces it
    /// where the dialect can.
    fn close_stream(
        &mut self,
        run: &str,
        stream: &str,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// Takes, before any run row is locked, the lock a child's end needs to queue its notice
    /// to the parent (PostgreSQL's inbox lock; SQLite's writer holds every lock already):
    /// for `Some(run)` only when that run has a parent (then the dialect may take it with
    /// the run's next statement, its fenced append), for `None` always. Taken in this order
    /// (inbox, then run rows) by every writer that queues payloads, so none waits for
    /// another in a cycle.
    fn lock_inbox_for_end(
        &mut self,
        run: Option<&str>,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// The children of `run` a cancellation of it reaches: not detached, not ended.
    fn children_to_cancel(
        &mut self,
        run: &str,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// Ends the run as `end` says, at `now`, without a lease; announces the end. A child's
    /// end goes to its parent's inbox too ([`EncodedEnd::notice`]), making the parent due.
    fn end_run(
        &mut self,
        run: &str,
        end: &EncodedEnd,
        now: i64,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// A run's last write: appends `events` as [`Tx::append_events`] does (false, writing
    /// nothing, when `fence` no longer holds) and then ends the run as
    /// [`Tx::end_run_releasing`] does. A dialect may do both in one statement.
    fn append_and_end(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
        end: &EncodedEnd,
        now: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> {
        async move {
            if !self.append_events(run, fence, events).await? {
                return Ok(false);
            }
            self.end_run_releasing(run, end, now).await?;
            Ok(true)
        }
    }

    /// Ends the run ([`Tx::end_run`]) and gives up every token it owns
    /// ([`Tx::release_tokens`] with `None`), both at `now`: how every end is written. A
    /// dialect may do both in one statement (one round trip).
    fn end_run_releasing(
        &mut self,
        run: &str,
        end: &EncodedEnd,
        now: i64,
    ) -> impl Future<Output = Result<(), StoreError>> {
        async move {
            self.end_run(run, end, now).await?;
            self.release_tokens(run, None, now).await
        }
    }
}

pub(in crate::store) fn exists(id: &RunId) -> StoreError {
    StoreError::database(format!("run {id} already exists"))
}

/// Admits `run`. With a token, the claim goes first: when it loses, nothing at all is
/// written. Without one, the insert alone decides (one statement).
pub(in crate::store) async fn admit(
    tx: &mut impl Tx,
    run: &NewRunRow,
) -> Result<(Admission, Option<Lease>), StoreError> {
    if let Some((token, retain_until)) = &run.hook {
        // An existing id is an error before any claim, as in the memory store.
        if tx.run_exists(&run.key).await? {
            return Err(exists(&run.id));
        }
        if let Some(owner) = claim_token(tx, token, &run.key, run.created_at, *retain_until).await?
        {
            return Ok((Admission::Conflict(owner), None));
        }
    }
    if !tx.insert_run(run).await? {
        return Err(exists(&run.id));
    }
    let lease = run.lease_until.map(|_| Lease {
        run_id: run.id,
        epoch: 1,
    });
    Ok((Admission::Admitted, lease))
}

/// `start(..).hook(token).or_resume(payload)`: queues `payload` to the token's live owner, or
/// else admits `run` with the token; a token only retained by an ended run is a conflict and
/// nothing is written. `None` when neither could be decided in this transaction: a hook took
/// the token between the resume, which found none, and the claim. The caller then rolls the
/// transaction back (nothing was written) and tries again, and the next resume finds that
/// hook.
///
/// The resume goes first, so the locks are taken in the order every other writer takes them
/// (PostgreSQL's inbox lock, then the owner's run row; the token's row only when the run is
/// admitted): a claim that lost would hold the token's row while waking the owner's run row,
/// and that run's worker, ending it, holds the run row while releasing the token's row.
pub(in crate::store) async fn admit_or_resume(
    tx: &mut impl Tx,
    run: &NewRunRow,
    payload: &str,
) -> Result<Option<AdmitOrResume>, StoreError> {
    let Some((token, retain_until)) = &run.hook else {
        return Err(no_token());
    };
    if tx.run_exists(&run.key).await? {
        return Err(exists(&run.id));
    }
    if let Some(queued) = tx.resume(token, payload, run.created_at).await? {
        let (payload_id, run) = queued.decode()?;
        return Ok(Some(AdmitOrResume::Resumed { run, payload_id }));
    }
    if tx
        .claim(token, &run.key, run.created_at, *retain_until)
        .await?
    {
        if !tx.insert_run(run).await? {
            return Err(exists(&run.id));
        }
        let lease = run.lease_until.map(|_| Lease {
            run_id: run.id,
            epoch: 1,
        });
        return Ok(Some(AdmitOrResume::Admitted(lease)));
    }
    let (owner, active) = tx.hook_owner(token).await?;
    if active {
        return Ok(None);
    }
    Ok(Some(AdmitOrResume::Conflict(owner_of(&owner, token)?)))
}

/// Claims `token` for `run`; the owner when it is taken (and then nothing was written).
async fn claim_token(
    tx: &mut impl Tx,
    token: &str,
    run: &str,
    at: i64,
    retain_until: Option<i64>,
) -> Result<Option<RunId>, StoreError> {
    if tx.claim(token, run, at, retain_until).await? {
        return Ok(None);
    }
    let (owner, _) = tx.hook_owner(token).await?;
    owner_of(&owner, token).map(Some)
}

/// The waiting queued runs that may begin at `now` within their queues' limits, at most
/// `room`, for `acquire` to lease (see [`Store::acquire`]). Each queue's row is locked while
/// it is decided, and the counts are read after the lock is granted, so concurrent acquirers
/// in any process take turns per queue and each sees the runs the previous one began.
/// Queues are visited in name order, so two acquirers never wait on each other's locks in a
/// cycle.
pub(in crate::store) async fn queued_to_begin(
    tx: &mut impl Tx,
    now: i64,
    workflows: &[String],
    mut room: i64,
) -> Result<Vec<String>, StoreError> {
    let mut begin = Vec::new();
    if room <= 0 {
        return Ok(begin);
    }
    for queue in tx.waiting_queues(now, workflows).await? {
        if room <= 0 {
            break;
        }
        let Some(limits) = tx.lock_queue(&queue).await? else {
            continue;
        };
        let since = limits
            .rate_period
            .map_or(i64::MAX, |p| now.saturating_sub(p));
        // A queue that only orders its runs (partition keys, priority) counts nothing.
        let limited = limits.concurrency.is_some() || limits.rate_limit.is_some();
        let (holding, begun) = if limited {
            tx.queue_counts(&queue, since).await?
        } else {
            (0, 0)
        };
        let mut allowance = room;
        if let Some(c) = limits.concurrency {
            allowance = allowance.min(c - holding);
        }
        if let (Some(n), Some(_)) = (limits.rate_limit, limits.rate_period) {
            allowance = allowance.min(n - begun);
        }
        if allowance <= 0 {
            continue;
        }
        let picked = tx
            .queue_candidates(&queue, now, workflows, allowance)
            .await?;
        room -= picked.len() as i64;
        begin.extend(picked);
    }
    Ok(begin)
}

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
                .append_and_end(&run, fence, &write.events, end, write.now)
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

/// Admits `run` (no token) with `history` recorded.
pub(in crate::store) async fn create_with_history(
    tx: &mut impl Tx,
    run: &NewRunRow,
    history: &EncodedEvents,
) -> Result<(), StoreError> {
    if run.hook.is_some() {
        return Err(StoreError::database(
            "a run created with a history cannot claim a token",
        ));
    }
    if !tx.insert_run(run).await? {
        return Err(exists(&run.id));
    }
    tx.append_events(&run.key, None, history).await?;
    Ok(())
}

/// Claims `token` for hook `hook_key` of the leased run and records the decision.
pub(in crate::store) async fn claim_hook(
    tx: &mut impl Tx,
    lease: &Lease,
    hook_key: &str,
    token: &str,
    at: SystemTime,
) -> Result<ClaimOutcome, StoreError> {
    let run = lease.run_id.to_string();
    let fence = Some(sql_epoch(lease.epoch));
    if !tx
        .append_events(&run, fence, &EncodedEvents::default())
        .await?
    {
        return Err(StoreError::LeaseLost(lease.run_id));
    }
    let conflict = claim_token(tx, token, &run, sql_time(at), None).await?;
    let event = EncodedEvents::new(&[NewEvent {
        at,
        event: Event::HookRegistered {
            hook_key: hook_key.to_owned(),
            token: token.to_owned(),
            conflict,
        },
    }])?;
    tx.append_events(&run, None, &event).await?;
    Ok(match conflict {
        None => ClaimOutcome::Claimed,
        Some(owner) => ClaimOutcome::Conflict(owner),
    })
}

/// Admits `child` under the leased run and records the [`Event::ChildStarted`] that says so
/// (or, when the child's token is taken, its owner as the conflict, and no child).
pub(in crate::store) async fn start_child(
    tx: &mut impl Tx,
    lease: &Lease,
    child_key: &str,
    child: &NewRunRow,
) -> Result<Admission, StoreError> {
    let run = lease.run_id.to_string();
    let fence = Some(sql_epoch(lease.epoch));
    if !tx
        .append_events(&run, fence, &EncodedEvents::default())
        .await?
    {
        return Err(StoreError::LeaseLost(lease.run_id));
    }
    let (admission, _) = admit(tx, child).await?;
    let conflict = match admission {
        Admission::Admitted => None,
        Admission::Conflict(owner) => Some(owner),
    };
    let event = EncodedEvents::new(&[NewEvent {
        at: crate::history::from_millis(u64::try_from(child.created_at).unwrap_or(0)),
        event: Event::ChildStarted {
            refused: None,
            child_key: child_key.to_owned(),
            child_id: child.id,
            workflow: child.workflow.clone(),
            conflict,
        },
    }])?;
    tx.append_events(&run, None, &event).await?;
    Ok(admission)
}

/// A chunk to append ([`append_chunk`]), encoded before the transaction.
pub(in crate::store) struct EncodedChunk {
    pub stream: String,
    pub attempt: i64,
    pub at: i64,
    /// JSON.
    pub value: String,
}

impl EncodedChunk {
    pub fn new(
        stream: &str,
        attempt: u32,
        value: &serde_json::Value,
        at: SystemTime,
    ) -> Result<Self, StoreError> {
        Ok(EncodedChunk {
            stream: stream.to_owned(),
            attempt: i64::from(attempt),
            at: sql_time(at),
            value: to_json(value, "the chunk")?,
        })
    }
}

/// What [`Tx::append_chunk`] did.
pub(in crate::store) enum ChunkAppend {
    /// Appended at this index.
    Appended(i64),
    /// The stream is closed; nothing written.
    Closed,
    /// The fence refused the write; nothing written.
    LeaseLost,
}

/// Holds `lease` for the rest of the transaction (the run's row stays locked where the
/// dialect locks rows: a chunk and the run's end or a cancel do not interleave), or
/// [`StoreError::LeaseLost`].
async fn fence(tx: &mut impl Tx, lease: &Lease) -> Result<String, StoreError> {
    let run = lease.run_id.to_string();
    let fence = Some(sql_epoch(lease.epoch));
    if !tx
        .append_events(&run, fence, &EncodedEvents::default())
        .await?
    {
        return Err(StoreError::LeaseLost(lease.run_id));
    }
    Ok(run)
}

/// Appends `chunk` to its stream of the leased run; its index, or `None` (nothing written)
/// when the stream is closed. The index is drawn by the stream row's upsert, so concurrent
/// writers to one stream get distinct, gap-free indexes in commit order.
pub(in crate::store) async fn append_chunk(
    tx: &mut impl Tx,
    lease: &Lease,
    chunk: &EncodedChunk,
) -> Result<Option<u64>, StoreError> {
    let run = lease.run_id.to_string();
    match tx.append_chunk(&run, sql_epoch(lease.epoch), chunk).await? {
        ChunkAppend::Appended(idx) => u64::try_from(idx)
            .map(Some)
            .map_err(|e| super::corrupt(&run, &format!("stream {:?}: len", chunk.stream), e)),
        ChunkAppend::Closed => Ok(None),
        ChunkAppend::LeaseLost => Err(StoreError::LeaseLost(lease.run_id)),
    }
}

/// Closes stream `stream` of the leased run.
pub(in crate::store) async fn close_stream(
    tx: &mut impl Tx,
    lease: &Lease,
    stream: &str,
) -> Result<(), StoreError> {
    let run = fence(tx, lease).await?;
    tx.close_stream(&run, stream).await
}

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
    let mut tree = tx.children_to_cancel(&key).await?;
    while let Some(child) = tree.pop() {
        // Read with its row locked, like the run's: a child ending on its own meanwhile is
        // left as it ended.
        let status = tx.run_status(&child).await?;
        if status.is_none_or(|s| status_of(&s, &child).is_ok_and(RunStatus::is_terminal)) {
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
        tree.extend(tx.children_to_cancel(&child).await?);
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

/// A [`RunFilter`] as statement arguments, in the order of the `list_runs` statements'
/// parameters: status, workflow (NULL matches every run), the limit, the queue, the parent,
/// created at or after (ms), created before (ms), and the cursor run. Inspection, not a hot
/// path: one statement serves every combination.
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

/// A queue's columns: name, concurrency, rate limit, rate period (ms).
pub(in crate::store) type QueueColumns = (String, Option<i64>, Option<i64>, Option<i64>);

/// [`QueueDef`]s as rows: name, concurrency, rate limit, rate period (ms); in name order
/// (byte-wise), the order `acquire` locks queues in, so a declaration and an acquire never
/// wait on each other's locks in a cycle.
pub(in crate::store) fn queue_rows(queues: &[QueueDef]) -> Vec<QueueColumns> {
    let mut queues: Vec<&QueueDef> = queues.iter().collect();
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    queues
        .into_iter()
        .map(|q| {
            (
                q.name.clone(),
                q.concurrency.map(i64::from),
                q.rate_limit.map(|(n, _)| i64::from(n)),
                q.rate_limit
                    .map(|(_, p)| i64::try_from(p.as_millis()).unwrap_or(i64::MAX)),
            )
        })
        .collect()
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
