//! The driver of one leased run: the async shell around the replay core ([`crate::replay`]).
//!
//! The core decides; the driver polls the workflow future, hands the core what the workflow
//! issued, persists what the core returns (it is the only writer of the run's history: step
//! attempts report their outcomes to it instead of writing themselves), runs step attempts as
//! tasks, sleeps until the next due time, claims hook tokens and reads the run's inbox.
//!
//! The workflow future stays in memory for as long as the run is active, so a run of n steps
//! costs O(n); replay happens only when a run is picked up (after a restart, a takeover, or an
//! eviction during a long sleep). The driver talks to its runtime through [`Host`] alone.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use foldhash::{HashMap, HashSet};
use futures::task::AtomicWaker;
use futures::FutureExt;
use serde_json::Value;
use tokio::sync::{mpsc, Notify};

use crate::config::Config;
use crate::context::{RunCtx, StepExec};
use crate::crypto::places;
use crate::error::{Error, StoreError};
use crate::history::never;
use crate::ids::RunId;
use crate::payload::Encoded;
use crate::registry::{BoxFuture, RunInput, WorkflowRegistration};
use crate::replay::{Effect, End, HookKey, Replay, StepId, Writes};
use crate::store::{
    Append, ClaimOutcome, EndHint, Event as Recorded, Lease, LeasedRun, RunOutcome, RunStatus,
    Store,
};
use crate::traces::InSpan;
use waker::FlagWaker;

pub(crate) use self::admission::{FireTick, Pending, TickAdmission, Via};

mod admission;
mod attempts;
mod begin;
mod chain;
mod children;
mod stops;
mod transactional;
mod waker;

use self::attempts::AttemptDone;
use self::begin::FirstDrive;

/// The first wait before a store call that failed on a transient error (connection lost,
/// database busy) is tried again, with the lease kept; it doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// What a driver needs from the runtime hosting it, and nothing more.
pub(crate) trait Host: Send + Sync + 'static {
    /// Where the run is kept.
    fn store(&self) -> &dyn Store;

    /// Eviction and retry settings.
    fn config(&self) -> &Config;

    /// The driver holding `lease` stopped; `evicted` when it gave the run back to the store
    /// until its next wake-up (a payload may have made it due meanwhile).
    fn left(&self, lease: &Lease, evicted: bool);

    /// The run's end is durable: wake whoever waits for it in this process (with `outcome`,
    /// as written, when the driver knows it, and `plain`, the output before it was sealed,
    /// when the driver sealed it), and its parent if it has one (the end is in the parent's
    /// inbox).
    fn ended(
        &self,
        run: crate::RunId,
        parent: Option<crate::RunId>,
        outcome: Option<RunOutcome>,
        plain: Option<Value>,
    );

    /// A run was admitted (a child): a worker here may take it at once.
    fn admitted(&self);

    /// Whether this process may drive, at once and in the place of the driven run that is
    /// continuing as new, the run of `workflow` that continues it (`continue_as_new`).
    fn can_continue(&self, workflow: &str) -> bool;

    /// The run that continues the driven one was admitted leased to this process: drive it.
    fn continued(self: Arc<Self>, next: LeasedRun);

    /// The run published values (`set_event`): wake their readers here.
    fn published(&self, run: crate::RunId);

    /// Whether queue `name` is declared on the store (by this or another runtime).
    fn queue_known<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The current time on the store's clock: every time the driver records or compares.
    fn now(&self) -> SystemTime;

    /// Wraps one step attempt so that code inside it finds this runtime
    /// (`workflow_core::api`).
    fn enter_step(
        self: Arc<Self>,
        attempt: BoxFuture<'static, Result<Value, Error>>,
    ) -> BoxFuture<'static, Result<Value, Error>>;
}

/// A run's workflow body: its output as stored, with the plain output when sealing changed it.
type WorkflowFuture = Pin<Box<dyn Future<Output = Result<Encoded, Error>> + Send>>;

