//! What a store shows of itself below its API, for the conformance suite
//! (`workflow_core::testing::store`): a store defines how it is inspected, and the suite asks
//! through this trait, so no store depends on the suite.

use std::time::SystemTime;

use crate::ids::RunId;

/// What the `inspect` cases check below the [`Store`](crate::store::Store) API: what the store keeps. A store's
/// tests implement it by reading the store's tables (or, for a store in memory, its state).
///
/// The methods panic when they cannot answer: they run in tests only.
// The suite awaits these in place and never spawns them, so their futures need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait Inspect {
    /// How many entries of `table` the store holds: `runs`, `events`, `hooks` (active hooks
    /// and released tokens still retained), `hook_inbox` (payloads), `streams` or
    /// `stream_chunks`.
    async fn count(&self, table: &str) -> i64;

    /// The run's wake time as stored (a store keeping milliseconds returns them).
    async fn wake_at(&self, run: RunId) -> SystemTime;

    /// The queryable `kind` of each of the run's events, in order (the serde tag of
    /// [`Event`](crate::store::Event), as [`Event::kind`](crate::store::Event::kind) gives it); `None` for a store that keeps events as values
    /// and has no such column.
    async fn event_kinds(&self, run: RunId) -> Option<Vec<String>>;
}
