//! The workflows and steps the scenarios run, and the probes through which they tell the
//! harness when something happened (an `Instant` taken where it happened, not when the harness
//! noticed).

use workflow_core::prelude::*;

/// A no-op step; records its start time while [`probe::record_ticks`] is on.
#[step(name = "bench.tick")]
async fn tick(i: u32) -> Result<u32> {
    probe::tick();
    Ok(i)
}

/// `n` sequential no-op steps.
#[workflow(name = "bench.sequential")]
pub async fn sequential(n: u32) -> Result<u32> {
    let mut last = 0;
    for i in 0..n {
        last = tick(i).await?;
    }
    Ok(last)
}

/// A step whose body counts its executions (W2 checks idempotency with it).
#[step(name = "bench.body")]
async fn body(i: u64) -> Result<u64> {
    probe::body_ran();
    Ok(i)
}

/// One step.
#[workflow(name = "bench.one_step")]
pub async fn one_step(i: u64) -> Result<u64> {
    body(i).await
}

/// A step that returns its text (W3 with `--payload-bytes`).
#[step(name = "bench.echo")]
async fn echo(text: String) -> Result<String> {
    Ok(text)
}

/// One step over a text: W3 with payloads of a chosen size (`--payload-bytes`).
#[workflow(name = "bench.one_step_text")]
pub async fn one_step_text(text: String) -> Result<String> {
    echo(text).await
}

/// A step that takes `ms` milliseconds.
#[step(name = "bench.nap")]
async fn nap(ms: u64) -> Result<()> {
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    Ok(())
}

/// `n` steps of `ms` milliseconds each, one after the other.
#[workflow(name = "bench.napping")]
pub async fn napping(n: u32, ms: u64) -> Result<u32> {
    for _ in 0..n {
        nap(ms).await?;
    }
    Ok(n)
}

/// Starts a `one_step` child and returns its result (`start_child`, then `child.result()`).
#[workflow(name = "bench.parent_of_one")]
pub async fn parent_of_one(i: u64) -> Result<u64> {
    let child = start_child(one_step, (i,)).await?;
    child.result().await
}

/// Marks that the workflow reached its durable sleep (recorded, so not run again on replay).
#[step(name = "bench.reached")]
async fn reached() -> Result<()> {
    probe::reached();
    Ok(())
}

/// The first step after the replayed part of a recovered run.
#[step(name = "bench.progressed")]
async fn progressed() -> Result<()> {
    probe::progressed();
    Ok(())
}

/// `n` recorded steps, a durable sleep of `pause_ms` (where the first runtime stops), then one
/// live step.
#[workflow(name = "bench.recovering")]
pub async fn recovering(n: u32, pause_ms: u64) -> Result<u32> {
    for i in 0..n {
        tick(i).await?;
    }
    reached().await?;
    sleep(Duration::from_millis(pause_ms)).await;
    progressed().await?;
    Ok(n)
}

/// Receives `count` payloads on `token` (claimed at start), reporting each as observed.
#[workflow(name = "bench.listener")]
pub async fn listener(token: String, count: u64) -> Result<u64> {
    let mut hook = create_hook::<u64>(token);
    for _ in 0..count {
        let seq = hook.recv().await?;
        probe::observed(seq);
    }
    Ok(count)
}

/// Waits on its hook (claimed at start) for one payload.
#[workflow(name = "bench.parked")]
pub async fn parked(token: String) -> Result<u64> {
    let mut hook = create_hook::<u64>(token);
    probe::parked();
    hook.recv().await
}

/// Process-wide probes. Scenarios run one at a time, so plain globals suffice.
pub mod probe {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Mutex;
    use std::time::Instant;

    use tokio::sync::mpsc::UnboundedSender;

    static RECORD_TICKS: AtomicBool = AtomicBool::new(false);
    static TICKS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());
    static BODIES: AtomicU64 = AtomicU64::new(0);
    static PARKED: AtomicU64 = AtomicU64::new(0);
    static REACHED: AtomicBool = AtomicBool::new(false);
    static PROGRESSED: Mutex<Option<Instant>> = Mutex::new(None);
    type Observer = UnboundedSender<(u64, Instant)>;
    static OBSERVER: Mutex<Option<Observer>> = Mutex::new(None);

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn tick() {
        if RECORD_TICKS.load(Ordering::Relaxed) {
            lock(&TICKS).push(Instant::now());
        }
    }

    /// Starts (clearing earlier ones) or stops recording step start times.
    pub fn record_ticks(on: bool) {
        if on {
            lock(&TICKS).clear();
        }
        RECORD_TICKS.store(on, Ordering::SeqCst);
    }

    /// The step start times recorded so far.
    pub fn ticks() -> Vec<Instant> {
        lock(&TICKS).clone()
    }

    pub(super) fn body_ran() {
        BODIES.fetch_add(1, Ordering::SeqCst);
    }

    /// Step bodies executed since the last call (and resets the count).
    pub fn take_bodies() -> u64 {
        BODIES.swap(0, Ordering::SeqCst)
    }

    pub(super) fn parked() {
        PARKED.fetch_add(1, Ordering::SeqCst);
    }

    /// Runs that reached their hook since the last reset.
    pub fn parked_count() -> u64 {
        PARKED.load(Ordering::SeqCst)
    }

    /// Clears the parked count, the reached flag and the progress mark.
    pub fn reset() {
        PARKED.store(0, Ordering::SeqCst);
        REACHED.store(false, Ordering::SeqCst);
        *lock(&PROGRESSED) = None;
        BODIES.store(0, Ordering::SeqCst);
    }

    pub(super) fn reached() {
        REACHED.store(true, Ordering::SeqCst);
    }

    /// Whether a recovering run reached its sleep.
    pub fn has_reached() -> bool {
        REACHED.load(Ordering::SeqCst)
    }

    pub(super) fn progressed() {
        lock(&PROGRESSED).get_or_insert_with(Instant::now);
    }

    /// When the recovered run first made progress past its history.
    pub fn progressed_at() -> Option<Instant> {
        *lock(&PROGRESSED)
    }

    pub(crate) fn observed(seq: u64) {
        if let Some(tx) = lock(&OBSERVER).as_ref() {
            let _ = tx.send((seq, Instant::now()));
        }
    }

    /// Where listeners report the payloads they observe (`None` to stop).
    pub fn set_observer(tx: Option<Observer>) {
        *lock(&OBSERVER) = tx;
    }
}
