//! The runtime's one clock: every time it writes to the store or compares there (admission,
//! lease ends, timer and retry due times, hook claims, retention windows, cancellation,
//! pruning) is read here, so that processes whose system clocks disagree still agree on time.
//!
//! A store with a clock of its own ([`Store::now`], PostgreSQL's server clock) is sampled
//! with one round trip when the runtime is built and again every [`REFRESH`]; between samples
//! the reading is carried forward with the local monotonic clock, which a wrong or stepped
//! wall clock does not move. A store on the local clock (memory, SQLite) is read directly.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::error::StoreError;
use crate::store::Store;

/// How long a sample of the store's clock is used before the next one is taken.
const REFRESH: Duration = Duration::from_secs(10);
/// How far the wall clock may move apart from the monotonic one since the last reading before
/// the store's clock is read again at once: the local clock was stepped, or the machine slept.
const JUMP: Duration = Duration::from_millis(250);
/// How fast a sample's uncertainty grows as it ages: 100 ppm, far above what quartz drifts.
const DRIFT_PER_SEC: Duration = Duration::from_micros(100);
/// Round trips the first sample may take to get below this uncertainty (the first one also
/// opens a connection).
const FIRST_SAMPLES: usize = 3;
const GOOD_ENOUGH: Duration = Duration::from_millis(2);

/// The time every part of one runtime uses. See the module docs.
pub(crate) struct Clock {
    store: Arc<dyn Store>,
    /// `None` when the store is on the local clock.
    sample: Option<Mutex<State>>,
}

/// The best sample so far, and when the store's clock was last read.
struct State {
    best: Sample,
    /// The last reading (kept or not), on the monotonic clock...
    checked: Instant,
    /// ...and on the wall clock.
    checked_wall: SystemTime,
    /// A caller is reading the store's clock: the others keep the best sample meanwhile
    /// instead of each sending a round trip of its own (a firing loop's look asks for the
    /// time once per tick, hundreds at once).
    renewing: bool,
}

impl State {
    fn new(best: Sample) -> State {
        State {
            best,
            checked: best.at,
            checked_wall: best.wall,
            renewing: false,
        }
    }

    /// Whether the store's clock should be read again: the last reading is old, or the wall
    /// clock moved apart from the monotonic one since (a local clock step, or a sleep the
    /// monotonic clock did not count: the estimate carried forward may be off).
    fn stale(&self) -> bool {
        let mono = self.checked.elapsed();
        let wall = SystemTime::now()
            .duration_since(self.checked_wall)
            .unwrap_or(Duration::ZERO);
        mono >= REFRESH || mono.abs_diff(wall) > JUMP
    }

    /// Whether the caller should read the store's clock now: it is stale and nobody else is
    /// reading it. Then marks the reading under way (cleared by [`Renewing`]).
    fn claim_renewal(&mut self) -> bool {
        let renew = !self.renewing && self.stale();
        self.renewing |= renew;
        renew
    }

    /// Records a reading: `new`, when there is one, competes with the best so far.
    fn checked(&mut self, new: Option<Sample>) {
        (self.checked, self.checked_wall) = (Instant::now(), SystemTime::now());
        if let Some(new) = new {
            self.best = self.best.or(new);
        }
    }
}

/// One reading of the store's clock, anchored to the local clocks at the moment it was taken.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// What the store said.
    store: SystemTime,
    /// The middle of the round trip, on the monotonic clock...
    at: Instant,
    /// ...and on the wall clock (only to notice that the wall clock jumped since).
    wall: SystemTime,
    /// Half the round trip: the store read its clock this close to `at`.
    uncertainty: Duration,
}

impl Sample {
    /// The store's time now, as this sample predicts it.
    fn now(&self) -> SystemTime {
        self.store + self.at.elapsed()
    }

    /// The uncertainty of [`Sample::now`] at `t`: the round trip's, grown with drift.
    fn uncertainty_at(&self, t: Instant) -> Duration {
        let age = t.saturating_duration_since(self.at);
        self.uncertainty + DRIFT_PER_SEC.mul_f64(age.as_secs_f64())
    }

    /// The better of `self` (older) and `new`: the newer one when the two disagree by more
    /// than their uncertainties allow (a clock moved), else the more certain one at `new.at`.
    fn or(self, new: Sample) -> Sample {
        let predicted = self.store + new.at.saturating_duration_since(self.at);
        let old_uncertainty = self.uncertainty_at(new.at);
        let apart = match predicted.duration_since(new.store) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        if apart > old_uncertainty + new.uncertainty || new.uncertainty <= old_uncertainty {
            new
        } else {
            self
        }
    }
}

