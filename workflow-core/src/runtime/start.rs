//! Starting runs: the [`Start`] builder `rt.start(wf, args)` returns and its options, the
//! start-or-resume of a hook token ([`OrResume`]), and the admission itself, which runs in a
//! task of its own so that a dropped start neither undoes nor strands it.

use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::flight::{Joined, StartFlight};
use super::spawn_run;
use super::{HookRef, Inner, Run, Runtime};
use crate::context::invalid_token;
use crate::driver::{Pending, Via};
use crate::error::{HookConflictError, StartError, StoreError};
use crate::history::{after, never};
use crate::ids::RunId;
use crate::payload::{Encoded, PayloadError, PayloadKind};
use crate::queue::entry;
use crate::registry::{BoxFuture, WorkflowDef};
use crate::store::{
    Admission, AdmitOrResume, Lease, LeasedRun, NewRun, QueueEntry, RunRecord, RunStatus,
    StartHook, TraceContext,
};

/// A pending start; await it. From [`Runtime::start`].
#[must_use = "a start does nothing unless awaited"]
pub struct Start<W: WorkflowDef> {
    rt: Runtime,
    /// The arguments as serialized, not yet checked.
    input: Result<Value, serde_json::Error>,
    hook: Option<String>,
    retention: Option<Duration>,
    timeout: Option<Duration>,
    /// From `#[workflow(queue = "..")]` until `.queue(..)` names another; the partition key
    /// and priority wait here for a queue.
    queue: Option<QueueEntry>,
    /// `.delay(..)` or `.start_at(..)`: not begun before then.
    begin: Option<Begin>,
    _def: PhantomData<fn() -> W>,
}

/// When a delayed start begins: a delay counted from admission, or an instant.
#[derive(Debug, Clone, Copy)]
enum Begin {
    After(Duration),
    At(SystemTime),
}

impl<W: WorkflowDef> Start<W> {
    /// The start of a run with `input` (as serialized), entering `queue`.
    pub(super) fn new(
        rt: Runtime,
        input: Result<Value, serde_json::Error>,
        queue: Option<QueueEntry>,
    ) -> Self {
        Start {
            rt,
            input,
            hook: None,
            retention: None,
            timeout: None,
            queue,
            begin: None,
            _def: PhantomData,
        }
    }

    /// Admits the run now — its id is known, its `.hook(..)` token claimed, its queue entered
    /// — but begins it no earlier than `d` after admission. Meanwhile it is
    /// [`RunStatus::Pending`] with its [`RunRecord::start_at`], survives restarts like any
    /// stored run, and can be cancelled; payloads sent to its token wait for it. A worker of
    /// this process begins it when the time comes; other processes' workers find it on
    /// their next poll. A `.timeout(..)` counts from the start, not from admission.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn send_reminder(user: String) -> Result<String> {
    ///     Ok(format!("reminded {user}"))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let run = rt
    ///     .start(send_reminder, ("ada".to_owned(),))
    ///     .delay(Duration::from_millis(50))
    ///     .await?;
    /// let info = run.info().await?;
    /// assert_eq!(info.status, RunStatus::Pending);
    /// assert!(info.start_at.is_some());
    /// assert_eq!(run.return_value().await?, "reminded ada");
    /// # Ok(())
    /// # }
    /// ```
    pub fn delay(mut self, d: Duration) -> Self {
        self.begin = Some(Begin::After(d));
        self
    }

    /// As [`Start::delay`], but begins no earlier than the instant `t` (on the store's
    /// clock, which for PostgreSQL is the database server's). A `t` that has passed begins
    /// the run at once.
    pub fn start_at(mut self, t: SystemTime) -> Self {
        self.begin = Some(Begin::At(t));
        self
    }

