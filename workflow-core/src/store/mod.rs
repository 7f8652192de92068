//! The storage contract. A [`Store`] holds runs and their event histories; every decision that
//! must be atomic across workers and processes (admitting a run, leasing it, fencing a stale
//! worker's writes, recording a run's end) is one call here, made atomic by the database.
//!
//! The runtime never knows which implementation it talks to: [`memory::MemoryStore`] for tests,
//! [`sqlite::SqliteStore`] as the embedded default, `postgres::PostgresStore` (feature
//! `postgres`) for many workers on many machines.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, StoreError};
use crate::ids::RunId;

pub use crate::history::{from_millis, never, to_millis, Event, EventRecord, NewEvent};

pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// The state of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Admitted, not yet picked up by a worker.
    Pending,
    /// Picked up at least once and not ended (it may be waiting on a timer).
    Running,
    /// Returned `Ok`.
    Completed,
    /// Returned `Err`, panicked, or could not be replayed.
    Failed,
    /// Cancelled with `cancel()`.
    Cancelled,
    /// Its replay does not match its history (the code changed under it): nothing more is
    /// recorded until a build that fits picks it up (SPEC 9). The divergence is the run's
    /// `error`; workers try it again when they start, with backoff, and on `retry()`.
    Blocked,
}

impl RunStatus {
    /// True for `Completed`, `Failed` and `Cancelled`.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The lower-case name used in databases and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Blocked => "blocked",
        }
    }

    /// The inverse of [`RunStatus::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            "blocked" => Self::Blocked,
            _ => return None,
        })
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run to admit.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// Its id, chosen by the caller.
    pub id: RunId,
    /// The registered workflow name.
    pub workflow: String,
    /// The serialized argument tuple.
    pub input: Value,
    /// Admission time; also the first time a worker may pick it up.
    pub created_at: SystemTime,
    /// A hook token to claim atomically with the admission (`start(..).hook(token)`).
    pub hook: Option<StartHook>,
    /// The run fails if it has not ended by then (`start(..).timeout(d)`).
    pub deadline: Option<SystemTime>,
    /// The run that started this one with `start_child`, if any.
    pub parent: Option<ParentLink>,
    /// The queue the run waits in for a slot (SPEC 11): `start(..).queue(name)` or the
    /// workflow's `#[workflow(queue = "..")]`. A queued run is never leased at admission.
    pub queue: Option<QueueEntry>,
}

/// How a child run is tied to the run that started it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParentLink {
    /// The parent run.
    pub run: RunId,
    /// Started with `.detached()`: cancelling the parent leaves this child running.
    pub detached: bool,
}

/// Where a run stands in a queue (SPEC 11): the queue, the run's partition key and priority.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueueEntry {
    /// The queue's name (declared with [`crate::Queue`] on the runtime builder).
    pub name: String,
    /// Runs of the queue with the same key run one at a time, in start order.
    pub partition_key: Option<String>,
    /// Among the queue's waiting runs, higher begins first; equal priority in start order.
    pub priority: i32,
}

impl QueueEntry {
    /// An entry in queue `name`, no partition key, priority 0.
    pub fn new(name: impl Into<String>) -> Self {
        QueueEntry {
            name: name.into(),
            partition_key: None,
            priority: 0,
        }
    }
}

/// A queue's limits as the store keeps them, shared by every process on the store
/// (see [`crate::Queue`]). `None`: no such limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueueDef {
    /// The queue's name.
    pub name: String,
    /// At most this many runs of the queue begun and not ended.
    pub concurrency: Option<u32>,
    /// At most this many runs of the queue begin in any window of this length.
    pub rate_limit: Option<(u32, Duration)>,
}

/// A queue as [`Store::list_queues`] reports it: its limits and what it holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// Its limits.
    pub def: QueueDef,
    /// Runs begun and not ended (each holds a slot; a sleeping run too).
    pub occupied: u64,
    /// Runs waiting for a slot (not yet begun).
    pub waiting: u64,
    /// Runs begun within the last rate window (0 without a rate limit).
    pub begun_in_window: u64,
}

