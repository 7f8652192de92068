//! Continue-as-new in memory: the run's last events, its end as `continued_as_new` and the
//! admission of the run that carries on, under the one lock (see
//! [`RunStore::continue_as_new`](crate::store::RunStore::continue_as_new)). What the next run
//! inherits is listed once, in [`State::continue_run`].

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use super::state::{Row, Slot, State};
use super::MemoryStore;
use crate::error::StoreError;

use crate::store::{
    check_continuation, Append, Inbound, Lease, LeasedRun, NewRun, RunRecord, RunStatus,
};

impl MemoryStore {
    /// [`RunStore::continue_as_new`](crate::store::RunStore::continue_as_new), the next run
    /// leased to the caller when `leased` (then returned).
    pub(super) fn continue_chain(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
        leased: bool,
    ) -> Result<Option<LeasedRun>, StoreError> {
        check_continuation(write, &next)?;
        let mut st = self.lock();
        st.held(lease)?;
        if st.runs.contains_key(&next.id) {
            return Err(StoreError::database(format!(
                "run {} already exists",
                next.id
            )));
        }
        let now = super::runs::record(&mut st, lease, write)?;
        let next_id = next.id;
        let admitted = st.continue_run(lease, next, now, leased)?;
        for entry in &write.carried {
            let inherited = match &entry.what {
                Inbound::Hook { token, .. } => st
                    .hooks
                    .get(token)
                    .is_some_and(|h| h.active && h.run_id == next_id),
                _ => true,
            };
            if inherited {
                st.inbox.insert(entry.id, (next_id, entry.clone()));
            }
        }
        Ok(admitted)
    }
}

impl State {
    /// Ends run `old` (held by `lease`, its last events already pushed) as continued by
    /// `next`, and admits `next` holding everything the chain keeps: leased under the same
    /// lease (epoch 1, until the old run's lease ends) when `leased`, and then returned.
    /// Validates before it mutates.
    pub(super) fn continue_run(
        &mut self,
        lease: &Lease,
        next: NewRun,
        now: SystemTime,
        leased: bool,
    ) -> Result<Option<LeasedRun>, StoreError> {
        let old = lease.run_id;
        if self.runs.contains_key(&next.id) {
            return Err(StoreError::database(format!(
                "run {} already exists",
                next.id
            )));
        }
        let row = self.held(lease)?;
        let lease_until = row.lease_until.filter(|_| leased);
        row.record.status = RunStatus::ContinuedAsNew;
        row.record.next_run = Some(next.id);
        row.record.updated_at = now;
        row.lease_until = None;
        let prev = row.record.clone();
        // Inherited: the start token (shown on the record), the deadline, the parent, the
        // queue entry with its slot (`began_at`), the version, the chain's origin, the
        // messages' idempotency keys, the requests not replied to yet and the trace context.
        let began_at = row.began_at;
        let detached = row.detached;
        let origin = row.record.origin.unwrap_or(old);
        let message_keys = std::mem::take(&mut row.message_keys);
        let published = row.published.clone();
        let open: Vec<u64> = row
            .requests
            .iter()
            .filter(|(_, r)| r.reply.is_none())
            .map(|(id, _)| *id)
            .collect();
        let mut requests = BTreeMap::new();
        for id in open {
            if let Some(r) = row.requests.remove(&id) {
                if let Some(k) = &r.key {
                    row.request_keys.remove(k);
                }
                requests.insert(id, r);
            }
        }
        let request_keys: HashMap<String, u64> = requests
            .iter()
            .filter_map(|(id, r)| r.key.clone().map(|k| (k, *id)))
            .collect();
        self.runs.insert(
            next.id,
            Row {
                record: RunRecord {
                    id: next.id,
                    workflow: next.workflow,
                    status: if lease_until.is_some() {
                        RunStatus::Running
                    } else {
                        RunStatus::Pending
                    },
                    input: next.input,
                    output: None,
                    error: None,
                    created_at: now,
                    updated_at: now,
                    hook_token: prev.hook_token.clone(),
                    deadline: prev.deadline,
                    parent: prev.parent,
                    queue: prev.queue.clone(),
                    start_at: None,
                    version: prev.version.clone(),
                    previous_run: Some(old),
                    next_run: None,
                    origin: Some(origin),
                    trace_context: prev.trace_context.clone(),
                },
                events: Vec::new(),
                wake_at: now,
                epoch: u64::from(lease_until.is_some()),
                lease_until,
                due_at: None,
                failed_tries: 0,
                blocked_tries: 0,
                detached,
                streams: BTreeMap::new(),
                began_at,
                slot: Slot::Out,
                message_keys,
                published,
                requests,
                request_keys,
            },
        );
        // The old run leaves its queue book before the next one enters it, so the slot
        // changes hands without ever being free.
        self.schedule(old);
        self.schedule(next.id);
        // Hook tokens change owner without a release; unreceived payloads, messages and
        // requests move to the next run's inbox in their order (children's ends stay: the
        // children are the old run's).
        for h in self.hooks.values_mut() {
            if h.run_id == old && h.active {
                h.run_id = next.id;
                h.inherited = true;
            }
        }
        for (run, entry) in self.inbox.values_mut() {
            if *run == old && !matches!(entry.what, Inbound::ChildEnded(_)) {
                *run = next.id;
            }
        }
        for s in self.schedules.values_mut() {
            s.repoint_ticks(old, next.id);
        }
        let Some(row) = self.runs.get(&next.id).filter(|_| lease_until.is_some()) else {
            return Ok(None);
        };
        Ok(Some(LeasedRun::admitted(row.record.clone())))
    }
}
