//! [`MemoryStore`]: the store for tests and examples that need no persistence. One mutex over
//! the whole state makes every operation atomic; clones share the state, so several runtimes in
//! one process can act as competing workers.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::{
    block_backoff, failure_backoff, gave_up, AcquireRequest, AdminStore, Admission, AdmitOrResume,
    Append, CancelOutcome, ChildNotice, ClaimOutcome, Event, EventRecord, FailureOutcome,
    HookFilter, HookRecord, HookStore, Lease, LeasedRun, NewEvent, NewRun, Payload, PruneStats,
    QueueDef, QueueInfo, QueueStore, RetryOutcome, RunFilter, RunOutcome, RunRecord, RunStatus,
    RunStore, StoredChunk, StreamInfo, StreamPage, StreamStore, CHILD_NOTICE_TOKEN,
    MAX_FAILED_TRIES,
};
use crate::error::{Error, StoreError};
use crate::history::after;
use crate::ids::RunId;

/// An in-memory [`Store`]. Nothing survives the process.
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    runs: HashMap<RunId, Row>,
    /// The runs that have not ended, by wake time, the order `acquire` hands them out in. It
    /// reads only the prefix that is due, where it skips runs under a live lease; suspended
    /// runs wake far ahead, so it costs the same with 100,000 of them as with ten.
    due: BTreeSet<(SystemTime, RunId)>,
    hooks: HashMap<String, HookRow>,
    /// Every payload by id: (run, payload).
    inbox: BTreeMap<u64, (RunId, Payload)>,
    /// The last payload id handed out: pruning deletes payloads, and their ids must never
    /// come back (a worker's cursor may already be past them).
    last_payload: u64,
    /// Declared queues by name, with their concurrency and rate limits.
    queues: HashMap<String, QueueDef>,
    /// What each queue holds, kept in step with the runs by [`State::schedule`].
    books: BTreeMap<String, QueueBook>,
}

/// The runs of one queue that have not ended: those waiting to begin, in the order they
/// may, and those holding a slot.
#[derive(Default)]
struct QueueBook {
    /// Waiting runs: higher priority first, then start order.
    waiting: BTreeSet<(Reverse<i32>, SystemTime, RunId)>,
    /// Waiting runs of each partition key, in start order: only the first may begin.
    key_waiting: HashMap<String, BTreeSet<(SystemTime, RunId)>>,
    /// Runs begun and not ended.
    holding: HashSet<RunId>,
    /// The partition keys of the holding runs.
    held_keys: HashSet<String>,
    /// When runs of the queue began, oldest first, trimmed to the rate window.
    begins: VecDeque<SystemTime>,
}

/// Where a run stands in its queue.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Not in a queue, or ended.
    Out,
    Waiting,
    Holding,
}

struct Row {
    record: RunRecord,
    events: Vec<EventRecord>,
    wake_at: SystemTime,
    epoch: u64,
    lease_until: Option<SystemTime>,
    /// This run's key in [`State::due`], if it is there.
    due_at: Option<SystemTime>,
    /// Tries in a row that ended in [`Store::record_failure`].
    failed_tries: u32,
    /// Blocks in a row ([`Store::block`]).
    blocked_tries: u32,
    /// Started with `.detached()`: a cancellation of its parent does not reach it.
    detached: bool,
    /// Its streams by name; they go with the run when it is pruned.
    streams: BTreeMap<String, StreamRow>,
    /// When a queued run first began (was leased within its queue's limits).
    began_at: Option<SystemTime>,
    /// Where [`State::books`] lists it.
    slot: Slot,
}

#[derive(Default)]
struct StreamRow {
    chunks: Vec<StoredChunk>,
    closed: bool,
}

impl Row {
    /// Where the run belongs in its queue's book now.
    fn wanted_slot(&self) -> Slot {
        match (&self.record.queue, self.began_at) {
            (None, _) => Slot::Out,
            _ if self.record.status.is_terminal() => Slot::Out,
            (Some(_), None) => Slot::Waiting,
            (Some(_), Some(_)) => Slot::Holding,
        }
    }
}