/// The token a run claims when it is admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartHook {
    /// The token.
    pub token: String,
    /// The token stays claimed at least until then, even after the run ended
    /// (`min_retention`).
    pub retain_until: Option<SystemTime>,
}

/// What [`Store::create_run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The run exists (and owns its start token, if it asked for one).
    Admitted,
    /// The start token is owned (or retained) by this run; nothing was written.
    Conflict(RunId),
}

/// What [`Store::admit_or_resume`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitOrResume {
    /// The run exists and owns its start token (leased to the caller when a lease was asked
    /// for and the store leases at admission); the payload was not queued.
    Admitted(Option<Lease>),
    /// The token is owned by an active hook of run `run`: the payload is in its inbox, with
    /// id `payload_id`; no run was admitted.
    Resumed {
        /// The owner of the token.
        run: RunId,
        /// The queued payload's id.
        payload_id: u64,
    },
    /// The token is retained by this run, which ended: nothing was written.
    Conflict(RunId),
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// Its id.
    pub id: RunId,
    /// The registered workflow name.
    pub workflow: String,
    /// Current state.
    pub status: RunStatus,
    /// The serialized argument tuple.
    pub input: Value,
    /// The return value of a completed run.
    pub output: Option<Value>,
    /// The error of a failed or cancelled run.
    pub error: Option<Error>,
    /// Admission time.
    pub created_at: SystemTime,
    /// Time of the last change of state.
    pub updated_at: SystemTime,
    /// The token claimed at admission, if any.
    pub hook_token: Option<String>,
    /// When the run fails if it has not ended (`start(..).timeout(d)`).
    pub deadline: Option<SystemTime>,
    /// The run that started this one with `start_child`, if any.
    pub parent: Option<RunId>,
    /// The queue it was started in, if any.
    pub queue: Option<QueueEntry>,
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
}

/// What [`Store::claim_hook`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The run now owns the token.
    Claimed,
    /// Another hook owns the token (or retains it); this run names the owner.
    Conflict(RunId),
}

/// A payload waiting in a run's inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    /// Global, increasing in commit order.
    pub id: u64,
    /// The token it was sent to.
    pub token: String,
    /// As sent.
    pub payload: Value,
}

/// An active hook, as [`Store::get_hook`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRecord {
    /// The token.
    pub token: String,
    /// The owning run.
    pub run_id: RunId,
    /// When the owner claimed it.
    pub created_at: SystemTime,
}

/// Which runs [`Store::list_runs`] returns: the newest first (by admission time, then id), at
/// most `limit`.
///
/// ```
/// use workflow_core::store::RunFilter;
/// use workflow_core::RunStatus;
///
/// let failed_orders = RunFilter::new()
///     .status(RunStatus::Failed)
///     .workflow("process_order")
///     .limit(20);
/// assert_eq!(failed_orders.limit, 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunFilter {
    /// Only runs in this state.
    pub status: Option<RunStatus>,
    /// Only runs of this workflow (its registered name).
    pub workflow: Option<String>,
    /// Only the children of this run (`start_child`).
    pub parent: Option<RunId>,
    /// Only runs started in this queue.
    pub queue: Option<String>,
    /// At most this many runs (default 100).
    pub limit: usize,
}

impl Default for RunFilter {
    fn default() -> Self {
        RunFilter {
            status: None,
            workflow: None,
            parent: None,
            queue: None,
            limit: 100,
        }
    }
}

impl RunFilter {
    /// Every run, at most 100.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only runs in state `status`.
    pub fn status(mut self, status: RunStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Only runs of workflow `name`.
    pub fn workflow(mut self, name: impl Into<String>) -> Self {
        self.workflow = Some(name.into());
        self
    }

    /// Only the runs `parent` started with `start_child`.
    pub fn parent(mut self, parent: RunId) -> Self {
        self.parent = Some(parent);
        self
    }

    /// Only runs started in queue `name`.
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queue = Some(name.into());
        self
    }

