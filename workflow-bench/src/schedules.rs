//! Schedules: how late a tick's run starts, and what the firing loop costs.
//!
//! - Lateness: one every-second schedule on one worker, over N ticks; per tick, from its
//!   nominal time to the start of its run's first step (the step body reads the wall clock;
//!   the nominal time is the store's, the same host's clock on PostgreSQL here): p50 and p99.
//! - Many: 1,000 every-second schedules on one worker for a window of whole seconds: the
//!   lateness p99 of their ticks, and the process's CPU time (`getrusage`, user + system, every
//!   thread: the firing loop, the runs it starts and SQLite's writer) divided by the ticks
//!   fired in the window.
//! - Idle: 100 hourly schedules, none due: the process's CPU time per second of wall time,
//!   which is what the firing loop costs while it only looks, next to the same worker without
//!   schedules (its own poll of the store).

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use workflow_core::prelude::*;

use crate::report::{percentile, Report, Row, Target, Unit};
use crate::scenarios::{progress, Ctx};
use crate::stores::StoreKind;
use crate::BoxResult;

/// (nominal ms since the epoch, lateness µs) of each tick whose run's first step started.
static STARTS: Mutex<Vec<(u64, f64)>> = Mutex::new(Vec::new());

fn starts() -> std::sync::MutexGuard<'static, Vec<(u64, f64)>> {
    STARTS.lock().unwrap_or_else(|p| p.into_inner())
}

fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

/// The first step of a scheduled run: notes how late it started after its tick's time.
#[step(name = "bench.schedule.first")]
async fn first_step(nominal_us: u64) -> Result<()> {
    let now = since_epoch(SystemTime::now()).as_micros() as u64;
    let late = now.saturating_sub(nominal_us) as f64;
    starts().push((nominal_us / 1000, late));
    Ok(())
}

/// The scheduled workflow: one step.
#[workflow(name = "bench.scheduled")]
pub async fn scheduled(tick: ScheduleTick) -> Result<()> {
    first_step(since_epoch(tick.nominal).as_micros() as u64).await
}

/// The lateness samples of ticks with nominal times in `from..to` (ms), recorded so far.
fn lateness(from: u64, to: u64) -> Vec<f64> {
    starts()
        .iter()
        .filter(|(n, _)| (from..to).contains(n))
        .map(|(_, l)| *l)
        .collect()
}

/// The ms since the epoch of the first whole second at least `ahead` from now.
fn whole_second_after(ahead: Duration) -> u64 {
    let ms = since_epoch(SystemTime::now() + ahead).as_millis() as u64;
    ms.div_ceil(1000) * 1000
}

/// Sleeps until `ms` since the epoch on the wall clock.
async fn sleep_until_ms(ms: u64) {
    let now = since_epoch(SystemTime::now());
    tokio::time::sleep(Duration::from_millis(ms).saturating_sub(now)).await;
}