struct HookRow {
    run_id: RunId,
    created_at: SystemTime,
    active: bool,
    retain_until: Option<SystemTime>,
}

impl HookRow {
    /// Whether the token is unavailable to others at `at`.
    fn taken(&self, at: SystemTime) -> bool {
        self.active || self.retain_until.is_some_and(|t| t > at)
    }
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

impl State {
    /// Puts run `id` where it belongs in [`State::due`] after a change of its status or wake
    /// time.
    fn schedule(&mut self, id: RunId) {
        self.rebook(id);
        let Some(row) = self.runs.get_mut(&id) else {
            return;
        };
        let due_at = (!row.record.status.is_terminal()).then_some(row.wake_at);
        if due_at == row.due_at {
            return;
        }
        if let Some(old) = row.due_at.take() {
            self.due.remove(&(old, id));
        }
        if let Some(at) = due_at {
            self.due.insert((at, id));
        }
        row.due_at = due_at;
    }

    /// Puts run `id` where it belongs in its queue's book (waiting, holding a slot, or out).
    fn rebook(&mut self, id: RunId) {
        let Some(row) = self.runs.get_mut(&id) else {
            return;
        };
        let wanted = row.wanted_slot();
        if wanted == row.slot {
            return;
        }
        let (old, created) = (row.slot, row.record.created_at);
        row.slot = wanted;
        let Some(entry) = row.record.queue.clone() else {
            return;
        };
        let book = self.books.entry(entry.name.clone()).or_default();
        let key = (Reverse(entry.priority), created, id);
        match old {
            Slot::Out => {}
            Slot::Waiting => {
                book.waiting.remove(&key);
                if let Some(k) = &entry.partition_key {
                    if let Some(w) = book.key_waiting.get_mut(k) {
                        w.remove(&(created, id));
                        if w.is_empty() {
                            book.key_waiting.remove(k);
                        }
                    }
                }
            }
            Slot::Holding => {
                book.holding.remove(&id);
                if let Some(k) = &entry.partition_key {
                    book.held_keys.remove(k);
                }
            }
        }
        match wanted {
            Slot::Out => {}
            Slot::Waiting => {
                book.waiting.insert(key);
                if let Some(k) = entry.partition_key {
                    book.key_waiting.entry(k).or_default().insert((created, id));
                }
            }
            Slot::Holding => {
                book.holding.insert(id);
                if let Some(k) = entry.partition_key {
                    book.held_keys.insert(k);
                }
            }
        }
    }

    /// The waiting queued runs that may begin now within their queues' limits, at most
    /// `limit`, for `acquire` (see [`Store::acquire`]).
    fn admissible(
        &mut self,
        req: &AcquireRequest<'_>,
        leased: &[RunId],
        mut limit: usize,
    ) -> Vec<RunId> {
        let mut picked = Vec::new();
        for (name, book) in &mut self.books {
            if limit == 0 {
                break;
            }
            let Some(def) = self.queues.get(name) else {
                continue;
            };
            if book.waiting.is_empty() {
                continue;
            }
            let mut allowance = limit;
            if let Some(c) = def.concurrency {
                allowance = allowance.min((c as usize).saturating_sub(book.holding.len()));
            }
            if let Some((n, period)) = def.rate_limit {
                if let Some(since) = req.now.checked_sub(period) {
                    while book.begins.front().is_some_and(|t| *t <= since) {
                        book.begins.pop_front();
                    }
                }
                allowance = allowance.min((n as usize).saturating_sub(book.begins.len()));
            }
            for (_, _, id) in &book.waiting {
                if allowance == 0 {
                    break;
                }
                // Handed out by this acquire already (a waiting run past its deadline).
                if leased.contains(id) {
                    continue;
                }
                let Some(row) = self.runs.get(id) else {
                    continue;
                };
                let ready = row.wake_at <= req.now
                    && row.lease_until.is_none_or(|t| t <= req.now)
                    && req.workflows.contains(&row.record.workflow);
                if !ready {
                    continue;
                }
                if let Some(k) = row
                    .record
                    .queue
                    .as_ref()
                    .and_then(|q| q.partition_key.as_deref())
                {
                    let first = book
                        .key_waiting
                        .get(k)
                        .and_then(|w| w.first())
                        .map(|(_, first)| *first);
                    // Only a key's first waiting run may begin, once no run of the key holds
                    // a slot (so one per key and acquire).
                    if book.held_keys.contains(k) || first != Some(*id) {
                        continue;
                    }
                }
                picked.push(*id);
                allowance -= 1;
                limit -= 1;
            }
        }
        picked
    }