    /// At most `n` runs.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
}

/// Which active hooks [`Store::list_hooks`] returns: the newest first (by claim time, then
/// token), at most `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HookFilter {
    /// Only the hook owning this exact token.
    pub token: Option<String>,
    /// Only hooks owned by this run.
    pub run_id: Option<RunId>,
    /// At most this many hooks (default 100).
    pub limit: usize,
}

impl Default for HookFilter {
    fn default() -> Self {
        HookFilter {
            token: None,
            run_id: None,
            limit: 100,
        }
    }
}

impl HookFilter {
    /// Every active hook, at most 100.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only the hook owning `token`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Only hooks owned by run `id`.
    pub fn run_id(mut self, id: RunId) -> Self {
        self.run_id = Some(id);
        self
    }

    /// At most `n` hooks.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
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

/// A run handed to a worker by [`Store::acquire`].
#[derive(Debug, Clone)]
pub struct LeasedRun {
    /// The run as stored (its status is now `Running`).
    pub run: RunRecord,
    /// The claim to present on every write.
    pub lease: Lease,
    /// The whole history, in order.
    pub events: Vec<EventRecord>,
}

/// What [`Store::acquire`] may hand out.
#[derive(Debug, Clone)]
pub struct AcquireRequest<'a> {
    /// The acquiring worker.
    pub worker_id: &'a str,
    /// Only runs of these workflows.
    pub workflows: &'a [String],
    /// The lease lasts this long unless renewed by [`Store::heartbeat`].
    pub lease: Duration,
    /// At most this many runs.
    pub limit: usize,
    /// The current time.
    pub now: SystemTime,
}

/// How a run ended, written by [`Store::append`] together with its last events.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// Returned `Ok` with this value.
    Completed(Value),
    /// Failed with this error.
    Failed(Error),
}

/// What [`Store::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The run is now cancelled.
    Cancelled,
    /// The run had already ended with this status; nothing changed.
    AlreadyEnded(RunStatus),
}

/// How many tries in a row a run gets when handling it keeps failing on a store error that is
/// not transient (a value the database refuses, a row it cannot decode): on the last,
/// [`Store::record_failure`] fails the run instead of giving it back (SPEC 8, poison runs).
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

/// The token under which a child's end reaches its parent's inbox. Tokens with control
/// characters are refused everywhere else, so no hook can own or send to it.
pub const CHILD_NOTICE_TOKEN: &str = "\u{1}child-ended";

/// A child run's end, as its parent's inbox holds it (see [`Store::start_child`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildNotice {
    /// The child run.
    pub child: RunId,
    /// How it ended (completed, failed or cancelled).
    pub status: RunStatus,
    /// Its return value, when it completed.
    pub output: Option<Value>,
    /// Its error, when it failed or was cancelled.
    pub error: Option<Error>,
}

impl ChildNotice {
    /// The notice as the child's result: its value, or its error.
    pub fn result(self) -> Result<Value, Error> {
        match (self.status, self.output, self.error) {
            (RunStatus::Completed, output, _) => Ok(output.unwrap_or(Value::Null)),
            (_, _, Some(error)) => Err(error),
            (status, _, None) => Err(Error::fatal(format!(
                "child run {} ended {status} without an error",
                self.child
            ))),
        }
    }

    /// The notice's JSON from the columns a SQL store writes (`output` and `error` are
    /// already JSON), without decoding them again.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn encode(
        child: &str,
        status: RunStatus,
        output: Option<&str>,
        error: Option<&str>,
    ) -> String {
        format!(
            r#"{{"child":"{child}","status":"{}","output":{},"error":{}}}"#,
            status.as_str(),
            output.unwrap_or("null"),
            error.unwrap_or("null")
        )
    }
}

/// How long a blocked run waits before a worker tries it again, after its `tries`-th block in
/// a row: a minute, doubling, at most an hour (SPEC 9).
pub fn block_backoff(tries: u32) -> Duration {
    let doublings = tries.saturating_sub(1).min(6);
    Duration::from_secs(60 << doublings).min(Duration::from_secs(3600))
}

