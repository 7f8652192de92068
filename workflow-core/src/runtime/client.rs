//! The client side of the runtime: starting runs ([`Start`], admitted in a task of its own),
//! handles on runs ([`Run`], whose `return_value` waits for the run's end signal), and sending
//! payloads to hooks ([`HookRef`], [`HookInfo`]).

use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;

use super::flight::{Joined, StartFlight};
use super::spawn_run;
use super::{Inner, Runtime};
use crate::context::invalid_token;
use crate::error::{
    Error, HookConflictError, HookError, HookNotFoundError, RunError, StartError, StoreError,
};
use crate::history::{
    after, fork_history, never, to_millis, ExportedEvent, ExportedHistory, ExportedRun,
    HISTORY_FORMAT, HISTORY_FORMAT_VERSION,
};
use crate::ids::RunId;
use crate::payload::{PayloadError, PayloadKind};
use crate::queue::entry;
use crate::registry::{BoxFuture, IntoWorkflow, WorkflowDef};
use crate::store::{
    Admission, AdmitOrResume, CancelOutcome, Lease, LeasedRun, NewRun, PruneStats, QueueEntry,
    RetryOutcome, RunOutcome, RunRecord, RunStatus, StartHook, Store, StreamInfo,
};
use crate::streams::RunStream;

impl Runtime {
    /// The store this runtime uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Starts a run of `workflow` with `args` (a tuple of its arguments). Await the returned
    /// builder; it resolves once the run is durably admitted.
    ///
    /// Once polled, the admission goes on in a task of its own: dropping the future (a
    /// timeout, a cancelled request) does not undo or strand it, so the run may exist even
    /// though this call never answered. Give such starts a `.hook(token)` to make retrying
    /// them safe: a retry then finds the run instead of starting a second one.
    pub fn start<F, Args>(&self, workflow: F, args: Args) -> Start<<F as IntoWorkflow<Args>>::Def>
    where
        F: IntoWorkflow<Args>,
    {
        let _ = workflow;
        // Serialized here, so that the pending start is `Send` whatever the arguments are: only
        // the macro's check reports arguments that cannot be recorded.
        let workflow = <F::Def as WorkflowDef>::NAME;
        let id = RunId::new();
        let cx = PayloadKind::WorkflowInput { workflow }.of(id);
        let input = self
            .inner
            .config
            .payloads
            .seal(<F::Def as WorkflowDef>::encode_args(&args), cx)
            .map_err(|e| match e {
                PayloadError::TooLarge(e) => StartError::TooLarge(e),
                e => StartError::Serialize {
                    workflow: workflow.to_owned(),
                    message: e.cause(),
                },
            });
        Start {
            rt: self.clone(),
            id,
            input,
            hook: None,
            retention: None,
            timeout: None,
            queue: <F::Def as WorkflowDef>::QUEUE.map(QueueEntry::new),
            _def: PhantomData,
        }
    }

    /// A handle on run `id` (whether or not it exists: queries on an unknown id fail with
    /// [`RunError::NotFound`]).
    pub fn get_run(&self, id: &RunId) -> Run<Value> {
        Run {
            id: *id,
            rt: self.clone(),
            _t: PhantomData,
        }
    }

    /// Sends `payload` to the run whose active hook owns `token`. The payload is durable once
    /// this returns and reaches the workflow's `recv()` in the order the calls committed.
    ///
    /// [`HookError::NotFound`] when no active hook owns the token (the run has not registered
    /// it yet, or released it). To start a run or else send to its owner, without that gap,
    /// use [`Start::or_resume`].
    pub async fn resume_hook<P: serde::Serialize>(
        &self,
        token: impl Into<String>,
        payload: P,
    ) -> Result<HookRef, HookError> {
        let token = token.into();
        if let Some(why) = invalid_token(&token) {
            return Err(HookError::InvalidToken(why));
        }
        let cx = PayloadKind::HookPayload { token: &token }.unbound();
        let payload = match self.inner.config.payloads.encode(&payload, cx) {
            Ok(payload) => payload,
            Err(PayloadError::TooLarge(e)) => return Err(HookError::TooLarge(e)),
            Err(e) => {
                return Err(HookError::Serialize {
                    message: e.cause(),
                    token,
                })
            }
        };
        let at = self.inner.clock.tick().await;
        match self.inner.store.resume_hook(&token, payload, at).await? {
            Some((run_id, _)) => {
                // Not driven here: evicted (now acquirable), or driven elsewhere. A driver
                // evicting the run right now looks for work once it has left.
                if !self.inner.payload_arrived(&run_id) {
                    self.inner.work.notify_one();
                }
                Ok(HookRef { token, run_id })
            }
            None => Err(HookError::NotFound(HookNotFoundError { token })),
        }
    }

