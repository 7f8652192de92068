//! [`MemoryStore`]: the store for tests and examples that need no persistence. One mutex over
//! the whole state makes every operation atomic; clones share the state, so several runtimes in
//! one process can act as competing workers.
//!
//! This file is the face: [`MemoryStore`] and its lock. The state and its operations are in
//! `state.rs`, each capability in a file of its own; nothing here, nor beside it outside the
//! tests, depends on the conformance suite (`crate::testing`).

mod admin;
mod chain;
mod hooks;
#[cfg(any(test, feature = "testing"))]
mod inspect;
mod messages;
mod queues;
mod rekey;
mod runs;
mod schedules;
mod state;
mod streams;
mod transactional;

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard};

use self::state::State;
/// An in-memory [`Store`](crate::store::Store). Nothing survives the process.
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied operation: every method
        // validates before it mutates. So a poisoned lock is still consistent.
        crate::sync::lock(&self.state)
    }
}
