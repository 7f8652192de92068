//! Schedules as the store keeps them: each schedule's definition, whether it is paused, the
//! next nominal time no tick has been recorded for, and the record of every tick. The one
//! guarantee that must hold across processes, exactly one run per schedule and nominal time,
//! is [`ScheduleStore::fire_tick`]: the tick's record and its run's admission commit together
//! under the unique key (schedule, nominal).
//!
//! When a schedule ticks (cron expressions, zones, periods) and what a tick does (catch-up,
//! overlap) is the runtime's to decide; the store keeps what was decided.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::ids::RunId;
use crate::model::NewRun;
use crate::store::{Lease, NewEvent};

/// How many tick records a schedule keeps: its latest by nominal time.
pub const TICKS_KEPT: usize = 1000;

/// A hash of a schedule's tick (its name and nominal time in ms since the Unix epoch), the
/// same on every worker, build and platform (FNV-1a): what a tick's jitter and whether it
/// trims the schedule's records are drawn from.
pub(crate) fn tick_hash(schedule: &str, nominal_ms: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in schedule.as_bytes().iter().chain(&nominal_ms.to_le_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// What a schedule's tick does when the schedule's previous run has not ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// The tick is recorded as skipped ([`SkipReason::Overlap`]).
    #[default]
    Skip,
    /// At most one tick waits ([`TickOutcome::Buffered`]) and starts when the previous run
    /// ends; further ticks meanwhile are skipped.
    BufferOne,
    /// The tick's run starts anyway.
    AllowAll,
    /// The previous run is cancelled and the tick's run starts.
    CancelOther,
}

/// Which ticks start when workers come back after none was up at their nominal times.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// None of the missed ticks.
    None,
    /// The most recent missed tick.
    #[default]
    Latest,
    /// Up to `max` of the most recent missed ticks, oldest first.
    All {
        /// At most this many.
        max: u32,
    },
}

/// When a schedule ticks, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleSpec {
    /// At the times a cron expression matches in a time zone.
    Cron {
        /// 5 fields, or 6 with seconds first.
        expr: String,
        /// An IANA zone name, or `UTC`.
        zone: String,
    },
    /// At the multiples of a period since the Unix epoch.
    Every {
        /// The period, in milliseconds.
        period_ms: u64,
    },
}

/// A schedule's definition as the store keeps it and every process reads it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScheduleDef {
    /// Its name, unique in the store.
    pub name: String,
    /// The workflow each tick starts.
    pub workflow: String,
    /// The queue the workflow's runs wait in, if it declares one.
    pub queue: Option<String>,
    /// When it ticks.
    pub spec: ScheduleSpec,
    /// What a tick does while the previous run goes on.
    pub overlap: Overlap,
    /// Which missed ticks start when workers come back.
    pub catch_up: CatchUp,
    /// Missed ticks older than this are never started.
    pub catch_up_window: Duration,
    /// A tick's run starts up to this long after its nominal time.
    pub jitter: Duration,
}

/// Why a tick started no run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SkipReason {
    /// The schedule's previous run had not ended (the overlap policy).
    Overlap,
    /// The schedule was paused.
    Paused,
    /// No worker was up at its nominal time, and the catch-up policy or window left it out.
    Missed,
}

/// What a tick did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TickOutcome {
    /// Its run was started (the record names it).
    Started,
    /// It started no run, for this reason.
    Skipped(SkipReason),
    /// It waits for the schedule's previous run to end ([`Overlap::BufferOne`]).
    Buffered,
}

impl TickOutcome {
    /// The outcome as stored: `started`, `buffered`, `skipped:overlap`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            TickOutcome::Started => "started",
            TickOutcome::Buffered => "buffered",
            TickOutcome::Skipped(SkipReason::Overlap) => "skipped:overlap",
            TickOutcome::Skipped(SkipReason::Paused) => "skipped:paused",
            TickOutcome::Skipped(SkipReason::Missed) => "skipped:missed",
        }
    }

    /// The inverse of [`TickOutcome::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "started" => TickOutcome::Started,
            "buffered" => TickOutcome::Buffered,
            "skipped:overlap" => TickOutcome::Skipped(SkipReason::Overlap),
            "skipped:paused" => TickOutcome::Skipped(SkipReason::Paused),
            "skipped:missed" => TickOutcome::Skipped(SkipReason::Missed),
            _ => return None,
        })
    }
}

