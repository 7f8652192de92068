//! Continue-as-new in memory: the run's last events, its end as `continued_as_new` and the
//! admission of the run that carries on, under the one lock (see
//! [`RunStore::continue_as_new`](crate::store::RunStore::continue_as_new)). What the next run
//! inherits is listed once, in [`State::continue_run`].

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use super::state::{Row, Slot, State};
use crate::error::StoreError;

use crate::store::{Inbound, Lease, NewRun, RunRecord, RunStatus};

impl State {
    /// Ends run `old` (held by `lease`, its last events already pushed) as continued by
    /// `next`, and admits `next` holding everything the chain keeps. Validates before it
    /// mutates.
    pub(super) fn continue_run(
        &mut self,
        lease: &Lease,
        next: NewRun,
        now: SystemTime,
    ) -> Result<(), StoreError> {
        let old = lease.run_id;
        if self.runs.contains_key(&next.id) {
            return Err(StoreError::database(format!(
                "run {} already exists",
                next.id
            )));
        }
        let row = self.held(lease)?;
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
        let origin = row.origin.unwrap_or(old);
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
                    status: RunStatus::Pending,
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
                    trace_context: prev.trace_context.clone(),
                },
                events: Vec::new(),
                wake_at: now,
                epoch: 0,
                lease_until: None,
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
                origin: Some(origin),
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
        Ok(())
    }
}