    /// The active hook owning `token`. Advisory: a later `start` is not atomic with this
    /// look-up (use `start(..).hook(token)` for that).
    pub async fn get_hook_by_token(&self, token: impl AsRef<str>) -> Result<HookInfo, HookError> {
        let token = token.as_ref();
        if let Some(why) = invalid_token(token) {
            return Err(HookError::InvalidToken(why));
        }
        match self.inner.store.get_hook(token).await? {
            Some(h) => Ok(HookInfo {
                token: h.token,
                run_id: h.run_id,
                created_at: h.created_at,
            }),
            None => Err(HookError::NotFound(HookNotFoundError {
                token: token.to_owned(),
            })),
        }
    }

    /// Deletes the runs that ended (completed, failed or cancelled) more than `older_than`
    /// ago, with everything recorded for them: events, hook payloads, released tokens. Runs
    /// that have not ended are never touched, nor is a run whose token is still retained
    /// (`min_retention`): the token keeps refusing duplicate starts and naming its run until
    /// its retention ends, and a later prune takes the run. One atomic store operation;
    /// returns how many runs and events it deleted.
    ///
    /// An `older_than` reaching back before the Unix epoch deletes nothing.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    /// use workflow_core::store::memory::MemoryStore;
    /// use workflow_core::PruneStats;
    ///
    /// #[workflow]
    /// async fn greet(name: String) -> Result<String> {
    ///     Ok(format!("hello, {name}"))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().store(MemoryStore::new()).build().await?;
    /// let run = rt.start(greet, ("Ada".to_string(),)).await?;
    /// run.return_value().await?;
    ///
    /// // Ended just now: a 30-day horizon keeps it.
    /// let stats = rt.prune(Duration::from_secs(30 * 24 * 3600)).await?;
    /// assert_eq!(stats, PruneStats { runs: 0, events: 0 });
    /// assert_eq!(run.status().await?, RunStatus::Completed);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn prune(&self, older_than: Duration) -> Result<PruneStats, StoreError> {
        let now = self.inner.clock.tick().await;
        let ended_before = now
            .checked_sub(older_than)
            .map_or(SystemTime::UNIX_EPOCH, |t| t.max(SystemTime::UNIX_EPOCH));
        self.inner.store.prune(ended_before, now).await
    }
}

/// Where `resume_hook` delivered a payload.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HookRef {
    /// The token.
    pub token: String,
    /// The run owning it.
    pub run_id: RunId,
}

/// An active hook, from `get_hook_by_token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookInfo {
    /// The token.
    pub token: String,
    /// The run owning it.
    pub run_id: RunId,
    /// When that run claimed it.
    pub created_at: SystemTime,
}

/// A pending start; await it. From [`Runtime::start`].
#[must_use = "a start does nothing unless awaited"]
pub struct Start<W: WorkflowDef> {
    rt: Runtime,
    /// The run's id, known before its admission.
    id: RunId,
    input: Result<Value, StartError>,
    hook: Option<String>,
    retention: Option<Duration>,
    timeout: Option<Duration>,
    /// From `#[workflow(queue = "..")]` until `.queue(..)` names another; the partition key
    /// and priority wait here for a queue.
    queue: Option<QueueEntry>,
    _def: PhantomData<fn() -> W>,
}

impl<W: WorkflowDef> Start<W> {
    /// Claims hook `token` atomically with admitting the run: of any number of concurrent
    /// starts with one token, across processes, exactly one becomes a run; the others fail with
    /// [`StartError::HookConflict`] naming it and leave no trace. The hook accepts payloads
    /// from admission on (they are buffered); inside the run, `create_hook(token)` binds to it.
    pub fn hook(mut self, token: impl Into<String>) -> Self {
        self.hook = Some(token.into());
        self
    }

