//! The outputs of runs that completed in this process, for `return_value` calls made after
//! their end, answered without a read while the answer cannot have changed in the store: a
//! completed run never changes again (`retry` re-opens failed and blocked runs only), but
//! `prune` may delete it, from any process, and a pruned run is not found. Only a run whose
//! start token is retained (`min_retention`) is safe from pruning until its retention ends,
//! so only such runs are remembered, and only until shortly before then. The caller of a
//! duplicate start, handed the owner's id, is the usual one.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use foldhash::HashMap;
use serde_json::Value;

use super::Told;
use crate::ids::RunId;
use crate::store::RunOutcome;

/// Outputs kept at most (and as many runs awaiting their end).
const ENTRIES: usize = 4096;
/// Bytes of JSON kept at most, all outputs together.
const BYTES: usize = 4 << 20;
/// An output larger than this is not kept (it would push out many small ones).
const ENTRY_BYTES: usize = 64 << 10;
/// An output is answered from here only until this long before its run's retention ends,
/// so that a prune by a process whose clock runs a little ahead still finds it retained.
const MARGIN: Duration = Duration::from_secs(1);

/// Bounded in entries and bytes; the oldest go first.
#[derive(Default)]
pub(crate) struct Completed {
    /// Runs admitted here whose token is retained, until when, waiting for their end.
    retained: HashMap<RunId, SystemTime>,
    retained_order: VecDeque<RunId>,
    order: VecDeque<RunId>,
    outputs: HashMap<RunId, Kept>,
    bytes: usize,
}

/// One remembered output.
struct Kept {
    /// The end as its driver told it here (shared with the run's waiters).
    told: Arc<Told>,
    size: usize,
    /// When its run's token retention ends: no prune deletes the run before.
    retained_until: SystemTime,
}

impl Completed {
    /// Run `id`, admitted here, keeps its token until `until` whatever its end: no prune
    /// deletes it before then, so its output may be remembered once it completes.
    pub(crate) fn retained(&mut self, id: RunId, until: SystemTime) {
        if self.retained.insert(id, until).is_some() {
            return;
        }
        self.retained_order.push_back(id);
        while self.retained_order.len() > ENTRIES {
            if let Some(oldest) = self.retained_order.pop_front() {
                self.retained.remove(&oldest);
            }
        }
    }

    /// Keeps `outcome` of run `id` if it completed, its token is retained (see
    /// [`Completed::retained`]) and its output is small.
    pub(crate) fn keep(&mut self, id: RunId, told: &Arc<Told>) {
        let Some(retained_until) = self.retained.remove(&id) else {
            return;
        };
        let RunOutcome::Completed(output) = &told.outcome else {
            return;
        };
        let Some(size) = json_size(output, ENTRY_BYTES) else {
            return;
        };
        let kept = Kept {
            told: told.clone(),
            size,
            retained_until,
        };
        if self.outputs.insert(id, kept).is_some() {
            return;
        }
        self.order.push_back(id);
        self.bytes += size;
        while self.order.len() > ENTRIES || self.bytes > BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(kept) = self.outputs.remove(&oldest) {
                self.bytes -= kept.size;
            }
        }
    }

    /// The output of run `id`, if it completed here, is still kept, and its retention (so
    /// the run itself) lasts beyond `now`.
    pub(crate) fn output(&self, id: &RunId, now: SystemTime) -> Option<Value> {
        let kept = self.outputs.get(id)?;
        if now
            .checked_add(MARGIN)
            .is_none_or(|t| t >= kept.retained_until)
        {
            return None;
        }
        match &kept.told.outcome {
            RunOutcome::Completed(v) => Some(v.clone()),
            RunOutcome::Failed(_) => None,
        }
    }
}

