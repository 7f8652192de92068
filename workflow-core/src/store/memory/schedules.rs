//! [`ScheduleStore`] in memory: each schedule's row holds its definition, state and tick
//! records. Each method takes the lock once, so a tick's record and its run's admission
//! (the state's own `admit`) are one act.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::state::{ScheduleRow, State};
use super::MemoryStore;
use crate::error::StoreError;
use crate::store::{
    Append, FiredTick, NewTick, ScheduleDef, ScheduleState, ScheduleStore, TickOutcome, TickRecord,
    TickWrite, TICKS_KEPT,
};

impl ScheduleRow {
    /// Its state; `live` tells whether a run has not ended.
    fn state(&self, live: impl Fn(&crate::ids::RunId) -> bool) -> ScheduleState {
        let started = self
            .ticks
            .values()
            .rev()
            .find(|t| t.outcome == TickOutcome::Started && !t.backfill);
        ScheduleState {
            def: self.def.clone(),
            paused: self.paused,
            next: self.next,
            last: self.ticks.keys().next_back().copied(),
            last_started: started.and_then(|t| t.run_id.map(|r| (t.nominal, r))),
            last_started_live: started.and_then(|t| t.run_id).is_some_and(|r| live(&r)),
            buffered: self
                .ticks
                .values()
                .find(|t| t.outcome == TickOutcome::Buffered)
                .map(|t| t.nominal),
        }
    }

    fn advance(&mut self, next: Option<SystemTime>) {
        if let Some(next) = next {
            self.next = Some(self.next.map_or(next, |n| n.max(next)));
        }
    }
}

/// `t` to the millisecond, as the SQL stores keep times.
fn millis(t: SystemTime) -> SystemTime {
    let ms = crate::history::to_millis(t);
    crate::history::from_millis(ms)
}

#[async_trait::async_trait]
impl ScheduleStore for MemoryStore {
    async fn define_schedule(
        &self,
        def: &ScheduleDef,
        next: Option<SystemTime>,
        _at: SystemTime,
    ) -> Result<(), StoreError> {
        let next = next.map(millis);
        let mut st = self.lock();
        match st.schedules.get_mut(&def.name) {
            Some(row) => {
                row.def = def.clone();
                row.next = match (row.next, next) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            None => {
                st.schedules.insert(
                    def.name.clone(),
                    ScheduleRow {
                        def: def.clone(),
                        paused: false,
                        next,
                        ticks: BTreeMap::new(),
                    },
                );
            }
        }
        Ok(())
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleState>, StoreError> {
        let st = self.lock();
        let live = |id: &crate::ids::RunId| {
            st.runs
                .get(id)
                .is_some_and(|r| !r.record.status.is_terminal())
        };
        Ok(st.schedules.values().map(|row| row.state(live)).collect())
    }

    async fn fire_tick(&self, mut tick: NewTick) -> Result<TickWrite, StoreError> {
        tick.lease = None;
        Ok(fire(&mut self.lock(), tick)?.write)
    }

    /// Each call is one act under the store's lock, with no writer to group them.
    fn writes_in_parallel(&self) -> bool {
        true
    }

    /// Every tick under one lock: one act, all or nothing.
    async fn fire_ticks(&self, ticks: Vec<NewTick>) -> Result<Vec<FiredTick>, StoreError> {
        let mut st = self.lock();
        // Checked first: a run id that exists fails the whole call before anything is written.
        let mut ids = std::collections::HashSet::new();
        for run in ticks.iter().filter_map(|t| t.run.as_ref()) {
            if st.runs.contains_key(&run.id) || !ids.insert(run.id) {
                return Err(StoreError::database(format!(
                    "run {} already exists",
                    run.id
                )));
            }
        }
        ticks.into_iter().map(|tick| fire(&mut st, tick)).collect()
    }

    async fn advance_schedule(&self, name: &str, next: SystemTime) -> Result<bool, StoreError> {
        let mut st = self.lock();
        let Some(row) = st.schedules.get_mut(name) else {
            return Ok(false);
        };
        row.advance(Some(millis(next)));
        Ok(true)
    }

    async fn schedule_ticks(&self, name: &str, n: usize) -> Result<Vec<TickRecord>, StoreError> {
        let st = self.lock();
        Ok(st.schedules.get(name).map_or_else(Vec::new, |row| {
            row.ticks.values().rev().take(n).cloned().collect()
        }))
    }

    async fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
        next: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let mut st = self.lock();
        let Some(row) = st.schedules.get_mut(name) else {
            return Ok(false);
        };
        row.paused = paused;
        row.advance(next.map(millis));
        Ok(true)
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.lock().schedules.remove(name).is_some())
    }
}

/// Records `tick` and admits its run (leased to the caller for `tick.lease` when it may be),
/// under the store's lock.
fn fire(st: &mut State, tick: NewTick) -> Result<FiredTick, StoreError> {
    let nominal = millis(tick.nominal);
    let unwritten = |write| {
        Ok(FiredTick {
            write,
            lease: None,
            first: false,
        })
    };
    let Some(row) = st.schedules.get(&tick.schedule) else {
        return unwritten(TickWrite::NoSchedule);
    };
    if let Some(old) = row.ticks.get(&nominal) {
        if !tick.replace_runless || old.run_id.is_some() {
            return unwritten(TickWrite::Exists);
        }
    }
    let run_id = tick.run.as_ref().map(|r| r.id);
    let lease = match tick.run {
        Some(run) => st.admit(run, tick.lease)?.1,
        None => None,
    };
    // Leased at its admission just now: its first events under that lease, in the same act.
    let first = match &lease {
        Some(leased) if !tick.first.is_empty() => {
            let first = Append {
                events: tick.first,
                ..Append::default()
            };
            super::runs::record(st, leased, &first)?;
            true
        }
        _ => false,
    };
    let Some(row) = st.schedules.get_mut(&tick.schedule) else {
        return unwritten(TickWrite::NoSchedule);
    };
    row.ticks.insert(
        nominal,
        TickRecord {
            schedule: tick.schedule.clone(),
            nominal,
            outcome: tick.outcome,
            run_id,
            backfill: tick.backfill,
            recorded_at: millis(tick.at),
        },
    );
    while row.ticks.len() > TICKS_KEPT {
        row.ticks.pop_first();
    }
    row.advance(tick.next.map(millis));
    Ok(FiredTick {
        write: TickWrite::Recorded,
        lease,
        first,
    })
}