    /// Starts the run with the `.hook(..)` token, or, if an active hook of another run owns
    /// that token, sends `payload` to it instead (SPEC 10): one store transaction does either,
    /// so there is no moment at which the token is owned but the payload finds no hook (no
    /// [`HookError::NotFound`] to retry on). Resolves to [`StartOrResume::Started`] when this
    /// call admitted the run — its own `payload` is then *not* delivered: pass what the run
    /// needs in its arguments — or to [`StartOrResume::Resumed`] naming the owner, whose
    /// `recv()` gets `payload` exactly once. A token only retained by an ended run
    /// (`min_retention`) is [`StartError::HookConflict`], and nothing is written.
    ///
    /// Calls of one token in this process wait for the first one's admission and then each
    /// queue their own payload: of any number of concurrent calls, one run is started and
    /// every other payload reaches it.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    /// use workflow_core::StartOrResume;
    ///
    /// #[workflow]
    /// async fn tally(first: u32) -> Result<u32> {
    ///     let mut more = create_hook::<u32>("tally");
    ///     Ok(first + more.recv().await?)
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// // Nobody owns the token: the run starts (with its argument; the payload is not sent).
    /// let StartOrResume::Started(run) = rt.start(tally, (1,)).hook("tally").or_resume(0).await?
    /// else {
    ///     unreachable!("the token was free")
    /// };
    /// // The run owns it now: the payload goes to the run.
    /// let StartOrResume::Resumed(hook) = rt.start(tally, (5,)).hook("tally").or_resume(2).await?
    /// else {
    ///     unreachable!("the token is owned")
    /// };
    /// assert_eq!(hook.run_id, run.id());
    /// assert_eq!(run.return_value().await?, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn or_resume<P: serde::Serialize>(self, payload: P) -> OrResume<W> {
        let token = self.hook.clone().unwrap_or_default();
        let cx = PayloadKind::HookPayload { token: &token }.unbound();
        let payload = self
            .rt
            .inner
            .config
            .payloads
            .encode(&payload, cx)
            .map_err(|e| match e {
                PayloadError::TooLarge(e) => StartError::TooLarge(e),
                e => StartError::SerializePayload {
                    message: e.cause(),
                    token,
                },
            });
        OrResume {
            start: self,
            payload,
        }
    }

    /// Keeps the `.hook(..)` token unavailable until `start + d`, even after the run ended, so
    /// that late duplicates are still refused (and can read this run's result). No effect
    /// without `.hook(..)`.
    pub fn min_retention(mut self, d: Duration) -> Self {
        self.retention = Some(d);
        self
    }

    /// A deadline for the whole run (SPEC 10): if it has not ended `d` after admission, it
    /// fails ("timed out after 30s"), its in-flight steps dropped, wherever it is — running,
    /// sleeping, waiting for a hook or not yet picked up. `Duration::MAX` means none.
    ///
    /// ```
    /// # use workflow_core::prelude::*;
    /// #[step]
    /// async fn slow() -> Result<()> { tokio::time::sleep(Duration::from_secs(3600)).await; Ok(()) }
    /// #[workflow]
    /// async fn report() -> Result<()> { slow().await }
    /// # #[tokio::main] async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let run = rt.start(report, ()).timeout(Duration::from_millis(50)).await?;
    /// let err = run.return_value().await.unwrap_err();
    /// assert!(err.to_string().contains("timed out after 50ms"), "{err}");
    /// # Ok(()) }
    /// ```
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// Enters the run in queue `name` (SPEC 11), declared with
    /// [`RuntimeBuilder::queue`](crate::RuntimeBuilder::queue) by this or another runtime on
    /// the store; replaces the workflow's `#[workflow(queue = "..")]`. The run waits,
    /// [`RunStatus::Pending`], until the queue's limits let it begin. An unknown name fails
    /// the start with [`StartError::UnknownQueue`].
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn charge(order: String) -> Result<String> {
    ///     Ok(format!("charged {order}"))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder()
    ///     .in_memory()
    ///     .queue(Queue::new("payments").concurrency(10))
    ///     .build()
    ///     .await?;
    /// let run = rt.start(charge, ("o-1".to_string(),)).queue("payments").await?;
    /// assert_eq!(run.return_value().await?, "charged o-1");
    ///
    /// let unknown = rt.start(charge, ("o-2".to_string(),)).queue("nope").await;
    /// assert!(matches!(unknown, Err(StartError::UnknownQueue { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        entry(&mut self.queue).name = name.into();
        self
    }

    /// Runs of the queue with the same `key` run one at a time, in start order (e.g. one
    /// per customer); runs with different keys run in parallel within the queue's limits.
    /// No effect without a queue.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn update_account(customer: String, change: i64) -> Result<i64> {
    ///     Ok(change)
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().queue(Queue::new("accounts")).build().await?;
    /// let first = rt
    ///     .start(update_account, ("c-1".to_string(), 5))
    ///     .queue("accounts")
    ///     .partition_key("c-1")
    ///     .await?;
    /// // Begins only once `first` has ended.
    /// let second = rt
    ///     .start(update_account, ("c-1".to_string(), -2))
    ///     .queue("accounts")
    ///     .partition_key("c-1")
    ///     .await?;
    /// assert_eq!(first.return_value().await? + second.return_value().await?, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        entry(&mut self.queue).partition_key = Some(key.into());
        self
    }

    /// Among the queue's waiting runs, higher `p` begins first; equal priority in start order
    /// (default 0). Runs of one partition key keep their start order whatever their priority.
    /// No effect without a queue.
    pub fn priority(mut self, p: i32) -> Self {
        entry(&mut self.queue).priority = p;
        self
    }
}