/// Why the driver stopped.
enum Stop {
    /// The run's end (or its divergence) is recorded.
    Ended,
    /// Cancelled, lease lost, or runtime shut down: another party owns what happens next.
    Abandoned,
    /// Evicted: given back to the store until its wake time or next payload.
    Evicted,
    /// Blocked: its replay diverged; given back until a build that fits takes it.
    Blocked,
}

/// What the driver is told from outside while it runs.
pub(crate) struct Signals {
    /// Stop driving (cancelled, lease lost, shutdown).
    pub(crate) stop: Arc<Notify>,
    /// The run's inbox may hold new payloads.
    pub(crate) inbox: Arc<Notify>,
}

pub(crate) struct Driver {
    host: Arc<dyn Host>,
    lease: Lease,
    ctx: Arc<RunCtx>,
    replay: Replay<StepExec>,
    /// Attempt tasks in flight, by step id.
    attempts: HashMap<StepId, tokio::task::AbortHandle>,
    done_tx: mpsc::UnboundedSender<AttemptDone>,
    done_rx: mpsc::UnboundedReceiver<AttemptDone>,
    /// The number of the run's last event, as far as this driver knows (it is the run's only
    /// writer while it holds the lease): what tells a write that failed on a transient error
    /// but committed from one that did not.
    last_seq: u64,
    /// Told to stop (see [`Signals::stop`]); watched while a store call waits to be retried.
    stop: Arc<Notify>,
    /// The run's deadline (`start(..).timeout(d)`) and `d`.
    deadline: Option<(SystemTime, Duration)>,
    /// The run that started this one (`start_child`), told of its end.
    parent: Option<RunId>,
    /// Children known to be this run's own: their ends come to its inbox.
    own_children: HashSet<RunId>,
    /// Awaited children another run started (a fork's copy shares its original's), still
    /// running when last read: when to read their record again, and the wait after that.
    shared_children: HashMap<RunId, (SystemTime, Duration)>,
    /// What the leased run's record says of the ties its end must update (parent, queue,
    /// start token); the hooks it holds are the replay's to say.
    ties: EndHint,
    /// The inbox was not read since the run began here (a fresh run skips that read: only
    /// messages sent before it began can be there, read once a `recv` waits).
    inbox_unread: bool,
    /// Why the run's inbox holds payloads this process cannot open (a key it lacks, a form
    /// newer than this build): the run is blocked at the next turn of its loop.
    unreadable: Option<places::Unreadable>,
    /// When the driver began to replay a recorded history, until the replay caught up
    /// (`workflow_replay_seconds`); `None` for a run without history, and once caught up.
    replay_began: Option<std::time::Instant>,
    /// The transactional attempt in flight, which records its own result: until it reports,
    /// nothing else of the run is recorded, delivered or started (`driver/transactional.rs`).
    tx_attempt: Option<StepId>,
    /// What was to be written before the transactional attempt about to start: it commits
    /// with the attempt's transaction (one commit), taken by [`Driver::start_attempt`].
    tx_pending: Option<Writes>,
    /// What the transactional attempt in flight carries for its commit: written by the
    /// driver after all should the attempt commit nothing.
    tx_unwritten: Option<Arc<Writes>>,
    /// Outcomes of other attempts that came in meanwhile, handled after it, in order.
    held: VecDeque<AttemptDone>,
    /// The trace context the run was started in, decoded once: the parent of every
    /// attempt's span.
    trace: crate::traces::Parent,
    /// The run's span (`workflow_run`): in logs, the parent of its attempts' spans and the
    /// span the workflow's own code runs in. Entered only while the workflow is polled (and
    /// each attempt's span while the attempt is), not around the driver's own awaits: a
    /// subscriber's work on every enter and exit (an OpenTelemetry layer's timings and
    /// context) then happens once per step of the workflow, not once per wake-up of the
    /// driver.
    span: tracing::Span,
    /// The admission of a run started here and driven before it (`driver/admission.rs`),
    /// made at the end of the first round; `None` once made, and for every other run. Boxed:
    /// a whole `NewRun`, which the driver would otherwise carry (and copy) inline all its
    /// life.
    pending: Option<Box<Pending>>,
    /// Counts this run among the active ones (`rt.active_runs()`, the gauge) while the
    /// driver lives.
    _active: crate::telemetry::ActiveRun,
}

