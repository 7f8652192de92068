//! The memory store's state under its one mutex: runs with their events, streams and queue
//! slots, hooks, the hook inbox and the queues' books, and the operations that keep them in
//! step. Every operation validates before it mutates, so a panic never leaves a half-applied
//! change. It knows nothing of locking or of the capability traits' async surface.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::error::{Error, StoreError};
use crate::history::after;
use crate::ids::RunId;
use crate::store::{
    AcquireRequest, Admission, CancelOutcome, ChildNotice, Event, EventRecord, Inbound, InboxEntry,
    Lease, NewRun, QueueDef, RunOutcome, RunRecord, RunStatus, ScheduleDef, StoredChunk,
    TickRecord,
};

#[derive(Default)]
pub(super) struct State {
    pub(super) runs: HashMap<RunId, Row>,
    /// The runs that have not ended, by wake time, the order `acquire` hands them out in. It
    /// reads only the prefix that is due, where it skips runs under a live lease; suspended
    /// runs wake far ahead, so it costs the same with 100,000 of them as with ten.
    pub(super) due: BTreeSet<(SystemTime, RunId)>,
    pub(super) hooks: HashMap<String, HookRow>,
    /// Every payload by id: (run, payload).
    pub(super) inbox: BTreeMap<u64, (RunId, InboxEntry)>,
    /// The last payload id handed out: pruning deletes payloads, and their ids must never
    /// come back (a worker's cursor may already be past them).
    pub(super) last_payload: u64,
    /// Declared queues by name, with their concurrency and rate limits.
    pub(super) queues: HashMap<String, QueueDef>,
    /// What each queue holds, kept in step with the runs by [`State::schedule`].
    pub(super) books: BTreeMap<String, QueueBook>,
    /// Schedules by name, with their tick records (`schedules.rs`).
    pub(super) schedules: BTreeMap<String, ScheduleRow>,
}

/// The runs of one queue that have not ended: those waiting to begin, in the order they
/// may, and those holding a slot.
#[derive(Default)]
pub(super) struct QueueBook {
    /// Waiting runs: higher priority first, then start order.
    pub(super) waiting: BTreeSet<(Reverse<i32>, SystemTime, RunId)>,
    /// Waiting runs of each partition key, in start order: only the first may begin.
    pub(super) key_waiting: HashMap<String, BTreeSet<(SystemTime, RunId)>>,
    /// Runs begun and not ended.
    pub(super) holding: HashSet<RunId>,
    /// The partition keys of the holding runs.
    pub(super) held_keys: HashSet<String>,
    /// When runs of the queue began, oldest first, trimmed to the rate window.
    pub(super) begins: VecDeque<SystemTime>,
}

/// Where a run stands in its queue.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// Not in a queue, or ended.
    Out,
    Waiting,
    Holding,
}

pub(super) struct Row {
    pub(super) record: RunRecord,
    pub(super) events: Vec<EventRecord>,
    pub(super) wake_at: SystemTime,
    pub(super) epoch: u64,
    pub(super) lease_until: Option<SystemTime>,
    /// This run's key in [`State::due`], if it is there.
    pub(super) due_at: Option<SystemTime>,
    /// Tries in a row that ended in [`Store::record_failure`].
    pub(super) failed_tries: u32,
    /// Blocks in a row ([`Store::block`]).
    pub(super) blocked_tries: u32,
    /// Started with `.detached()`: a cancellation of its parent does not reach it.
    pub(super) detached: bool,
    /// Its streams by name; they go with the run when it is pruned.
    pub(super) streams: BTreeMap<String, StreamRow>,
    /// When a queued run first began (was leased within its queue's limits).
    pub(super) began_at: Option<SystemTime>,
    /// Where [`State::books`] lists it.
    pub(super) slot: Slot,
    /// The idempotency keys of the messages sent to it, with each message's inbox id.
    pub(super) message_keys: HashMap<String, u64>,
    /// The latest value of each key it published (`set_event`).
    pub(super) published: BTreeMap<String, Value>,
    /// The requests sent to it, by id, and the ids of those sent with an idempotency key.
    pub(super) requests: BTreeMap<u64, RequestRow>,
    pub(super) request_keys: HashMap<String, u64>,
}

/// A request sent to a run (`run.request`), kept for its reply.
pub(super) struct RequestRow {
    pub(super) name: String,
    pub(super) key: Option<String>,
    pub(super) at: SystemTime,
    /// The workflow's reply, once recorded.
    pub(super) reply: Option<Result<Value, crate::error::Error>>,
}