    fn held(&mut self, lease: &Lease) -> Result<&mut Row, StoreError> {
        self.runs
            .get_mut(&lease.run_id)
            .filter(|r| r.holds(lease))
            .ok_or(StoreError::LeaseLost(lease.run_id))
    }

    /// Admits `run` (claiming its start token); with `lease`, leased to the caller at once.
    fn admit(
        &mut self,
        run: NewRun,
        lease: Option<Duration>,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        let (id, created_at) = (run.id, run.created_at);
        // A queued run waits for its slot, which only `acquire` gives.
        let lease = lease.filter(|_| run.queue.is_none());
        if self.runs.contains_key(&run.id) {
            return Err(StoreError::database(format!(
                "run {} already exists",
                run.id
            )));
        }
        if let Some(hook) = &run.hook {
            if let Some(owner) = self
                .hooks
                .get(&hook.token)
                .filter(|h| h.taken(run.created_at))
            {
                return Ok((Admission::Conflict(owner.run_id), None));
            }
            self.hooks.insert(
                hook.token.clone(),
                HookRow {
                    run_id: run.id,
                    created_at: run.created_at,
                    active: true,
                    retain_until: hook.retain_until,
                },
            );
        }
        self.runs.insert(
            run.id,
            Row {
                record: RunRecord {
                    id: run.id,
                    workflow: run.workflow,
                    status: if lease.is_some() {
                        RunStatus::Running
                    } else {
                        RunStatus::Pending
                    },
                    input: run.input,
                    output: None,
                    error: None,
                    created_at: run.created_at,
                    updated_at: run.created_at,
                    hook_token: run.hook.map(|h| h.token),
                    deadline: run.deadline,
                    parent: run.parent.map(|p| p.run),
                    queue: run.queue,
                },
                events: Vec::new(),
                wake_at: run.created_at,
                epoch: u64::from(lease.is_some()),
                lease_until: lease.map(|l| after(created_at, l)),
                due_at: None,
                failed_tries: 0,
                blocked_tries: 0,
                streams: BTreeMap::new(),
                detached: run.parent.is_some_and(|p| p.detached),
                began_at: None,
                slot: Slot::Out,
            },
        );
        self.schedule(id);
        let lease = lease.map(|_| Lease {
            run_id: id,
            epoch: 1,
        });
        Ok((Admission::Admitted, lease))
    }

    /// Queues `payload` to the run whose active hook owns `token` and makes it due at `at`.
    fn resume(&mut self, token: &str, payload: Value, at: SystemTime) -> Option<(RunId, u64)> {
        let run = self.hooks.get(token).filter(|h| h.active)?.run_id;
        Some((run, self.queue(run, token, payload, at)))
    }