impl Driver {
    /// Drives `leased` until it ends, is evicted, or is abandoned.
    pub(crate) async fn run(
        host: Arc<dyn Host>,
        leased: LeasedRun,
        reg: &'static WorkflowRegistration,
        signals: Signals,
        pending: Option<Box<Pending>>,
    ) {
        let (mut d, first) = Driver::begin(host, leased, reg, &signals, pending);
        let run_id = d.ctx.run_id;
        let result = AssertUnwindSafe(d.first_drive(reg, first, &signals))
            .catch_unwind()
            .await;
        for (_, h) in d.attempts.drain() {
            h.abort();
        }
        let result = match result {
            Ok(result) => result,
            Err(panic) => {
                // A bug in the runtime's own code for this run (the workflow body and the
                // steps are caught where they run): give the run back, so it is retried here
                // or elsewhere instead of staying leased and undriven.
                tracing::error!(
                    %run_id,
                    panic = %panic_message(&panic),
                    "the run's driver panicked; releasing the run"
                );
                let release = d.host.store().release(&d.lease, d.host.now(), 0);
                // Should the store panic too, the run is still dropped here, so its lease is no
                // longer renewed and expires.
                AssertUnwindSafe(release)
                    .catch_unwind()
                    .await
                    .unwrap_or(Ok(()))
                    .map(|()| Stop::Evicted)
            }
        };
        let evicted = match result {
            Ok(stop) => matches!(stop, Stop::Evicted),
            Err(StoreError::LeaseLost(_)) => {
                tracing::debug!(%run_id, "lease lost; the run is no longer driven here");
                false
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(%run_id, error = %e, "told to stop while the store was failing");
                false
            }
            Err(e) => d.failed_try(e).await,
        };
        d.host.left(&d.lease, evicted);
    }

    /// Checks what must hold before the body first runs (its deadline, keys for every
    /// payload of its history and inbox), then builds the workflow future and drives it.
    async fn first_drive(
        &mut self,
        reg: &'static WorkflowRegistration,
        first: FirstDrive,
        signals: &Signals,
    ) -> Result<Stop, StoreError> {
        let FirstDrive {
            input,
            owner,
            unreadable,
            fresh,
            span,
        } = first;
        if self.deadline.is_some_and(|(at, _)| at <= self.host.now()) {
            return self.time_out().await;
        }
        if let Some(why) = unreadable.or_else(|| self.unreadable.take()) {
            return self.block_unreadable(&why).await;
        }
        if !fresh {
            self.fetch_payloads().await?;
        }
        if let Some(why) = self.unreadable.take() {
            return self.block_unreadable(&why).await;
        }
        // The arguments a start here sealed, handed over in the clear with the run.
        let input = RunInput {
            stored: input,
            known: self.pending.as_mut().and_then(|p| p.known_input.take()),
            remember_output: self.parent.is_some(),
        };
        match (reg.run)(&self.ctx.payloads, owner, input) {
            Ok(fut) => {
                let fut: WorkflowFuture = Box::pin(InSpan::new(span, self.ctx.scope(fut)));
                self.drive(fut, signals).await
            }
            Err(e) => self.fail_at_start(e).await,
        }
    }