/// The queue entry of a start, checked: `None` without a queue (a partition key or priority
/// alone has no effect), [`StartError::UnknownQueue`] for a queue that neither this runtime
/// nor any other on the store declared.
pub(super) async fn checked_queue(
    inner: &Inner,
    queue: Option<QueueEntry>,
) -> Result<Option<QueueEntry>, StartError> {
    let Some(entry) = queue.filter(|q| !q.name.is_empty()) else {
        return Ok(None);
    };
    let known = crate::lock(&inner.queues).contains(&entry.name);
    if !known {
        let now = inner.clock.tick().await;
        let declared = inner.store.list_queues(now).await?;
        if !declared.iter().any(|q| q.def.name == entry.name) {
            return Err(StartError::UnknownQueue { queue: entry.name });
        }
        crate::lock(&inner.queues).extend(declared.into_iter().map(|q| q.def.name));
    }
    inner
        .queued
        .store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(Some(entry))
}

impl<W: WorkflowDef> IntoFuture for Start<W> {
    type Output = Result<Run<W::Output>, StartError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let input = self.input?;
            if let Some(why) = self.hook.as_deref().and_then(invalid_token) {
                return Err(StartError::InvalidToken(why));
            }
            let id = self.id;
            let token = self.hook;
            let inner = &self.rt.inner;
            let queue = checked_queue(inner, self.queue).await?;
            let mut flight = None;
            if let Some(token) = &token {
                match inner.join_start(token) {
                    Joined::Lead(lead) => flight = Some(lead),
                    Joined::Follow(mut owner) => {
                        // Woken by the leader's answer or its end; no answer: ask the store.
                        let _ = owner.wait_for(Option::is_some).await;
                        let owner = *owner.borrow();
                        if let Some(owner) = owner {
                            return Err(StartError::HookConflict(HookConflictError {
                                token: token.clone(),
                                conflicting_run_id: owner,
                            }));
                        }
                    }
                }
            }
            let start = Admit {
                id,
                workflow: W::NAME,
                input,
                token,
                retention: self.retention,
                timeout: self.timeout,
                queue,
            };
            // Admission runs in its own task: once the store has the start, the run is driven
            // (or left to the workers) and duplicates following it get their answer, even if
            // this future is dropped meanwhile.
            let admitted = inner.tasks.spawn(admit(inner.clone(), start, flight)).await;
            match admitted {
                Ok(admitted) => admitted?,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return Err(StartError::NoRuntime),
            }
            Ok(Run {
                id,
                rt: self.rt,
                _t: PhantomData,
            })
        })
    }
}

/// A pending start-or-resume; await it. From [`Start::or_resume`].
#[must_use = "a start does nothing unless awaited"]
pub struct OrResume<W: WorkflowDef> {
    start: Start<W>,
    payload: Result<Value, StartError>,
}

/// What [`Start::or_resume`] did.
#[derive(Debug)]
pub enum StartOrResume<T = Value> {
    /// This call admitted the run, which owns the token; the payload was not sent.
    Started(Run<T>),
    /// The token's owner received the payload; no run was started.
    Resumed(HookRef),
}

