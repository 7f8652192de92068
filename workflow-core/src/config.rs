//! The runtime's tuning: lease length, poll interval, retry backoff, capacity, eviction,
//! payload limits. Set through [`crate::RuntimeBuilder`]; read by the runtime's loops and by
//! the driver of each run, which is why it lives apart from both.

use std::time::Duration;

use crate::history::HistorySize;
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
    /// `history_limits`: the soft limit of a run's history.
    pub(crate) history: HistoryLimits,
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
            history: HistoryLimits::default(),
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

/// How far a run's history may grow: past the soft limit `continue_as_new_suggested()`
/// is true; past the hard one, [`HARD_FACTOR`] times as large, the run fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HistoryLimits {
    /// Events.
    pub(crate) events: u64,
    /// Bytes of payloads (see `WorkflowMetadata::history_bytes`).
    pub(crate) bytes: u64,
}

/// The hard limit is this many times the soft one.
pub(crate) const HARD_FACTOR: u64 = 5;

impl Default for HistoryLimits {
    /// 10,000 events or 10 MiB (the hard limit: 50,000 events or 50 MiB).
    fn default() -> Self {
        HistoryLimits {
            events: 10_000,
            bytes: 10 << 20,
        }
    }
}

/// Which part of a limit a history went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Past {
    /// Its number of events: the history's and the limit's.
    Events { size: u64, limit: u64 },
    /// Its bytes of payloads: the history's and the limit's.
    Bytes { size: u64, limit: u64 },
}

impl HistoryLimits {
    /// The soft limit `history_limits(events, bytes)` sets, or why it cannot be one: each is
    /// at least 1, and small enough that the hard limit is a number.
    pub(crate) fn new(events: u64, bytes: u64) -> Result<Self, String> {
        for (what, n) in [("events", events), ("bytes", bytes)] {
            if n == 0 {
                return Err(format!(
                    "the soft limit of {what} is 0; it must be at least 1"
                ));
            }
            if n.checked_mul(HARD_FACTOR).is_none() {
                return Err(format!(
                    "the soft limit of {what}, {n}, is too large: the hard limit, \
                     {HARD_FACTOR} times it, must fit in a u64"
                ));
            }
        }
        Ok(HistoryLimits { events, bytes })
    }

    /// The hard limit.
    pub(crate) fn hard(&self) -> HistoryLimits {
        HistoryLimits {
            events: self.events.saturating_mul(HARD_FACTOR),
            bytes: self.bytes.saturating_mul(HARD_FACTOR),
        }
    }

    /// What of `size` is past this limit (the events first).
    pub(crate) fn past(&self, size: HistorySize) -> Option<Past> {
        if size.events > self.events {
            Some(Past::Events {
                size: size.events,
                limit: self.events,
            })
        } else if size.bytes > self.bytes {
            Some(Past::Bytes {
                size: size.bytes,
                limit: self.bytes,
            })
        } else {
            None
        }
    }
}

impl std::fmt::Display for Past {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Past::Events { size, limit } => {
                write!(f, "{size} events, past the hard limit of {limit} events")
            }
            Past::Bytes { size, limit } => write!(
                f,
                "{size} bytes of payloads, past the hard limit of {limit} bytes ({})",
                human_bytes(*limit)
            ),
        }
    }
}

/// `n` bytes as a person reads them: `50 MiB`, `1.5 KiB`, `300 B`.
pub(crate) fn human_bytes(n: u64) -> String {
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in units {
        if n >= size {
            let whole = n / size;
            let tenths = (n % size) * 10 / size;
            return if tenths == 0 {
                format!("{whole} {unit}")
            } else {
                format!("{whole}.{tenths} {unit}")
            };
        }
    }
    format!("{n} B")
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

    #[test]
    fn history_limits_check_their_figures_and_name_what_is_past() {
        let soft = HistoryLimits::default();
        assert_eq!((soft.events, soft.bytes), (10_000, 10 << 20));
        assert_eq!(soft.hard(), HistoryLimits::new(50_000, 50 << 20).unwrap());
        let size = |events, bytes| HistorySize { events, bytes };
        assert_eq!(soft.hard().past(size(50_000, 50 << 20)), None);
        let past = soft.hard().past(size(50_001, 0)).unwrap();
        assert_eq!(
            past.to_string(),
            "50001 events, past the hard limit of 50000 events"
        );
        let past = soft.hard().past(size(3, (50 << 20) + 1)).unwrap();
        assert_eq!(
            past.to_string(),
            "52428801 bytes of payloads, past the hard limit of 52428800 bytes (50 MiB)"
        );
        assert!(HistoryLimits::new(0, 1)
            .unwrap_err()
            .contains("events is 0"));
        assert!(HistoryLimits::new(1, 0).unwrap_err().contains("bytes is 0"));
        assert!(HistoryLimits::new(u64::MAX / 4, 1)
            .unwrap_err()
            .contains("too large"));
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(300), "300 B");
    }
}
