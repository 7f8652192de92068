//! Schedules in the SQL stores, written once: the columns of a schedule and of a tick and
//! their decoding, and the firing of a tick ([`fire_tick`]) over the statements each dialect
//! supplies ([`ScheduleTx`]). The tick's record and its run's admission are one transaction;
//! the record's primary key (schedule, nominal) decides between concurrent firings.

use std::future::Future;
use std::time::SystemTime;

use super::policy::{self, NewRunRow, Tx};
use super::{json, sql_time, time_of, to_json};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::{
    NewTick, ScheduleDef, ScheduleState, TickOutcome, TickRecord, TickWrite, TICKS_KEPT,
};

/// The statements each dialect writes for the schedules (its `schedules.rs`), field by field
/// side by side.
pub(in crate::store) struct ScheduleSql {
    pub define: &'static str,
    pub list: &'static str,
    pub lock: &'static str,
    pub upsert_tick: &'static str,
    pub advance: &'static str,
    pub trim: &'static str,
    pub ticks: &'static str,
    pub pause: &'static str,
    pub delete: &'static str,
    pub delete_ticks: &'static str,
}

/// A schedule's columns as listed: name, definition (JSON), paused, next, the latest tick's
/// nominal time, the latest started tick's nominal time and run, the earliest buffered tick.
pub(in crate::store) type ScheduleCols = (
    String,
    String,
    bool,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
);

/// A tick's columns: schedule, nominal, outcome, run, backfill, recorded at.
pub(in crate::store) type TickCols = (String, i64, String, Option<String>, bool, i64);

fn corrupt(name: &str, what: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("schedule {name:?}: {what}: {why}"))
}

fn time(ms: Option<i64>, name: &str, what: &str) -> Result<Option<SystemTime>, StoreError> {
    ms.map(|ms| time_of(ms, name, what)).transpose()
}

fn run_id(id: &str, name: &str) -> Result<RunId, StoreError> {
    id.parse().map_err(|e| corrupt(name, "run_id", e))
}

/// A listed schedule read back.
pub(in crate::store) fn decode_schedule(c: ScheduleCols) -> Result<ScheduleState, StoreError> {
    let (name, def, paused, next, last, started_at, started_run, buffered) = c;
    let def: ScheduleDef = json(&def, &name, "def")?;
    let last_started = match (started_at, started_run) {
        (Some(at), Some(run)) => Some((time_of(at, &name, "nominal")?, run_id(&run, &name)?)),
        _ => None,
    };
    Ok(ScheduleState {
        def,
        paused,
        next: time(next, &name, "next_at")?,
        last: time(last, &name, "nominal")?,
        last_started,
        buffered: time(buffered, &name, "nominal")?,
        // Read last: `name` is borrowed above.
    })
}

/// A tick record read back.
pub(in crate::store) fn decode_tick(c: TickCols) -> Result<TickRecord, StoreError> {
    let (schedule, nominal, outcome, run, backfill, recorded_at) = c;
    Ok(TickRecord {
        nominal: time_of(nominal, &schedule, "nominal")?,
        outcome: TickOutcome::parse(&outcome)
            .ok_or_else(|| corrupt(&schedule, "outcome", format!("unknown outcome `{outcome}`")))?,
        run_id: run.as_deref().map(|r| run_id(r, &schedule)).transpose()?,
        backfill,
        recorded_at: time_of(recorded_at, &schedule, "recorded_at")?,
        schedule,
    })
}

/// A schedule's definition as its column holds it.
pub(in crate::store) fn encode_def(def: &ScheduleDef) -> Result<String, StoreError> {
    to_json(def, "the schedule's definition")
}

/// A tick to write, as its columns.
pub(in crate::store) struct TickRow {
    pub schedule: String,
    pub nominal: i64,
    pub outcome: &'static str,
    pub run_id: Option<String>,
    pub backfill: bool,
    pub recorded_at: i64,
    pub next: Option<i64>,
    pub replace_runless: bool,
    pub run: Option<NewRunRow>,
}

impl TickRow {
    pub fn new(tick: NewTick) -> Result<Self, StoreError> {
        Ok(TickRow {
            nominal: sql_time(tick.nominal),
            outcome: tick.outcome.as_str(),
            run_id: tick.run.as_ref().map(|r| r.id.to_string()),
            backfill: tick.backfill,
            recorded_at: sql_time(tick.at),
            next: tick.next.map(sql_time),
            replace_runless: tick.replace_runless,
            run: tick.run.map(|r| NewRunRow::new(r, None)).transpose()?,
            schedule: tick.schedule,
        })
    }
}

/// The statements [`fire_tick`] runs, inside the transaction of the dialect that also runs
/// the admission's ([`Tx`]).
pub(in crate::store) trait ScheduleTx: Tx {
    /// True when the schedule exists; its row stays locked until the transaction ends where
    /// the dialect has row locks, so firings of one schedule take turns.
    fn lock_schedule(&mut self, name: &str) -> impl Future<Output = Result<bool, StoreError>>;

    /// Inserts the tick's record, or with `replace_runless` replaces a record of the same
    /// tick that names no run; false, writing nothing, when a record stays.
    fn upsert_tick(&mut self, tick: &TickRow) -> impl Future<Output = Result<bool, StoreError>>;

    /// Moves the schedule's next nominal time forward to `next`, never back.
    fn advance(&mut self, name: &str, next: i64) -> impl Future<Output = Result<(), StoreError>>;

    /// Deletes the schedule's tick records but the latest `keep` by nominal time.
    fn trim_ticks(&mut self, name: &str, keep: i64)
        -> impl Future<Output = Result<(), StoreError>>;
}

/// Records `tick` and admits its run in the caller's transaction: the schedule is checked
/// (and locked) first, then the record's upsert decides; only a tick it recorded admits a
/// run and moves the schedule on.
pub(in crate::store) async fn fire_tick(
    tx: &mut impl ScheduleTx,
    tick: &TickRow,
) -> Result<TickWrite, StoreError> {
    if !tx.lock_schedule(&tick.schedule).await? {
        return Ok(TickWrite::NoSchedule);
    }
    if !tx.upsert_tick(tick).await? {
        return Ok(TickWrite::Exists);
    }
    if let Some(run) = &tick.run {
        policy::admit(tx, run).await?;
    }
    if let Some(next) = tick.next {
        tx.advance(&tick.schedule, next).await?;
    }
    tx.trim_ticks(&tick.schedule, TICKS_KEPT as i64).await?;
    Ok(TickWrite::Recorded)
}
