//! Schedules: recurring runs of a workflow at the nominal times of a cron expression in a time
//! zone, or of a fixed period. This module holds what a schedule is ([`Schedule`], built by
//! the user and kept in the store as a `ScheduleDef`), what its times are (`timing`), and
//! which of its due ticks start a run (`firing`, pure functions). The runtime's firing loop
//! and client calls (`runtime::schedules`) build on them; the store keeps the ticks.

pub(crate) mod firing;
pub(crate) mod timing;

#[cfg(test)]
mod tests;

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use self::timing::{zone, CronSpec, Timing};
use crate::registry::{IntoWorkflow, WorkflowDef};
use crate::store::{CatchUp, Overlap, ScheduleDef, ScheduleSpec};

pub use crate::error::ScheduleError;

/// The one argument of a scheduled workflow: which schedule started the run, and for which
/// time.
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[workflow]
/// async fn nightly(tick: ScheduleTick) -> Result<String> {
///     Ok(format!("report of {} for {:?}", tick.schedule, tick.nominal))
/// }
/// # fn main() {}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScheduleTick {
    /// The schedule's name.
    pub schedule: String,
    /// The time the schedule named (not when the run started).
    pub nominal: SystemTime,
    /// Started by [`crate::Runtime::backfill_schedule`].
    pub backfill: bool,
}

/// A recurring start of a workflow: at the times of a cron expression in a time zone
/// ([`Schedule::cron`]), or at the multiples of a period ([`Schedule::every`]). Declare it on
/// the builder ([`crate::RuntimeBuilder::schedule`]) or at run time
/// ([`crate::Runtime::create_schedule`]); every worker on the store fires it, and each
/// nominal time starts at most one run.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use workflow_core::prelude::*;
///
/// #[workflow]
/// async fn nightly_report(tick: ScheduleTick) -> Result<u32> {
///     Ok(0)
/// }
///
/// # fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let nightly = Schedule::cron("nightly", nightly_report, "0 2 * * *")?
///     .timezone("Europe/Paris")?
///     .overlap(Overlap::Skip)
///     .catch_up(CatchUp::Latest)
///     .catch_up_window(Duration::from_secs(24 * 3600))
///     .jitter(Duration::from_secs(5));
/// let next = nightly.upcoming(SystemTime::UNIX_EPOCH, 2);
/// // 1970-01-01 02:00 in Paris (UTC+1) is 01:00 UTC.
/// assert_eq!(next[0], SystemTime::UNIX_EPOCH + Duration::from_secs(3600));
/// assert_eq!(next[1].duration_since(next[0])?, Duration::from_secs(24 * 3600));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Schedule {
    pub(crate) def: ScheduleDef,
    pub(crate) timing: Timing,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.def.name)
            .field("workflow", &self.def.workflow)
            .field("spec", &self.def.spec)
            .field("overlap", &self.def.overlap)
            .field("catch_up", &self.def.catch_up)
            .field("catch_up_window", &self.def.catch_up_window)
            .field("jitter", &self.def.jitter)
            .finish()
    }
}

/// The default catch-up window: a day.
const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);

impl Schedule {
    /// A schedule named `name` starting `workflow` at the times cron expression `expr`
    /// matches, in UTC unless [`Schedule::timezone`] says otherwise. `expr` has 5 fields
    /// (minute, hour, day of month, month, day of week), or 6 with seconds first. The
    /// workflow takes one argument, a [`ScheduleTick`].
    ///
    /// An invalid expression is an error naming the field at fault, or quoting the
    /// expression.
    pub fn cron<F>(
        name: impl Into<String>,
        workflow: F,
        expr: &str,
    ) -> Result<Schedule, ScheduleError>
    where
        F: IntoWorkflow<(ScheduleTick,)>,
    {
        let _ = workflow;
        let spec = CronSpec::parse(expr)?;
        Ok(Schedule::new::<F::Def>(
            name.into(),
            ScheduleSpec::Cron {
                expr: expr.to_owned(),
                zone: "UTC".to_owned(),
            },
            Timing::cron(spec, zone("UTC")?),
        ))
    }

    /// A schedule named `name` starting `workflow` at every multiple of `period` since the
    /// Unix epoch (the same instants on every worker and after every restart), in whole
    /// milliseconds. A period under a millisecond never ticks.
    pub fn every<F>(name: impl Into<String>, workflow: F, period: Duration) -> Schedule
    where
        F: IntoWorkflow<(ScheduleTick,)>,
    {
        let _ = workflow;
        let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
        Schedule::new::<F::Def>(
            name.into(),
            ScheduleSpec::Every { period_ms },
            Timing::Every(Duration::from_millis(period_ms)),
        )
    }

