//! The outputs of runs that completed in this process, for `return_value` calls made after
//! their end: a completed run never changes again (`retry` re-opens failed and blocked runs
//! only), so such a call needs no read. The caller of a duplicate start, handed the owner's id,
//! is the usual one.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;

use crate::ids::RunId;
use crate::store::RunOutcome;

/// Outputs kept at most.
const ENTRIES: usize = 4096;
/// Bytes of JSON kept at most, all outputs together.
const BYTES: usize = 4 << 20;
/// An output larger than this is not kept (it would push out many small ones).
const ENTRY_BYTES: usize = 64 << 10;

/// Bounded in entries and bytes; the oldest go first.
#[derive(Default)]
pub(crate) struct Completed {
    order: VecDeque<RunId>,
    outputs: HashMap<RunId, (Arc<RunOutcome>, usize)>,
    bytes: usize,
}

impl Completed {
    /// Keeps `outcome` of run `id` if it completed and its output is small.
    pub(crate) fn keep(&mut self, id: RunId, outcome: &Arc<RunOutcome>) {
        let RunOutcome::Completed(output) = &**outcome else {
            return;
        };
        let Some(size) = json_size(output, ENTRY_BYTES) else {
            return;
        };
        if self.outputs.insert(id, (outcome.clone(), size)).is_some() {
            return;
        }
        self.order.push_back(id);
        self.bytes += size;
        while self.order.len() > ENTRIES || self.bytes > BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, size)) = self.outputs.remove(&oldest) {
                self.bytes -= size;
            }
        }
    }

    /// The output of run `id`, if it completed here and is still kept.
    pub(crate) fn output(&self, id: &RunId) -> Option<Value> {
        match self.outputs.get(id).map(|(outcome, _)| &**outcome) {
            Some(RunOutcome::Completed(v)) => Some(v.clone()),
            _ => None,
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

    fn completed(v: Value) -> Arc<RunOutcome> {
        Arc::new(RunOutcome::Completed(v))
    }

    #[test]
    fn keeps_completed_outputs_only() {
        let mut c = Completed::default();
        let (done, failed) = (RunId::new(), RunId::new());
        c.keep(done, &completed(serde_json::json!({"total": 3})));
        c.keep(
            failed,
            &Arc::new(RunOutcome::Failed(crate::Error::fatal("no"))),
        );
        assert_eq!(c.output(&done), Some(serde_json::json!({"total": 3})));
        assert_eq!(c.output(&failed), None);
    }

    #[test]
    fn the_oldest_go_first_and_large_outputs_are_not_kept() {
        let mut c = Completed::default();
        let ids: Vec<RunId> = (0..ENTRIES + 1).map(|_| RunId::new()).collect();
        for (i, id) in ids.iter().enumerate() {
            c.keep(*id, &completed(Value::from(i)));
        }
        assert_eq!(c.output(&ids[0]), None);
        assert_eq!(c.output(&ids[ENTRIES]), Some(Value::from(ENTRIES)));
        let big = RunId::new();
        c.keep(big, &completed(Value::String("x".repeat(ENTRY_BYTES + 1))));
        assert_eq!(c.output(&big), None);
        // Bytes bound: outputs near the entry limit push out the older ones.
        let near: Vec<RunId> = (0..BYTES / ENTRY_BYTES + 2).map(|_| RunId::new()).collect();
        for id in &near {
            c.keep(*id, &completed(Value::String("y".repeat(ENTRY_BYTES - 10))));
        }
        assert!(c.bytes <= BYTES);
        assert_eq!(c.output(&near[0]), None);
        assert!(c.output(&near[near.len() - 1]).is_some());
    }
}