/// This process's CPU time so far (user + system, all threads).
pub(crate) fn cpu_time() -> Duration {
    // SAFETY: getrusage writes the struct it is given; zeroes are a valid `rusage`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to that struct, RUSAGE_SELF.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// One trial of one every-second schedule: the lateness of `n` ticks, p50 and p99 (µs).
async fn lateness_trial(ctx: &Ctx, kind: StoreKind, n: usize) -> BoxResult<(f64, f64)> {
    let fresh = ctx.fresh(kind).await?;
    starts().clear();
    let rt = fresh
        .builder()
        .schedule(Schedule::every("tick", scheduled, Duration::from_secs(1)))
        .build()
        .await?;
    // Not the first tick, which may be up to a second older than the schedule.
    let from = whole_second_after(Duration::from_millis(1500));
    let to = from + 1000 * n as u64;
    sleep_until_ms(to).await;
    let started = Instant::now();
    while lateness(from, to).len() < n {
        if started.elapsed() > Duration::from_secs(30) {
            return Err(format!("{} of {n} ticks started", lateness(from, to).len()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let late = lateness(from, to);
    rt.shutdown();
    fresh.cleanup().await?;
    Ok((percentile(&late, 50.0), percentile(&late, 99.0)))
}

/// One trial of `count` every-second schedules for `window` whole seconds: (lateness p50 and
/// p99 µs, CPU µs per tick fired, ticks fired).
async fn many_trial(
    ctx: &Ctx,
    kind: StoreKind,
    count: usize,
    window: u64,
) -> BoxResult<(f64, f64, f64, usize)> {
    let fresh = ctx.fresh(kind).await?;
    starts().clear();
    let mut b = fresh.builder();
    for i in 0..count {
        b = b.schedule(Schedule::every(
            format!("s{i}"),
            scheduled,
            Duration::from_secs(1),
        ));
    }
    let rt = b.build().await?;
    // Two seconds to settle, then the window.
    let from = whole_second_after(Duration::from_secs(2));
    let to = from + 1000 * window;
    sleep_until_ms(from).await;
    let cpu = cpu_time();
    sleep_until_ms(to).await;
    let cpu = cpu_time().saturating_sub(cpu);
    // The window's last ticks may still be firing.
    let expected = count * window as usize;
    let waited = Instant::now();
    while lateness(from, to).len() < expected && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let late = lateness(from, to);
    rt.shutdown();
    fresh.cleanup().await?;
    let fired = late.len();
    Ok((
        percentile(&late, 50.0),
        percentile(&late, 99.0),
        cpu.as_secs_f64() * 1e6 / fired.max(1) as f64,
        fired,
    ))
}

/// One trial of `count` hourly schedules, none due, for `secs` seconds: CPU µs per second.
async fn idle_trial(ctx: &Ctx, kind: StoreKind, count: usize, secs: u64) -> BoxResult<f64> {
    let fresh = ctx.fresh(kind).await?;
    let mut b = fresh.builder();
    // Hourly at a minute that is not now, so that no tick falls in the measurement.
    let minute = (since_epoch(SystemTime::now()).as_secs() / 60 + 30) % 60;
    for i in 0..count {
        b = b.schedule(Schedule::cron(
            format!("h{i}"),
            scheduled,
            &format!("{minute} * * * *"),
        )?);
    }
    let rt = b.build().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu, t) = (cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let per_sec = cpu_time().saturating_sub(cpu).as_secs_f64() * 1e6 / t.elapsed().as_secs_f64();
    rt.shutdown();
    fresh.cleanup().await?;
    Ok(per_sec)
}

pub async fn schedules(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    let sizes = &ctx.sizes;
    for kind in ctx.stores(&[Sqlite, Postgres], rep) {
        let s = kind.name();
        let n = sizes.schedule_ticks;
        progress(format!(
            "schedules {s}: one every-second schedule, {n} ticks"
        ));
        let (mut p50, mut p99) = (Vec::new(), Vec::new());
        for _ in 0..ctx.trials {
            let (a, b) = lateness_trial(ctx, kind, n).await?;
            p50.push(a);
            p99.push(b);
        }
        let target = match kind {
            Postgres => 100_000.0,
            _ => 50_000.0,
        };
        rep.push(
            Row::new(
                "schedules",
                s,
                format!("one every-second schedule, {n} ticks: nominal → first step, p50"),
                Unit::Micros,
            )
            .samples(p50),
        );
        rep.push(
            Row::new("schedules", s, "… p99", Unit::Micros)
                .samples(p99)
                .target(Target::AtMost(target)),
        );

        load(ctx, rep, kind).await?;

        let (count, secs) = (sizes.schedule_idle, sizes.schedule_idle_secs);
        progress(format!(
            "schedules {s}: {count} hourly schedules idle, {secs} s"
        ));
        let (mut idle, mut alone) = (Vec::new(), Vec::new());
        for _ in 0..ctx.trials {
            idle.push(idle_trial(ctx, kind, count, secs).await?);
            alone.push(idle_trial(ctx, kind, 0, secs).await?);
        }
        rep.push(
            Row::new(
                "schedules",
                s,
                format!("{count} hourly schedules, none due: worker CPU per second"),
                Unit::Micros,
            )
            .samples(idle),
        );
        rep.push(
            Row::new(
                "schedules",
                s,
                "… the same worker without schedules (its poll alone)",
                Unit::Micros,
            )
            .samples(alone),
        );
    }
    Ok(())
}

/// The 1,000-schedule line of [`schedules`] alone.
pub async fn schedule_load(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    for kind in ctx.stores(&[StoreKind::Sqlite, StoreKind::Postgres], rep) {
        load(ctx, rep, kind).await?;
    }
    Ok(())
}

/// `sizes.schedule_many` every-second schedules on one worker: lateness p99, CPU per tick.
async fn load(ctx: &Ctx, rep: &mut Report, kind: StoreKind) -> BoxResult<()> {
    let (s, sizes) = (kind.name(), &ctx.sizes);
    let target = match kind {
        StoreKind::Postgres => 100_000.0,
        _ => 50_000.0,
    };
    let (count, window) = (sizes.schedule_many, sizes.schedule_window);
    progress(format!(
        "schedules {s}: {count} every-second schedules, {window} s"
    ));
    let (mut p50, mut p99, mut cpu, mut fired) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ctx.trials {
        let (a, b, c, d) = many_trial(ctx, kind, count, window).await?;
        p50.push(a);
        p99.push(b);
        cpu.push(c);
        fired.push(d as f64);
    }
    rep.push(
        Row::new(
            "schedules",
            s,
            format!("{count} every-second schedules, one worker, {window} s: lateness p99"),
            Unit::Micros,
        )
        .samples(p99)
        .target(Target::AtMost(target)),
    );
    rep.push(Row::new("schedules", s, "… lateness p50", Unit::Micros).samples(p50));
    rep.push(
        Row::new(
            "schedules",
            s,
            "… worker CPU per tick fired (its run included)",
            Unit::Micros,
        )
        .samples(cpu),
    );
    rep.push(Row::new("schedules", s, "… ticks fired", Unit::Count).samples(fired));
    Ok(())
}
