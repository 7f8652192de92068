//! Runs and their histories: admitting a run, leasing it to a worker, fenced appends of its
//! events, giving it back, blocking, retrying, cancelling, and the children a run starts. The
//! life of every run goes through [`RunStore`].

use std::time::{Duration, SystemTime};

use crate::error::{Error, StoreError};
use crate::ids::RunId;

use super::*;

/// What [`RunStore::create_run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The run exists (and owns its start token, if it asked for one).
    Admitted,
    /// The start token is owned (or retained) by this run; nothing was written.
    Conflict(RunId),
}

/// A write of the worker driving a run: events in order, hook tokens to release, and possibly
/// the run's end — all or nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Append {
    /// Appended in order.
    pub events: Vec<NewEvent>,
    /// Tokens this run owns and gives up (kept unavailable until their retention ends).
    pub release_tokens: Vec<String>,
    /// Ends the run: status, output or error; releases every token the run owns and the lease.
    pub outcome: Option<RunOutcome>,
    /// What the writer knows of the run, for a store choosing how to write its end (with
    /// `outcome`). Only a hint: a wrong one may cost a store a round trip, or a retry of its
    /// transaction, never a wrong write. The default, [`EndHint::Unknown`], claims nothing.
    pub end_hint: EndHint,
    /// Read only by [`RunStore::continue_as_new`]: inbox entries whose delivery this run
    /// recorded (in this write or before) but whose workflow never took them (a payload
    /// buffered for a hook the run still holds, a message whose `recv` lost a `select`).
    /// The continuation puts them back into the inbox under their own ids, for the next
    /// run, so each is received by exactly one run of the chain and in its order; a hook
    /// payload only when the next run inherits its token (one the run gave up earlier took
    /// its payloads with it).
    pub carried: Vec<InboxEntry>,
}

/// What the writer of a run's end knows of the run's ties to other records, which the end
/// must update: the parent told of the end, the queue slot freed, the tokens given up (see
/// [`Append::end_hint`]). The driver knows them from the leased run's [`RunRecord`] (parent,
/// queue, start token) and from its history (the hooks it holds); a store may ignore them.
///
/// ```
/// use workflow_core::store::{Append, EndHint, RunOutcome};
///
/// let end = Append {
///     outcome: Some(RunOutcome::Completed(serde_json::json!(42))),
///     end_hint: EndHint::Alone,
///     ..Append::default()
/// };
/// assert!(end.events.is_empty());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum EndHint {
    /// Nothing is known: the store prepares the end for every tie.
    #[default]
    Unknown,
    /// The run has no parent, no queue, no start token and holds no active hook: its end
    /// touches only its own row and history.
    Alone,
    /// The run has no parent, but has a queue, a start token or an active hook.
    NoParent,
    /// The run has a parent (it was started with `start_child`), whose inbox its end
    /// reaches.
    Child,
}

/// A worker's claim on a run. `epoch` is the fencing token: it grows with every acquisition,
/// and a write carrying an older epoch is refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The leased run.
    pub run_id: RunId,
    /// The acquisition this lease belongs to.
    pub epoch: u64,
}

impl Lease {
    /// The lease of a run leased at its admission (or its continuation's): the first
    /// acquisition, epoch 1.
    pub fn admitted(run_id: RunId) -> Lease {
        Lease { run_id, epoch: 1 }
    }
}

/// A run handed to a worker by [`RunStore::acquire`].
#[derive(Debug, Clone)]
pub struct LeasedRun {
    /// The run as stored (its status is now `Running`).
    pub run: RunRecord,
    /// The claim to present on every write.
    pub lease: Lease,
    /// The whole history, in order.
    pub events: Vec<EventRecord>,
    /// The run's previous lease was still set but had expired: a worker stopped renewing it
    /// (it died, stalled or was cut off) without giving the run back, and this acquire took
    /// the run over (`workflow_lease_takeovers_total`). False for a run never leased, given
    /// back by a release (a run waiting on a timer, a hook or a message), or leased at
    /// admission.
    pub took_over: bool,
}

