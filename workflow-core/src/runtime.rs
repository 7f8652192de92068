//! The runtime: a worker that leases runs from the store and drives them, and the client API
//! (`start`, `get_run`, run handles). A process whose runtime is built is a worker.

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
#[cfg(feature = "sqlite")]
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{broadcast, watch, Notify};

use crate::config::Config;
use crate::context::invalid_token;
use crate::driver::{Driver, Host, Signals};
use crate::error::{BuildError, Error, RunError, StartError};
use crate::error::{HookConflictError, HookError, HookNotFoundError};
use crate::ids::RunId;
use crate::registry::{
    BoxFuture, IntoWorkflow, StepRegistration, WorkflowDef, WorkflowRegistration,
};
use crate::store::memory::MemoryStore;
use crate::store::{
    AcquireRequest, Admission, CancelOutcome, Lease, LeasedRun, NewRun, Notice, RunRecord,
    RunStatus, StartHook, Store,
};

/// With a store that pushes changes, the safety-net poll runs this many times less often.
const PUSHED_POLL_FACTOR: u32 = 10;

tokio::task_local! {
    static CURRENT_RUNTIME: Arc<Inner>;
}

static LAST_BUILT: OnceLock<Mutex<Option<Runtime>>> = OnceLock::new();

fn last_built() -> MutexGuard<'static, Option<Runtime>> {
    crate::lock(LAST_BUILT.get_or_init(|| Mutex::new(None)))
}

/// Runs `fut` with `rt` as the runtime that `workflow_core::api` uses (inside steps).
pub(crate) fn with_runtime<F: Future>(rt: Arc<Inner>, fut: F) -> impl Future<Output = F::Output> {
    CURRENT_RUNTIME.scope(rt, fut)
}

/// The runtime `workflow_core::api` uses: inside a step, the one executing it; elsewhere, the
/// most recently built one.
pub(crate) fn current_runtime() -> Option<Runtime> {
    CURRENT_RUNTIME
        .try_with(|i| Runtime { inner: i.clone() })
        .ok()
        .or_else(|| last_built().clone())
}

struct Active {
    lease: Lease,
    stop: Arc<Notify>,
    inbox: Arc<Notify>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: Config,
    worker_id: String,
    workflows: HashMap<&'static str, &'static WorkflowRegistration>,
    workflow_names: Vec<String>,
    active: Mutex<HashMap<RunId, Active>>,
    pub(crate) work: Notify,
    /// Whether the store pushes changes (then polling is only a slow safety net).
    pushed: bool,
    /// The runs someone waits for in `return_value`, each with the signal of its end (in this
    /// process or, with a pushing store, anywhere): a run's end wakes its own waiters only.
    waiting: Mutex<HashMap<RunId, Waiting>>,
    shutdown: watch::Sender<bool>,
    /// The `.hook(token)` starts this process has in flight, by token (see [`StartFlight`]).
    starting: Mutex<HashMap<String, watch::Receiver<Option<RunId>>>>,
    /// The tokio runtime the runtime was built in: admissions run there, so a start may be
    /// awaited from any executor.
    tasks: tokio::runtime::Handle,
}

impl Inner {
    fn active(&self) -> MutexGuard<'_, HashMap<RunId, Active>> {
        crate::lock(&self.active)
    }

    fn run_left(&self, id: &RunId) {
        let mut active = self.active();
        let was_full = active.len() >= self.config.max_active_runs;
        active.remove(id);
        drop(active);
        // Only a full worker may have left acquirable runs behind; otherwise the next
        // acquire would find nothing new and cost a write transaction per finished run.
        if was_full {
            self.work.notify_one();
        }
    }

    /// Whether this process should lease a run of `workflow` it is admitting: it is a running
    /// worker that knows the workflow and has room.
    fn can_take(&self, workflow: &str) -> bool {
        self.config.worker
            && !*self.shutdown.borrow()
            && self.workflows.contains_key(workflow)
            && self.active().len() < self.config.max_active_runs
    }

    /// Tells the local driver of `run`, if any, that its inbox has news.
    /// Tells the local driver of `run`, if any, that its inbox has news; false if no driver
    /// here has the run.
    fn payload_arrived(&self, run: &RunId) -> bool {
        match self.active().get(run) {
            Some(a) => {
                a.inbox.notify_one();
                true
            }
            None => false,
        }
    }

    /// Joins the start of `token` in flight in this process, or becomes it.
    fn join_start(self: &Arc<Self>, token: &str) -> Joined {
        let mut starting = crate::lock(&self.starting);
        if let Some(flight) = starting.get(token) {
            return Joined::Follow(flight.clone());
        }
        let (tx, rx) = watch::channel(None);
        starting.insert(token.to_owned(), rx);
        Joined::Lead(StartFlight {
            inner: self.clone(),
            token: token.to_owned(),
            owner: tx,
        })
    }

    pub(crate) fn run_ended(&self, id: RunId) {
        let waiting = crate::lock(&self.waiting);
        if let Some(w) = waiting.get(&id) {
            w.ended.send_replace(());
        }
    }
}

