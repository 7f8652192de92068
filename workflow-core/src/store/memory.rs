//! [`MemoryStore`]: the store for tests and examples that need no persistence. One mutex over
//! the whole state makes every operation atomic; clones share the state, so several runtimes in
//! one process can act as competing workers.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::{
    AcquireRequest, CancelOutcome, Event, EventRecord, Lease, LeasedRun, NewEvent, NewRun,
    RunOutcome, RunRecord, RunStatus, Store,
};
use crate::error::{Error, StoreError};
use crate::ids::RunId;

/// An in-memory [`Store`]. Nothing survives the process.
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    runs: HashMap<RunId, Row>,
    /// The runs that have not ended: what `acquire` scans.
    open: HashSet<RunId>,
}

struct Row {
    record: RunRecord,
    events: Vec<EventRecord>,
    wake_at: SystemTime,
    epoch: u64,
    lease_until: Option<SystemTime>,
}

impl Row {
    fn holds(&self, lease: &Lease) -> bool {
        self.epoch == lease.epoch
            && self.lease_until.is_some()
            && self.record.status == RunStatus::Running
    }

    fn push(&mut self, at: SystemTime, event: Event) {
        let seq = self.events.len() as u64 + 1;
        self.events.push(EventRecord { seq, at, event });
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied operation: every method
        // validates before it mutates. So a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn create_run(&self, run: NewRun) -> Result<(), StoreError> {
        let mut st = self.lock();
        if st.runs.contains_key(&run.id) {
            return Err(StoreError::Database(format!(
                "run {} already exists",
                run.id
            )));
        }
        st.open.insert(run.id);
        st.runs.insert(
            run.id,
            Row {
                record: RunRecord {
                    id: run.id,
                    workflow: run.workflow,
                    status: RunStatus::Pending,
                    input: run.input,
                    output: None,
                    error: None,
                    created_at: run.created_at,
                    updated_at: run.created_at,
                },
                events: Vec::new(),
                wake_at: run.created_at,
                epoch: 0,
                lease_until: None,
            },
        );
        Ok(())
    }

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        Ok(self.lock().runs.get(id).map(|r| r.record.clone()))
    }

    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        Ok(self
            .lock()
            .runs
            .get(id)
            .map(|r| r.events.clone())
            .unwrap_or_default())
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Vec<LeasedRun>, StoreError> {
        let mut st = self.lock();
        let State { runs, open } = &mut *st;
        let mut ready: Vec<(SystemTime, RunId)> = open
            .iter()
            .filter_map(|id| runs.get(id))
            .filter(|r| {
                req.workflows.contains(&r.record.workflow)
                    && r.wake_at <= req.now
                    && r.lease_until.is_none_or(|t| t <= req.now)
            })
            .map(|r| (r.wake_at, r.record.id))
            .collect();
        ready.sort();
        ready.truncate(req.limit);
        let mut leased = Vec::with_capacity(ready.len());
        for (_, id) in ready {
            if let Some(r) = runs.get_mut(&id) {
                r.epoch += 1;
                r.lease_until = Some(req.now + req.lease);
                r.record.status = RunStatus::Running;
                leased.push(LeasedRun {
                    run: r.record.clone(),
                    lease: Lease {
                        run_id: r.record.id,
                        epoch: r.epoch,
                    },
                    events: r.events.clone(),
                });
            }
        }
        Ok(leased)
    }

    async fn append(
        &self,
        lease: &Lease,
        events: Vec<NewEvent>,
        outcome: Option<RunOutcome>,
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        let row = st
            .runs
            .get_mut(&lease.run_id)
            .filter(|r| r.holds(lease))
            .ok_or(StoreError::LeaseLost(lease.run_id))?;
        let mut last = None;
        for e in events {
            last = Some(e.at);
            row.push(e.at, e.event);
        }
        if let Some(outcome) = outcome {
            let now = last.unwrap_or_else(SystemTime::now);
            match outcome {
                RunOutcome::Completed(v) => {
                    row.record.status = RunStatus::Completed;
                    row.record.output = Some(v);
                }
                RunOutcome::Failed(e) => {
                    row.record.status = RunStatus::Failed;
                    row.record.error = Some(e);
                }
            }
            row.record.updated_at = now;
            row.lease_until = None;
            st.open.remove(&lease.run_id);
        }
        Ok(())
    }

    async fn release(&self, lease: &Lease, wake_at: SystemTime) -> Result<(), StoreError> {
        let mut st = self.lock();
        let row = st
            .runs
            .get_mut(&lease.run_id)
            .filter(|r| r.holds(lease))
            .ok_or(StoreError::LeaseLost(lease.run_id))?;
        row.lease_until = None;
        row.wake_at = wake_at;
        Ok(())
    }

    async fn heartbeat(
        &self,
        leases: &[Lease],
        lease: Duration,
        now: SystemTime,
    ) -> Result<Vec<RunId>, StoreError> {
        let mut st = self.lock();
        let mut lost = Vec::new();
        for l in leases {
            match st.runs.get_mut(&l.run_id).filter(|r| r.holds(l)) {
                Some(row) => row.lease_until = Some(now + lease),
                None => lost.push(l.run_id),
            }
        }
        Ok(lost)
    }

    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        let mut st = self.lock();
        let row = st.runs.get_mut(id).ok_or(StoreError::RunNotFound(*id))?;
        if row.record.status.is_terminal() {
            return Ok(CancelOutcome::AlreadyEnded(row.record.status));
        }
        row.push(now, Event::RunCancelled);
        row.record.status = RunStatus::Cancelled;
        row.record.error = Some(Error::cancelled(id));
        row.record.updated_at = now;
        row.lease_until = None;
        st.open.remove(id);
        Ok(CancelOutcome::Cancelled)
    }
}
