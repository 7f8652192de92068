//! Schedules in the runtime: the client calls ([`Runtime::create_schedule`],
//! [`Runtime::schedules`], pause, resume, trigger, backfill, delete) and the firing loop each
//! worker runs (`schedule_loop`), which sleeps until the next due tick, decides with
//! `schedule::firing` which due ticks start, applies the overlap policy, and fires each tick
//! through the store, which records it and admits its run in one act.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use serde_json::Value;
use tokio::sync::oneshot;

mod batch;

use batch::Batch;

use super::start::{admitted_run, drive, drive_pending};
use super::{Inner, Runtime};
use crate::driver::{FireTick, TickAdmission, Via};
use crate::error::StoreError;
use crate::history::{from_millis, to_millis};
use crate::ids::RunId;
use crate::payload::PayloadKind;
use crate::schedule::firing::{due_at, plan, Action, Plan, STALLED};
use crate::schedule::{Schedule, ScheduleError, ScheduleInfo, ScheduleTick};
use crate::store::{
    NewRun, NewTick, Overlap, QueueEntry, ScheduleState, SkipReason, TickOutcome, TickRecord,
    TickWrite,
};

/// How long the firing loop sleeps at most without a wake-up: other processes' changes to
/// the schedules (on a store that does not push them) are seen within it.
const LOOK_AGAIN: Duration = Duration::from_secs(1);
/// With a store that pushes changes to the schedules.
const LOOK_AGAIN_PUSHED: Duration = Duration::from_secs(10);
/// How often a buffered tick checks whether the run it waits for has ended.
const BUFFERED_POLL: Duration = Duration::from_millis(200);
/// The most runs one backfill starts.
const MAX_BACKFILL: usize = 10_000;
/// How many schedules one look fires at once: their ticks go to the store together, in
/// `fire_ticks` calls ([`Batch`]), instead of one commit after the other (1,000 every-second
/// schedules took most of a second per look that way on SQLite, more on PostgreSQL). Every
/// tick of a look is built before the first call returns, so the next call goes out as soon
/// as it does (with 512, building the second half waited for the first and competed with its
/// runs).
const FIRE_AT_ONCE: usize = 4096;

/// `t` to the millisecond, as the stores keep it.
fn millis(t: SystemTime) -> SystemTime {
    from_millis(to_millis(t))
}

/// What firing a tick did.
#[derive(Debug, Clone, Copy)]
enum Fired {
    /// Recorded it, with the run it started if any.
    Recorded(Option<RunId>),
    /// Nothing: the tick had a record already.
    Exists,
}

impl Fired {
    /// The run this call started.
    fn run(self) -> Option<RunId> {
        match self {
            Fired::Recorded(run) => run,
            Fired::Exists => None,
        }
    }
}