/// Where the runtime keeps its state.
enum StoreChoice {
    Memory,
    #[cfg(feature = "sqlite")]
    Sqlite(PathBuf),
    #[cfg(feature = "postgres")]
    Postgres(String),
    Custom(Arc<dyn Store>),
}

/// Configures and builds a [`Runtime`]; from [`Runtime::builder`].
#[must_use]
pub struct RuntimeBuilder {
    store: StoreChoice,
    config: Config,
    #[cfg(feature = "postgres")]
    schema: String,
}

impl RuntimeBuilder {
    /// Keep everything in memory (tests; nothing survives the process).
    pub fn in_memory(mut self) -> Self {
        self.store = StoreChoice::Memory;
        self
    }

    /// Use the SQLite database at `path`, created if absent (the embedded default).
    #[cfg(feature = "sqlite")]
    pub fn sqlite(mut self, path: impl Into<PathBuf>) -> Self {
        self.store = StoreChoice::Sqlite(path.into());
        self
    }

    /// Use the PostgreSQL database at `url` (`postgres://user@host:port/db`): many worker
    /// processes on many machines share its work. Tables live in the schema set with
    /// [`RuntimeBuilder::schema`] (default `workflow`), created or migrated on connect.
    #[cfg(feature = "postgres")]
    pub fn postgres(mut self, url: impl Into<String>) -> Self {
        self.store = StoreChoice::Postgres(url.into());
        self
    }

    /// The PostgreSQL schema holding the tables (default `workflow`).
    #[cfg(feature = "postgres")]
    pub fn schema(mut self, name: impl Into<String>) -> Self {
        self.schema = name.into();
        self
    }

