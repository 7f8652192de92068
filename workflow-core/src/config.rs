//! The runtime's tuning: lease length, poll interval, retry backoff, capacity, eviction,
//! payload limits. Set through [`crate::RuntimeBuilder`]; read by the runtime's loops and by
//! the driver of each run, which is why it lives apart from both.

use std::time::Duration;

use crate::payload::Payloads;

/// The settings one runtime and every run it drives share.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) retry_backoff: Duration,
    pub(crate) max_active_runs: usize,
    pub(crate) worker: bool,
    pub(crate) evict_after: Duration,
    /// How payloads are stored: `max_payload_bytes`.
    pub(crate) payloads: Payloads,
    /// The build's version, recorded on every run this runtime starts.
    pub(crate) version: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(200),
            retry_backoff: Duration::from_secs(1),
            max_active_runs: 1000,
            worker: true,
            evict_after: Duration::from_secs(30),
            payloads: Payloads::default(),
            version: None,
        }
    }
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

/// `d` as a person writes it: `30s`, `5m`, `1h`, `1m30s`, `250ms`.
pub(crate) fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    let mut rest = ms;
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if rest >= size {
            out.push_str(&format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    out
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn durations_read_as_written() {
        let ms = Duration::from_millis;
        assert_eq!(human_duration(ms(30_000)), "30s");
        assert_eq!(human_duration(ms(90_000)), "1m30s");
        assert_eq!(human_duration(ms(3_600_000)), "1h");
        assert_eq!(human_duration(ms(250)), "250ms");
        assert_eq!(human_duration(ms(1_500)), "1s500ms");
    }
}