#[derive(Default)]
pub(super) struct StreamRow {
    pub(super) chunks: Vec<StoredChunk>,
    pub(super) closed: bool,
}

impl Row {
    /// Where the run belongs in its queue's book now.
    pub(super) fn wanted_slot(&self) -> Slot {
        match (&self.record.queue, self.began_at) {
            (None, _) => Slot::Out,
            _ if self.record.status.is_terminal() => Slot::Out,
            (Some(_), None) => Slot::Waiting,
            (Some(_), Some(_)) => Slot::Holding,
        }
    }
}

pub(super) struct HookRow {
    pub(super) run_id: RunId,
    /// Inherited by the run that continued a chain (`continue_as_new`) and not claimed by it
    /// since: its first claim binds.
    pub(super) inherited: bool,
    pub(super) created_at: SystemTime,
    pub(super) active: bool,
    pub(super) retain_until: Option<SystemTime>,
}

impl HookRow {
    /// Whether the token is unavailable to others at `at`.
    pub(super) fn taken(&self, at: SystemTime) -> bool {
        self.active || self.retain_until.is_some_and(|t| t > at)
    }
}

impl Row {
    pub(super) fn holds(&self, lease: &Lease) -> bool {
        self.epoch == lease.epoch
            && self.lease_until.is_some()
            && self.record.status == RunStatus::Running
    }

    pub(super) fn push(&mut self, at: SystemTime, event: Event) {
        let seq = self.events.len() as u64 + 1;
        self.events.push(EventRecord { seq, at, event });
    }
}

impl State {
    /// Puts run `id` where it belongs in [`State::due`] after a change of its status or wake
    /// time.
    pub(super) fn schedule(&mut self, id: RunId) {
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
    pub(super) fn rebook(&mut self, id: RunId) {
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
    pub(super) fn admissible(
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

    pub(super) fn held(&mut self, lease: &Lease) -> Result<&mut Row, StoreError> {
        self.runs
            .get_mut(&lease.run_id)
            .filter(|r| r.holds(lease))
            .ok_or(StoreError::LeaseLost(lease.run_id))
    }

    /// Whether a run of partition key `key` admitted into queue `queue` at `now` may take a
    /// slot at once: the queue is declared, none of its runs waits to begin (nobody is
    /// overtaken), a slot and the rate window are free, and no run of the key holds a slot.
    fn queue_room(&mut self, queue: &str, key: Option<&str>, now: SystemTime) -> bool {
        let Some(def) = self.queues.get(queue) else {
            return false;
        };
        let Some(book) = self.books.get_mut(queue) else {
            return def.concurrency != Some(0) && def.rate_limit.is_none_or(|(n, _)| n > 0);
        };
        if !book.waiting.is_empty() {
            return false;
        }
        if def
            .concurrency
            .is_some_and(|c| book.holding.len() >= c as usize)
        {
            return false;
        }
        if let Some((n, period)) = def.rate_limit {
            if let Some(since) = now.checked_sub(period) {
                while book.begins.front().is_some_and(|t| *t <= since) {
                    book.begins.pop_front();
                }
            }
            if book.begins.len() >= n as usize {
                return false;
            }
        }
        key.is_none_or(|k| !book.held_keys.contains(k))
    }

    /// Counts run `id`'s begin at `at` in its queue's rate window, if the queue has one.
    pub(super) fn count_begin(&mut self, id: RunId, at: SystemTime) {
        let queue = self
            .runs
            .get(&id)
            .and_then(|r| r.record.queue.as_ref())
            .map(|q| q.name.clone());
        if let Some(q) = queue {
            if self.queues.get(&q).is_some_and(|d| d.rate_limit.is_some()) {
                self.books.entry(q).or_default().begins.push_back(at);
            }
        }
    }

    /// Admits `run` (claiming its start token); with `lease`, leased to the caller at once.
    pub(super) fn admit(
        &mut self,
        run: NewRun,
        lease: Option<Duration>,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        let (id, created_at) = (run.id, run.created_at);
        // A queued run waits for its slot, which `acquire` gives, unless the worker admitting
        // it would lease it and its queue has room now (as the SQL stores decide it); a delayed
        // run waits for its time.
        let begin = lease.is_some()
            && !run.delayed()
            && run.hook.is_none()
            && !self.runs.contains_key(&run.id)
            && run
                .queue
                .as_ref()
                .is_some_and(|q| self.queue_room(&q.name, q.partition_key.as_deref(), created_at));
        let lease = lease.filter(|_| !run.delayed() && (run.queue.is_none() || begin));
        let wake_at = run.first_wake();
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
                    inherited: false,
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
                    trace_context: run.trace_context,
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
                    start_at: run.start_at,
                    version: run.version,
                    previous_run: None,
                    next_run: None,
                    origin: None,
                },
                events: Vec::new(),
                wake_at,
                epoch: u64::from(lease.is_some()),
                lease_until: lease.map(|l| after(created_at, l)),
                due_at: None,
                failed_tries: 0,
                blocked_tries: 0,
                streams: BTreeMap::new(),
                detached: run.parent.is_some_and(|p| p.detached),
                began_at: begin.then_some(created_at),
                slot: Slot::Out,
                message_keys: HashMap::new(),
                published: BTreeMap::new(),
                requests: BTreeMap::new(),
                request_keys: HashMap::new(),
            },
        );
        if begin {
            self.count_begin(id, created_at);
        }
        self.schedule(id);
        let lease = lease.map(|_| Lease::admitted(id));
        Ok((Admission::Admitted, lease))
    }