impl LeasedRun {
    /// `run`, leased at its admission ([`Lease::admitted`]) with no history yet.
    pub fn admitted(run: RunRecord) -> LeasedRun {
        LeasedRun {
            lease: Lease::admitted(run.id),
            run,
            events: Vec::new(),
            took_over: false,
        }
    }
}

/// What [`RunStore::acquire`] may hand out.
#[derive(Debug, Clone)]
pub struct AcquireRequest<'a> {
    /// The acquiring worker.
    pub worker_id: &'a str,
    /// Only runs of these workflows.
    pub workflows: &'a [String],
    /// The lease lasts this long unless renewed by [`RunStore::heartbeat`].
    pub lease: Duration,
    /// At most this many runs.
    pub limit: usize,
    /// The current time.
    pub now: SystemTime,
}

/// What [`RunStore::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The run is now cancelled.
    Cancelled,
    /// The run had already ended with this status; nothing changed.
    AlreadyEnded(RunStatus),
}

/// How many tries in a row a run gets when handling it keeps failing on a store error that is
/// not transient (a value the database refuses, a row it cannot decode): on the last,
/// [`RunStore::record_failure`] fails the run instead of giving it back (poison runs).
pub const MAX_FAILED_TRIES: u32 = 5;

/// How long a run waits after its `tries`-th failed try in a row before it is handed out
/// again: half a second, doubling, at most a minute.
pub fn failure_backoff(tries: u32) -> Duration {
    let doublings = tries.saturating_sub(1).min(7);
    Duration::from_millis(500 << doublings).min(Duration::from_secs(60))
}

/// The error a run fails with when its last try failed on `cause`.
pub(crate) fn gave_up(cause: &Error) -> Error {
    Error::fatal(format!(
        "gave up on the run after {MAX_FAILED_TRIES} failed tries in a row; the last failed \
         with: {}",
        cause.message()
    ))
}

/// Refuses a continuation whose write ends the run or gives up tokens, or whose next run
/// claims a token: both are the store's to decide.
pub(crate) fn check_continuation(write: &Append, next: &NewRun) -> Result<(), StoreError> {
    if write.outcome.is_some() || !write.release_tokens.is_empty() || next.hook.is_some() {
        return Err(StoreError::database(
            "a continuation neither ends the run, gives up tokens, nor claims a token for the \
             next run",
        ));
    }
    Ok(())
}

/// How long a blocked run waits before a worker tries it again, after its `tries`-th block in
/// a row: a minute, doubling, at most an hour.
pub fn block_backoff(tries: u32) -> Duration {
    let doublings = tries.saturating_sub(1).min(6);
    Duration::from_secs(60 << doublings).min(Duration::from_secs(3600))
}

/// What [`RunStore::retry`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOutcome {
    /// A failed run was re-opened (`RunRetried` recorded) and is due now.
    Reopened,
    /// A blocked run is due now.
    Unblocked,
    /// Nothing to retry: the run has this status (completed, cancelled, or not ended).
    NotRetryable(RunStatus),
}

/// What [`RunStore::record_failure`] did with the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOutcome {
    /// Given back, due again at `at`; `tries` failed tries in a row so far.
    Retrying {
        /// Failed tries in a row, this one included.
        tries: u32,
        /// When the run is due again.
        at: SystemTime,
    },
    /// The run failed: this was try [`MAX_FAILED_TRIES`].
    Failed,
}

/// A change pushed by a store that can tell other processes about it (PostgreSQL's
/// `LISTEN/NOTIFY`). Stores without push leave workers to poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Runs became acquirable (admitted, released with a wake time, woken by a payload).
    RunsReady,
    /// Run `0` received a payload.
    Payload(RunId),
    /// Run `0` ended (completed, failed or cancelled).
    RunEnded(RunId),
    /// A stream of run `0` received a chunk or was closed.
    Chunk(RunId),
    /// Schedules were defined, paused, resumed or deleted.
    SchedulesChanged,
}

