//! Schedules in the SQL stores, written once: the columns of a schedule and of a tick and
//! their decoding, and the firing of a tick ([`fire_tick`]) over the statements each dialect
//! supplies ([`ScheduleTx`]). The tick's record and its run's admission are one transaction;
//! the record's primary key (schedule, nominal) decides between concurrent firings.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::time::SystemTime;

use super::policy::{self, NewRunRow, Tx};
use super::{json, sql_time, time_of, to_json, EncodedEvents};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::model::RunStatus;
use crate::store::{
    FiredTick, Lease, NewTick, ScheduleDef, ScheduleState, TickOutcome, TickRecord, TickWrite,
    TICKS_KEPT,
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
/// nominal time, the latest started tick's nominal time, run and that run's status, the
/// earliest buffered tick.
pub(in crate::store) type ScheduleCols = (
    String,
    String,
    bool,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
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
    let (name, def, paused, next, last, started_at, started_run, started_status, buffered) = c;
    let def: ScheduleDef = json(&def, &name, "def")?;
    let last_started_live = match started_status {
        Some(status) => !RunStatus::parse(&status)
            .ok_or_else(|| corrupt(&name, "status", format!("unknown status `{status}`")))?
            .is_terminal(),
        None => false,
    };
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
        last_started_live,
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

/// One recorded tick in this many (on average) trims its schedule's records back to the
/// latest [`TICKS_KEPT`]. The trim finds the cut by walking the schedule's latest
/// [`TICKS_KEPT`] records: once a schedule has them all, that cost 66 µs per tick on SQLite
/// (a Python `sqlite3` probe of the statement with 1,000 records kept), more than the rest of
/// the tick's firing. Between trims a schedule has up to a few dozen records more, older than
/// the latest [`TICKS_KEPT`]; `schedule_ticks` never lists them.
const TRIM_EVERY: u64 = 32;

impl TickRow {
    /// Whether recording this tick trims its schedule's records: true for one tick in
    /// [`TRIM_EVERY`], picked by a hash of the schedule and the nominal time (the same on
    /// every worker and build, whatever the schedule's period).
    fn trims(&self) -> bool {
        let nominal = u64::try_from(self.nominal).unwrap_or_default();
        let h = crate::store::tick_hash(&self.schedule, nominal);
        h % TRIM_EVERY == 0
    }
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
    /// The run's first events, when they may be written with it: it is to be leased, and
    /// they only record (see [`EncodedEvents::is_plain`]).
    pub first: Option<EncodedEvents>,
}

/// The rows of `ticks`, in order.
pub(in crate::store) fn tick_rows(ticks: Vec<NewTick>) -> Result<Vec<TickRow>, StoreError> {
    ticks.into_iter().map(TickRow::new).collect()
}

/// The `ready` of a `fire_ticks_when` that may write at once.
pub(in crate::store) fn ready_now<'a>() -> futures::future::BoxFuture<'a, Result<(), StoreError>> {
    Box::pin(async { Ok(()) })
}

impl TickRow {
    /// `tick`, its run leased to the firing worker for `tick.lease` if given (as
    /// [`NewRunRow::new`] leases).
    pub fn new(tick: NewTick) -> Result<Self, StoreError> {
        let first = match (&tick.run, tick.lease) {
            (Some(_), Some(_)) if !tick.first.is_empty() => {
                Some(EncodedEvents::new(&tick.first)?).filter(EncodedEvents::is_plain)
            }
            _ => None,
        };
        Ok(TickRow {
            first,
            nominal: sql_time(tick.nominal),
            outcome: tick.outcome.as_str(),
            run_id: tick.run.as_ref().map(|r| r.id.to_string()),
            backfill: tick.backfill,
            recorded_at: sql_time(tick.at),
            next: tick.next.map(sql_time),
            replace_runless: tick.replace_runless,
            run: tick
                .run
                .map(|r| NewRunRow::new(r, tick.lease))
                .transpose()?,
            schedule: tick.schedule,
        })
    }
}

/// The statements [`fire_ticks`] runs, inside the transaction of the dialect that also runs
/// the admissions' ([`Tx`]). The `_many` ones are fast paths: their defaults compose the
/// single statements, and a dialect may do each in one statement.
pub(in crate::store) trait ScheduleTx: Tx {
    /// True when the schedule exists; its row stays locked until the transaction ends where
    /// the dialect has row locks, so firings of one schedule take turns.
    fn lock_schedule(&mut self, name: &str) -> impl Future<Output = Result<bool, StoreError>>;

    /// [`ScheduleTx::lock_schedule`] of each of `names` (sorted, distinct: the order every
    /// firing locks in, so two never wait for each other both ways); the ones that exist.
    fn lock_schedules(
        &mut self,
        names: &[&str],
    ) -> impl Future<Output = Result<HashSet<String>, StoreError>> {
        async move {
            let mut found = HashSet::new();
            for name in names {
                if self.lock_schedule(name).await? {
                    found.insert((*name).to_owned());
                }
            }
            Ok(found)
        }
    }

    /// Inserts the tick's record, or with `replace_runless` replaces a record of the same
    /// tick that names no run; false, writing nothing, when a record stays.
    fn upsert_tick(&mut self, tick: &TickRow) -> impl Future<Output = Result<bool, StoreError>>;

    /// [`ScheduleTx::upsert_tick`] of each of `ticks` (no two of the same tick); whether
    /// each was written, in order.
    fn upsert_ticks(
        &mut self,
        ticks: &[&TickRow],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> {
        async move {
            let mut written = Vec::with_capacity(ticks.len());
            for tick in ticks {
                written.push(self.upsert_tick(tick).await?);
            }
            Ok(written)
        }
    }

    /// Moves the schedule's next nominal time forward to `next`, never back.
    fn advance(&mut self, name: &str, next: i64) -> impl Future<Output = Result<(), StoreError>>;

    /// [`ScheduleTx::advance`] of each (schedule, next) (no schedule twice).
    fn advance_many(
        &mut self,
        nexts: &[(&str, i64)],
    ) -> impl Future<Output = Result<(), StoreError>> {
        async move {
            for (name, next) in nexts {
                self.advance(name, *next).await?;
            }
            Ok(())
        }
    }

    /// Deletes the schedule's tick records but the latest `keep` by nominal time.
    fn trim_ticks(&mut self, name: &str, keep: i64)
        -> impl Future<Output = Result<(), StoreError>>;

    /// [`ScheduleTx::trim_ticks`] of each of `names` (distinct).
    fn trim_many(
        &mut self,
        names: &[&str],
        keep: i64,
    ) -> impl Future<Output = Result<(), StoreError>> {
        async move {
            for name in names {
                self.trim_ticks(name, keep).await?;
            }
            Ok(())
        }
    }
}

/// Records `ticks` and admits their runs in the caller's transaction, answering each as a
/// firing of it alone would: the schedules are checked (and locked, in name order) first,
/// then each record's upsert decides; only a tick it recorded admits a run and moves its
/// schedule on. A run that cannot be admitted (its id exists) fails the whole call, and the
/// caller rolls it back.
pub(in crate::store) async fn fire_ticks(
    tx: &mut impl ScheduleTx,
    ticks: &[TickRow],
) -> Result<Vec<FiredTick>, StoreError> {
    let names: Vec<&str> = ticks
        .iter()
        .map(|t| t.schedule.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let found = tx.lock_schedules(&names).await?;
    let mut fired = vec![None; ticks.len()];
    // In rounds with no tick twice (a tick repeated in one call is decided after the first).
    let mut rest: Vec<usize> = (0..ticks.len())
        .filter(|i| found.contains(&ticks[*i].schedule))
        .collect();
    let mut nexts: BTreeMap<&str, i64> = BTreeMap::new();
    let mut trim: Vec<&str> = Vec::new();
    while !rest.is_empty() {
        let mut seen = HashSet::new();
        let (round, later): (Vec<usize>, Vec<usize>) = std::mem::take(&mut rest)
            .into_iter()
            .partition(|i| seen.insert((&ticks[*i].schedule, ticks[*i].nominal)));
        rest = later;
        let rows: Vec<&TickRow> = round.iter().map(|i| &ticks[*i]).collect();
        let written = tx.upsert_ticks(&rows).await?;
        let recorded: Vec<usize> = round
            .iter()
            .zip(written)
            .filter_map(|(i, w)| w.then_some(*i))
            .collect();
        let admitted = admit(tx, recorded.iter().map(|i| &ticks[*i])).await?;
        let mut admitted = admitted.into_iter();
        for i in recorded {
            let tick = &ticks[i];
            let (lease, first) = match tick.run {
                Some(_) => admitted.next().unwrap_or_default(),
                None => (None, false),
            };
            fired[i] = Some(FiredTick {
                write: TickWrite::Recorded,
                lease,
                first,
            });
            if let Some(next) = tick.next {
                let at = nexts.entry(&tick.schedule).or_insert(next);
                *at = (*at).max(next);
            }
            if tick.trims() {
                trim.push(&tick.schedule);
            }
        }
        for i in round {
            if fired[i].is_none() {
                fired[i] = Some(FiredTick {
                    write: TickWrite::Exists,
                    lease: None,
                    first: false,
                });
            }
        }
    }
    if !nexts.is_empty() {
        let nexts: Vec<(&str, i64)> = nexts.into_iter().collect();
        tx.advance_many(&nexts).await?;
    }
    trim.sort_unstable();
    trim.dedup();
    if !trim.is_empty() {
        tx.trim_many(&trim, TICKS_KEPT as i64).await?;
    }
    Ok(fired
        .into_iter()
        .map(|f| {
            f.unwrap_or(FiredTick {
                write: TickWrite::NoSchedule,
                lease: None,
                first: false,
            })
        })
        .collect())
}

/// Admits the runs of `ticks` (those that carry one) in order: those without a token or a
/// queue to decide in one insert ([`Tx::insert_many`]), with their first events, the others
/// one by one through the admission policy. For each run, its lease when it was admitted
/// leased, and whether its first events were written with it.
async fn admit<'a>(
    tx: &mut impl ScheduleTx,
    ticks: impl Iterator<Item = &'a TickRow>,
) -> Result<Vec<(Option<Lease>, bool)>, StoreError> {
    let runs: Vec<(&NewRunRow, Option<&EncodedEvents>)> = ticks
        .filter_map(|t| t.run.as_ref().map(|r| (r, t.first.as_ref())))
        .collect();
    let (plain, first): (Vec<&NewRunRow>, Vec<Option<&EncodedEvents>>) = runs
        .iter()
        .copied()
        .filter(|(r, _)| r.hook.is_none() && r.queue_lease.is_none())
        .unzip();
    let mut inserted: HashMap<RunId, (Option<Lease>, bool)> = HashMap::new();
    if !plain.is_empty() {
        let answers = policy::admit_many(tx, &plain, &first).await?;
        for ((run, first), answer) in plain.iter().zip(&first).zip(answers) {
            let lease = answer?.1;
            // Written with the run exactly when it was admitted leased (`Tx::insert_many`).
            let written = lease.is_some() && first.is_some_and(|e| !e.at.is_empty());
            inserted.insert(run.id, (lease, written));
        }
    }
    let mut admitted = Vec::with_capacity(runs.len());
    for (run, _) in runs {
        match inserted.remove(&run.id) {
            Some(done) => admitted.push(done),
            None => admitted.push((policy::admit(tx, run).await?.1, false)),
        }
    }
    Ok(admitted)
}