    /// Queues `payload` to the run whose active hook owns `token` and makes it due at `at`.
    pub(super) fn resume(
        &mut self,
        token: &str,
        payload: Value,
        at: SystemTime,
    ) -> Option<(RunId, u64)> {
        let run = self.hooks.get(token).filter(|h| h.active)?.run_id;
        let what = Inbound::Hook {
            token: token.to_owned(),
            payload,
        };
        Some((run, self.queue(run, what, at)))
    }

    /// Puts `what` into `run`'s inbox and makes the run due at `at`; its id.
    pub(super) fn queue(&mut self, run: RunId, what: Inbound, at: SystemTime) -> u64 {
        self.last_payload += 1;
        let id = self.last_payload;
        self.inbox.insert(id, (run, InboxEntry { id, what }));
        if let Some(r) = self.runs.get_mut(&run) {
            // A blocked run waits for a build that fits, not for payloads.
            // A delayed run waits for its start, payloads or not.
            if r.record.status != RunStatus::Blocked {
                let woken = r.wake_at.min(at);
                r.wake_at = r.record.start_at.map_or(woken, |start| woken.max(start));
            }
        }
        self.schedule(run);
        id
    }

    /// Gives up `token` if `run` owns it: kept while retained, removed otherwise.
    pub(super) fn release_token(&mut self, run: RunId, token: &str, now: SystemTime) {
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
    pub(super) fn end(
        &mut self,
        run: RunId,
        outcome: RunOutcome,
        status: RunStatus,
        now: SystemTime,
    ) {
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
                // The parent awaits the chain's first run.
                child: row.record.origin.unwrap_or(run),
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
            self.queue(p, Inbound::ChildEnded(notice), now);
        }
    }

    /// Cancels run `id` unless it ended, and then its children that are not detached, down
    /// the tree.
    pub(super) fn cancel(
        &mut self,
        id: RunId,
        now: SystemTime,
    ) -> Result<CancelOutcome, StoreError> {
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
    pub(super) fn children_to_cancel(&self, run: RunId) -> Vec<RunId> {
        self.runs
            .values()
            .filter(|r| {
                r.record.parent == Some(run) && !r.detached && !r.record.status.is_terminal()
            })
            .map(|r| r.record.id)
            .collect()
    }

    pub(super) fn release_all(&mut self, run: RunId, now: SystemTime) {
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

/// A schedule under the store's lock (its methods are in `schedules.rs`).
pub(super) struct ScheduleRow {
    pub(super) def: ScheduleDef,
    pub(super) paused: bool,
    pub(super) next: Option<SystemTime>,
    /// Its tick records by nominal time.
    pub(super) ticks: BTreeMap<SystemTime, TickRecord>,
}

impl ScheduleRow {
    /// The ticks whose run `old` continued as `next` now name `next`: the chain is the
    /// tick's run (the overlap policy sees it running).
    pub(super) fn repoint_ticks(&mut self, old: RunId, next: RunId) {
        for t in self.ticks.values_mut() {
            if t.run_id == Some(old) {
                t.run_id = Some(next);
            }
        }
    }
}