impl<W: WorkflowDef> IntoFuture for OrResume<W> {
    type Output = Result<StartOrResume<W::Output>, StartError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Start {
                rt,
                id,
                input,
                hook,
                retention,
                timeout,
                queue,
                ..
            } = self.start;
            let input = input?;
            let Some(token) = hook else {
                return Err(StartError::InvalidToken(
                    "`.or_resume(..)` needs `.hook(token)`: the token to resume through".into(),
                ));
            };
            if let Some(why) = invalid_token(&token) {
                return Err(StartError::InvalidToken(why));
            }
            let payload = self.payload?;
            let inner = &rt.inner;
            let queue = checked_queue(inner, queue).await?;
            let flight = match inner.join_start(&token) {
                Joined::Lead(lead) => Some(lead),
                Joined::Follow(mut owner) => {
                    // Another start of the token is in flight here. Once it has an answer the
                    // store knows the token's owner and this call's own transaction resumes
                    // to it; if it failed, this call contends for the token itself. Either
                    // way its payload is queued by its own transaction, once.
                    let _ = owner.wait_for(Option::is_some).await;
                    None
                }
            };
            let start = Admit {
                id,
                workflow: W::NAME,
                input,
                token: Some(token),
                retention,
                timeout,
                queue,
            };
            // In a task of its own, as for `start`: a dropped call does not strand followers.
            let done = inner
                .tasks
                .spawn(admit_or_resume(inner.clone(), start, payload, flight))
                .await;
            let resumed = match done {
                Ok(resumed) => resumed?,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return Err(StartError::NoRuntime),
            };
            Ok(match resumed {
                Some(hook) => StartOrResume::Resumed(hook),
                None => StartOrResume::Started(Run {
                    id,
                    rt,
                    _t: PhantomData,
                }),
            })
        })
    }
}

/// A start on its way to the store, not yet timed.
struct Admit {
    id: RunId,
    workflow: &'static str,
    input: Value,
    token: Option<String>,
    retention: Option<Duration>,
    timeout: Option<Duration>,
    queue: Option<QueueEntry>,
}

impl Admit {
    /// The run to admit at `created_at`, its token retained from then on.
    fn at(self, created_at: SystemTime) -> NewRun {
        NewRun {
            parent: None,
            id: self.id,
            workflow: self.workflow.to_owned(),
            input: self.input,
            created_at,
            hook: self.token.map(|token| StartHook {
                token,
                retain_until: self.retention.map(|d| after(created_at, d)),
            }),
            deadline: self
                .timeout
                .and_then(|d| created_at.checked_add(d))
                .filter(|t| *t < never()),
            queue: self.queue,
        }
    }
}

/// Admits `start` and, when this process leased the run, starts driving it. The admission
/// time is read here, in the runtime's own tokio runtime: reading the store's clock may need
/// a round trip, and the start may be awaited from any executor.
async fn admit(
    inner: Arc<Inner>,
    start: Admit,
    flight: Option<StartFlight>,
) -> Result<(), StartError> {
    let run = start.at(inner.clock.tick().await);
    let id = run.id;
    let record = admitted_run(&run);
    let token = record.hook_token.clone();
    // A worker with room for the run leases it at admission (one transaction instead of
    // admission + acquire) and drives it at once; a queued run waits for its slot instead.
    let (admission, lease) = if run.queue.is_none() && inner.can_take(&record.workflow) {
        inner
            .store
            .create_run_leased(run, inner.config.lease)
            .await?
    } else {
        (inner.store.create_run(run).await?, None)
    };
    if let Some(flight) = flight {
        flight.land(match admission {
            Admission::Admitted => id,
            Admission::Conflict(owner) => owner,
        });
    }
    if let Admission::Conflict(owner) = admission {
        return Err(StartError::HookConflict(HookConflictError {
            token: token.unwrap_or_default(),
            conflicting_run_id: owner,
        }));
    }
    drive(&inner, record, lease);
    Ok(())
}

/// The record of a run just admitted, as a worker that leased it at admission holds it.
fn admitted_run(run: &NewRun) -> RunRecord {
    RunRecord {
        parent: None,
        id: run.id,
        workflow: run.workflow.clone(),
        status: RunStatus::Running,
        input: run.input.clone(),
        output: None,
        error: None,
        created_at: run.created_at,
        updated_at: run.created_at,
        hook_token: run.hook.as_ref().map(|h| h.token.clone()),
        deadline: run.deadline,
        queue: run.queue.clone(),
    }
}