/// The error of [`Store::admit_or_resume`] for a run without a token to resume through.
pub(crate) fn no_token() -> StoreError {
    StoreError::database("admit_or_resume needs a run with a hook token")
}

/// What [`Store::retry`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOutcome {
    /// A failed run was re-opened (`RunRetried` recorded) and is due now.
    Reopened,
    /// A blocked run is due now.
    Unblocked,
    /// Nothing to retry: the run has this status (completed, cancelled, or not ended).
    NotRetryable(RunStatus),
}

/// What [`Store::record_failure`] did with the run.
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

/// What [`Store::prune`] deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PruneStats {
    /// Ended runs deleted, each with everything recorded for it.
    pub runs: u64,
    /// Events of those runs deleted with them.
    pub events: u64,
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
}

/// A chunk of a run's stream as stored (SPEC 12): the `index`-th value written to the stream,
/// from 0, by step attempt `attempt`, at `at`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredChunk {
    /// Its place in the stream, from 0, in write order.
    pub index: u64,
    /// The attempt of the step that wrote it (from 1).
    pub attempt: u32,
    /// When it was written.
    pub at: SystemTime,
    /// As written.
    pub value: Value,
}

/// What [`Store::read_stream`] found. `run`, `closed` and `len` are read before the chunks,
/// so a reader that sees the run ended (or the stream closed) and reads fewer chunks than it
/// asked for has read the whole stream: no chunk is written after a run's end or a close.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamPage {
    /// The run's status; `None` for an unknown run.
    pub run: Option<RunStatus>,
    /// Whether the stream is closed.
    pub closed: bool,
    /// How many chunks the stream holds (the index the next write gets).
    pub len: u64,
    /// The chunks from the index asked for, in order, at most the limit asked for.
    pub chunks: Vec<StoredChunk>,
}

/// One stream of a run, as [`Store::list_streams`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// Its name.
    pub name: String,
    /// How many chunks it holds.
    pub len: u64,
    /// Whether it was closed.
    pub closed: bool,
}