    /// Claims hook `token` atomically with admitting the run: of any number of concurrent
    /// starts with one token, across processes, exactly one becomes a run; the others fail with
    /// [`StartError::HookConflict`] naming it and leave no trace. The hook accepts payloads
    /// from admission on (they are buffered); inside the run, `create_hook(token)` binds to it.
    pub fn hook(mut self, token: impl Into<String>) -> Self {
        self.hook = Some(token.into());
        self
    }

    /// Starts the run with the `.hook(..)` token, or, if an active hook of another run owns
    /// that token, sends `payload` to it instead: one store transaction does either,
    /// so there is no moment at which the token is owned but the payload finds no hook (no
    /// [`HookError::NotFound`](crate::HookError::NotFound) to retry on). Resolves to [`StartOrResume::Started`] when this
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

    /// A deadline for the whole run: if it has not ended `d` after its start (its admission,
    /// or the time a [`Start::delay`] names), it fails ("timed out after 30s"), its in-flight
    /// steps dropped, wherever it is — running, sleeping, waiting for a hook or not yet picked
    /// up. `Duration::MAX` means none.
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

    /// Enters the run in queue `name`, declared with
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

impl<W: WorkflowDef> IntoFuture for Start<W> {
    type Output = Result<Run<W::Output>, StartError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let id = RunId::new();
            // A child of the caller's current span, kept with the run (feature `otel`).
            let (span, trace) = crate::traces::start_span(W::NAME, id, None);
            // The arguments are handed in the clear to a driver here that begins the run at
            // once; kept for other readers here (see `crypto::seal`) only when the run may
            // begin otherwise (a worker acquires it later).
            let handed = self.hook.is_none()
                && self.begin.is_none()
                && self.queue.is_none()
                && self.rt.inner.can_take(W::NAME);
            let Encoded {
                stored: input,
                plain: known_input,
            } = sealed::<W>(&self.rt, id, self.input, !handed)?;
            if let Some(why) = self.hook.as_deref().and_then(invalid_token) {
                return Err(StartError::InvalidToken(why));
            }
            let token = self.hook;
            let inner = &self.rt.inner;
            let queue = inner.checked_queue(self.queue).await?;
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
                known_input,
                token,
                retention: self.retention,
                timeout: self.timeout,
                queue,
                begin: self.begin,
                version: inner.config.version.clone(),
                trace,
            };
            // Admission runs in its own task: once the store has the start, the run is driven
            // (or left to the workers) and duplicates following it get their answer, even if
            // this future is dropped meanwhile. The start span lasts as long and ends with it.
            let admitted = inner
                .tasks
                .spawn(crate::traces::lasting(
                    span,
                    admit(inner.clone(), start, flight),
                ))
                .await;
            match admitted {
                Ok(admitted) => admitted?,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return Err(StartError::NoRuntime),
            }
            Ok(Run::started(id, self.rt))
        })
    }
}

/// The arguments of run `id` of `W`, as serialized, made ready for the store (and their
/// plain value when the store's differs); `remember` as [`Payloads::seal_kept`].
///
/// [`Payloads::seal_kept`]: crate::payload::Payloads::seal_kept
fn sealed<W: WorkflowDef>(
    rt: &Runtime,
    id: RunId,
    input: Result<Value, serde_json::Error>,
    remember: bool,
) -> Result<Encoded, StartError> {
    let cx = PayloadKind::WorkflowInput { workflow: W::NAME }.of(id);
    rt.inner
        .config
        .payloads
        .seal_kept(input, cx, remember)
        .map_err(|e| match e {
            PayloadError::TooLarge(e) => StartError::TooLarge(e),
            e => StartError::Serialize {
                workflow: W::NAME.to_owned(),
                message: e.cause(),
            },
        })
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
                input,
                hook,
                retention,
                timeout,
                queue,
                begin,
                ..
            } = self.start;
            let id = RunId::new();
            let (span, trace) = crate::traces::start_span(W::NAME, id, None);
            let input = sealed::<W>(&rt, id, input, true)?.stored;
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
            let queue = inner.checked_queue(queue).await?;
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
                known_input: None,
                token: Some(token),
                retention,
                timeout,
                queue,
                begin,
                version: inner.config.version.clone(),
                trace,
            };
            // In a task of its own, as for `start`: a dropped call does not strand followers.
            let done = inner
                .tasks
                .spawn(crate::traces::lasting(
                    span,
                    admit_or_resume(inner.clone(), start, payload, flight),
                ))
                .await;
            let resumed = match done {
                Ok(resumed) => resumed?,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return Err(StartError::NoRuntime),
            };
            Ok(match resumed {
                Some(hook) => StartOrResume::Resumed(hook),
                None => StartOrResume::Started(Run::started(id, rt)),
            })
        })
    }
}