/// Drives a run admitted with `lease` here at once; without one, wakes a worker for it.
fn drive(inner: &Arc<Inner>, run: RunRecord, lease: Option<Lease>) {
    match lease {
        Some(lease) => spawn_run(
            inner,
            LeasedRun {
                run,
                lease,
                events: Vec::new(),
            },
        ),
        None => inner.work.notify_one(),
    }
}

/// Admits `start` with its token or queues `payload` to the token's owner, in one store
/// transaction; the hook the payload went to, or `None` when the run was admitted.
async fn admit_or_resume(
    inner: Arc<Inner>,
    start: Admit,
    payload: Value,
    flight: Option<StartFlight>,
) -> Result<Option<HookRef>, StartError> {
    let run = start.at(inner.clock.tick().await);
    let id = run.id;
    let record = admitted_run(&run);
    let token = record.hook_token.clone().unwrap_or_default();
    let lease =
        (run.queue.is_none() && inner.can_take(&record.workflow)).then_some(inner.config.lease);
    let outcome = inner.store.admit_or_resume(run, lease, payload).await?;
    if let Some(flight) = flight {
        flight.land(match &outcome {
            AdmitOrResume::Admitted(_) => id,
            AdmitOrResume::Resumed { run, .. } | AdmitOrResume::Conflict(run) => *run,
        });
    }
    match outcome {
        AdmitOrResume::Admitted(lease) => {
            drive(&inner, record, lease);
            Ok(None)
        }
        AdmitOrResume::Resumed { run, .. } => {
            // As in `resume_hook`: driven here, its driver reads the payload now; otherwise
            // a worker (here or elsewhere) may acquire it.
            if !inner.payload_arrived(&run) {
                inner.work.notify_one();
            }
            Ok(Some(HookRef { token, run_id: run }))
        }
        AdmitOrResume::Conflict(owner) => Err(StartError::HookConflict(HookConflictError {
            token,
            conflicting_run_id: owner,
        })),
    }
}