    /// Puts `payload` for `token` into `run`'s inbox and makes the run due at `at`; its id.
    fn queue(&mut self, run: RunId, token: &str, payload: Value, at: SystemTime) -> u64 {
        self.last_payload += 1;
        let id = self.last_payload;
        self.inbox.insert(
            id,
            (
                run,
                Payload {
                    id,
                    token: token.to_owned(),
                    payload,
                },
            ),
        );
        if let Some(r) = self.runs.get_mut(&run) {
            // A blocked run waits for a build that fits, not for payloads.
            if r.record.status != RunStatus::Blocked {
                r.wake_at = r.wake_at.min(at);
            }
        }
        self.schedule(run);
        id
    }

    /// Gives up `token` if `run` owns it: kept while retained, removed otherwise.
    fn release_token(&mut self, run: RunId, token: &str, now: SystemTime) {
        if let Some(h) = self.hooks.get_mut(token) {
            if h.run_id == run && h.active {
                h.active = false;
                if !h.taken(now) {
                    self.hooks.remove(token);
                }
            }
        }
    }

    /// Ends run `run` (the end event is the caller's): its status and result, no lease, out
    /// of the due set, every token it owns released.
    /// A child's end also reaches its parent's inbox as a [`ChildNotice`].
    fn end(&mut self, run: RunId, outcome: RunOutcome, status: RunStatus, now: SystemTime) {
        let parent = self.runs.get_mut(&run).and_then(|row| {
            row.record.status = status;
            let completed = matches!(outcome, RunOutcome::Completed(_));
            match outcome {
                RunOutcome::Completed(v) => row.record.output = Some(v),
                RunOutcome::Failed(e) => row.record.error = Some(e),
            }
            row.record.updated_at = now;
            row.lease_until = None;
            // Only a child's end is copied, into its parent's inbox.
            let parent = row.record.parent?;
            let notice = ChildNotice {
                child: run,
                status,
                output: if completed {
                    row.record.output.clone()
                } else {
                    None
                },
                error: if completed {
                    None
                } else {
                    row.record.error.clone()
                },
            };
            Some((parent, notice))
        });
        self.schedule(run);
        self.release_all(run, now);
        if let Some((p, notice)) = parent {
            if let Ok(notice) = serde_json::to_value(notice) {
                self.queue(p, CHILD_NOTICE_TOKEN, notice, now);
            }
        }
    }

    /// Cancels run `id` unless it ended, and then its children that are not detached, down
    /// the tree.
    fn cancel(&mut self, id: RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        let row = self.runs.get_mut(&id).ok_or(StoreError::RunNotFound(id))?;
        if row.record.status.is_terminal() {
            return Ok(CancelOutcome::AlreadyEnded(row.record.status));
        }
        row.push(now, Event::RunCancelled);
        self.end(
            id,
            RunOutcome::Failed(Error::cancelled(&id)),
            RunStatus::Cancelled,
            now,
        );
        let mut tree = self.children_to_cancel(id);
        while let Some(child) = tree.pop() {
            if let Some(row) = self.runs.get_mut(&child) {
                row.push(now, Event::RunCancelled);
            }
            let error = Error::cancelled_with_parent(&child, &id);
            self.end(child, RunOutcome::Failed(error), RunStatus::Cancelled, now);
            tree.extend(self.children_to_cancel(child));
        }
        Ok(CancelOutcome::Cancelled)
    }

    /// The children of `run` a cancellation of it reaches: not detached, not ended.
    fn children_to_cancel(&self, run: RunId) -> Vec<RunId> {
        self.runs
            .values()
            .filter(|r| {
                r.record.parent == Some(run) && !r.detached && !r.record.status.is_terminal()
            })
            .map(|r| r.record.id)
            .collect()
    }