    fn new<W: WorkflowDef>(name: String, spec: ScheduleSpec, timing: Timing) -> Schedule {
        Schedule {
            def: ScheduleDef {
                name,
                workflow: W::NAME.to_owned(),
                queue: W::QUEUE.map(str::to_owned),
                spec,
                overlap: Overlap::default(),
                catch_up: CatchUp::default(),
                catch_up_window: DEFAULT_WINDOW,
                jitter: Duration::ZERO,
            },
            timing,
        }
    }

    /// The schedule as the store keeps it, read back (a definition another process wrote).
    pub(crate) fn from_def(def: ScheduleDef) -> Result<Schedule, ScheduleError> {
        let timing = match &def.spec {
            ScheduleSpec::Cron { expr, zone: tz } => {
                Timing::cron(CronSpec::parse(expr)?, zone(tz)?)
            }
            ScheduleSpec::Every { period_ms } => Timing::Every(Duration::from_millis(*period_ms)),
        };
        Ok(Schedule { def, timing })
    }

    /// The time zone a cron expression is read in: an IANA name (`Europe/Paris`) or `UTC`
    /// (the default). Nominal times are the zone's civil times: one that a DST change skips
    /// fires once, at the first instant after the gap; one that a DST change repeats fires
    /// once, at its first occurrence. A period ([`Schedule::every`]) ignores the zone. An
    /// unknown zone is an error naming it.
    pub fn timezone(mut self, name: &str) -> Result<Schedule, ScheduleError> {
        let tz = zone(name)?;
        if let (ScheduleSpec::Cron { zone, .. }, Timing::Cron(_, timing_zone)) =
            (&mut self.def.spec, &mut self.timing)
        {
            *zone = name.to_owned();
            *timing_zone = tz;
        }
        Ok(self)
    }

    /// What a tick does while the schedule's previous run has not ended (default
    /// [`Overlap::Skip`]).
    pub fn overlap(mut self, overlap: Overlap) -> Schedule {
        self.def.overlap = overlap;
        self
    }

    /// Which ticks missed while no worker was up start when one comes back (default
    /// [`CatchUp::Latest`]).
    pub fn catch_up(mut self, catch_up: CatchUp) -> Schedule {
        self.def.catch_up = catch_up;
        self
    }

    /// Missed ticks older than this are recorded as skipped, never started (default 24 h).
    pub fn catch_up_window(mut self, window: Duration) -> Schedule {
        self.def.catch_up_window = window;
        self
    }

    /// Each tick's run starts up to this long after its nominal time, the same delay on every
    /// worker (default none): spreads the starts of many schedules ticking at once.
    pub fn jitter(mut self, jitter: Duration) -> Schedule {
        self.def.jitter = jitter;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The next `n` nominal times after `from`, in order: a pure function of the expression
    /// or period and the zone.
    pub fn upcoming(&self, from: SystemTime, n: usize) -> Vec<SystemTime> {
        self.timing.upcoming(from, n)
    }
}

/// A schedule as [`crate::Runtime::schedules`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// Paused: its ticks are recorded as skipped until it is resumed.
    pub paused: bool,
    /// Its latest recorded tick's nominal time.
    pub last: Option<SystemTime>,
    /// Its next nominal time; `None` when it never ticks again.
    pub next: Option<SystemTime>,
    /// The workflow each tick starts.
    pub workflow: String,
    /// When it ticks: the expression and zone, or the period.
    pub spec: ScheduleSpec,
    /// Its overlap policy.
    pub overlap: Overlap,
    /// Its catch-up policy.
    pub catch_up: CatchUp,
}

impl ScheduleInfo {
    /// The next `n` nominal times after `from`, as [`Schedule::upcoming`] gives them (none
    /// when this build cannot read the spec, say a zone its time zone database lacks).
    pub fn upcoming(&self, from: SystemTime, n: usize) -> Vec<SystemTime> {
        let timing = match &self.spec {
            ScheduleSpec::Cron { expr, zone: tz } => match (CronSpec::parse(expr), zone(tz)) {
                (Ok(spec), Ok(tz)) => Timing::cron(spec, tz),
                _ => return Vec::new(),
            },
            ScheduleSpec::Every { period_ms } => Timing::Every(Duration::from_millis(*period_ms)),
        };
        timing.upcoming(from, n)
    }
}