/// A handle on one run. `T` is the workflow's return type (`serde_json::Value` from
/// [`Runtime::get_run`]; [`Run::typed`] changes it).
pub struct Run<T = Value> {
    id: RunId,
    rt: Runtime,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Run<T> {
    fn clone(&self) -> Self {
        Run {
            id: self.id,
            rt: self.rt.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for Run<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run").field("id", &self.id).finish()
    }
}

impl<T> Run<T> {
    /// The run's id.
    pub fn id(&self) -> RunId {
        self.id
    }

    /// The same run, with its result read as `U`.
    pub fn typed<U>(self) -> Run<U> {
        Run {
            id: self.id,
            rt: self.rt,
            _t: PhantomData,
        }
    }

    /// The run as stored.
    pub async fn info(&self) -> Result<RunRecord, RunError> {
        self.rt
            .inner
            .store
            .get_run(&self.id)
            .await?
            .ok_or(RunError::NotFound(self.id))
    }

    /// Reads the run's stream `name` (SPEC 12): every chunk from index 0 (or `.from(i)`, or
    /// `.tail(n)`), then the live writes, until the stream is closed or the run ends. See
    /// [`RunStream`] and [`stream`](crate::stream) for the writing side.
    ///
    /// ```
    /// use futures::StreamExt;
    /// use workflow_core::prelude::*;
    ///
    /// #[step]
    /// async fn progress() -> Result<()> {
    ///     for pct in [25, 50, 75, 100] {
    ///         stream::<u8>("progress").write(pct).await?;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// #[workflow]
    /// async fn job() -> Result<()> {
    ///     progress().await
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let run = rt.start(job, ()).await?;
    /// // Not closed: the stream ends with the run. The last two chunks only:
    /// let mut last = run.stream::<u8>("progress").tail(2);
    /// # run.return_value().await?;
    /// let first = last.next().await.unwrap()?;
    /// assert_eq!((first.index, first.value), (2, 75));
    /// assert_eq!(last.next().await.unwrap()?.value, 100);
    /// assert!(last.next().await.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn stream<U>(&self, name: impl Into<String>) -> RunStream<U> {
        RunStream::new(self.rt.clone(), self.id, name.into())
    }

    /// The run's streams, by name, with their length and whether they were closed.
    pub async fn streams(&self) -> Result<Vec<StreamInfo>, RunError> {
        Ok(self.rt.inner.store.list_streams(&self.id).await?)
    }

    /// The run's current status.
    pub async fn status(&self) -> Result<RunStatus, RunError> {
        Ok(self.info().await?.status)
    }

    /// Cancels the run: once this returns, the run is recorded as cancelled; the worker driving
    /// it stops at its next await point and in-flight step results are discarded. A run that
    /// already ended is left as it is (`Ok`).
    pub async fn cancel(&self) -> Result<(), RunError> {
        let now = self.rt.inner.clock.tick().await;
        let outcome = self.rt.inner.store.cancel(&self.id, now).await?;
        if outcome == CancelOutcome::Cancelled {
            if let Some(a) = self.rt.inner.active().get(&self.id) {
                a.stop.notify_one();
            }
            self.rt.inner.run_ended(self.id, None);
            self.rt.inner.slot_freed();
        }
        Ok(())
    }

    /// Tries the run again at once (SPEC 9). A blocked run is handed to a worker now (it
    /// continues where it was if the code fits its history again, or blocks again). A failed
    /// run is re-opened: its recorded steps are not run again; the steps whose error ended it
    /// get a fresh set of attempts (or, if the workflow itself returned the error, it runs
    /// again from its replay). A run that completed, was cancelled or has not ended is an
    /// error ([`RunError::NotRetryable`]) and is left as it is.
    ///
    /// ```
    /// # use workflow_core::prelude::*;
    /// # use workflow_core::RunError;
    /// #[step]
    /// async fn fine() -> Result<u32> { Ok(1) }
    /// #[workflow]
    /// async fn done() -> Result<u32> { fine().await }
    /// # #[tokio::main] async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let run = rt.start(done, ()).await?;
    /// run.return_value().await?;
    /// // A completed run has nothing to retry.
    /// assert!(matches!(run.retry().await, Err(RunError::NotRetryable { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn retry(&self) -> Result<(), RunError> {
        let inner = &self.rt.inner;
        let now = inner.clock.tick().await;
        match inner.store.retry(&self.id, now).await? {
            RetryOutcome::Reopened | RetryOutcome::Unblocked => {
                inner.work.notify_one();
                Ok(())
            }
            RetryOutcome::NotRetryable(status) => Err(RunError::NotRetryable {
                id: self.id,
                status,
            }),
        }
    }

    /// Starts a new run of the same workflow with the same arguments whose history holds
    /// this run's recorded results of its first `from_step` steps (in the order they were
    /// scheduled); later steps run again, with this build's code (SPEC 9). The copy claims no
    /// hook token, so a run that registered a hook before that step cannot be forked there
    /// ([`RunError::CannotFork`], as for a `from_step` beyond the steps it scheduled).
    pub async fn fork(&self, from_step: usize) -> Result<Run<T>, RunError> {
        let inner = &self.rt.inner;
        let run = self.info().await?;
        let events = inner.store.events(&self.id).await?;
        let id = RunId::new();
        let history = fork_history(&events, from_step, &self.id, &id)
            .map_err(|why| RunError::CannotFork { id: self.id, why })?;
        let new = NewRun {
            parent: None,
            id,
            workflow: run.workflow,
            input: run.input,
            created_at: inner.clock.tick().await,
            hook: None,
            deadline: None,
            // The copy waits for a slot of the same queue.
            queue: run.queue,
        };
        inner.store.create_run_with_history(new, &history).await?;
        inner.work.notify_one();
        Ok(Run {
            id,
            rt: self.rt.clone(),
            _t: PhantomData,
        })
    }