    fn release_all(&mut self, run: RunId, now: SystemTime) {
        let tokens: Vec<String> = self
            .hooks
            .iter()
            .filter(|(_, h)| h.run_id == run && h.active)
            .map(|(t, _)| t.clone())
            .collect();
        for t in tokens {
            self.release_token(run, &t, now);
        }
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
        crate::lock(&self.state)
    }
}

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
            let queue = r.record.queue.as_ref().map(|q| q.name.clone());
            if let Some(q) = queue {
                if st.queues.get(&q).is_some_and(|d| d.rate_limit.is_some()) {
                    st.books.entry(q).or_default().begins.push_back(req.now);
                }
            }
            st.rebook(*id);
        }
        ready.extend(begin);
        let mut leased = Vec::with_capacity(ready.len());
        for id in ready {
            if let Some(r) = st.runs.get_mut(&id) {
                r.epoch += 1;
                r.lease_until = Some(after(req.now, req.lease));
                if r.record.status == RunStatus::Blocked {
                    // Tried again: the divergence is shown only while it blocks the run.
                    r.record.error = None;
                }
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

    async fn append(&self, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        let mut st = self.lock();
        let row = st.held(lease)?;
        let mut now = SystemTime::now();
        let mut received = Vec::new();
        for e in &write.events {
            now = e.at;
            if let Some(payload_id) = e.event.delivered_payload() {
                received.push(payload_id);
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

#[async_trait::async_trait]
impl HookStore for MemoryStore {
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: Value,
    ) -> Result<AdmitOrResume, StoreError> {
        let Some(token) = run.hook.as_ref().map(|h| h.token.clone()) else {
            return Err(super::no_token());
        };
        let at = run.created_at;
        let mut st = self.lock();
        match st.admit(run, lease)? {
            (Admission::Admitted, lease) => Ok(AdmitOrResume::Admitted(lease)),
            (Admission::Conflict(owner), _) => Ok(match st.resume(&token, payload, at) {
                Some((run, payload_id)) => AdmitOrResume::Resumed { run, payload_id },
                None => AdmitOrResume::Conflict(owner),
            }),
        }
    }

    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut st = self.lock();
        st.held(lease)?;
        let outcome = match st.hooks.get(token).filter(|h| h.taken(at)) {
            Some(owner) => ClaimOutcome::Conflict(owner.run_id),
            None => {
                st.hooks.insert(
                    token.to_owned(),
                    HookRow {
                        run_id: lease.run_id,
                        created_at: at,
                        active: true,
                        retain_until: None,
                    },
                );
                ClaimOutcome::Claimed
            }
        };
        let conflict = match outcome {
            ClaimOutcome::Claimed => None,
            ClaimOutcome::Conflict(owner) => Some(owner),
        };
        st.held(lease)?.push(
            at,
            Event::HookRegistered {
                hook_key: hook_key.to_owned(),
                token: token.to_owned(),
                conflict,
            },
        );
        Ok(outcome)
    }

    async fn resume_hook(
        &self,
        token: &str,
        payload: Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError> {
        Ok(self.lock().resume(token, payload, at))
    }

    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<Payload>, StoreError> {
        Ok(self
            .lock()
            .inbox
            .range(after.saturating_add(1)..)
            .filter(|(_, (r, _))| r == run)
            .map(|(_, (_, p))| p.clone())
            .collect())
    }

    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError> {
        Ok(self
            .lock()
            .inbox
            .range(after.saturating_add(1)..)
            .take(limit)
            .map(|(id, (run, _))| (*id, *run))
            .collect())
    }

    async fn last_payload_id(&self) -> Result<u64, StoreError> {
        Ok(self.lock().inbox.last_key_value().map_or(0, |(k, _)| *k))
    }

    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError> {
        Ok(self
            .lock()
            .hooks
            .get(token)
            .filter(|h| h.active)
            .map(|h| HookRecord {
                token: token.to_owned(),
                run_id: h.run_id,
                created_at: h.created_at,
            }))
    }

    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        let st = self.lock();
        let mut hooks: Vec<HookRecord> = st
            .hooks
            .iter()
            .filter(|(t, h)| {
                h.active
                    && filter.token.as_ref().is_none_or(|want| want == *t)
                    && filter.run_id.is_none_or(|run| run == h.run_id)
            })
            .map(|(t, h)| HookRecord {
                token: t.clone(),
                run_id: h.run_id,
                created_at: h.created_at,
            })
            .collect();
        hooks.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| a.token.cmp(&b.token))
        });
        hooks.truncate(filter.limit);
        Ok(hooks)
    }
}