impl std::fmt::Display for TickOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tick as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TickRecord {
    /// The schedule.
    pub schedule: String,
    /// The time the schedule named.
    pub nominal: SystemTime,
    /// What it did.
    pub outcome: TickOutcome,
    /// The run it started, when it started one.
    pub run_id: Option<RunId>,
    /// Started by a backfill.
    pub backfill: bool,
    /// When it was recorded (for a started tick: its run's admission).
    pub recorded_at: SystemTime,
}

/// A schedule as the store keeps it, with what the runtime needs to fire its ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleState {
    /// Its definition.
    pub def: ScheduleDef,
    /// Paused: its ticks are recorded as skipped.
    pub paused: bool,
    /// The next nominal time no tick has been recorded for by the firing of its ticks;
    /// `None`: it never ticks again.
    pub next: Option<SystemTime>,
    /// The latest recorded tick's nominal time.
    pub last: Option<SystemTime>,
    /// The latest tick that started a run (not a backfill): its nominal time and run.
    pub last_started: Option<(SystemTime, RunId)>,
    /// The earliest tick waiting for the previous run to end.
    pub buffered: Option<SystemTime>,
    /// Whether the run of `last_started` had not ended when the schedule was listed (`false`
    /// without one): the overlap policy's question, answered with the listing instead of a
    /// read per schedule.
    pub last_started_live: bool,
}

/// A tick to record with [`ScheduleStore::fire_tick`].
#[derive(Debug, Clone)]
pub struct NewTick {
    /// The schedule.
    pub schedule: String,
    /// Its nominal time (kept to the millisecond).
    pub nominal: SystemTime,
    /// What it did; [`TickOutcome::Started`] exactly when `run` is given.
    pub outcome: TickOutcome,
    /// The run to admit with the record.
    pub run: Option<NewRun>,
    /// Started by a backfill.
    pub backfill: bool,
    /// When it is recorded.
    pub at: SystemTime,
    /// Moves the schedule's next nominal time forward to this, never back.
    pub next: Option<SystemTime>,
    /// A record of this tick that started no run (skipped or buffered) is replaced; otherwise
    /// any record of it stays and nothing is written.
    pub replace_runless: bool,
    /// Lease the run to the caller for this long when it is admitted, as
    /// [`RunStore::create_run_leased`](crate::store::RunStore::create_run_leased) leases (a
    /// queued or delayed run only as that does): the caller drives it at once, without an
    /// `acquire`. Only [`ScheduleStore::fire_ticks`] reports the lease, so only it leases;
    /// [`ScheduleStore::fire_tick`] admits the run unleased.
    pub lease: Option<Duration>,
    /// The run's first events (its first round: the start of its first steps), appended
    /// under its lease in the same act when it is admitted leased to the caller, as
    /// [`RunStore::create_run_leased_with`](crate::store::RunStore::create_run_leased_with)
    /// appends them, so that a tick's run starts its first steps without a commit of their
    /// own. Events only, numbered from 1. Written only when [`FiredTick::first`] says so; a
    /// store may always leave them out.
    pub first: Vec<NewEvent>,
}

/// What [`ScheduleStore::fire_tick`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickWrite {
    /// The tick was recorded (and its run admitted).
    Recorded,
    /// The tick had a record already (that it may not replace): nothing was written.
    Exists,
    /// No such schedule: nothing was written.
    NoSchedule,
}

/// What [`ScheduleStore::fire_ticks`] did with one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiredTick {
    /// What was written.
    pub write: TickWrite,
    /// The lease of the tick's run when it was admitted leased to the caller.
    pub lease: Option<Lease>,
    /// [`NewTick::first`] was written with the run (never without a lease): otherwise the
    /// caller appends the first events itself.
    pub first: bool,
}