    /// The run's history as documented, versioned JSON ([`ExportedHistory`]): feed it to
    /// `workflow_core::testing::replay` to check a new build against it, or keep it as a
    /// test fixture. `workflow export <id>` writes the same.
    pub async fn export(&self) -> Result<Value, RunError> {
        let run = self.info().await?;
        let events = self.rt.inner.store.events(&self.id).await?;
        let history = ExportedHistory {
            format: HISTORY_FORMAT.to_owned(),
            version: HISTORY_FORMAT_VERSION,
            run: ExportedRun {
                id: run.id,
                workflow: run.workflow,
                status: run.status.as_str().to_owned(),
                input: run.input,
                created_at_ms: to_millis(run.created_at),
                hook_token: run.hook_token,
            },
            events: events
                .into_iter()
                .map(|e| ExportedEvent {
                    seq: e.seq,
                    at_ms: to_millis(e.at),
                    event: e.event,
                })
                .collect(),
        };
        serde_json::to_value(history)
            .map_err(|e| RunError::Store(StoreError::database(format!("cannot export: {e}"))))
    }
}

impl<T: DeserializeOwned> Run<T> {
    /// Waits for the run to end and returns its value: `Err` with the run's error if it failed,
    /// an error whose `is_cancelled()` is true if it was cancelled. Runs ending in this process
    /// wake the waiter at once; runs driven by other processes are seen within the poll interval.
    pub async fn return_value(&self) -> Result<T, Error> {
        // A run that completed here never changes again.
        if let Some(output) = self.rt.inner.completed_here(&self.id) {
            return self.decode(output);
        }
        // Registered before the first read, so an end between the read and the wait counts.
        let mut ended = WaitForEnd::new(&self.rt.inner, self.id);
        // A run driven here tells its waiters its end as it writes it: no read before. An end
        // told before this call may be an earlier one (the run was retried since): read.
        let earlier = ended.signal.borrow().clone();
        let mut read = earlier.is_some() || !self.rt.inner.drives(&self.id);
        loop {
            if read {
                let run = self.info().await?;
                match run.status {
                    RunStatus::Completed => return self.decode(run.output.unwrap_or(Value::Null)),
                    RunStatus::Failed => {
                        return Err(run
                            .error
                            .unwrap_or_else(|| Error::fatal(format!("run {} failed", self.id))))
                    }
                    RunStatus::Cancelled => return Err(Error::cancelled(&self.id)),
                    RunStatus::Pending | RunStatus::Running | RunStatus::Blocked => {}
                }
            }
            // Read again when this run ends or leaves here, when notices were missed, or
            // after the poll interval (runs driven by processes that do not push).
            let _ =
                tokio::time::timeout(self.rt.inner.config.poll_interval, ended.signal.changed())
                    .await;
            let seen = ended.signal.borrow_and_update().clone();
            let told = seen.filter(|end| !earlier.as_ref().is_some_and(|e| Arc::ptr_eq(e, end)));
            match told.as_deref() {
                Some(RunOutcome::Completed(v)) => return self.decode(v.clone()),
                Some(RunOutcome::Failed(e)) => return Err(e.clone()),
                None => read = true,
            }
        }
    }

    /// The run's output as a `T`.
    fn decode(&self, output: Value) -> Result<T, Error> {
        let cx = PayloadKind::WorkflowOutput { workflow: None }.of(self.id);
        self.rt
            .inner
            .config
            .payloads
            .decode(output, cx)
            .map_err(PayloadError::fatal)
    }
}

/// The end signal of one run that `return_value` calls wait for, shared by all of them.
pub(super) struct Waiting {
    /// Signalled at the run's end, with the run's outcome when it ended here.
    pub(super) ended: watch::Sender<Option<Arc<RunOutcome>>>,
    waiters: usize,
}

/// One `return_value` call's registration in [`Inner::waiting`]; removed on drop.
struct WaitForEnd {
    inner: Arc<Inner>,
    run: RunId,
    signal: watch::Receiver<Option<Arc<RunOutcome>>>,
}

impl WaitForEnd {
    fn new(inner: &Arc<Inner>, run: RunId) -> Self {
        let mut waiting = crate::lock(&inner.waiting);
        let w = waiting.entry(run).or_insert_with(|| Waiting {
            ended: watch::channel(None).0,
            waiters: 0,
        });
        w.waiters += 1;
        let signal = w.ended.subscribe();
        drop(waiting);
        WaitForEnd {
            inner: inner.clone(),
            run,
            signal,
        }
    }
}

impl Drop for WaitForEnd {
    fn drop(&mut self) {
        let mut waiting = crate::lock(&self.inner.waiting);
        if let Some(w) = waiting.get_mut(&self.run) {
            w.waiters -= 1;
            if w.waiters == 0 {
                waiting.remove(&self.run);
            }
        }
    }
}