    /// Use a store built elsewhere (e.g. a [`MemoryStore`] shared by several runtimes).
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = StoreChoice::Custom(Arc::new(store));
        self
    }

    /// How long a worker's claim on a run lasts without a heartbeat before another worker may
    /// take the run over (default 30 s). Heartbeats renew it every third of this; a run
    /// cancelled by another process stops here within that third at the latest.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease.max(Duration::from_millis(30));
        self
    }

    /// How often the worker looks for work created by other processes (default 200 ms); work
    /// created in this process is picked up at once.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.config.poll_interval = every.max(Duration::from_millis(1));
        self
    }

    /// The first retry delay of a failing step (default 1 s); it doubles with each further
    /// failure, capped at one hour. `Error::retry_after` overrides it per failure.
    pub fn retry_backoff(mut self, base: Duration) -> Self {
        self.config.retry_backoff = base;
        self
    }

    /// At most this many runs are driven at once by this process (default 1000).
    pub fn max_active_runs(mut self, n: usize) -> Self {
        self.config.max_active_runs = n.max(1);
        self
    }

    /// A run whose only pending work is durable sleeps ending later than this from now is
    /// evicted from memory and replayed when the first one is due (default 30 s).
    pub fn evict_after(mut self, d: Duration) -> Self {
        self.config.evict_after = d;
        self
    }

    /// Whether this process executes runs (default `true`). A client-only runtime starts and
    /// inspects runs that worker processes execute.
    pub fn worker(mut self, enabled: bool) -> Self {
        self.config.worker = enabled;
        self
    }

    /// Opens the store, registers every workflow and step linked into the binary and, unless
    /// disabled, starts the worker. Must be called inside a tokio runtime.
    pub async fn build(self) -> Result<Runtime, BuildError> {
        let mut workflows = HashMap::new();
        for reg in inventory::iter::<WorkflowRegistration> {
            if workflows.insert(reg.name, reg).is_some() {
                return Err(BuildError::DuplicateName {
                    kind: "workflow",
                    name: reg.name.to_owned(),
                });
            }
        }
        let mut steps = HashMap::new();
        for reg in inventory::iter::<StepRegistration> {
            if steps.insert(reg.def.name, ()).is_some() {
                return Err(BuildError::DuplicateName {
                    kind: "step",
                    name: reg.def.name.to_owned(),
                });
            }
        }
        let store: Arc<dyn Store> = match self.store {
            StoreChoice::Memory => Arc::new(MemoryStore::new()),
            #[cfg(feature = "sqlite")]
            StoreChoice::Sqlite(path) => {
                Arc::new(crate::store::sqlite::SqliteStore::open(path).await?)
            }
            #[cfg(feature = "postgres")]
            StoreChoice::Postgres(url) => {
                Arc::new(crate::store::postgres::PostgresStore::connect(&url, &self.schema).await?)
            }
            StoreChoice::Custom(s) => s,
        };
        let mut workflow_names: Vec<String> = workflows.keys().map(|s| s.to_string()).collect();
        workflow_names.sort();
        let notices = store.notices();
        let inner = Arc::new(Inner {
            store,
            config: self.config,
            worker_id: format!("w-{}", RunId::new()),
            workflows,
            workflow_names,
            active: Mutex::new(HashMap::new()),
            work: Notify::new(),
            pushed: notices.is_some(),
            waiting: Mutex::new(HashMap::new()),
            shutdown: watch::channel(false).0,
            starting: Mutex::new(HashMap::new()),
            tasks: tokio::runtime::Handle::current(),
        });
        if let Some(rx) = notices {
            tokio::spawn(notice_loop(inner.clone(), rx));
        }
        if inner.config.worker {
            tokio::spawn(worker_loop(inner.clone()));
            tokio::spawn(heartbeat_loop(inner.clone()));
        }
        let rt = Runtime { inner };
        *last_built() = Some(rt.clone());
        Ok(rt)
    }
}