    /// Calls the store until the call does not fail on a transient error, waiting between
    /// tries while the lease is kept (the heartbeat goes on renewing it). Returns the
    /// transient error if the driver is told to stop meanwhile.
    async fn retry<T, F, Fut>(&self, mut call: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut tries = 0;
        loop {
            match call().await {
                Err(e) if e.is_transient() => self.back_off(e, &mut tries).await?,
                done => return done,
            }
        }
    }

    /// Waits before try `tries + 1` of a store call that failed on transient error `e`;
    /// `Err(e)` if the driver is told to stop meanwhile (the signal stays set for the loop).
    async fn back_off(&self, e: StoreError, tries: &mut u32) -> Result<(), StoreError> {
        let wait = RETRY_MIN
            .saturating_mul(1 << (*tries).min(10))
            .min(RETRY_MAX);
        *tries += 1;
        tracing::warn!(
            run_id = %self.ctx.run_id, error = %e, tries = *tries, ?wait,
            "transient store error; trying again with the lease kept"
        );
        tokio::select! {
            _ = self.stop.notified() => {
                self.stop.notify_one();
                Err(e)
            }
            _ = tokio::time::sleep(wait) => Ok(()),
        }
    }

    /// Whether a write of `n` events after event `before` (`ends`: with the run's end), whose
    /// call failed on a transient error, committed after all. Nobody else writes the run's
    /// events while this driver holds the lease, except a cancellation, which ends it.
    async fn committed(&self, before: u64, n: u64, ends: bool) -> Result<bool, StoreError> {
        let run_id = self.ctx.run_id;
        if ends {
            let run = self.host.store().get_run(&run_id).await?;
            return Ok(run.is_some_and(|r| r.status.is_terminal()));
        }
        let events = self.host.store().events(&run_id).await?;
        match events.last().map_or(0, |e| e.seq) {
            last if last == before => Ok(false),
            last if last == before + n => Ok(true),
            _ => Err(StoreError::LeaseLost(run_id)),
        }
    }

    /// Reads new entries (hook payloads, children's ends, messages) from the run's inbox.
    async fn fetch_payloads(&mut self) -> Result<(), StoreError> {
        let (run, seen) = (self.ctx.run_id, self.replay.inbox_seen());
        let fresh = self
            .retry(|| self.host.store().payloads(&run, seen))
            .await?;
        self.inbox_unread = false;
        let keys = self.ctx.payloads.keys();
        if let Some(why) = places::unreadable_inbox(keys, &fresh) {
            // Nothing of it is delivered: the run blocks before it moves on.
            self.unreadable = Some(why);
            return Ok(());
        }
        self.replay.add_inbox(fresh);
        Ok(())
    }

