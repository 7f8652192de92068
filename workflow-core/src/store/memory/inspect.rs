//! What the conformance suite reads below the store API, from the memory store's state: the
//! [`Inspect`] impl, compiled only for tests and the `testing` feature.

use std::time::SystemTime;

use super::MemoryStore;
use crate::ids::RunId;
use crate::store::Inspect;

/// What the conformance suite reads below the [`Store`](crate::store::Store) API, from this store's state.
impl Inspect for MemoryStore {
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