/// A handle on the workflow runtime: cheap to clone, clones share one runtime.
///
/// See the crate docs for a complete example.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("worker_id", &self.inner.worker_id)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A builder; the default store is SQLite at `workflows.db` when the `sqlite` feature is on
    /// (it is by default), memory otherwise.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            #[cfg(feature = "sqlite")]
            store: StoreChoice::Sqlite(PathBuf::from("workflows.db")),
            #[cfg(not(feature = "sqlite"))]
            store: StoreChoice::Memory,
            config: Config {
                lease: Duration::from_secs(30),
                poll_interval: Duration::from_millis(200),
                retry_backoff: Duration::from_secs(1),
                max_active_runs: 1000,
                worker: true,
                evict_after: Duration::from_secs(30),
            },
            #[cfg(feature = "postgres")]
            schema: "workflow".to_owned(),
        }
    }

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
        let input =
            <F::Def as WorkflowDef>::encode_args(&args).map_err(|e| StartError::Serialize {
                workflow: <F::Def as WorkflowDef>::NAME.to_owned(),
                message: e.to_string(),
            });
        Start {
            rt: self.clone(),
            input,
            hook: None,
            retention: None,
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
    /// it yet, or released it): see the route pattern in the crate docs.
    pub async fn resume_hook<P: serde::Serialize>(
        &self,
        token: impl Into<String>,
        payload: P,
    ) -> Result<HookRef, HookError> {
        let token = token.into();
        if let Some(why) = invalid_token(&token) {
            return Err(HookError::InvalidToken(why));
        }
        let payload = serde_json::to_value(payload).map_err(|e| HookError::Serialize {
            token: token.clone(),
            message: e.to_string(),
        })?;
        match self
            .inner
            .store
            .resume_hook(&token, payload, SystemTime::now())
            .await?
        {
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

    /// How many runs this process is driving in memory now (evicted and pending runs are not
    /// counted).
    pub fn active_runs(&self) -> usize {
        self.inner.active().len()
    }

    /// Stops this runtime's worker: runs it drives are left to other workers (after their
    /// leases expire) or to the next start of this program.
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        for a in self.inner.active().values() {
            a.stop.notify_one();
        }
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

/// A `.hook(token)` start while no other start of `token` is in flight in this process. Starts
/// of the same token that arrive meanwhile (a storm of duplicate requests) follow it instead of
/// contending for the token in the store: when it learns the token's owner (its own new run,
/// or the run that already held the token) they fail with the same [`HookConflictError`] it
/// would have met, and when it fails or is dropped they go to the store themselves. Each
/// follower was waiting while the leader's admission was in flight, so the owner it is told
/// of held the token within the follower's own call, as if it had contended in the store.
struct StartFlight {
    inner: Arc<Inner>,
    token: String,
    owner: watch::Sender<Option<RunId>>,
}

impl StartFlight {
    /// Ends the flight: the token's owner is `owner`.
    fn land(self, owner: RunId) {
        // Out of the map first, so a start arriving from now on asks the store.
        self.leave();
        self.owner.send_replace(Some(owner));
    }

    /// Removes this flight from the map, unless a later one has replaced it.
    fn leave(&self) {
        let mut starting = crate::lock(&self.inner.starting);
        if starting
            .get(&self.token)
            .is_some_and(|rx| rx.same_channel(&self.owner.subscribe()))
        {
            starting.remove(&self.token);
        }
    }
}

impl Drop for StartFlight {
    fn drop(&mut self) {
        // Failed or dropped without an answer: the followers, woken when the sender goes
        // right after, ask the store themselves.
        self.leave();
    }
}

enum Joined {
    Lead(StartFlight),
    Follow(watch::Receiver<Option<RunId>>),
}

/// A pending start; await it. From [`Runtime::start`].
#[must_use = "a start does nothing unless awaited"]
pub struct Start<W: WorkflowDef> {
    rt: Runtime,
    input: Result<Value, StartError>,
    hook: Option<String>,
    retention: Option<Duration>,
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

    /// Keeps the `.hook(..)` token unavailable until `start + d`, even after the run ended, so
    /// that late duplicates are still refused (and can read this run's result). No effect
    /// without `.hook(..)`.
    pub fn min_retention(mut self, d: Duration) -> Self {
        self.retention = Some(d);
        self
    }
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
            let id = RunId::new();
            let created_at = SystemTime::now();
            let hook = self.hook.map(|token| StartHook {
                token,
                retain_until: self.retention.map(|d| created_at + d),
            });
            let token = hook.as_ref().map(|h| h.token.clone());
            let inner = &self.rt.inner;
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
            let new_run = NewRun {
                id,
                workflow: W::NAME.to_owned(),
                input,
                created_at,
                hook,
            };
            // Admission runs in its own task: once the store has the start, the run is driven
            // (or left to the workers) and duplicates following it get their answer, even if
            // this future is dropped meanwhile.
            let admitted = inner
                .tasks
                .spawn(admit(inner.clone(), new_run, flight))
                .await;
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

/// Admits `run` and, when this process leased it, starts driving it.
async fn admit(
    inner: Arc<Inner>,
    run: NewRun,
    flight: Option<StartFlight>,
) -> Result<(), StartError> {
    let (id, created_at) = (run.id, run.created_at);
    let workflow = run.workflow.clone();
    let input = run.input.clone();
    let token = run.hook.as_ref().map(|h| h.token.clone());
    // A worker with room for the run leases it at admission (one transaction instead of
    // admission + acquire) and drives it at once.
    let (admission, lease) = if inner.can_take(&workflow) {
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
    match lease {
        Some(lease) => spawn_run(
            &inner,
            LeasedRun {
                run: RunRecord {
                    id,
                    workflow,
                    status: RunStatus::Running,
                    input,
                    output: None,
                    error: None,
                    created_at,
                    updated_at: created_at,
                    hook_token: token,
                },
                lease,
                events: Vec::new(),
            },
        ),
        None => inner.work.notify_one(),
    }
    Ok(())
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

    /// The run's current status.
    pub async fn status(&self) -> Result<RunStatus, RunError> {
        Ok(self.info().await?.status)
    }

    /// Cancels the run: once this returns, the run is recorded as cancelled; the worker driving
    /// it stops at its next await point and in-flight step results are discarded. A run that
    /// already ended is left as it is (`Ok`).
    pub async fn cancel(&self) -> Result<(), RunError> {
        let outcome = self
            .rt
            .inner
            .store
            .cancel(&self.id, SystemTime::now())
            .await?;
        if outcome == CancelOutcome::Cancelled {
            if let Some(a) = self.rt.inner.active().get(&self.id) {
                a.stop.notify_one();
            }
            self.rt.inner.run_ended(self.id);
        }
        Ok(())
    }
}

impl<T: DeserializeOwned> Run<T> {
    /// Waits for the run to end and returns its value: `Err` with the run's error if it failed,
    /// an error whose `is_cancelled()` is true if it was cancelled. Runs ending in this process
    /// wake the waiter at once; runs driven by other processes are seen within the poll interval.
    pub async fn return_value(&self) -> Result<T, Error> {
        // Registered before the first read, so an end between the read and the wait counts.
        let mut ended = WaitForEnd::new(&self.rt.inner, self.id);
        loop {
            let run = self.info().await?;
            match run.status {
                RunStatus::Completed => {
                    let v = run.output.unwrap_or(Value::Null);
                    return serde_json::from_value(v).map_err(|e| {
                        Error::fatal(format!(
                            "the result of run {} does not deserialize into the requested type: {e}",
                            self.id
                        ))
                    });
                }
                RunStatus::Failed => {
                    return Err(run
                        .error
                        .unwrap_or_else(|| Error::fatal(format!("run {} failed", self.id))))
                }
                RunStatus::Cancelled => return Err(Error::cancelled(&self.id)),
                RunStatus::Pending | RunStatus::Running => {
                    // Read again when this run ends here, when notices were missed, or after
                    // the poll interval (runs driven by processes that do not push).
                    let _ = tokio::time::timeout(
                        self.rt.inner.config.poll_interval,
                        ended.signal.changed(),
                    )
                    .await;
                }
            }
        }
    }
}

/// The end signal of one run that `return_value` calls wait for, shared by all of them.
struct Waiting {
    ended: watch::Sender<()>,
    waiters: usize,
}

/// One `return_value` call's registration in [`Inner::waiting`]; removed on drop.
struct WaitForEnd {
    inner: Arc<Inner>,
    run: RunId,
    signal: watch::Receiver<()>,
}

impl WaitForEnd {
    fn new(inner: &Arc<Inner>, run: RunId) -> Self {
        let mut waiting = crate::lock(&inner.waiting);
        let w = waiting.entry(run).or_insert_with(|| Waiting {
            ended: watch::channel(()).0,
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

/// Applies the changes a pushing store reports: wakes the worker, the drivers of runs that got
/// payloads, and the waiters of runs that ended (in any process, so client-only runtimes too).
async fn notice_loop(rt: Arc<Inner>, mut notices: broadcast::Receiver<Notice>) {
    let mut shutdown = rt.shutdown.subscribe();
    loop {
        let n = tokio::select! {
            n = notices.recv() => n,
            _ = shutdown.changed() => return,
        };
        match n {
            Ok(Notice::RunsReady) => rt.work.notify_one(),
            Ok(Notice::Payload(run)) => {
                rt.payload_arrived(&run);
            }
            Ok(Notice::RunEnded(run)) => {
                // Cancelled or ended elsewhere: stop driving it here at once.
                if let Some(a) = rt.active().get(&run) {
                    a.stop.notify_one();
                }
                rt.run_ended(run);
            }
            // Missed notices: the worker's poll and the waiters' timeouts catch up.
            Err(broadcast::error::RecvError::Lagged(_)) => {
                // Notices were lost: look again at whatever they may have been about.
                rt.work.notify_one();
                let waiting = crate::lock(&rt.waiting);
                for w in waiting.values() {
                    w.ended.send_replace(());
                }
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

async fn worker_loop(rt: Arc<Inner>) {
    let mut shutdown = rt.shutdown.subscribe();
    let mut failures = 0u32;
    // Payloads sent through other processes reach the runs driven here through this cursor.
    let mut payload_cursor = rt.store.last_payload_id().await.unwrap_or(0);
    // Stores that push changes wake the worker at once; the poll stays as a safety net.
    let pushed = rt.pushed;
    // Payloads sent in this process notify their runs directly: the cursor is only for other
    // processes' payloads, so it is read once per poll interval, not on every local wake-up.
    let mut payloads_polled: Option<std::time::Instant> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        if payloads_polled.is_none_or(|t| t.elapsed() >= rt.config.poll_interval) {
            payloads_polled = Some(std::time::Instant::now());
            match rt.store.payloads_since(payload_cursor, 1024).await {
                Ok(news) => {
                    for (id, run) in news {
                        payload_cursor = payload_cursor.max(id);
                        rt.payload_arrived(&run);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading new hook payloads failed"),
            }
        }
        // The payload poll awaited: a shutdown meanwhile must not lease runs any more.
        if *shutdown.borrow() {
            return;
        }
        let capacity = rt.config.max_active_runs.saturating_sub(rt.active().len());
        let mut full_batch = false;
        if capacity > 0 && !rt.workflow_names.is_empty() {
            let req = AcquireRequest {
                worker_id: &rt.worker_id,
                workflows: &rt.workflow_names,
                lease: rt.config.lease,
                limit: capacity.min(64),
                now: SystemTime::now(),
            };
            match rt.store.acquire(req).await {
                Ok(runs) => {
                    failures = 0;
                    full_batch = runs.len() == capacity.min(64);
                    for leased in runs {
                        spawn_run(&rt, leased);
                    }
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, "acquiring runs failed; retrying");
                }
            }
        }
        if full_batch {
            continue;
        }
        let mut wait = rt.config.poll_interval.saturating_mul(failures.min(10) + 1);
        if pushed {
            wait = wait.saturating_mul(PUSHED_POLL_FACTOR);
        }
        tokio::select! {
            _ = rt.work.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
    }
}

fn spawn_run(rt: &Arc<Inner>, leased: LeasedRun) {
    let Some(reg) = rt.workflows.get(leased.run.workflow.as_str()).copied() else {
        // acquire filters by name, so this means the store ignored the filter.
        tracing::error!(run_id = %leased.run.id, workflow = %leased.run.workflow, "leased a run of an unregistered workflow");
        return;
    };
    let signals = Signals {
        stop: Arc::new(Notify::new()),
        inbox: Arc::new(Notify::new()),
    };
    rt.active().insert(
        leased.run.id,
        Active {
            lease: leased.lease.clone(),
            stop: signals.stop.clone(),
            inbox: signals.inbox.clone(),
        },
    );
    tokio::spawn(Driver::run(rt.clone(), leased, reg, signals));
}

async fn heartbeat_loop(rt: Arc<Inner>) {
    let mut shutdown = rt.shutdown.subscribe();
    let every = rt.config.lease / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        let leases: Vec<Lease> = rt.active().values().map(|a| a.lease.clone()).collect();
        if leases.is_empty() {
            continue;
        }
        match rt
            .store
            .heartbeat(&leases, rt.config.lease, SystemTime::now())
            .await
        {
            Ok(lost) => {
                let active = rt.active();
                for id in lost {
                    if let Some(a) = active.get(&id) {
                        tracing::info!(run_id = %id, "run no longer held here (cancelled, ended or taken over); stopping it");
                        a.stop.notify_one();
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
    }
}

impl Host for Inner {
    fn store(&self) -> &dyn Store {
        &*self.store
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn left(&self, lease: &Lease, evicted: bool) {
        self.run_left(&lease.run_id);
        if evicted {
            // A payload that arrived since the release made the run due, and found it still
            // listed here: now that it has left, any worker may take it.
            self.work.notify_one();
        }
    }

    fn ended(&self, run: RunId) {
        self.run_ended(run);
    }

    fn enter_step(
        self: Arc<Self>,
        attempt: BoxFuture<'static, Result<Value, Error>>,
    ) -> BoxFuture<'static, Result<Value, Error>> {
        Box::pin(with_runtime(self, attempt))
    }
}