    async fn drive(
        &mut self,
        mut fut: WorkflowFuture,
        signals: &Signals,
    ) -> Result<Stop, StoreError> {
        let flag = Arc::new(FlagWaker {
            woken: AtomicBool::new(false),
            driver: AtomicWaker::new(),
        });
        let waker = Waker::from(flag.clone());
        loop {
            if let Some(why) = self.unreadable.take() {
                return self.block_unreadable(&why).await;
            }
            let polled = self.poll_quiescent(&mut fut, &flag, &waker);
            let now = self.host.now();
            let issued = self.replay.issue(self.ctx.take_issued(), now);
            // A run started here is admitted now, before anything of its first round is
            // written or carried out: with that round's writes when it only started steps.
            if self.pending.is_some() {
                let first =
                    (issued.is_ok() && polled.is_none() && !self.replay.next_is_transactional())
                        .then(|| self.replay.take_writes());
                if !self.admit_pending(first).await? {
                    return Ok(Stop::Abandoned);
                }
            }
            if let Err(d) = issued {
                return self.diverge(d).await;
            }
            if let Some(result) = polled {
                if let Some(c) = result.as_ref().err().and_then(Error::continuation_of) {
                    return self.continue_as_new(c.clone(), now).await;
                }
                return self.end_with(result, now).await;
            }
            // Recorded results first, one per round; then live ones.
            match self.replay.next_delivery() {
                Some(Ok(delivery)) => {
                    self.ctx.deliver(delivery);
                    continue;
                }
                Some(Err(d)) => return self.diverge(d).await,
                None => {}
            }
            if let Some(began) = self.replay_began.take() {
                crate::telemetry::replayed(began.elapsed());
            }
            // A transactional attempt records its own result: until it has, nothing else is
            // written or delivered, so the history keeps the order the workflow saw.
            if self.tx_attempt.is_some() {
                tokio::select! {
                    biased;
                    _ = signals.stop.notified() => return Ok(Stop::Abandoned),
                    Some(done) = self.done_rx.recv() => self.attempt_done(done)?,
                    _ = flag.woken() => {}
                }
                continue;
            }
            // Past the hard limit, the run fails with what it decided so far recorded.
            if let Some(past) = self.host.config().history.hard().past(self.replay.size()) {
                return self.fail_past_limit(past).await;
            }
            // Live: make what the core decided durable, then act on it. A transactional
            // attempt next commits it with its own transaction instead.
            if self.replay.next_is_transactional() {
                self.tx_pending = Some(self.replay.take_writes());
            } else {
                self.flush().await?;
            }
            if self.carry_out_effects().await? {
                continue;
            }
            self.read_shared_child_ends().await?;
            // A run that started without reading its inbox reads it once a `recv` waits:
            // messages may have been sent before it began.
            if self.inbox_unread && self.ctx.receiving() {
                self.fetch_payloads().await?;
            }
            if self.deliver_live() {
                continue;
            }
            if let Some(stop) = self.wait(signals, &flag).await? {
                return Ok(stop);
            }
        }
    }