fn checked_name(name: &str) -> Result<(), ScheduleError> {
    if name.is_empty() || name.chars().count() > 200 || name.chars().any(char::is_control) {
        return Err(ScheduleError::InvalidName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

impl Inner {
    /// Stores `schedule`: a new one ticks from its first nominal time after a second before
    /// now; an existing one keeps its ticks. Wakes the firing loop here.
    pub(crate) async fn define_schedule(&self, schedule: &Schedule) -> Result<(), ScheduleError> {
        checked_name(&schedule.def.name)?;
        let now = self.clock.tick().await;
        let from = now.checked_sub(Duration::from_secs(1)).unwrap_or(now);
        let next = schedule.timing.next_after(from).map(millis);
        self.store.define_schedule(&schedule.def, next, now).await?;
        self.schedules_changed.notify_one();
        Ok(())
    }

    async fn schedule_state(&self, name: &str) -> Result<ScheduleState, ScheduleError> {
        self.store
            .list_schedules()
            .await?
            .into_iter()
            .find(|s| s.def.name == name)
            .ok_or_else(|| ScheduleError::NotFound {
                name: name.to_owned(),
            })
    }

    /// The run of `tick` of `state`'s schedule, admitted at `now`.
    fn tick_run(
        &self,
        state: &ScheduleState,
        tick: &ScheduleTick,
        now: SystemTime,
    ) -> Result<NewRun, ScheduleError> {
        let id = RunId::new();
        let workflow = &state.def.workflow;
        let cx = PayloadKind::WorkflowInput { workflow }.of(id);
        let input: Value = self
            .config
            .payloads
            .seal(serde_json::to_value((tick,)), cx)
            .map_err(|e| StoreError::database(e.to_string()))?;
        // Each tick's run is a trace of its own (feature `otel`).
        let (_span, trace) = crate::traces::start_span(workflow, id, None);
        Ok(NewRun::new(id, workflow.clone(), input, now)
            .version(self.config.version.clone())
            .queue(state.def.queue.clone().map(QueueEntry::new))
            .trace_context(trace))
    }

    /// Fires the tick of `state`'s schedule at `nominal`: records `outcome`, with a run when
    /// it is `Started`, unless the tick has a record already; through `batch` when given,
    /// else alone. A run this worker can drive is admitted leased to it and driven at once
    /// (no `acquire`, no wake-up in between); another is left for any worker to take.
    #[allow(clippy::too_many_arguments)]
    async fn fire(
        self: &Arc<Self>,
        state: &ScheduleState,
        nominal: SystemTime,
        outcome: TickOutcome,
        backfill: bool,
        next: Option<SystemTime>,
        replace_runless: bool,
        batch: Option<&Batch>,
    ) -> Result<Fired, ScheduleError> {
        // Fired ahead of its due time (a held batch), a tick's record and run carry the due
        // time: the firing commits then.
        let now = self.clock.tick().await.max(due_at(&state.def, nominal));
        let run = match outcome {
            TickOutcome::Started => {
                let tick = ScheduleTick {
                    schedule: state.def.name.clone(),
                    nominal,
                    backfill,
                };
                Some(self.tick_run(state, &tick, now)?)
            }
            _ => None,
        };
        let record = run.as_ref().map(admitted_run);
        let lease = run
            .as_ref()
            .filter(|r| self.can_take(&r.workflow))
            .map(|_| self.config.lease);
        let mut tick = NewTick {
            schedule: state.def.name.clone(),
            nominal,
            outcome,
            run: None,
            backfill,
            at: now,
            next,
            replace_runless,
            lease,
            first: Vec::new(),
        };
        // A run this worker drives is polled before its tick fires, and admitted by the
        // firing with what its first round decided (`driver/admission.rs`): its first steps
        // start with the tick's commit. Counted among the runs driven here from now on, so
        // the room for it was taken when `lease` was decided. Not with a store whose one
        // writer takes the calls one after the other (SQLite): there the run's first steps
        // start in the writer's next commits while the other runs of the look are polled,
        // and polling every run before the look's ticks fire made their lateness worse (see
        // `ScheduleStore::writes_in_parallel`), unless the look is made ahead of its due time
        // (a held batch): then the runs are polled before it, on every store.
        let driven = match (run, &record, lease, batch) {
            (Some(run), Some(record), Some(_), Some(batch))
                if self.store.writes_in_parallel() || batch.held() =>
            {
                let (answer, answered) = oneshot::channel();
                let batch = batch.clone();
                let promise = batch.promise();
                let fire: FireTick = Box::new(move |tick| {
                    Box::pin(async move { batch.fire_promised(tick, Some(promise)).await })
                });
                let via = Via::Tick(Box::new(TickAdmission { tick, fire, answer }));
                drive_pending(self, record.clone(), run, via, None);
                Ok(answered)
            }
            (run, ..) => {
                tick.run = run;
                Err(tick)
            }
        };
        let driving = driven.is_ok();
        let fired = match (driven, batch) {
            (Ok(answered), _) => answered.await.map_err(|_| {
                StoreError::database("the run's driver stopped before firing its tick")
            })??,
            (Err(tick), Some(batch)) => batch.fire(tick).await?,
            (Err(tick), None) => self
                .store
                .fire_ticks(vec![tick])
                .await?
                .pop()
                .ok_or_else(|| StoreError::database("the store answered no tick"))?,
        };
        match fired.write {
            TickWrite::Recorded => {
                crate::telemetry::schedule_tick(&state.def.name, outcome.as_str());
                let id = record.as_ref().map(|r| r.id);
                if id.is_some() {
                    crate::telemetry::run_started(&state.def.workflow);
                }
                match record {
                    // Its driver admitted it and goes on (or stopped for any worker to take it).
                    Some(_) if driving => {}
                    // Leased here: driven at once. Otherwise any worker, here or elsewhere,
                    // may take it.
                    Some(record) => drive(self, record, fired.lease),
                    None => {}
                }
                Ok(Fired::Recorded(id))
            }
            TickWrite::Exists => Ok(Fired::Exists),
            TickWrite::NoSchedule => Err(ScheduleError::NotFound {
                name: state.def.name.clone(),
            }),
        }
    }

    /// Whether run `id` has not ended.
    async fn live(&self, id: &RunId) -> Result<bool, ScheduleError> {
        Ok(self
            .store
            .get_run(id)
            .await?
            .is_some_and(|r| !r.status.is_terminal()))
    }

    /// Fires what is due of `state`'s schedule (read as `schedule`) at `now`, for a firing
    /// loop up without a stall since `up_since`, its ticks through `batch`; when to look at
    /// it again. `ahead`: `state` was listed before its ticks fell due; `planned`: what is
    /// due at `now`, when [`Inner::decided_early`] worked it out already.
    #[allow(clippy::too_many_arguments)]
    async fn fire_due(
        self: &Arc<Self>,
        state: ScheduleState,
        schedule: &Schedule,
        now: SystemTime,
        up_since: Option<SystemTime>,
        batch: &Batch,
        ahead: bool,
        planned: Option<Plan>,
    ) -> Result<Option<SystemTime>, ScheduleError> {
        let batch = Some(batch);
        let mut previous = state.last_started.map(|(_, run)| run);
        // Whether `previous` has not ended: as listed with the schedule until a tick of this
        // call starts another run, then read. A run listed live ahead of the due time may
        // have ended since: read again. One listed ended stays ended.
        let mut listed_live = Some(state.last_started_live).filter(|live| !(ahead && *live));
        let mut buffered = state.buffered;
        let mut look_again = None;
        // A tick waiting for the previous run starts once that run has ended (and the
        // schedule is not paused: then it waits for the resume).
        if let Some(waiting) = buffered.filter(|_| !state.paused) {
            if self.busy(&previous, listed_live).await? {
                look_again = Some(now + BUFFERED_POLL);
            } else {
                let started = self
                    .fire(
                        &state,
                        waiting,
                        TickOutcome::Started,
                        false,
                        None,
                        true,
                        batch,
                    )
                    .await?;
                if let Some(run) = started.run() {
                    (previous, listed_live) = (Some(run), None);
                }
                buffered = None;
            }
        }
        let plan = planned.unwrap_or_else(|| plan(&schedule.timing, &state, now, up_since));
        // The next nominal time the store holds, as far as this call knows.
        let mut stored_next = state.next;
        for (nominal, action) in plan.due {
            let next = schedule.timing.next_after(nominal).map(millis);
            let outcome = match action {
                Action::Skip(reason) => TickOutcome::Skipped(reason),
                Action::Fire => {
                    let busy = self.busy(&previous, listed_live).await?;
                    match (busy, state.def.overlap) {
                        (false, _) | (true, Overlap::AllowAll) => TickOutcome::Started,
                        (true, Overlap::Skip) => TickOutcome::Skipped(SkipReason::Overlap),
                        (true, Overlap::BufferOne) if buffered.is_some() => {
                            TickOutcome::Skipped(SkipReason::Overlap)
                        }
                        (true, Overlap::BufferOne) => TickOutcome::Buffered,
                        (true, Overlap::CancelOther) => {
                            if let Some(run) = previous {
                                self.cancel_run(run).await?;
                            }
                            TickOutcome::Started
                        }
                    }
                }
            };
            let fired = self
                .fire(&state, nominal, outcome, false, next, false, batch)
                .await?;
            // A record written by another call may have moved the next time elsewhere (a
            // trigger's does not move it).
            stored_next = match fired {
                Fired::Recorded(_) => next,
                Fired::Exists => None,
            };
            if outcome == TickOutcome::Buffered {
                buffered = Some(nominal);
                look_again = Some(now + BUFFERED_POLL);
            }
            if let Some(run) = fired.run() {
                (previous, listed_live) = (Some(run), None);
            }
        }
        if let Some(wait) = plan.wait {
            // Nothing decided: made again once the ticks can be told missed.
            look_again = Some(look_again.map_or(wait, |l: SystemTime| l.min(wait)));
        }
        if let Some(next) = plan.next {
            // Written only when it moves: a loop looking at a schedule with nothing due
            // writes nothing.
            if stored_next != Some(next) {
                self.store.advance_schedule(&state.def.name, next).await?;
            }
            let at = due_at(&state.def, next);
            look_again = Some(look_again.map_or(at, |l: SystemTime| l.min(at)));
        }
        Ok(look_again)
    }

    /// What `state`'s schedule has due at `due`, when it can be decided ahead of that time,
    /// from the listing: no buffered tick waits to start, at most one tick is due, and its
    /// start depends on no run that may still end before then (none, one listed as ended,
    /// or the policy `AllowAll`). Such a tick is fired through a batch held until `due`, its
    /// run polled meanwhile; any other waits for `due` to be decided (`None`).
    fn decided_early(
        &self,
        state: &ScheduleState,
        schedule: &Schedule,
        due: SystemTime,
        up_since: Option<SystemTime>,
    ) -> Option<Plan> {
        if state.buffered.is_some() && !state.paused {
            return None;
        }
        let plan = plan(&schedule.timing, state, due, up_since);
        let early = match plan.due.as_slice() {
            [] | [(_, Action::Skip(_))] => true,
            [(_, Action::Fire)] => {
                state.last_started.is_none()
                    || !state.last_started_live
                    || state.def.overlap == Overlap::AllowAll
            }
            _ => false,
        };
        early.then_some(plan)
    }

    /// Whether the schedule's previous run has not ended: `listed` when known, else read.
    async fn busy(
        &self,
        previous: &Option<RunId>,
        listed: Option<bool>,
    ) -> Result<bool, ScheduleError> {
        match (previous, listed) {
            (None, _) => Ok(false),
            (Some(_), Some(live)) => Ok(live),
            (Some(run), None) => self.live(run).await,
        }
    }

    /// Cancels run `id` as `run.cancel()` does.
    async fn cancel_run(self: &Arc<Self>, id: RunId) -> Result<(), ScheduleError> {
        match Runtime::revive(self.clone()) {
            Some(rt) => rt
                .get_run(&id)
                .cancel()
                .await
                .map_err(|e| ScheduleError::Store(StoreError::database(e.to_string()))),
            None => Ok(()),
        }
    }
}

/// The schedules as this loop read them last, each with its definition parsed: parsing a
/// cron expression again on every look cost tens of microseconds per schedule. An entry is
/// parsed again when its stored definition changes.
#[derive(Default)]
struct Parsed(HashMap<String, Arc<Schedule>>);

impl Parsed {
    /// `states`, each with its schedule; those whose definition this build cannot read are
    /// reported and left out.
    fn read(&mut self, states: Vec<ScheduleState>) -> Vec<(ScheduleState, Arc<Schedule>)> {
        let mut kept = HashMap::with_capacity(states.len());
        let mut read = Vec::with_capacity(states.len());
        for state in states {
            let cached = self
                .0
                .remove(&state.def.name)
                .filter(|s| s.def == state.def);
            let schedule = match cached {
                Some(s) => s,
                None => match Schedule::from_def(state.def.clone()) {
                    Ok(s) => Arc::new(s),
                    Err(e) => {
                        tracing::warn!(schedule = state.def.name, error = %e, "a schedule's definition cannot be read; its ticks are not fired");
                        continue;
                    }
                },
            };
            kept.insert(state.def.name.clone(), schedule.clone());
            read.push((state, schedule));
        }
        self.0 = kept;
        read
    }
}

/// Fires every schedule's due ticks, then sleeps until the next one falls due, a schedule
/// changes (here at once; elsewhere through the store's notice, or within a second), or the
/// runtime shuts down.
///
/// The loop knows since when it has been up without a stall: from its first look, or from
/// the first look after it woke more than [`STALLED`] after it meant to. Ticks that fell due
/// since then were not missed (a missed tick is one whose time passed while no worker was
/// up): they start however late, within the catch-up window, whatever the catch-up policy.
/// Ticks that fell due before then and that no other worker recorded were missed, and follow
/// the policy (`schedule::firing`).
///
/// The schedules are listed shortly before the next tick falls due ([`lead`]), and that
/// look is made at once against its due time: a tick whose outcome the listing decides
/// ([`Inner::decided_early`]) is built then, its run's first round polled (on every store),
/// and sent to a batch held until the due time, which fires them all in one call with the
/// runs' first events; the first steps start with that commit. Nothing is written before the
/// due time, and a tick whose start depends on a previous run that may still end (listed as
/// not ended, under a policy other than `AllowAll`), or that waits behind a buffered one, is
/// decided at the due time, that run read again. A change of the schedules notified before
/// the due time (a pause, a deletion, a new definition: here, or pushed by the store) fails
/// the held ticks, their runs never admitted, and the look is made again on a new listing.
pub(super) async fn schedule_loop(rt: Arc<Inner>) {
    let mut shutdown = rt.shutdown.subscribe();
    let most = if rt.pushed {
        LOOK_AGAIN_PUSHED
    } else {
        LOOK_AGAIN
    };
    let mut up_since: Option<SystemTime> = None;
    // When this look was meant to happen (the end of the last sleep).
    let mut meant: Option<SystemTime> = None;
    let mut parsed = Parsed::default();
    // The schedules listed ahead of this look's due time, and that time, if they were.
    let mut ahead: Option<(Vec<ScheduleState>, SystemTime)> = None;
    // How long the last listing took.
    let mut listing = Duration::ZERO;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let mut wait = most;
        let mut looked = false;
        let (listed, due) = match ahead.take() {
            Some((states, due)) => (Ok(states), Some(due)),
            None => (timed(&mut listing, rt.store.list_schedules()).await, None),
        };
        let listed_ahead = due.is_some();
        match listed {
            Ok(states) => {
                looked = true;
                let now = rt.clock.tick().await;
                let stalled =
                    meant.is_some_and(|m| now.duration_since(m).unwrap_or_default() > STALLED);
                if up_since.is_none() || stalled {
                    up_since = Some(now);
                }
                let stopping = &shutdown;
                // A look listed ahead of its due time is made at once: what can be decided
                // then goes through a batch held until the due time, its runs polled
                // meanwhile; the rest is decided at the due time.
                let held_until = due.map(|due| {
                    let rest = due.duration_since(rt.clock.now()).unwrap_or_default();
                    tokio::time::Instant::now() + rest
                });
                let (batch, batches) = Batch::new(&rt, held_until);
                let firing = async {
                    let batch = batch;
                    let mut fired = futures::stream::iter(parsed.read(states))
                        .take_while(|_| std::future::ready(!*stopping.borrow()))
                        .map(|(state, schedule)| {
                            let (rt, batch) = (&rt, &batch);
                            async move {
                                let name = state.def.name.clone();
                                let early = due.and_then(|due| {
                                    rt.decided_early(&state, &schedule, due, up_since)
                                        .map(|plan| (due, plan))
                                });
                                let (at, planned) = match (early, held_until) {
                                    (Some((due, plan)), _) => (due, Some(plan)),
                                    (None, Some(until)) => {
                                        let mut stop = stopping.clone();
                                        tokio::select! {
                                            _ = tokio::time::sleep_until(until) => {}
                                            _ = stop.changed() => {}
                                        }
                                        if *stop.borrow() {
                                            return (name, Ok(None));
                                        }
                                        (rt.clock.tick().await, None)
                                    }
                                    (None, None) => (now, None),
                                };
                                let done = rt.fire_due(
                                    state,
                                    &schedule,
                                    at,
                                    up_since,
                                    batch,
                                    listed_ahead,
                                    planned,
                                );
                                (name, done.await)
                            }
                        })
                        .buffer_unordered(FIRE_AT_ONCE);
                    while let Some((name, result)) = fired.next().await {
                        match result {
                            Ok(Some(at)) => {
                                let until = at.duration_since(rt.clock.now()).unwrap_or_default();
                                wait = wait.min(until);
                            }
                            Ok(None) => {}
                            // Ticks held for the due time fail when the runtime shuts
                            // down before it (nothing to retry) or the schedules change
                            // (the look is made again at once).
                            Err(_) if *stopping.borrow() || batch.abandoned() => {}
                            Err(e) => {
                                tracing::warn!(schedule = name, error = %e, "firing a schedule's ticks failed; retrying")
                            }
                        }
                    }
                };
                futures::join!(firing, batches);
                if *shutdown.borrow() {
                    return;
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading the schedules failed; retrying"),
        }
        if looked {
            // A loop that cannot read the store is not up: after an outage longer than
            // STALLED, the ticks of the outage were missed.
            meant = Some(rt.clock.now() + wait);
        }
        let early = wait.saturating_sub(lead(listing));
        tokio::select! {
            _ = tokio::time::sleep(early) => {}
            _ = rt.schedules_changed.notified() => continue,
            _ = shutdown.changed() => return,
        }
        if early == wait || !looked {
            continue;
        }
        // Listed now, fired at the due time with what was listed (decided now where it can
        // be).
        let Ok(states) = timed(&mut listing, rt.store.list_schedules()).await else {
            // Listed again at the due time.
            continue;
        };
        if let Some(due) = meant {
            ahead = Some((states, due));
        }
    }
}

/// How long before a look's due time the loop lists the schedules, when the last listing
/// took `listing`: twice that, at least 50 ms (the time to poll the first rounds of a
/// thousand runs before their ticks fire), at most 500 ms. Longer would decide on an older
/// reading of schedules other processes change without a notice (SQLite).
fn lead(listing: Duration) -> Duration {
    listing
        .saturating_mul(2)
        .clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// `f`, noting in `took` how long it took.
async fn timed<T>(took: &mut Duration, f: impl std::future::Future<Output = T>) -> T {
    let began = std::time::Instant::now();
    let out = f.await;
    *took = began.elapsed();
    out
}

impl Runtime {
    /// Adds `schedule` to the store at run time: every worker on the store fires it from
    /// now on. Declaring an existing name again replaces its definition and keeps its ticks.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn ping(tick: ScheduleTick) -> Result<()> {
    ///     Ok(())
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// rt.create_schedule(Schedule::every("heartbeat", ping, Duration::from_secs(60))).await?;
    /// let listed = rt.schedules().await?;
    /// assert_eq!(listed[0].name, "heartbeat");
    /// assert!(!listed[0].paused);
    /// rt.delete_schedule("heartbeat").await?;
    /// assert!(rt.schedules().await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn create_schedule(&self, schedule: Schedule) -> Result<(), ScheduleError> {
        self.inner.define_schedule(&schedule).await
    }

    /// Every schedule in the store, by name, with its last and next nominal times.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>, ScheduleError> {
        let states = self.inner.store.list_schedules().await?;
        Ok(states
            .into_iter()
            .map(|s| {
                // The next nominal time under the definition (the stored one may lie before
                // it when the definition changed).
                let next = Schedule::from_def(s.def.clone()).ok().and_then(|sch| {
                    s.next.and_then(|n| {
                        n.checked_sub(Duration::from_millis(1))
                            .and_then(|b| sch.timing.next_after(b))
                    })
                });
                ScheduleInfo {
                    name: s.def.name,
                    paused: s.paused,
                    last: s.last,
                    next: next.or(s.next),
                    workflow: s.def.workflow,
                    spec: s.def.spec,
                    overlap: s.def.overlap,
                    catch_up: s.def.catch_up,
                }
            })
            .collect())
    }

    /// The schedule's latest `n` ticks by nominal time, the latest first, each with its
    /// outcome and the run it started.
    pub async fn schedule_ticks(
        &self,
        name: &str,
        n: usize,
    ) -> Result<Vec<TickRecord>, ScheduleError> {
        self.inner.schedule_state(name).await?;
        Ok(self.inner.store.schedule_ticks(name, n).await?)
    }

    /// Pauses the schedule: its ticks are recorded as skipped ([`SkipReason::Paused`]) and
    /// never start later.
    pub async fn pause_schedule(&self, name: &str) -> Result<(), ScheduleError> {
        if !self
            .inner
            .store
            .set_schedule_paused(name, true, None)
            .await?
        {
            return Err(ScheduleError::NotFound {
                name: name.to_owned(),
            });
        }
        self.inner.schedules_changed.notify_one();
        Ok(())
    }

    /// Resumes the schedule from its next nominal time after now: the ticks of the paused
    /// span are not caught up.
    pub async fn resume_schedule(&self, name: &str) -> Result<(), ScheduleError> {
        let state = self.inner.schedule_state(name).await?;
        let schedule = Schedule::from_def(state.def)?;
        let now = self.inner.clock.tick().await;
        let next = schedule.timing.next_after(now).map(millis);
        if !self
            .inner
            .store
            .set_schedule_paused(name, false, next)
            .await?
        {
            return Err(ScheduleError::NotFound {
                name: name.to_owned(),
            });
        }
        self.inner.schedules_changed.notify_one();
        Ok(())
    }

    /// Starts one run of the schedule now (its nominal time: now), whatever its state and
    /// overlap policy; its id.
    pub async fn trigger_schedule(&self, name: &str) -> Result<RunId, ScheduleError> {
        let state = self.inner.schedule_state(name).await?;
        let mut nominal = millis(self.inner.clock.tick().await);
        // A tick recorded for this very millisecond: the next one.
        for _ in 0..1000 {
            let started = self
                .inner
                .fire(
                    &state,
                    nominal,
                    TickOutcome::Started,
                    false,
                    None,
                    false,
                    None,
                )
                .await?;
            if let Some(id) = started.run() {
                return Ok(id);
            }
            nominal += Duration::from_millis(1);
        }
        Err(ScheduleError::Store(StoreError::database(
            "every nominal time of the last second has a tick already",
        )))
    }

    /// Starts a run, with [`ScheduleTick::backfill`] set, for every nominal time of the
    /// schedule from `from` to `to` (both included) that has no run yet; how many it started.
    /// Repeating a backfill starts nothing twice. At most 10,000 runs per call.
    pub async fn backfill_schedule(
        &self,
        name: &str,
        from: SystemTime,
        to: SystemTime,
    ) -> Result<usize, ScheduleError> {
        let state = self.inner.schedule_state(name).await?;
        let schedule = Schedule::from_def(state.def.clone())?;
        let mut at = match from.checked_sub(Duration::from_millis(1)) {
            Some(before) => schedule.timing.next_after(before),
            None => Some(from),
        };
        let mut started = 0;
        while let Some(nominal) = at.filter(|t| *t <= to) {
            if started >= MAX_BACKFILL {
                break;
            }
            let run = self
                .inner
                .fire(
                    &state,
                    millis(nominal),
                    TickOutcome::Started,
                    true,
                    None,
                    true,
                    None,
                )
                .await?;
            started += usize::from(run.run().is_some());
            at = schedule.timing.next_after(nominal);
        }
        Ok(started)
    }

    /// Deletes the schedule and its tick records; the runs it started stay.
    pub async fn delete_schedule(&self, name: &str) -> Result<(), ScheduleError> {
        if !self.inner.store.delete_schedule(name).await? {
            return Err(ScheduleError::NotFound {
                name: name.to_owned(),
            });
        }
        self.inner.schedules_changed.notify_one();
        Ok(())
    }
}