#[async_trait::async_trait]
impl StreamStore for MemoryStore {
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let mut st = self.lock();
        let row = st.held(lease)?;
        let s = row.streams.entry(stream.to_owned()).or_default();
        if s.closed {
            return Ok(None);
        }
        let index = s.chunks.len() as u64;
        s.chunks.push(StoredChunk {
            index,
            attempt,
            at,
            value,
        });
        Ok(Some(index))
    }

    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        _at: SystemTime,
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        let row = st.held(lease)?;
        row.streams.entry(stream.to_owned()).or_default().closed = true;
        Ok(())
    }

    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        let st = self.lock();
        let Some(row) = st.runs.get(run) else {
            return Ok(StreamPage::default());
        };
        let mut page = StreamPage {
            run: Some(row.record.status),
            ..StreamPage::default()
        };
        if let Some(s) = row.streams.get(stream) {
            page.closed = s.closed;
            page.len = s.chunks.len() as u64;
            let from = usize::try_from(from).unwrap_or(usize::MAX);
            page.chunks = s.chunks.iter().skip(from).take(limit).cloned().collect();
        }
        Ok(page)
    }

    async fn list_streams(&self, run: &RunId) -> Result<Vec<StreamInfo>, StoreError> {
        let st = self.lock();
        Ok(st.runs.get(run).map_or_else(Vec::new, |row| {
            row.streams
                .iter()
                .map(|(name, s)| StreamInfo {
                    name: name.clone(),
                    len: s.chunks.len() as u64,
                    closed: s.closed,
                })
                .collect()
        }))
    }
}

#[async_trait::async_trait]
impl QueueStore for MemoryStore {
    async fn define_queues(&self, queues: &[QueueDef]) -> Result<(), StoreError> {
        let mut st = self.lock();
        for q in queues {
            st.queues.insert(q.name.clone(), q.clone());
        }
        Ok(())
    }

    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        let st = self.lock();
        let mut opening: Option<SystemTime> = None;
        for (name, book) in &st.books {
            let Some((n, period)) = st.queues.get(name).and_then(|d| d.rate_limit) else {
                continue;
            };
            if book.waiting.is_empty() {
                continue;
            }
            let since = now.checked_sub(period);
            let mut in_window = book.begins.iter().filter(|t| since.is_none_or(|s| **t > s));
            let count = in_window.clone().count();
            if count >= n as usize {
                if let Some(oldest) = in_window.next() {
                    let at = after(*oldest, period);
                    opening = Some(opening.map_or(at, |o| o.min(at)));
                }
            }
        }
        Ok(opening)
    }

    async fn list_queues(&self, now: SystemTime) -> Result<Vec<QueueInfo>, StoreError> {
        let st = self.lock();
        let mut queues: Vec<QueueInfo> = st
            .queues
            .values()
            .map(|def| {
                let book = st.books.get(&def.name);
                let since = def.rate_limit.and_then(|(_, p)| now.checked_sub(p));
                QueueInfo {
                    def: def.clone(),
                    occupied: book.map_or(0, |b| b.holding.len() as u64),
                    waiting: book.map_or(0, |b| b.waiting.len() as u64),
                    begun_in_window: match (book, def.rate_limit) {
                        (Some(b), Some(_)) => b
                            .begins
                            .iter()
                            .filter(|t| since.is_none_or(|s| **t > s))
                            .count() as u64,
                        _ => 0,
                    },
                }
            })
            .collect();
        queues.sort_by(|a, b| a.def.name.cmp(&b.def.name));
        Ok(queues)
    }
}