/// Schedules, their next nominal times and their ticks. Stores without schedules keep the
/// defaults, which refuse every change and list none.
#[async_trait::async_trait]
pub trait ScheduleStore: Send + Sync + 'static {
    /// Declares `def`. A new schedule's next nominal time is `next`; an existing one keeps its
    /// state and its ticks, takes the new definition, and its next nominal time becomes the
    /// earlier of its own and `next`.
    async fn define_schedule(
        &self,
        def: &ScheduleDef,
        next: Option<SystemTime>,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let _ = (def, next, at);
        Err(unsupported())
    }

    /// Every schedule, by name.
    async fn list_schedules(&self) -> Result<Vec<ScheduleState>, StoreError> {
        Ok(Vec::new())
    }

    /// Records `tick` and, when it carries a run, admits the run, in one act, under the
    /// unique key (schedule, nominal): of concurrent calls for one tick, one records it and
    /// the others write nothing. With `tick.next` the schedule's next nominal time moves
    /// forward to it in the same act. Only the schedule's latest [`TICKS_KEPT`] records are
    /// kept.
    async fn fire_tick(&self, tick: NewTick) -> Result<TickWrite, StoreError> {
        let _ = tick;
        Err(unsupported())
    }

    /// Fires `ticks` as [`ScheduleStore::fire_tick`] fires each, in order, with one answer
    /// per tick; a store may commit them together (then an error writes none of them). A
    /// tick's run admitted with [`NewTick::lease`] is leased to the caller, and its answer
    /// carries the lease, and its [`NewTick::first`] events may be written with it. The
    /// default fires each alone and leases none.
    async fn fire_ticks(&self, ticks: Vec<NewTick>) -> Result<Vec<FiredTick>, StoreError> {
        let mut fired = Vec::with_capacity(ticks.len());
        for mut tick in ticks {
            tick.lease = None;
            let write = self.fire_tick(tick).await?;
            fired.push(FiredTick {
                write,
                lease: None,
                first: false,
            });
        }
        Ok(fired)
    }

    /// [`ScheduleStore::fire_ticks`] once `ready` resolves: with `Err`, nothing is written
    /// and the error is returned. A store may prepare the writes while it waits (the firing
    /// loop hands a look decided ahead of its due time over before that time, with a `ready`
    /// that resolves at it), so that less is left to do once the ticks are due. The default
    /// waits, then fires.
    async fn fire_ticks_when(
        &self,
        ticks: Vec<NewTick>,
        ready: futures::future::BoxFuture<'_, Result<(), StoreError>>,
    ) -> Result<Vec<FiredTick>, StoreError> {
        ready.await?;
        self.fire_ticks(ticks).await
    }

    /// Whether concurrent calls of this store are written in parallel, each in a
    /// transaction of its own (PostgreSQL's pool; the memory store's acts), rather than one
    /// after the other by one writer that groups them (SQLite). The firing loop shapes its
    /// calls by it: with parallel writes, a tick's run driven by the firing worker is polled
    /// first and admitted with its first events ([`NewTick::first`]), and a look's many ticks
    /// go out as two calls at once; with one writer, the ticks go out together at once and
    /// the runs' first steps start in the writer's next commits, while the other runs are
    /// polled. (A look the loop makes ahead of its due time polls its runs first on every
    /// store: the polling is done before the ticks are due.) The default is `false`.
    ///
    /// Measured with 1,000 every-second schedules on one worker (`workflow-bench
    /// schedule-load`, BENCHMARKS.md): PostgreSQL's lateness p99 fell from 125 to 77 ms
    /// (median of four pairs) with parallel writes; SQLite's rose from 59 to 71 ms.
    fn writes_in_parallel(&self) -> bool {
        false
    }

    /// Moves the schedule's next nominal time forward to `next` (never back); false for an
    /// unknown schedule.
    async fn advance_schedule(&self, name: &str, next: SystemTime) -> Result<bool, StoreError> {
        let _ = (name, next);
        Err(unsupported())
    }

    /// The schedule's latest `n` ticks by nominal time, the latest first.
    async fn schedule_ticks(&self, name: &str, n: usize) -> Result<Vec<TickRecord>, StoreError> {
        let _ = (name, n);
        Ok(Vec::new())
    }

    /// Pauses or resumes the schedule; with `next`, its next nominal time moves forward to
    /// it. False for an unknown schedule.
    async fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
        next: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let _ = (name, paused, next);
        Err(unsupported())
    }

    /// Deletes the schedule and its tick records (its runs stay); false for an unknown one.
    async fn delete_schedule(&self, name: &str) -> Result<bool, StoreError> {
        let _ = name;
        Err(unsupported())
    }
}

fn unsupported() -> StoreError {
    StoreError::database("schedules are not supported by this store")
}
