//! [`RunStore`] in memory: admission, acquiring, appending, ending, failures, blocks and child
//! runs. Each method takes the lock once
//! and calls the state's operations, so it is atomic; the rules themselves live in `state.rs`
//! and the shared store helpers, which this file must not repeat.

use std::time::{Duration, SystemTime};

use super::state::Slot;
use super::MemoryStore;
use crate::error::{Error, StoreError};
use crate::history::after;
use crate::ids::RunId;
use crate::store::{
    block_backoff, failure_backoff, gave_up, AcquireRequest, Admission, AdmittedWith, Append,
    CancelOutcome, Event, EventRecord, FailureOutcome, Lease, LeasedRun, NewEvent, NewRun,
    RetryOutcome, RunOutcome, RunRecord, RunStatus, RunStore, MAX_FAILED_TRIES,
};

#[async_trait::async_trait]
impl RunStore for MemoryStore {
    async fn create_run(&self, run: NewRun) -> Result<Admission, StoreError> {
        Ok(self.lock().admit(run, None)?.0)
    }

    async fn create_run_leased(
        &self,
        run: NewRun,
        lease: Duration,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        self.lock().admit(run, Some(lease))
    }

    async fn create_run_leased_with(
        &self,
        run: NewRun,
        lease: Duration,
        first: &Append,
    ) -> Result<AdmittedWith, StoreError> {
        crate::store::first_events_only(first)?;
        let mut st = self.lock();
        let (admission, leased) = st.admit(run, Some(lease))?;
        if let Some(leased) = &leased {
            if !first.events.is_empty() {
                record(&mut st, leased, first)?;
            }
        }
        Ok(AdmittedWith::Done(admission, leased))
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
        // Runs outside queues, and queued runs that hold their slot already.
        let mut ready: Vec<RunId> = st
            .due
            .iter()
            .take_while(|(at, _)| *at <= req.now)
            .filter(|(_, id)| {
                st.runs.get(id).is_some_and(|r| {
                    r.lease_until.is_none_or(|t| t <= req.now)
                        && req.workflows.contains(&r.record.workflow)
                        // A waiting run past its deadline is handed out without a slot,
                        // to fail at once.
                        && (r.slot != Slot::Waiting
                            || r.record.deadline.is_some_and(|d| d <= req.now))
                })
            })
            .take(req.limit)
            .map(|(_, id)| *id)
            .collect();
        let room = req.limit - ready.len();
        let begin = st.admissible(&req, &ready, room);
        for id in &begin {
            let Some(r) = st.runs.get_mut(id) else {
                continue;
            };
            r.began_at = Some(req.now);
            st.count_begin(*id, req.now);
            st.rebook(*id);
        }
        ready.extend(begin);
        let mut leased = Vec::with_capacity(ready.len());
        for id in ready {
            if let Some(r) = st.runs.get_mut(&id) {
                // Acquirable with a lease set only once that lease expired.
                let took_over = r.lease_until.is_some();
                r.epoch += 1;
                r.lease_until = Some(after(req.now, req.lease));
                if r.record.status == RunStatus::Blocked {
                    // Tried again: the divergence is shown only while it blocks the run.
                    r.record.error = None;
                }
                if r.record.status != RunStatus::Running {
                    // A change of state: begun, or tried again after a block.
                    r.record.updated_at = req.now;
                }
                r.record.status = RunStatus::Running;
                leased.push(LeasedRun {
                    run: r.record.clone(),
                    lease: Lease {
                        run_id: r.record.id,
                        epoch: r.epoch,
                    },
                    events: r.events.clone(),
                    took_over,
                });
            }
        }
        Ok(leased)
    }

    async fn append(&self, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        let mut st = self.lock();
        let now = record(&mut st, lease, write)?;
        for token in &write.release_tokens {
            st.release_token(lease.run_id, token, now);
        }
        if let Some(outcome) = &write.outcome {
            let status = match outcome {
                RunOutcome::Completed(_) => RunStatus::Completed,
                RunOutcome::Failed(_) => RunStatus::Failed,
            };
            st.end(lease.run_id, outcome.clone(), status, now);
        }
        Ok(())
    }

    async fn continue_as_new(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
    ) -> Result<(), StoreError> {
        self.continue_chain(lease, write, next, false)?;
        Ok(())
    }

    async fn continue_as_new_leased(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
    ) -> Result<Option<LeasedRun>, StoreError> {
        self.continue_chain(lease, write, next, true)
    }

    async fn release(
        &self,
        lease: &Lease,
        wake_at: SystemTime,
        payloads_seen: u64,
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        let waiting = st
            .inbox
            .range(payloads_seen.saturating_add(1)..)
            .any(|(_, (run, _))| *run == lease.run_id);
        let row = st.held(lease)?;
        row.lease_until = None;
        row.failed_tries = 0;
        row.blocked_tries = 0;
        row.wake_at = if waiting { SystemTime::now() } else { wake_at };
        // A run given back is suspended (evicted) and its history may stay so for days:
        // hold only what it uses.
        row.events.shrink_to_fit();
        st.schedule(lease.run_id);
        Ok(())
    }