/// A start on its way to the store, not yet timed.
struct Admit {
    id: RunId,
    workflow: &'static str,
    input: Value,
    /// The plain value of `input` when sealing changed it: handed to a driver here.
    known_input: Option<Value>,
    token: Option<String>,
    retention: Option<Duration>,
    timeout: Option<Duration>,
    queue: Option<QueueEntry>,
    begin: Option<Begin>,
    version: Option<String>,
    /// The context of the start's span (feature `otel`), kept with the run.
    trace: Option<TraceContext>,
}

impl Admit {
    /// The run to admit at `created_at`, its token retained from then on, its deadline
    /// counted from its start.
    fn at(self, created_at: SystemTime) -> NewRun {
        let start_at = self.begin.map(|b| match b {
            Begin::After(d) => after(created_at, d),
            // Past the latest time every store keeps: as late as that (as for `after`).
            Begin::At(t) => t.min(never()),
        });
        let begins = start_at.map_or(created_at, |t| t.max(created_at));
        NewRun::new(self.id, self.workflow.to_owned(), self.input, created_at)
            .start_at(start_at)
            .version(self.version)
            .hook(self.token.map(|token| StartHook {
                token,
                retain_until: self.retention.map(|d| after(created_at, d)),
            }))
            .deadline(
                self.timeout
                    .and_then(|d| begins.checked_add(d))
                    .filter(|t| *t < never()),
            )
            .queue(self.queue)
            .trace_context(self.trace)
    }
}