/// What [`RunStore::create_run_leased_with`] did.
#[derive(Debug)]
pub enum AdmittedWith {
    /// The admission, as [`RunStore::create_run_leased`] answers it; when leased, the first
    /// write committed with it.
    Done(Admission, Option<Lease>),
    /// Nothing: the store cannot admit and append in one act. The run given, back (boxed:
    /// the rare answer, and a large one).
    Unsupported(Box<NewRun>),
}

/// Refuses a first write of [`RunStore::create_run_leased_with`] that is more than events.
pub(crate) fn first_events_only(first: &Append) -> Result<(), StoreError> {
    if first.outcome.is_some() || !first.release_tokens.is_empty() {
        return Err(StoreError::database(
            "internal error: a run's first write at its admission may only add events",
        ));
    }
    Ok(())
}

/// Runs and their histories: the capability every store has. See [`super::Store`] for the
/// rules every capability follows (one atomic act per call, times given by the caller).
#[async_trait::async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// The current time on the store's own clock, for a store that processes on several
    /// machines share (PostgreSQL: the database server's clock); `None` (the default) for a
    /// store on the local machine's clock. See "Time" above.
    async fn now(&self) -> Result<Option<SystemTime>, StoreError> {
        Ok(None)
    }

    /// Admits a run in status `Pending`, acquirable from `created_at` — or from
    /// `run.start_at` if that is later: a delayed run is acquirable from its start on, and
    /// nothing that wakes runs (a payload to its token) makes it so earlier. With `run.hook`, the
    /// admission and the claim of the token are one act: if the token is owned by an active
    /// hook, or retained by an ended run until later than `created_at`, nothing is written and
    /// the owner is returned.
    async fn create_run(&self, run: NewRun) -> Result<Admission, StoreError>;

    /// [`RunStore::create_run`], and on admission the run is also leased to the caller (a worker
    /// that will drive it at once) for `lease`: status `Running`, epoch 1, no acquire needed —
    /// one transaction instead of two. A run in a queue, or whose start lies after its
    /// admission, is not leased. Stores that cannot do this return no lease (the default)
    /// and the run is acquired as usual.
    ///
    /// A queued run is leased so only when it may begin at once without overtaking anyone:
    /// its queue is declared, no run of it waits to begin, a slot and the rate window are free
    /// and no run of its partition key holds a slot; it then holds its slot from admission,
    /// as if an `acquire` had begun it. Otherwise (and on stores that cannot decide this in
    /// the admission's transaction) it waits for its slot with no lease.
    async fn create_run_leased(
        &self,
        run: NewRun,
        lease: Duration,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        let _ = lease;
        Ok((self.create_run(run).await?, None))
    }

    /// [`RunStore::create_run_leased`], and when the run is leased, `first` appended under
    /// that lease (as [`RunStore::append`] would) in the same act: a worker that polled a
    /// fresh run before admitting it makes the admission and the start of its first steps
    /// durable with one commit instead of two. When the run is not leased, `first` is not
    /// written (whoever acquires the run decides its first steps again). `first` holds
    /// events only: no outcome, no tokens to release.
    ///
    /// [`AdmittedWith::Unsupported`] (the default) when the store cannot do both in one act:
    /// nothing was written, and the caller admits the run it gets back with
    /// [`RunStore::create_run_leased`] and appends after.
    async fn create_run_leased_with(
        &self,
        run: NewRun,
        lease: Duration,
        first: &Append,
    ) -> Result<AdmittedWith, StoreError> {
        let _ = (lease, first);
        Ok(AdmittedWith::Unsupported(Box::new(run)))
    }

    /// The run, or `None`.
    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError>;

    /// The run's history in order (empty for an unknown run).
    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError>;

    /// Leases up to `limit` runs that are `Pending` or `Running`, of the given workflows, whose
    /// wake time has come and that no live lease holds (none, or expired). Each gets a new epoch,
    /// status `Running`, and a lease until `now + lease`. Earliest wake time first.
    ///
    /// A queued run that has not begun yet begins only within its queue's limits,
    /// decided in the same act across every process: at most `concurrency` runs of the queue
    /// begun and not ended, at most `rate_limit.0` begun within the last `rate_limit.1` before
    /// `now`, and of one partition key only the earliest started, once no run of that key
    /// holds a slot. Among a queue's runs allowed to begin, higher priority first, then start
    /// order (admission time, then id). A run begun keeps its slot until it ends, through
    /// sleeps and lease expiries. A queue the store does not know admits nothing. A waiting
    /// run whose deadline has passed is handed out without taking a slot (to fail at once).
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Vec<LeasedRun>, StoreError>;

    /// Writes `write` — all or nothing, and only while `lease` is current and the run is
    /// `Running`; otherwise [`StoreError::LeaseLost`] and nothing is written. Released tokens
    /// whose retention has not ended stay unavailable (and unresumable) until it ends; others
    /// become free at once. Ending a run also releases all its tokens and its lease. A
    /// [`Event::HookReceived`] among the events takes its payload out of the run's inbox (the
    /// history holds it now), so a run picked up again reads only what it has not received.
    async fn append(&self, lease: &Lease, write: &Append) -> Result<(), StoreError>;

    /// `continue_as_new(wf, args)`: in one act, fenced like [`RunStore::append`] (a lease
    /// that is not current, or a run that is not `Running`, gives
    /// [`StoreError::LeaseLost`] and writes nothing), appends `write.events` to the leased
    /// run (the last one its [`Event::RunContinuedAsNew`]; payloads they deliver leave the
    /// inbox, published values and replies are kept as by `append`), ends it as
    /// [`RunStatus::ContinuedAsNew`] with [`RunRecord::next_run`] set, and admits `next`
    /// (pending, due at once, [`RunRecord::previous_run`] set). `write` must neither end the
    /// run nor give up tokens; of `next` only `id`, `workflow`, `input` and `created_at` are
    /// read (it may not claim a token).
    ///
    /// The next run inherits, with no moment in which another run could take them: the
    /// leased run's active hook tokens (their owner changes, no release in between), its
    /// unreceived inbox entries in their order (hook payloads, messages, requests; its
    /// children's ends stay with it), its requests not replied to (callers get the next run's
    /// reply) and message idempotency keys, its published values, its start token (shown),
    /// queue entry and the queue slot it holds (no other run of its queue or partition key
    /// begins between the two), parent (a child's end names the chain's first run, which the
    /// parent awaits), deadline and version; the schedule tick that started the chain names
    /// the next run.
    async fn continue_as_new(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
    ) -> Result<(), StoreError>;

    /// [`RunStore::continue_as_new`], and the next run is admitted leased to the caller (the
    /// worker whose lease ended the previous run, which drives the next at once): `Running`,
    /// epoch 1, its lease ending when the previous run's did, no acquire needed and no
    /// notice to other workers. The [`LeasedRun`] it returns has no history. Fenced like
    /// `continue_as_new`: a caller that lost its lease leases nothing and writes nothing.
    /// Stores that cannot do this return no lease (the default) and the next run is acquired
    /// as usual.
    async fn continue_as_new_leased(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
    ) -> Result<Option<LeasedRun>, StoreError> {
        self.continue_as_new(lease, write, next).await?;
        Ok(None)
    }

    /// Records that this try at the run (the lease's) ended on `cause`, a store error that is
    /// not transient, at `now`. Below [`MAX_FAILED_TRIES`] failed tries in a row the run is
    /// given back, due again after [`failure_backoff`]; on the last it fails with `cause`
    /// (a `RunFailed` event, the run's end, its tokens released). [`StoreError::LeaseLost`]
    /// if `lease` is not current. A store that cannot decode a run it is about to hand out
    /// from [`RunStore::acquire`] records the failure itself, so such a run ends too.
    async fn record_failure(
        &self,
        lease: &Lease,
        cause: &Error,
        now: SystemTime,
    ) -> Result<FailureOutcome, StoreError>;

    /// Gives the run back without ending it: no lease holds it until another worker acquires
    /// it at or after `wake_at` — or at once if its inbox holds a payload with an id above
    /// `payloads_seen` (so a payload sent during the release is not missed). A release ends a
    /// try well, so the run's count of failed tries starts again from zero.
    /// [`StoreError::LeaseLost`] if `lease` is not current.
    async fn release(
        &self,
        lease: &Lease,
        wake_at: SystemTime,
        payloads_seen: u64,
    ) -> Result<(), StoreError>;

    /// Blocks the run under `lease` (its replay diverged from its history): status
    /// [`RunStatus::Blocked`] with `divergence` as its error, nothing added to its history,
    /// the lease given back, due again after [`block_backoff`] of its blocks in a row.
    /// Returns when it is due. [`StoreError::LeaseLost`] if `lease` is not current.
    async fn block(
        &self,
        lease: &Lease,
        divergence: &Error,
        now: SystemTime,
    ) -> Result<SystemTime, StoreError>;

    /// `run.retry()`: a blocked run becomes due at `now`; a failed run is re-opened (a
    /// `RunRetried` event, status pending, its error cleared, due at `now`). Any other status
    /// changes nothing. [`StoreError::RunNotFound`] for an unknown run.
    async fn retry(&self, id: &RunId, now: SystemTime) -> Result<RetryOutcome, StoreError>;

    /// Makes every blocked run due at `now` (a worker started: maybe a build that fits);
    /// how many.
    async fn wake_blocked(&self, now: SystemTime) -> Result<u64, StoreError>;

    /// Admits `run` (which must not carry a hook) with `history` already recorded, for
    /// `run.fork()`. An existing id is an error.
    async fn create_run_with_history(
        &self,
        run: NewRun,
        history: &[NewEvent],
    ) -> Result<(), StoreError>;

    /// Admits `child` (its `parent` is the leased run) and appends the
    /// [`Event::ChildStarted`] that records it, keyed `child_key`, to the leased run's history,
    /// in one act (fenced like [`RunStore::append`]). With a hook token the claim decides as in
    /// [`RunStore::create_run`]: when another run owns the token, no child is admitted and the
    /// event records the owner as the conflict.
    ///
    /// A child's end (by any path: its own, a failure, a cancellation) puts a
    /// [`ChildNotice`] into its parent's inbox (read back as [`Inbound::ChildEnded`]) and makes
    /// the parent due, in the transaction that ends the child; cancelling a run cancels its
    /// children that are not detached, down the tree.
    async fn start_child(
        &self,
        lease: &Lease,
        child_key: &str,
        child: NewRun,
    ) -> Result<Admission, StoreError>;

    /// Extends the given leases to `now + lease`; returns the runs among them that this worker
    /// no longer holds (taken over, cancelled or ended), which it must stop driving.
    async fn heartbeat(
        &self,
        leases: &[Lease],
        lease: Duration,
        now: SystemTime,
    ) -> Result<Vec<RunId>, StoreError>;

    /// Records a `RunCancelled` event and status `Cancelled`, releases the run's tokens and
    /// drops any lease — one act — unless the run already ended. [`StoreError::RunNotFound`]
    /// for an unknown id.
    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError>;

    /// Of `runs`, those that ended (completed, failed, cancelled) or are gone: how a worker of
    /// a store without [`RunStore::notices`] learns, within its poll interval, that runs it
    /// drives were cancelled elsewhere, so it drops their step futures. The default asks
    /// [`RunStore::get_run`] for each; the built-in stores answer with one read.
    async fn ended_among(&self, runs: &[RunId]) -> Result<Vec<RunId>, StoreError> {
        let mut ended = Vec::new();
        for id in runs {
            if self
                .get_run(id)
                .await?
                .is_none_or(|r| r.status.is_terminal())
            {
                ended.push(*id);
            }
        }
        Ok(ended)
    }

    /// Changes made by any process, for stores that push them; `None` (the default) when the
    /// runtime must poll. Receivers may lag and miss notices: they are hints, the store's data
    /// stays the truth, and the runtime still polls slowly as a safety net.
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<Notice>> {
        None
    }
}