    async fn record_failure(
        &self,
        lease: &Lease,
        cause: &Error,
        now: SystemTime,
    ) -> Result<FailureOutcome, StoreError> {
        let mut st = self.lock();
        let row = st.held(lease)?;
        row.failed_tries = row.failed_tries.saturating_add(1);
        row.lease_until = None;
        let tries = row.failed_tries;
        if tries >= MAX_FAILED_TRIES {
            let error = gave_up(cause);
            row.push(
                now,
                Event::RunFailed {
                    error: error.clone(),
                },
            );
            st.end(
                lease.run_id,
                RunOutcome::Failed(error),
                RunStatus::Failed,
                now,
            );
            return Ok(FailureOutcome::Failed);
        }
        let at = after(now, failure_backoff(tries));
        row.wake_at = at;
        st.schedule(lease.run_id);
        Ok(FailureOutcome::Retrying { tries, at })
    }

    async fn ended_among(&self, runs: &[RunId]) -> Result<Vec<RunId>, StoreError> {
        let st = self.lock();
        let live = |id: &RunId| {
            st.runs
                .get(id)
                .is_some_and(|r| !r.record.status.is_terminal())
        };
        Ok(runs.iter().filter(|id| !live(id)).copied().collect())
    }

    async fn block(
        &self,
        lease: &Lease,
        divergence: &Error,
        now: SystemTime,
    ) -> Result<SystemTime, StoreError> {
        let mut st = self.lock();
        let row = st.held(lease)?;
        row.blocked_tries = row.blocked_tries.saturating_add(1);
        let at = after(now, block_backoff(row.blocked_tries));
        row.record.status = RunStatus::Blocked;
        row.record.error = Some(divergence.clone());
        row.record.updated_at = now;
        row.lease_until = None;
        row.wake_at = at;
        st.schedule(lease.run_id);
        Ok(at)
    }

    async fn retry(&self, id: &RunId, now: SystemTime) -> Result<RetryOutcome, StoreError> {
        let mut st = self.lock();
        let row = st.runs.get_mut(id).ok_or(StoreError::RunNotFound(*id))?;
        let outcome = match row.record.status {
            RunStatus::Blocked => RetryOutcome::Unblocked,
            RunStatus::Failed => {
                row.push(now, Event::RunRetried);
                row.record.status = RunStatus::Pending;
                row.record.error = None;
                row.record.updated_at = now;
                row.failed_tries = 0;
                // Re-opened, it waits for a slot of its queue again.
                row.began_at = None;
                RetryOutcome::Reopened
            }
            other => return Ok(RetryOutcome::NotRetryable(other)),
        };
        row.blocked_tries = 0;
        row.wake_at = now;
        st.schedule(*id);
        Ok(outcome)
    }

    async fn wake_blocked(&self, now: SystemTime) -> Result<u64, StoreError> {
        let mut st = self.lock();
        let blocked: Vec<RunId> = st
            .runs
            .values_mut()
            .filter(|r| r.record.status == RunStatus::Blocked)
            .map(|r| {
                r.wake_at = r.wake_at.min(now);
                r.record.id
            })
            .collect();
        for id in &blocked {
            st.schedule(*id);
        }
        Ok(blocked.len() as u64)
    }

    async fn create_run_with_history(
        &self,
        run: NewRun,
        history: &[NewEvent],
    ) -> Result<(), StoreError> {
        if run.hook.is_some() {
            return Err(StoreError::database(
                "a run created with a history cannot claim a token",
            ));
        }
        let mut st = self.lock();
        let id = run.id;
        st.admit(run, None)?;
        if let Some(row) = st.runs.get_mut(&id) {
            for e in history {
                row.push(e.at, e.event.clone());
            }
        }
        Ok(())
    }

    async fn start_child(
        &self,
        lease: &Lease,
        child_key: &str,
        child: NewRun,
    ) -> Result<Admission, StoreError> {
        let mut st = self.lock();
        st.held(lease)?;
        let (child_id, workflow, at) = (child.id, child.workflow.clone(), child.created_at);
        let (admission, _) = st.admit(child, None)?;
        let conflict = match admission {
            Admission::Admitted => None,
            Admission::Conflict(owner) => Some(owner),
        };
        st.held(lease)?.push(
            at,
            Event::ChildStarted {
                refused: None,
                child_key: child_key.to_owned(),
                child_id,
                workflow,
                conflict,
            },
        );
        Ok(admission)
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
                Some(row) => row.lease_until = Some(after(now, lease)),
                None => lost.push(l.run_id),
            }
        }
        Ok(lost)
    }

    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        self.lock().cancel(*id, now)
    }
}

/// Pushes `write`'s events to the run `lease` holds, publishing values, keeping replies and
/// taking delivered payloads out of the inbox; the write's time (its last event's).
pub(super) fn record(
    st: &mut super::state::State,
    lease: &Lease,
    write: &Append,
) -> Result<SystemTime, StoreError> {
    let row = st.held(lease)?;
    let mut now = SystemTime::now();
    let mut received = Vec::new();
    for e in &write.events {
        now = e.at;
        if let Some(payload_id) = e.event.delivered_payload() {
            received.push(payload_id);
        }
        if let Event::EventSet { key, value, .. } = &e.event {
            row.published.insert(key.clone(), value.clone());
        }
        if let Event::RequestReplied {
            request_id, reply, ..
        } = &e.event
        {
            if let Some(r) = row.requests.get_mut(request_id) {
                r.reply.get_or_insert_with(|| reply.clone());
            }
        }
        row.push(e.at, e.event.clone());
    }
    for id in received {
        if st
            .inbox
            .get(&id)
            .is_some_and(|(run, _)| *run == lease.run_id)
        {
            st.inbox.remove(&id);
        }
    }
    Ok(now)
}
