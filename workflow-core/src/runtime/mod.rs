//! The runtime: the state one built runtime shares between its user-held [`Runtime`] handles,
//! its worker loops and the drivers of its runs, and which runtime `workflow_core::api` finds.
//! A process whose runtime is built is a worker; it stays one until [`Runtime::shutdown`] or
//! until the last user-held handle is dropped.
//!
//! - `builder`: the store choice and options, and `build`;
//! - `clock`: the one clock every time written or compared is read from;
//! - `client`: the runtime's client calls: run handles and listings, hooks, pruning;
//! - `start`: the start builder and admission;
//! - `run`: a run handle's queries and actions, and waiting for a run's end;
//! - `streams`: what steps write to a run's streams and what readers get back;
//! - `schedules`: the schedules' client calls and firing loop;
//! - `worker`: leasing, heartbeats, store notices, spawning drivers;
//! - `flight`: concurrent in-process starts of one hook token.
//!
//! This module imports none of its children's items but leaf ones (`clock`, `completed`,
//! `worker`'s constants): the children build on the shared state here, not the reverse.

mod builder;
mod client;
mod clock;
mod completed;
mod events;
mod flight;
mod messages;
mod rekey;
mod requests;
mod run;
mod schedules;
mod start;
mod streams;
mod worker;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::SystemTime;

use foldhash::HashMap;
use serde_json::Value;
use tokio::sync::{watch, Notify};

use crate::config::Config;
use crate::driver::Host;
use crate::error::{Error, StartError, StoreError};
use crate::ids::RunId;
use crate::registry::BoxFuture;
use crate::registry::WorkflowRegistration;
use crate::store::{Lease, QueueEntry, RunOutcome, Store};

pub use builder::RuntimeBuilder;
pub use client::{HookInfo, HookRef};
pub use events::{EventRead, LatestEvent};
pub use messages::SendMessage;
pub use rekey::{RekeyCount, RekeyError, RekeyOptions, RekeyReport};
pub use requests::SendRequest;
pub use run::Run;
pub use start::{OrResume, Start, StartOrResume};
pub use streams::{stream, Chunk, RunStream, StreamWriter};
pub(crate) use worker::spawn_run;

tokio::task_local! {
    static CURRENT_RUNTIME: Arc<Inner>;
}

/// The runtimes built in this process, oldest first, for `workflow_core::api` outside steps.
/// Weak, so that it never keeps a runtime its user has dropped working in the background.
static BUILT: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// Lists `inner` as the most recently built runtime, forgetting the dropped ones.
fn register_built(inner: &Arc<Inner>) {
    let mut built = crate::sync::lock(&BUILT);
    built.retain(|w| {
        w.upgrade()
            .is_some_and(|i| i.handles.load(Ordering::Acquire) > 0)
    });
    built.push(Arc::downgrade(inner));
}

/// Runs `fut` with `rt` as the runtime that `workflow_core::api` uses (inside steps).
pub(crate) fn with_runtime<F: Future>(rt: Arc<Inner>, fut: F) -> impl Future<Output = F::Output> {
    CURRENT_RUNTIME.scope(rt, fut)
}

/// The runtime `workflow_core::api` uses: inside a step, the one executing it; elsewhere, the
/// most recently built one that a user still holds.
pub(crate) fn current_runtime() -> Option<Runtime> {
    if let Ok(inner) = CURRENT_RUNTIME.try_with(Arc::clone) {
        return Some(Runtime::attach(inner));
    }
    let built = crate::sync::lock(&BUILT);
    built
        .iter()
        .rev()
        .find_map(|w| w.upgrade().and_then(Runtime::revive))
}