impl Clock {
    /// The clock of a runtime on `store`: reads the store's clock once (a store with a clock
    /// of its own that cannot be read fails the build).
    pub(crate) async fn new(store: Arc<dyn Store>) -> Result<Clock, StoreError> {
        let mut first = match sample(&*store).await? {
            None => {
                return Ok(Clock {
                    store,
                    sample: None,
                })
            }
            Some(s) => s,
        };
        for _ in 1..FIRST_SAMPLES {
            if first.uncertainty <= GOOD_ENOUGH {
                break;
            }
            if let Ok(Some(s)) = sample(&*store).await {
                first = first.or(s);
            }
        }
        Ok(Clock {
            store,
            sample: Some(Mutex::new(State::new(first))),
        })
    }

    /// The store's time now. Never waits: callers that can should [`Clock::tick`] first.
    pub(crate) fn now(&self) -> SystemTime {
        match &self.sample {
            None => SystemTime::now(),
            Some(s) => crate::sync::lock(s).best.now(),
        }
    }

    /// Samples the store's clock again if the last sample is due for renewal, then reads it.
    /// A failed reading keeps the last sample (the caller's own store call reports the
    /// outage) until the next renewal.
    ///
    /// One caller at a time reads it: while a reading is under way, the others read the best
    /// sample so far without waiting.
    pub(crate) async fn tick(&self) -> SystemTime {
        if let Some(cell) = &self.sample {
            let renew = crate::sync::lock(cell).claim_renewal();
            if renew {
                // Cleared however this call ends (a caller dropped mid-reading included).
                let _renewing = Renewing(cell);
                let new = sample(&*self.store).await.unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "reading the store's clock failed; keeping the last reading");
                    None
                });
                crate::sync::lock(cell).checked(new);
            }
        }
        self.now()
    }
}

/// Marks the reading of the store's clock under way until dropped.
struct Renewing<'a>(&'a Mutex<State>);

impl Drop for Renewing<'_> {
    fn drop(&mut self) {
        crate::sync::lock(self.0).renewing = false;
    }
}

/// One round trip to the store's clock; `None` when the store is on the local clock.
async fn sample(store: &dyn Store) -> Result<Option<Sample>, StoreError> {
    let (sent, wall) = (Instant::now(), SystemTime::now());
    let Some(store_now) = store.now().await? else {
        return Ok(None);
    };
    let round_trip = sent.elapsed();
    let half = round_trip / 2;
    Ok(Some(Sample {
        store: store_now,
        at: sent + half,
        wall: wall + half,
        uncertainty: half,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(store_ms: u64, at: Instant, uncertainty_ms: u64) -> Sample {
        Sample {
            store: SystemTime::UNIX_EPOCH + Duration::from_millis(store_ms),
            at,
            wall: SystemTime::now(),
            uncertainty: Duration::from_millis(uncertainty_ms),
        }
    }

    #[test]
    fn the_more_certain_of_two_agreeing_samples_is_kept() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(10);
        let precise = sample(1_000, t0, 1);
        // Agrees with `precise` (10 s later, 3 ms off) but is far less certain.
        let vague = sample(11_003, t1, 40);
        assert_eq!(precise.or(vague).store, precise.store);
        let sharper = sample(11_000, t1, 0);
        assert_eq!(precise.or(sharper).store, sharper.store);
    }

    #[test]
    fn a_sample_that_disagrees_replaces_the_old_one() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(10);
        let old = sample(1_000, t0, 1);
        // The store's clock moved by an hour: the old prediction is no longer true.
        let moved = sample(11_000 + 3_600_000, t1, 40);
        assert_eq!(old.or(moved).store, moved.store);
    }

    #[test]
    fn one_caller_at_a_time_reads_a_stale_clock() {
        let old = Instant::now() - REFRESH - Duration::from_secs(1);
        let cell = Mutex::new(State::new(sample(1_000, old, 1)));
        {
            let claimed = crate::sync::lock(&cell).claim_renewal();
            assert!(claimed, "a stale clock is read");
            let _renewing = Renewing(&cell);
            // Everyone else meanwhile keeps the best sample.
            assert!(!crate::sync::lock(&cell).claim_renewal());
            assert!(!crate::sync::lock(&cell).claim_renewal());
        }
        // The reader was dropped before recording anything (a cancelled call): the next
        // caller reads it.
        assert!(crate::sync::lock(&cell).claim_renewal());
        {
            let _renewing = Renewing(&cell);
            crate::sync::lock(&cell).checked(None);
        }
        // Read just now: fresh until the next refresh.
        assert!(!crate::sync::lock(&cell).claim_renewal());
    }

    #[test]
    fn a_sample_is_carried_forward_on_the_monotonic_clock() {
        let s = sample(5_000, Instant::now() - Duration::from_secs(2), 0);
        let now = s.now();
        let ms = crate::store::to_millis(now);
        assert!((7_000..7_500).contains(&ms), "{ms}");
        assert!(s.uncertainty_at(s.at + Duration::from_secs(10)) >= Duration::from_millis(1));
    }
}