#[async_trait::async_trait]
impl AdminStore for MemoryStore {
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let st = self.lock();
        let cursor = match filter.after {
            Some(id) => {
                let run = st.runs.get(&id).ok_or(StoreError::RunNotFound(id))?;
                Some((run.record.created_at, id))
            }
            None => None,
        };
        let mut runs: Vec<&RunRecord> = st
            .runs
            .values()
            .map(|r| &r.record)
            .filter(|r| filter.created_after.is_none_or(|t| r.created_at >= t))
            .filter(|r| filter.created_before.is_none_or(|t| r.created_at < t))
            .filter(|r| cursor.is_none_or(|c| (r.created_at, r.id) < c))
            .filter(|r| filter.status.is_none_or(|s| r.status == s))
            .filter(|r| filter.workflow.as_ref().is_none_or(|w| &r.workflow == w))
            .filter(|r| filter.parent.is_none_or(|p| r.parent == Some(p)))
            .filter(|r| {
                filter
                    .queue
                    .as_ref()
                    .is_none_or(|q| r.queue.as_ref().is_some_and(|e| &e.name == q))
            })
            .collect();
        runs.sort_by_key(|r| std::cmp::Reverse((r.created_at, r.id)));
        Ok(runs.into_iter().take(filter.limit).cloned().collect())
    }

    async fn prune(
        &self,
        ended_before: SystemTime,
        now: SystemTime,
    ) -> Result<PruneStats, StoreError> {
        let mut st = self.lock();
        let retaining: HashSet<RunId> = st
            .hooks
            .values()
            .filter(|h| h.retain_until.is_some_and(|t| t > now))
            .map(|h| h.run_id)
            .collect();
        let doomed: HashSet<RunId> = st
            .runs
            .iter()
            .filter(|(id, row)| {
                row.record.status.is_terminal()
                    && row.record.updated_at < ended_before
                    && !retaining.contains(*id)
            })
            .map(|(id, _)| *id)
            .collect();
        let mut stats = PruneStats::default();
        for id in &doomed {
            if let Some(row) = st.runs.remove(id) {
                stats.runs += 1;
                stats.events += row.events.len() as u64;
            }
        }
        st.hooks.retain(|_, h| !doomed.contains(&h.run_id));
        st.inbox.retain(|_, (run, _)| !doomed.contains(run));
        Ok(stats)
    }
}

/// What the conformance suite reads below the [`Store`] API, from this store's state.
#[cfg(any(test, feature = "testing"))]
impl crate::testing::store::Inspect for MemoryStore {
    async fn count(&self, table: &str) -> i64 {
        let st = self.lock();
        let n = match table {
            "runs" => st.runs.len(),
            "events" => st.runs.values().map(|r| r.events.len()).sum(),
            "hooks" => st.hooks.len(),
            "hook_inbox" => st.inbox.len(),
            "streams" => st.runs.values().map(|r| r.streams.len()).sum(),
            "stream_chunks" => st
                .runs
                .values()
                .flat_map(|r| r.streams.values())
                .map(|s| s.chunks.len())
                .sum(),
            other => panic!("the memory store keeps no table `{other}`"),
        };
        i64::try_from(n).expect("a count fits in i64")
    }

    async fn wake_at(&self, run: RunId) -> SystemTime {
        match self.lock().runs.get(&run) {
            Some(r) => r.wake_at,
            None => panic!("the memory store holds no run {run}"),
        }
    }

    async fn event_kinds(&self, _run: RunId) -> Option<Vec<String>> {
        // Events are kept as values: there is no `kind` to query.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::store::conformance_tests;

    // Not run here: `compared` (this store is the reference the others are compared with), and
    // `damage` (this store keeps decoded values, so nothing in it can be undecodable).
    conformance_tests! {
        groups: [contract, inspect],
        one: {
            let store = MemoryStore::new();
        } => store,
        shared: {
            // Clones share one state, as workers in one process do.
            let a = MemoryStore::new();
            let stores = [a.clone(), a.clone(), a];
        } => stores,
    }
}