/// A run this process drives, with the signals its driver listens to.
struct Active {
    lease: Lease,
    stop: Arc<Notify>,
    inbox: Arc<Notify>,
    /// Set while a run started here is not admitted yet (`driver/admission.rs`): the store
    /// does not know it, so neither heartbeats nor the check for runs ended elsewhere ask
    /// about it (they would find it lost and stop its driver).
    admitting: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Active {
    /// Whether the store knows the run (see [`Active::admitting`]).
    fn admitted(&self) -> bool {
        self.admitting
            .as_ref()
            .is_none_or(|a| !a.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// One runtime's shared state. The worker loops, the drivers and the admission tasks hold it
/// through `Arc`s; only [`Runtime`] handles count as users (see [`Inner::handles`]).
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    /// Where every time this runtime writes to the store or compares there comes from.
    clock: clock::Clock,
    pub(crate) config: Config,
    worker_id: String,
    workflows: HashMap<&'static str, &'static WorkflowRegistration>,
    workflow_names: Vec<String>,
    active: Mutex<HashMap<RunId, Active>>,
    pub(crate) work: Arc<Notify>,
    /// Whether the store pushes changes (then polling is only a slow safety net).
    pushed: bool,
    /// The runs someone waits for in `return_value`, each with the signal of its end (in this
    /// process or, with a pushing store, anywhere): a run's end wakes its own waiters only.
    waiting: Mutex<HashMap<RunId, Waiting>>,
    /// The outputs of runs that completed here and cannot be pruned yet, for `return_value`
    /// calls after the end.
    completed: Mutex<completed::Completed>,
    /// The runs whose streams someone reads here ([`StreamWatch`]), each with the signal
    /// that a chunk was written or a stream closed (in this process or, with a pushing store,
    /// anywhere), or that the run ended.
    stream_readers: Mutex<HashMap<RunId, Watched>>,
    shutdown: watch::Sender<bool>,
    /// The `.hook(token)` starts this process has in flight, by token (see
    /// [`flight::StartFlight`]).
    starting: Mutex<HashMap<String, watch::Receiver<Option<RunId>>>>,
    /// The tokio runtime the runtime was built in: admissions run there, so a start may be
    /// awaited from any executor.
    tasks: tokio::runtime::Handle,
    /// How many [`Runtime`] handles exist. The loops hold `Arc<Inner>` for as long as they run,
    /// so the `Arc`'s own count cannot tell that every user is gone: this one can, and its
    /// last decrement shuts the runtime down.
    handles: AtomicUsize,
    /// Set when `handles` first dropped to zero: from then on the runtime is shutting down for
    /// good, and `api` outside a step no longer finds it even while a step briefly holds a
    /// handle on it.
    abandoned: AtomicBool,
    /// Whether queued runs are about (declared here, started or driven here): then the end
    /// of a run here may free a slot for a waiting run, and wakes the worker.
    queued: AtomicBool,
    /// The check whether runs wait for a slot (see `slot_freed`).
    checking_slots: Arc<SlotCheck>,
    /// Whether a queue declared here has a rate limit: then the worker asks the store when a
    /// rate window reopens instead of waiting for its next poll.
    rate_limited: bool,
    /// The queues known to exist: declared by this runtime, or found in the store by a start
    /// (queues are never undeclared, so a name once found stays known).
    queues: Mutex<std::collections::HashSet<String>>,
    /// Wakes the schedules' firing loop: a schedule was defined, paused, resumed or deleted.
    schedules_changed: Notify,
}

/// The state of `Inner::slot_freed`'s check whether runs wait for a slot.
#[derive(Default)]
pub(crate) struct SlotCheck {
    /// Set while a check is under way.
    under_way: AtomicBool,
    /// Set when a run ended since the check under way began.
    again: AtomicBool,
}

impl Inner {
    /// Run `id` and the first run of its chain, whom the values its chain shares (messages,
    /// requests, replies, published values, its end) are sealed for: `known` when the caller
    /// knows it, otherwise read from the run's record when payloads are sealed, and `id`
    /// itself when they are not (no binding is used) or the run is not found (the call that
    /// needs it then says so).
    pub(crate) async fn owner_of(
        &self,
        id: RunId,
        known: Option<RunId>,
    ) -> Result<crate::crypto::places::Owner, StoreError> {
        use crate::crypto::places::Owner;
        if known.is_some() || !self.config.payloads.transforms() {
            return Ok(Owner::new(id, known));
        }
        Ok(match self.store.get_run(&id).await? {
            Some(run) => Owner::of(&run),
            None => Owner::first(id),
        })
    }

    /// The lease under which this runtime drives run `run`, if it does.
    pub(crate) fn lease_of(&self, run: &RunId) -> Option<Lease> {
        self.active().get(run).map(|a| a.lease.clone())
    }

    /// The current time on the runtime's clock.
    pub(crate) fn clock_now(&self) -> SystemTime {
        self.clock.now()
    }

    /// How long a stream reader waits before reading again without a wake-up: the poll
    /// interval, or with a pushing store (whose notices wake it) ten times that.
    pub(crate) fn stream_poll(&self) -> std::time::Duration {
        if self.pushed {
            self.config
                .poll_interval
                .saturating_mul(worker::PUSHED_POLL_FACTOR)
        } else {
            self.config.poll_interval
        }
    }

    fn active(&self) -> MutexGuard<'_, HashMap<RunId, Active>> {
        crate::sync::lock(&self.active)
    }

    /// The driver holding `lease` stopped. A later driver of the same run (this process
    /// leased it again after that lease expired) keeps its entry.
    fn run_left(&self, lease: &Lease) {
        let mut active = self.active();
        let was_full = active.len() >= self.config.max_active_runs;
        if active
            .get(&lease.run_id)
            .is_some_and(|a| a.lease.epoch == lease.epoch)
        {
            active.remove(&lease.run_id);
        }
        drop(active);
        // Whoever waits here for a run that left without ending here (given back, taken
        // over) goes back to reading the store.
        if let Some(w) = crate::sync::lock(&self.waiting).get(&lease.run_id) {
            w.ended.send_modify(|_| {});
        }
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

    /// A run ended here: if it may have held a queue's slot, a waiting run may begin now, and
    /// the worker leases at once when one waits. Whether one does is read first (a read,
    /// where the worker's lease is a write transaction, which a queue of 100 busy slots
    /// otherwise paid at every end), by one check at a time: an end while a check is under
    /// way is covered by it, since the check reads after that end committed. A run admitted
    /// waiting here wakes the worker itself; one admitted elsewhere waits at most for a
    /// poll.
    pub(crate) fn slot_freed(&self) {
        if !self.queued.load(Ordering::Relaxed) {
            return;
        }
        let check = &self.checking_slots;
        check.again.store(true, Ordering::SeqCst);
        if check.under_way.swap(true, Ordering::SeqCst) {
            return;
        }
        let (store, work, check) = (
            self.store.clone(),
            self.work.clone(),
            self.checking_slots.clone(),
        );
        self.tasks.spawn(async move {
            loop {
                check.again.store(false, Ordering::SeqCst);
                // On an error, the worker looks as it did before there was a check.
                if store.has_waiting_runs().await.unwrap_or(true) {
                    work.notify_one();
                }
                check.under_way.store(false, Ordering::SeqCst);
                // A run that ended while this check read may have freed the slot a run
                // admitted meanwhile waits for: read again, unless its own check does.
                if !check.again.load(Ordering::SeqCst)
                    || check.under_way.swap(true, Ordering::SeqCst)
                {
                    return;
                }
            }
        });
    }

    /// Run `id` ended: here with `outcome` (as written), or else seen to have ended (its
    /// waiters read it from the store, unless they got its outcome from here already: the
    /// notice of an end here also comes back from the store).
    /// `plain`: the run's output before it was sealed, when this process sealed it.
    pub(crate) fn run_ended(&self, id: RunId, outcome: Option<RunOutcome>, plain: Option<Value>) {
        let outcome = outcome.map(|outcome| Arc::new(Told { outcome, plain }));
        if let Some(told) = &outcome {
            crate::sync::lock(&self.completed).keep(id, told);
        }
        let waiting = crate::sync::lock(&self.waiting);
        if let Some(w) = waiting.get(&id) {
            match outcome {
                Some(outcome) => {
                    w.ended.send_replace(Some(outcome));
                }
                None => w.ended.send_modify(|_| {}),
            }
        }
        drop(waiting);
        self.stream_changed(id);
    }

    /// The output of run `id` if it completed here and is still remembered: only while its
    /// retained token keeps any prune from deleting it.
    pub(crate) fn completed_here(&self, id: &RunId) -> Option<Value> {
        crate::sync::lock(&self.completed).output(id, self.clock.now())
    }

    /// Run `id` was admitted here with its token retained until `until` (no prune deletes it
    /// before then): its output may be remembered when it completes here.
    fn retained_until(&self, id: RunId, until: SystemTime) {
        crate::sync::lock(&self.completed).retained(id, until);
    }

    /// Whether run `id` is driven here now.
    pub(crate) fn drives(&self, id: &RunId) -> bool {
        self.active().contains_key(id)
    }

    /// Wakes the readers of run `run`'s streams here: a chunk was written, a stream closed,
    /// or the run ended.
    pub(crate) fn stream_changed(&self, run: RunId) {
        if let Some(w) = crate::sync::lock(&self.stream_readers).get(&run) {
            w.changed.send_replace(());
        }
    }

    /// Wakes every stream reader here (notices were lost).
    pub(crate) fn streams_changed(&self) {
        for w in crate::sync::lock(&self.stream_readers).values() {
            w.changed.send_replace(());
        }
    }

    /// The queue entry of a start, checked: `None` without a queue (a partition key or priority
    /// alone has no effect), [`StartError::UnknownQueue`] for a queue that neither this runtime
    /// nor any other on the store declared.
    pub(super) async fn checked_queue(
        &self,
        queue: Option<QueueEntry>,
    ) -> Result<Option<QueueEntry>, StartError> {
        let Some(entry) = queue.filter(|q| !q.name.is_empty()) else {
            return Ok(None);
        };
        let known = crate::sync::lock(&self.queues).contains(&entry.name);
        if !known {
            let now = self.clock.tick().await;
            let declared = self.store.list_queues(now).await?;
            if !declared.iter().any(|q| q.def.name == entry.name) {
                return Err(StartError::UnknownQueue { queue: entry.name });
            }
            crate::sync::lock(&self.queues).extend(declared.into_iter().map(|q| q.def.name));
        }
        self.queued.store(true, Ordering::Relaxed);
        Ok(Some(entry))
    }

    /// Stops the worker loops and every driver; runs driven here are left to other workers
    /// (after their leases expire).
    fn shut_down(&self) {
        self.shutdown.send_replace(true);
        for a in self.active().values() {
            a.stop.notify_one();
        }
    }
}

/// A run's end as a driver of this process tells it to the run's waiters here: the outcome
/// as written and, when the driver sealed the output (encryption or a codec is on), the plain
/// output, which a waiter reads instead of opening the stored one.
pub(crate) struct Told {
    pub(crate) outcome: RunOutcome,
    pub(crate) plain: Option<Value>,
}

/// The end signal of one run that `return_value` calls wait for, shared by all of them.
struct Waiting {
    /// Signalled at the run's end, with the run's outcome when it ended here.
    ended: watch::Sender<Option<Arc<Told>>>,
    waiters: usize,
}

/// The change signal of one run's streams, shared by the readers of its streams here.
struct Watched {
    changed: watch::Sender<()>,
    readers: usize,
}

/// One stream reader's registration in [`Inner::stream_readers`]; removed on drop.
pub(crate) struct StreamWatch {
    inner: Arc<Inner>,
    run: RunId,
    signal: watch::Receiver<()>,
}

impl StreamWatch {
    pub(crate) fn new(inner: &Arc<Inner>, run: RunId) -> Self {
        let mut readers = crate::sync::lock(&inner.stream_readers);
        let w = readers.entry(run).or_insert_with(|| Watched {
            changed: watch::channel(()).0,
            readers: 0,
        });
        w.readers += 1;
        let signal = w.changed.subscribe();
        drop(readers);
        StreamWatch {
            inner: inner.clone(),
            run,
            signal,
        }
    }

    /// Marks every change so far as seen: call before reading the store, so that a change
    /// committed after the read wakes [`StreamWatch::changed`].
    pub(crate) fn seen(&mut self) {
        self.signal.borrow_and_update();
    }

    /// Waits for a change after the last [`StreamWatch::seen`], or `at_most`.
    pub(crate) async fn changed(&mut self, at_most: std::time::Duration) {
        let _ = tokio::time::timeout(at_most, self.signal.changed()).await;
    }

    /// The runtime this reader reads through.
    pub(crate) fn runtime(&self) -> &Arc<Inner> {
        &self.inner
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        let mut readers = crate::sync::lock(&self.inner.stream_readers);
        if let Some(w) = readers.get_mut(&self.run) {
            w.readers -= 1;
            if w.readers == 0 {
                readers.remove(&self.run);
            }
        }
    }
}

/// The runtime executing the current step, if the caller runs inside one (not the fallback
/// of `workflow_core::api`: a stream write belongs to the run that runtime drives).
pub(crate) fn step_runtime() -> Option<Arc<Inner>> {
    CURRENT_RUNTIME.try_with(Arc::clone).ok()
}

/// A handle on the workflow runtime: cheap to clone, clones share one runtime.
///
/// The runtime works for as long as a handle on it exists (run handles and pending starts hold
/// one too): dropping the last one shuts it down as [`Runtime::shutdown`] does.
///
/// See the crate docs for a complete example.
pub struct Runtime {
    inner: Arc<Inner>,
}

impl Runtime {
    /// A new counted handle on `inner`.
    fn attach(inner: Arc<Inner>) -> Runtime {
        // As in `Arc::clone`: a new handle is made from an existing reference, so no ordering
        // with other threads is needed here.
        inner.handles.fetch_add(1, Ordering::Relaxed);
        Runtime { inner }
    }

    /// A handle on `inner` if its users still hold one; `None` once they dropped them all.
    fn revive(inner: Arc<Inner>) -> Option<Runtime> {
        if inner.abandoned.load(Ordering::Acquire) {
            return None;
        }
        let mut n = inner.handles.load(Ordering::Acquire);
        loop {
            if n == 0 {
                return None;
            }
            match inner
                .handles
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(Runtime { inner }),
                Err(now) => n = now,
            }
        }
    }

    /// The shared state behind this handle.
    pub(crate) fn inner_arc(&self) -> Arc<Inner> {
        self.inner.clone()
    }

    /// How many runs this process is driving in memory now (evicted and pending runs are not
    /// counted).
    pub fn active_runs(&self) -> usize {
        self.inner.active().len()
    }

    /// Stops this runtime's worker: runs it drives are left to other workers (after their
    /// leases expire) or to the next start of this program.
    pub fn shutdown(&self) {
        self.inner.shut_down();
    }
}

impl Clone for Runtime {
    fn clone(&self) -> Self {
        Runtime::attach(self.inner.clone())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.abandoned.store(true, Ordering::Release);
            self.inner.shut_down();
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("worker_id", &self.inner.worker_id)
            .finish_non_exhaustive()
    }
}

/// What a run's driver may ask of its runtime.
impl Host for Inner {
    fn store(&self) -> &dyn Store {
        &*self.store
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn left(&self, lease: &Lease, evicted: bool) {
        self.run_left(lease);
        if evicted {
            // A payload that arrived since the release made the run due, and found it still
            // listed here: now that it has left, any worker may take it.
            self.work.notify_one();
        }
    }

    fn ended(
        &self,
        run: RunId,
        parent: Option<RunId>,
        outcome: Option<RunOutcome>,
        plain: Option<Value>,
    ) {
        self.run_ended(run, outcome, plain);
        self.slot_freed();
        // The parent's driver here reads the child's end from its inbox at once; a parent
        // given back to the store is due now, so the worker looks.
        if let Some(parent) = parent {
            if !self.payload_arrived(&parent) {
                self.work.notify_one();
            }
        }
    }

    fn admitted(&self) {
        self.work.notify_one();
    }

    fn can_continue(&self, workflow: &str) -> bool {
        // The continuing run's driver, still counted, leaves as the next one's begins.
        self.config.worker
            && !*self.shutdown.borrow()
            && self.workflows.contains_key(workflow)
            && self.active().len() <= self.config.max_active_runs
    }

    fn continued(self: Arc<Self>, next: crate::store::LeasedRun) {
        worker::spawn_run(&self, next, None);
    }

    fn published(&self, run: RunId) {
        self.stream_changed(run);
    }

    fn queue_known<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            match self.checked_queue(Some(QueueEntry::new(name))).await {
                Ok(_) => Ok(true),
                Err(StartError::UnknownQueue { .. }) => Ok(false),
                Err(StartError::Store(e)) => Err(e),
                Err(other) => Err(StoreError::database(other.to_string())),
            }
        })
    }

    fn now(&self) -> SystemTime {
        self.clock.now()
    }

    fn enter_step(
        self: Arc<Self>,
        attempt: BoxFuture<'static, Result<Value, Error>>,
    ) -> BoxFuture<'static, Result<Value, Error>> {
        Box::pin(with_runtime(self, attempt))
    }
}