/// Admits `start` and, when this process leased the run, starts driving it. The admission
/// time is read here, in the runtime's own tokio runtime: reading the store's clock may need
/// a round trip, and the start may be awaited from any executor.
async fn admit(
    inner: Arc<Inner>,
    mut start: Admit,
    flight: Option<StartFlight>,
) -> Result<(), StartError> {
    let known_input = start.known_input.take();
    let run = start.at(inner.clock.tick().await);
    let id = run.id;
    let record = admitted_run(&run);
    let token = record.hook_token.clone();
    let retained = run.hook.as_ref().and_then(|h| h.retain_until);
    // A run this worker can drive at once, with no token or delay: its driver admits it
    // with the start of its first steps, in one commit (`driver/admission.rs`). A queued run
    // too: the store decides whether it begins at once (then it is leased here, holding its
    // slot) or waits for its slot (then nothing of its first round is written).
    if token.is_none() && !run.delayed() && inner.can_take(&record.workflow) {
        let workflow = record.workflow.clone();
        let (answer, admitted) = tokio::sync::oneshot::channel();
        drive_pending(&inner, record, run, Via::Start(answer), known_input);
        // Admitted without a lease here, the driver has woken a worker for it already.
        admitted.await.map_err(|_| {
            StoreError::database("the run's driver stopped before admitting it; it was not started")
        })??;
        crate::telemetry::run_started(&workflow);
        return Ok(());
    }
    // A worker with room for the run leases it at admission (one transaction instead of
    // admission + acquire) and drives it at once; a queued run too when its queue has room
    // and nobody waits in it (the store decides), and otherwise waits for its slot; a
    // delayed run waits for its time.
    let (admission, lease) = if !run.delayed() && inner.can_take(&record.workflow) {
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
    if let Some(until) = retained {
        inner.retained_until(id, until);
    }
    crate::telemetry::run_started(&record.workflow);
    drive(&inner, record, lease);
    Ok(())
}

/// Spawns the driver of `run` (whose record is `record`) before its admission: the driver
/// polls the workflow's first round and admits the run `via` the start or the tick's firing,
/// with that round (`driver/admission.rs`). Counted among the runs driven here from now on.
/// `known_input`: the plain value of the run's arguments, when sealing changed them.
pub(super) fn drive_pending(
    inner: &Arc<Inner>,
    record: RunRecord,
    run: NewRun,
    via: Via,
    known_input: Option<Value>,
) {
    let leased = LeasedRun::admitted(record);
    let pending = Pending {
        run,
        admitting: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        via,
        known_input,
    };
    spawn_run(inner, leased, Some(Box::new(pending)));
}

/// The record of a run just admitted, as a worker that leased it at admission holds it.
pub(super) fn admitted_run(run: &NewRun) -> RunRecord {
    RunRecord {
        trace_context: run.trace_context.clone(),
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
        start_at: run.start_at,
        version: run.version.clone(),
        previous_run: None,
        next_run: None,
        origin: None,
    }
}

/// Drives a run admitted with `lease` here at once; without one, wakes a worker for it (for
/// a delayed run, when it is due).
pub(super) fn drive(inner: &Arc<Inner>, run: RunRecord, lease: Option<Lease>) {
    match lease {
        Some(lease) => spawn_run(
            inner,
            LeasedRun {
                run,
                lease,
                events: Vec::new(),
                took_over: false,
            },
            None,
        ),
        None => match run.start_at.filter(|at| *at > run.created_at) {
            Some(at) => wake_when_due(inner, &run.workflow, at),
            None => inner.work.notify_one(),
        },
    }
}

/// Wakes this process's worker at `at`, when a delayed run of `workflow` admitted here is
/// due: it begins then, as a sleeping run wakes, instead of at the next poll. Workers of
/// other processes find it by polling. The timer holds the runtime weakly and ends with it.
fn wake_when_due(inner: &Arc<Inner>, workflow: &str, at: SystemTime) {
    if !inner.config.worker || !inner.workflows.contains_key(workflow) {
        return;
    }
    let runtime = Arc::downgrade(inner);
    let mut shutdown = inner.shutdown.subscribe();
    inner.tasks.spawn(async move {
        loop {
            let Some(inner) = runtime.upgrade() else {
                return;
            };
            let wait = at
                .duration_since(inner.clock_now())
                .unwrap_or(Duration::ZERO);
            drop(inner);
            if wait.is_zero() {
                break;
            }
            // Stores keep whole milliseconds: one more, and the run is due on any reading.
            tokio::select! {
                _ = tokio::time::sleep(wait + Duration::from_millis(1)) => {}
                _ = shutdown.changed() => return,
            }
        }
        if let Some(inner) = runtime.upgrade() {
            inner.work.notify_one();
        }
    });
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
    let retained = run.hook.as_ref().and_then(|h| h.retain_until);
    let lease = (run.queue.is_none() && !run.delayed() && inner.can_take(&record.workflow))
        .then_some(inner.config.lease);
    let outcome = inner.store.admit_or_resume(run, lease, payload).await?;
    if let Some(flight) = flight {
        flight.land(match &outcome {
            AdmitOrResume::Admitted(_) => id,
            AdmitOrResume::Resumed { run, .. } | AdmitOrResume::Conflict(run) => *run,
        });
    }
    match outcome {
        AdmitOrResume::Admitted(lease) => {
            if let Some(until) = retained {
                inner.retained_until(id, until);
            }
            crate::telemetry::run_started(&record.workflow);
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
