//! The runtime's settings that the driver reads too, kept apart so the driver needs nothing
//! else from the runtime.

use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) retry_backoff: Duration,
    pub(crate) max_active_runs: usize,
    pub(crate) worker: bool,
    pub(crate) evict_after: Duration,
}

impl Config {
    /// The delay before attempt `failed + 1`: the base doubled per failure, capped at 1 hour.
    pub(crate) fn backoff(&self, failed: u32) -> Duration {
        let factor = 1u32 << failed.saturating_sub(1).min(20);
        self.retry_backoff
            .saturating_mul(factor)
            .min(Duration::from_secs(3600))
    }
}