    /// Polls the workflow until it is pending with nothing woken meanwhile, or ready; a
    /// panic of its body is its failure.
    fn poll_quiescent(
        &self,
        fut: &mut WorkflowFuture,
        flag: &FlagWaker,
        waker: &Waker,
    ) -> Option<Result<Encoded, Error>> {
        loop {
            flag.woken.store(false, Ordering::Release);
            let mut cx = Context::from_waker(waker);
            let p = std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx)));
            match p {
                Ok(Poll::Pending) if flag.woken.load(Ordering::Acquire) => continue,
                Ok(Poll::Pending) => return None,
                Ok(Poll::Ready(r)) => return Some(r),
                Err(panic) => {
                    return Some(Err(Error::panicked(format!(
                        "workflow `{}` panicked: {}",
                        self.ctx.workflow,
                        panic_message(&panic)
                    ))))
                }
            }
        }
    }

    /// Delivers one live result the workflow waits for from what the run has received (a
    /// hook payload, a child's end, a message), recording it. Whether one was.
    fn deliver_live(&mut self) -> bool {
        let now = self.host.now();
        let delivered = self
            .replay
            .deliver_payload(|token| self.ctx.wants_payload(token), now)
            || self.replay.deliver_child_end(now)
            || self
                .replay
                .deliver_message(|m| self.ctx.wants_message(m), now);
        if delivered {
            self.deliver_ready();
        }
        delivered
    }

    /// Waits for what moves the run on: an attempt's end, a due time (a timer, a retry, the
    /// deadline), new inbox entries, a wake-up of the workflow; or evicts the run when
    /// nothing is due soon. `Some` when the drive stops.
    async fn wait(
        &mut self,
        signals: &Signals,
        flag: &Arc<FlagWaker>,
    ) -> Result<Option<Stop>, StoreError> {
        let idle = self.replay.is_idle();
        // The deadline is due like a timer: a run evicted before it wakes up for it.
        let next_due = [
            self.replay.next_due(),
            self.deadline.map(|(at, _)| at),
            self.shared_children.values().map(|(at, _)| *at).min(),
        ]
        .into_iter()
        .flatten()
        .min();
        let evict_after = self.host.config().evict_after;
        let now = self.host.now();
        if idle {
            let far = now
                .checked_add(evict_after)
                .is_some_and(|limit| next_due.is_some_and(|due| due > limit));
            if far {
                return self.evict(next_due.unwrap_or_else(never)).await.map(Some);
            }
        }
        let due_sleep = async {
            match next_due {
                Some(at) => {
                    let d = at.duration_since(now).unwrap_or_default();
                    tokio::time::sleep(d).await
                }
                None => std::future::pending().await,
            }
        };
        // A run with nothing in flight and nothing due soon waits in memory for a while,
        // then is evicted (a payload wakes it up again).
        let idle_evict = async {
            if idle {
                tokio::time::sleep(evict_after).await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            biased;
            _ = signals.stop.notified() => return Ok(Some(Stop::Abandoned)),
            Some(done) = self.done_rx.recv() => self.attempt_done(done)?,
            _ = due_sleep => {
                if self.deadline.is_some_and(|(at, _)| at <= self.host.now()) {
                    return self.time_out().await.map(Some);
                }
                self.replay.fire_due(self.host.now());
                self.deliver_ready();
            }
            _ = signals.inbox.notified() => self.fetch_payloads().await?,
            _ = flag.woken() => {}
            _ = idle_evict => return self.evict(next_due.unwrap_or_else(never)).await.map(Some),
        }
        Ok(None)
    }

    /// Hands the next live result to the workflow, if one is ready.
    fn deliver_ready(&mut self) {
        if let Some(Ok(delivery)) = self.replay.next_delivery() {
            self.ctx.deliver(delivery);
        }
    }

    /// Starts every attempt the core asked for and carries out at most one claim (its decision
    /// is delivered before anything else happens). Returns whether something was delivered.
    async fn carry_out_effects(&mut self) -> Result<bool, StoreError> {
        while self.tx_attempt.is_none() {
            let Some(effect) = self.replay.next_effect() else {
                break;
            };
            match effect {
                Effect::Attempt { step_id, attempt } => {
                    self.start_attempt(step_id, attempt);
                    // Not taken (no such step after all): written before anything else.
                    if let Some(pending) = self.tx_pending.take() {
                        self.replay.restore_writes(pending);
                        self.flush().await?;
                    }
                }
                Effect::Claim { hook_key, token } => {
                    let at = self.host.now();
                    let outcome = self.claim(hook_key, &token, at).await?;
                    self.last_seq += 1;
                    let conflict = match outcome {
                        ClaimOutcome::Claimed => None,
                        ClaimOutcome::Conflict(owner) => Some(owner),
                    };
                    self.replay.claimed(hook_key, token, conflict, at);
                    self.deliver_ready();
                    return Ok(true);
                }
                Effect::StartChild { child_key } => {
                    let Some(call) = self.replay.child(child_key).cloned() else {
                        continue;
                    };
                    let at = self.host.now();
                    let child_id = call.child_id;
                    if let Some(q) = &call.queue {
                        let name = q.name.clone();
                        if !self.retry(|| self.host.queue_known(&name)).await? {
                            let why = format!(
                                "unknown queue {name:?} for child workflow `{}`: declare it \
                                 with `Runtime::builder().queue(Queue::new({name:?}))`",
                                call.workflow
                            );
                            self.replay.child_refused(child_key, child_id, why, at);
                            self.deliver_ready();
                            return Ok(true);
                        }
                    }
                    let conflict = self.start_child(call, child_id, at).await?;
                    self.last_seq += 1;
                    if conflict.is_none() {
                        self.own_children.insert(child_id);
                        self.host.admitted();
                    }
                    self.replay.child_started(child_key, child_id, conflict, at);
                    self.deliver_ready();
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Claims `token` for hook `hook_key`. After a transient error, the history tells whether
    /// the claim committed (its `HookRegistered` event holds the decision) before it is tried
    /// again.
    async fn claim(
        &self,
        hook_key: HookKey,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError> {
        // The store and the history know the key as text.
        let hook_key = hook_key.to_string();
        let mut tries = 0;
        loop {
            let claimed = self
                .host
                .store()
                .claim_hook(&self.lease, &hook_key, token, at);
            let e = match claimed.await {
                Err(e) if e.is_transient() => e,
                done => return done,
            };
            self.back_off(e, &mut tries).await?;
            let run_id = self.ctx.run_id;
            let events = self.retry(|| self.host.store().events(&run_id)).await?;
            match events.last() {
                Some(e) if e.seq == self.last_seq + 1 => {
                    return match &e.event {
                        Recorded::HookRegistered {
                            hook_key: key,
                            conflict,
                            ..
                        } if *key == hook_key => Ok(match conflict {
                            None => ClaimOutcome::Claimed,
                            Some(owner) => ClaimOutcome::Conflict(*owner),
                        }),
                        _ => Err(StoreError::LeaseLost(run_id)),
                    };
                }
                last if last.map_or(0, |e| e.seq) == self.last_seq => {}
                _ => return Err(StoreError::LeaseLost(run_id)),
            }
        }
    }

    /// Makes what the core decided durable.
    async fn flush(&mut self) -> Result<(), StoreError> {
        let writes = self.replay.take_writes();
        if writes.is_empty() {
            return Ok(());
        }
        self.write(writes).await.map(drop)
    }

    /// Appends `writes` under the lease. A transient error is retried, once the history
    /// shows the failed call did not commit, so nothing is recorded twice. The run's end, when
    /// `writes` ended it.
    async fn write(&mut self, writes: Writes) -> Result<Option<RunOutcome>, StoreError> {
        let append = Append {
            events: writes.events,
            release_tokens: writes.releases,
            outcome: writes.end.map(|end| match end {
                End::Completed(v) => RunOutcome::Completed(v),
                End::Failed(e) => RunOutcome::Failed(e),
            }),
            end_hint: match self.ties {
                EndHint::Alone if self.replay.holds_hooks() => EndHint::NoParent,
                ties => ties,
            },
            carried: Vec::new(),
        };
        let (before, n) = (self.last_seq, append.events.len() as u64);
        let ends = append.outcome.is_some();
        let mut tries = 0;
        loop {
            match self.host.store().append(&self.lease, &append).await {
                Ok(()) => break,
                Err(e) if e.is_transient() => {
                    self.back_off(e, &mut tries).await?;
                    if self.retry(|| self.committed(before, n, ends)).await? {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.last_seq = before + n;
        if let Some(outcome) = &append.outcome {
            let status = match outcome {
                RunOutcome::Completed(_) => RunStatus::Completed,
                RunOutcome::Failed(_) => RunStatus::Failed,
            };
            crate::telemetry::run_ended(self.ctx.workflow, status);
        }
        if append.events.iter().any(|e| e.event.publishes()) {
            self.host.published(self.ctx.run_id);
        }
        Ok(append.outcome)
    }
}

/// A step attempt's `body` bounded by the step's `limit`: at the deadline the body's future is
/// dropped, `timed_out` is set, and the attempt failed (retryably).
fn bounded(
    body: BoxFuture<'static, Result<Value, Error>>,
    limit: Option<Duration>,
    name: &'static str,
    timed_out: &Arc<AtomicBool>,
) -> BoxFuture<'static, Result<Value, Error>> {
    let Some(limit) = limit else {
        return body;
    };
    let timed_out = timed_out.clone();
    Box::pin(async move {
        tokio::time::timeout(limit, body).await.unwrap_or_else(|_| {
            timed_out.store(true, Ordering::Relaxed);
            Err(Error::retryable(format!(
                "step `{name}` timed out after {}",
                crate::config::human_duration(limit)
            )))
        })
    })
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}
