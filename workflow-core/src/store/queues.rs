//! Queues: their declared limits, shared by every process on the store, and their occupancy.
//! The limits themselves are enforced by [`super::RunStore::acquire`].

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// A queue's limits as the store keeps them, shared by every process on the store
/// (see [`crate::Queue`]). `None`: no such limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueueDef {
    /// The queue's name.
    pub name: String,
    /// At most this many runs of the queue begun and not ended.
    pub concurrency: Option<u32>,
    /// At most this many runs of the queue begin in any window of this length.
    pub rate_limit: Option<(u32, Duration)>,
}

/// A queue as [`QueueStore::list_queues`] reports it: its limits and what it holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// Its limits.
    pub def: QueueDef,
    /// Runs begun and not ended (each holds a slot; a sleeping run too).
    pub occupied: u64,
    /// Runs waiting for a slot (not yet begun).
    pub waiting: u64,
    /// Runs begun within the last rate window (0 without a rate limit).
    pub begun_in_window: u64,
    /// When the queue's longest-waiting run (of those counted in `waiting`) was admitted;
    /// `None` when none waits.
    pub oldest_waiting: Option<SystemTime>,
}

/// Queue declarations and occupancy. Stores without queues keep the defaults.
#[async_trait::async_trait]
pub trait QueueStore: Send + Sync + 'static {
    /// Declares `queues`, replacing the limits of any queue of the same name: every
    /// process on the store enforces them from then on. Stores without queues keep this
    /// default, which refuses a non-empty list.
    async fn define_queues(&self, queues: &[QueueDef]) -> Result<(), StoreError> {
        if queues.is_empty() {
            return Ok(());
        }
        Err(StoreError::database(
            "queues are not supported by this store",
        ))
    }

    /// The earliest time after `now` at which a queue whose waiting runs are held back by its
    /// rate window may begin one again: when the oldest begin in its window leaves it. `None`
    /// when no queue with waiting runs is at its rate limit (ends of runs, which free the
    /// other limits, are announced instead). Workers sleep until then rather than poll. The
    /// default: `None`.
    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        let _ = now;
        Ok(None)
    }

    /// Whether any queued run waits for a slot (admitted, not begun, not ended), in any
    /// queue: a worker where a run freed a slot asks this before it leases (a write) to
    /// begin the next. The default, `true`, has it lease each time.
    async fn has_waiting_runs(&self) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Every declared queue by name, with its occupancy at `now` (for the rate window).
    /// Stores without queues keep this default: none.
    async fn list_queues(&self, now: SystemTime) -> Result<Vec<QueueInfo>, StoreError> {
        let _ = now;
        Ok(Vec::new())
    }
}