/// About the size of `v` as JSON, or `None` when over `limit` (counted no further).
fn json_size(v: &Value, limit: usize) -> Option<usize> {
    let mut size = 0;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        size += match v {
            Value::Null | Value::Bool(_) => 5,
            Value::Number(_) => 20,
            Value::String(s) => s.len() + 2,
            Value::Array(items) => {
                stack.extend(items);
                items.len() + 2
            }
            Value::Object(fields) => {
                for (k, v) in fields {
                    size += k.len() + 4;
                    stack.push(v);
                }
                2
            }
        };
        if size > limit {
            return None;
        }
    }
    Some(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(outcome: RunOutcome) -> Arc<Told> {
        Arc::new(Told {
            outcome,
            plain: None,
        })
    }

    fn completed(v: Value) -> Arc<Told> {
        told(RunOutcome::Completed(v))
    }

    fn hour_after(t: SystemTime) -> SystemTime {
        t + Duration::from_secs(3600)
    }

    #[test]
    fn keeps_completed_outputs_of_retained_runs_only() {
        let mut c = Completed::default();
        let now = SystemTime::now();
        let (done, failed, unretained) = (RunId::new(), RunId::new(), RunId::new());
        c.retained(done, hour_after(now));
        c.retained(failed, hour_after(now));
        c.keep(done, &completed(serde_json::json!({"total": 3})));
        c.keep(failed, &told(RunOutcome::Failed(crate::Error::fatal("no"))));
        c.keep(unretained, &completed(Value::from(1)));
        assert_eq!(c.output(&done, now), Some(serde_json::json!({"total": 3})));
        assert_eq!(c.output(&failed, now), None);
        assert_eq!(c.output(&unretained, now), None, "a prune may delete it");
    }

    #[test]
    fn an_output_is_answered_only_well_before_the_retention_ends() {
        let mut c = Completed::default();
        let now = SystemTime::now();
        let id = RunId::new();
        c.retained(id, now + Duration::from_secs(10));
        c.keep(id, &completed(Value::from(1)));
        assert_eq!(c.output(&id, now), Some(Value::from(1)));
        assert_eq!(c.output(&id, now + Duration::from_secs(9)), None);
        assert_eq!(c.output(&id, now + Duration::from_secs(11)), None);
    }

    #[test]
    fn the_oldest_go_first_and_large_outputs_are_not_kept() {
        let mut c = Completed::default();
        let now = SystemTime::now();
        let keep = |c: &mut Completed, id: RunId, v: Value| {
            c.retained(id, hour_after(now));
            c.keep(id, &completed(v));
        };
        let ids: Vec<RunId> = (0..ENTRIES + 1).map(|_| RunId::new()).collect();
        for (i, id) in ids.iter().enumerate() {
            keep(&mut c, *id, Value::from(i));
        }
        assert_eq!(c.output(&ids[0], now), None);
        assert_eq!(c.output(&ids[ENTRIES], now), Some(Value::from(ENTRIES)));
        let big = RunId::new();
        keep(&mut c, big, Value::String("x".repeat(ENTRY_BYTES + 1)));
        assert_eq!(c.output(&big, now), None);
        // Bytes bound: outputs near the entry limit push out the older ones.
        let near: Vec<RunId> = (0..BYTES / ENTRY_BYTES + 2).map(|_| RunId::new()).collect();
        for id in &near {
            keep(&mut c, *id, Value::String("y".repeat(ENTRY_BYTES - 10)));
        }
        assert!(c.bytes <= BYTES);
        assert_eq!(c.output(&near[0], now), None);
        assert!(c.output(&near[near.len() - 1], now).is_some());
        // Runs waiting for their end are bounded too.
        let waiting: Vec<RunId> = (0..ENTRIES + 1).map(|_| RunId::new()).collect();
        for id in &waiting {
            c.retained(*id, hour_after(now));
        }
        assert!(c.retained.len() <= ENTRIES);
        c.keep(waiting[0], &completed(Value::from(0)));
        assert_eq!(c.output(&waiting[0], now), None, "forgotten before its end");
    }
}