/// A storage backend. See the module docs.
///
/// Every method is one atomic operation. Implementations must make the guarantees below hold
/// across processes (and for PostgreSQL, machines), never by a check in Rust alone.
///
/// # Time
///
/// Times are given to the store, never read by it for a decision the caller can time: the
/// admission time (`created_at`, also the run's first wake time), lease ends (`now + lease`)
/// and their expiry, wake times, claim and payload times, retention windows, cancellation and
/// pruning horizons all come from the caller. The runtime reads every one of them from one
/// clock: [`Store::now`] when the store has a clock of its own (sampled when the runtime is
/// built and every few seconds, carried forward between samples with the local monotonic
/// clock), else the local wall clock. So on a store shared by several machines, processes
/// whose system clocks are wrong still write and compare times on the store's time line.
/// What a store decides without a caller's time (a run woken at once by a payload) it
/// decides on that same clock.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// The current time on the store's own clock, for a store that processes on several
    /// machines share (PostgreSQL: the database server's clock); `None` (the default) for a
    /// store on the local machine's clock. See "Time" above.
    async fn now(&self) -> Result<Option<SystemTime>, StoreError> {
        Ok(None)
    }

    /// Admits a run in status `Pending`, acquirable from `created_at`. With `run.hook`, the
    /// admission and the claim of the token are one act: if the token is owned by an active
    /// hook, or retained by an ended run until later than `created_at`, nothing is written and
    /// the owner is returned.
    async fn create_run(&self, run: NewRun) -> Result<Admission, StoreError>;

    /// [`Store::create_run`], and on admission the run is also leased to the caller (a worker
    /// that will drive it at once) for `lease`: status `Running`, epoch 1, no acquire needed —
    /// one transaction instead of two. Stores that cannot do this return no lease (the default)
    /// and the run is acquired as usual.
    async fn create_run_leased(
        &self,
        run: NewRun,
        lease: Duration,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        let _ = lease;
        Ok((self.create_run(run).await?, None))
    }

    /// `start(..).hook(token).or_resume(payload)`: in one act, either admits `run` claiming
    /// its token (as [`Store::create_run_leased`] with `lease`, or [`Store::create_run`]
    /// without; the payload is not queued), or, when an active hook owns the token, queues
    /// `payload` to its run as [`Store::resume_hook`] does at `run.created_at`. A token only
    /// retained by an ended run is [`AdmitOrResume::Conflict`] and nothing is written. There
    /// is no moment at which the token is owned but the payload finds no hook. `run` must
    /// carry a hook. Stores that cannot do this keep this default, which refuses.
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: Value,
    ) -> Result<AdmitOrResume, StoreError> {
        let _ = (run, lease, payload);
        Err(StoreError::database(
            "admit_or_resume is not supported by this store",
        ))
    }

    /// The run, or `None`.
    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError>;

    /// The run's history in order (empty for an unknown run).
    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError>;

    /// Leases up to `limit` runs that are `Pending` or `Running`, of the given workflows, whose
    /// wake time has come and that no live lease holds (none, or expired). Each gets a new epoch,
    /// status `Running`, and a lease until `now + lease`. Earliest wake time first.
    ///
    /// A queued run that has not begun yet (SPEC 11) begins only within its queue's limits,
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

    /// Records that this try at the run (the lease's) ended on `cause`, a store error that is
    /// not transient, at `now`. Below [`MAX_FAILED_TRIES`] failed tries in a row the run is
    /// given back, due again after [`failure_backoff`]; on the last it fails with `cause`
    /// (a `RunFailed` event, the run's end, its tokens released). [`StoreError::LeaseLost`]
    /// if `lease` is not current. A store that cannot decode a run it is about to hand out
    /// from [`Store::acquire`] records the failure itself, so such a run ends too.
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

    /// Blocks the run under `lease` (its replay diverged, SPEC 9): status
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

    /// Claims `token` for hook `hook_key` of the leased run and appends the
    /// [`Event::HookRegistered`] that records the decision, in one act (fenced like
    /// [`Store::append`]). The token is free when no active hook owns it and no ended run
    /// retains it past `at`.
    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Admits `child` (its `parent` is the leased run) and appends the
    /// [`Event::ChildStarted`] that records it, keyed `child_key`, to the leased run's history,
    /// in one act (fenced like [`Store::append`]). With a hook token the claim decides as in
    /// [`Store::create_run`]: when another run owns the token, no child is admitted and the
    /// event records the owner as the conflict.
    ///
    /// A child's end (by any path: its own, a failure, a cancellation) puts a
    /// [`ChildNotice`] into its parent's inbox under [`CHILD_NOTICE_TOKEN`] and makes the
    /// parent due, in the transaction that ends the child; cancelling a run cancels its
    /// children that are not detached, down the tree.
    async fn start_child(
        &self,
        lease: &Lease,
        child_key: &str,
        child: NewRun,
    ) -> Result<Admission, StoreError>;

    /// Puts `payload` into the inbox of the run whose active hook owns `token`, and makes that
    /// run acquirable now if no worker holds it. `None` when no active hook owns the token.
    async fn resume_hook(
        &self,
        token: &str,
        payload: Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError>;

    /// The run's inbox payloads with ids above `after`, in id order.
    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<Payload>, StoreError>;

    /// Payloads (id, run) with ids above `after`, in id order, at most `limit`: how a worker
    /// learns that runs it drives received something.
    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError>;

    /// The highest payload id so far (0 if none).
    async fn last_payload_id(&self) -> Result<u64, StoreError>;

    /// The active hook owning `token`, if any.
    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError>;

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
    /// a store without [`Store::notices`] learns, within its poll interval, that runs it
    /// drives were cancelled elsewhere, so it drops their step futures. The default asks
    /// [`Store::get_run`] for each; the built-in stores answer with one read.
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

    /// Runs matching `filter`, the newest first: what inspection tools list. Not used by the
    /// runtime; stores that cannot list keep this default, which refuses.
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let _ = filter;
        Err(StoreError::database(
            "list_runs is not supported by this store",
        ))
    }

    /// Deletes, in one act, every run that ended (completed, failed or cancelled) before
    /// `ended_before` (its `updated_at`), with its events, inbox payloads, hook rows and
    /// streams —
    /// except a run that still owns a hook row retained past `now`: its token must keep
    /// refusing duplicates and naming the run. A run that has not ended is never touched.
    /// Payload ids are never reused after their payloads are deleted. Stores that cannot
    /// prune keep this default, which refuses.
    async fn prune(
        &self,
        ended_before: SystemTime,
        now: SystemTime,
    ) -> Result<PruneStats, StoreError> {
        let _ = (ended_before, now);
        Err(StoreError::database("prune is not supported by this store"))
    }

    /// Appends `value` to stream `stream` of the leased run as written by step attempt
    /// `attempt` at `at`, and returns its index: the stream's length before it, assigned by
    /// the store atomically (from 0 per run and stream). Fenced like [`Store::append`]
    /// ([`StoreError::LeaseLost`], nothing written); `Ok(None)`, nothing written, when the
    /// stream is closed. Stores that push changes announce it ([`Notice::Chunk`]). Stores
    /// without streams keep this default, which refuses.
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let _ = (lease, stream, attempt, value, at);
        Err(StoreError::database(
            "streams are not supported by this store",
        ))
    }

    /// Closes stream `stream` of the leased run (creating it, empty, if nothing was written
    /// to it): later appends are refused, readers end after its last chunk. Closing a closed
    /// stream changes nothing. Fenced like [`Store::append`]; announced like an append.
    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let _ = (lease, stream, at);
        Err(StoreError::database(
            "streams are not supported by this store",
        ))
    }

    /// The chunks of stream `stream` of run `run` from index `from` on, at most `limit`, with
    /// the run's status and the stream's state read before them (see [`StreamPage`]). An
    /// unknown stream reads as empty and open.
    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        let _ = (run, stream, from, limit);
        Err(StoreError::database(
            "streams are not supported by this store",
        ))
    }

    /// The streams of run `run`, by name.
    async fn list_streams(&self, run: &RunId) -> Result<Vec<StreamInfo>, StoreError> {
        let _ = run;
        Err(StoreError::database(
            "streams are not supported by this store",
        ))
    }

    /// Active hooks matching `filter`, the newest first: what inspection tools list. Not used
    /// by the runtime; stores that cannot list keep this default, which refuses.
    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        let _ = filter;
        Err(StoreError::database(
            "list_hooks is not supported by this store",
        ))
    }

    /// Declares `queues` (SPEC 11), replacing the limits of any queue of the same name: every
    /// process on the store enforces them from then on. Stores without queues keep this
    /// default, which refuses a non-empty list.
    async fn define_queues(&self, queues: &[QueueDef]) -> Result<(), StoreError> {
        if queues.is_empty() {
            return Ok(());
        }
        Err(StoreError::database(
            "queues are not supported by this store",
        ))
    }

    /// The earliest time after `now` at which a queue whose waiting runs are held back by its
    /// rate window may begin one again: when the oldest begin in its window leaves it. `None`
    /// when no queue with waiting runs is at its rate limit (ends of runs, which free the
    /// other limits, are announced instead). Workers sleep until then rather than poll. The
    /// default: `None`.
    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        let _ = now;
        Ok(None)
    }

    /// Every declared queue by name, with its occupancy at `now` (for the rate window).
    /// Stores without queues keep this default: none.
    async fn list_queues(&self, now: SystemTime) -> Result<Vec<QueueInfo>, StoreError> {
        let _ = now;
        Ok(Vec::new())
    }

    /// Changes made by any process, for stores that push them; `None` (the default) when the
    /// runtime must poll. Receivers may lag and miss notices: they are hints, the store's data
    /// stays the truth, and the runtime still polls slowly as a safety net.
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<Notice>> {
        None
    }
}
