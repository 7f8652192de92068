//! Bounded histories: how a run whose history holds 5,000 and then 50,000 events
//! recovers. The recovery scenario's workflow (n steps, then a durable sleep at which the
//! first runtime stops) is recorded; a new runtime is built when the sleep is due, and the
//! time from its build to the run's first new step (the replay of the whole history
//! included) is measured, with the time per event at both sizes (the same figure at both
//! means replay is linear) and the memory the recovery takes at its peak: the heap bytes it
//! allocated above what was live before (a counting allocator, [`Counting`], on only while a
//! recovery is measured) and the growth of the process's peak resident set (VmHWM, reset
//! through /proc/self/clear_refs before).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::report::{Report, Row, Unit};
use crate::scenarios::{build_history, progress, recover, trim_heap, vm_rss, Ctx};
use crate::stores::StoreKind;
use crate::BoxResult;

/// The process's allocator: the system's, counting live heap bytes and their peak while
/// [`Counting::start`] is on (a relaxed load per call otherwise).
pub struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is forwarded to `System` unchanged; the counters do not touch memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Counting::grew(layout.size() as i64);
        // SAFETY: forwarded as given.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Counting::grew(layout.size() as i64);
        // SAFETY: forwarded as given.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Counting::grew(-(layout.size() as i64));
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Counting::grew(new_size as i64 - layout.size() as i64);
        // SAFETY: forwarded as given.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

impl Counting {
    fn grew(by: i64) {
        if COUNTING.load(Ordering::Relaxed) {
            let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
    }

    /// Counts from 0 bytes now (memory freed later that was allocated before counts below 0).
    fn start() {
        LIVE.store(0, Ordering::SeqCst);
        PEAK.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
    }

    /// Stops counting: the peak of heap bytes live above the start.
    fn stop() -> i64 {
        COUNTING.store(false, Ordering::SeqCst);
        PEAK.load(Ordering::SeqCst)
    }
}

/// The process's peak resident set (VmHWM), in bytes.
fn vm_hwm() -> BoxResult<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .ok_or("no VmHWM in /proc/self/status")?;
    let kib: f64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib * 1024.0)
}

/// Sets VmHWM to the current resident set (Linux: "5" to /proc/self/clear_refs).
fn reset_hwm() -> BoxResult<()> {
    std::fs::write("/proc/self/clear_refs", "5")?;
    Ok(())
}

pub async fn history(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    for kind in ctx.stores(&[Memory, Sqlite, Postgres], rep) {
        for &n in &ctx.sizes.history_steps {
            progress(format!("history {} {n} steps", kind.name()));
            let (mut times, mut per_event, mut heap, mut rss) = (vec![], vec![], vec![], vec![]);
            let mut events = 0;
            for _ in 0..ctx.trials {
                let fresh = ctx.fresh(kind).await?;
                let (ev, fire_at) = build_history(&fresh, n).await?;
                events = ev;
                trim_heap();
                let before = vm_rss()?;
                reset_hwm()?;
                Counting::start();
                let took = recover(&fresh, fire_at).await;
                let peak = Counting::stop();
                let took = took?;
                rss.push((vm_hwm()? - before).max(0.0));
                heap.push(peak as f64);
                times.push(took.as_secs_f64() * 1e6);
                per_event.push(took.as_secs_f64() * 1e6 / ev as f64);
                fresh.cleanup().await?;
            }
            let s = kind.name();
            let what = format!("{events}-event history");
            rep.push(
                Row::new(
                    "history",
                    s,
                    format!("{what}: recovery to the first new step"),
                    Unit::Micros,
                )
                .samples(times),
            );
            rep.push(
                Row::new("history", s, format!("{what}: per event"), Unit::Micros)
                    .samples(per_event),
            );
            rep.push(
                Row::new(
                    "history",
                    s,
                    format!("{what}: peak heap above the start"),
                    Unit::Bytes,
                )
                .samples(heap),
            );
            rep.push(
                Row::new(
                    "history",
                    s,
                    format!("{what}: peak RSS growth (VmHWM)"),
                    Unit::Bytes,
                )
                .samples(rss),
            );
        }
    }
    Ok(())
}
