//! Children a run shares with another run: a fork's copy keeps the children its original
//! started before the cut (their `ChildStarted` events are in its history), but their ends
//! reach the original's inbox only. The driver reads such an end from the child's record and
//! hands it in here; from then on it is delivered and recorded like an end from the inbox.

use serde_json::Value;

use super::{Key, Replay};
use crate::error::Error;
use crate::ids::RunId;

/// The inbox id recorded with a child's end that was read from the child's record rather
/// than from this run's inbox (inbox ids start at 1).
const READ_FROM_RECORD: u64 = 0;

impl<S> Replay<S> {
    /// The children whose end the workflow waits for, with neither a recorded end nor one
    /// read from the inbox.
    pub(crate) fn unread_child_ends(&self) -> Vec<RunId> {
        self.waiting
            .iter()
            .filter_map(|key| match key {
                Key::ChildEnd(id)
                    if !self.recorded_results.contains(key)
                        && !self.child_ends.contains_key(id) =>
                {
                    Some(*id)
                }
                _ => None,
            })
            .collect()
    }

    /// The end of child `child_id` as its record in the store says, for a child whose end
    /// does not come to this run's inbox. Delivered by [`Replay::deliver_child_end`].
    pub(crate) fn child_end_read(&mut self, child_id: RunId, result: Result<Value, Error>) {
        self.child_ends
            .entry(child_id)
            .or_insert((READ_FROM_RECORD, result));
    }
}
