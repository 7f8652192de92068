//! The scenarios. Each runs its trials on a fresh database per trial and adds rows
//! (one sample per trial) to the report.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use workflow_core::store::Event;
use workflow_core::{Queue, Runtime, StartError};

use crate::flows::{listener, parked, probe, recovering, sequential};
use crate::report::{median, percentile, Report, Row, Target, Unit};
use crate::stores::{Fresh, StoreKind};
use crate::BoxResult;

/// How big each scenario is.
#[derive(Debug, Clone)]
pub struct Sizes {
    pub baseline_ops: usize,
    pub sequential_steps: u32,
    pub throughput_runs: usize,
    pub throughput_steps: u32,
    pub recovery_steps: Vec<u32>,
    /// Recovery sizes on PostgreSQL, whose history is rebuilt for every trial.
    pub recovery_steps_pg: Vec<u32>,
    pub storm_starts: usize,
    pub hooks_live: u64,
    pub hooks_evicted: u64,
    pub parked_runs: usize,
    pub replay_steps: u32,
    pub w0_runs: usize,
    pub w1_steps: u32,
    pub w1_reps: usize,
    pub w2_starts: usize,
    pub w2_tokens: usize,
    pub w_in_flight: usize,
    pub w3_runs: usize,
    /// Chunks one writer appends in the streams scenario.
    pub stream_chunks: u32,
    /// Timed chunks per latency trial of the streams scenario.
    pub stream_timed: u32,
    /// Runs through a queue of concurrency 1, one slot handed over between each two.
    pub handoff_runs: usize,
    /// Runs and steps per run of each scale-out trial.
    pub scale_runs: usize,
    pub scale_steps: u32,
    /// Ticks of the one every-second schedule whose lateness is measured.
    pub schedule_ticks: usize,
    /// Every-second schedules on one worker, and the seconds they are measured for.
    pub schedule_many: usize,
    pub schedule_window: u64,
    /// Hourly schedules of the idle measurement, and its seconds.
    pub schedule_idle: usize,
    pub schedule_idle_secs: u64,
    /// Steps of the histories whose recovery the history scenario measures (each step is
    /// two events).
    pub history_steps: Vec<u32>,
    /// Spans opened and closed per trial of `spans`, under each subscriber.
    pub spans: u64,
}

impl Sizes {
    /// The sizes the figures in BENCHMARKS.md are measured at.
    pub fn full() -> Sizes {
        Sizes {
            baseline_ops: 200,
            sequential_steps: 1000,
            throughput_runs: 1000,
            throughput_steps: 10,
            recovery_steps: vec![1_000, 10_000, 100_000],
            recovery_steps_pg: vec![1_000, 10_000],
            storm_starts: 1000,
            hooks_live: 300,
            hooks_evicted: 100,
            parked_runs: 100_000,
            replay_steps: 10_000,
            w0_runs: 20,
            w1_steps: 100,
            w1_reps: 5,
            w2_starts: 1000,
            w2_tokens: 100,
            w_in_flight: 100,
            w3_runs: 1000,
            stream_chunks: 2000,
            stream_timed: 200,
            handoff_runs: 200,
            scale_runs: 200,
            scale_steps: 20,
            schedule_ticks: 60,
            schedule_many: 1000,
            schedule_window: 10,
            schedule_idle: 100,
            schedule_idle_secs: 10,
            history_steps: vec![2_500, 25_000],
            spans: 100_000,
        }
    }

    /// Just enough to prove each scenario works (tests, `--quick`).
    pub fn tiny() -> Sizes {
        Sizes {
            baseline_ops: 5,
            sequential_steps: 200,
            throughput_runs: 10,
            throughput_steps: 3,
            recovery_steps: vec![20, 40],
            recovery_steps_pg: vec![20],
            storm_starts: 20,
            hooks_live: 8,
            hooks_evicted: 6,
            parked_runs: 50,
            replay_steps: 50,
            w0_runs: 3,
            w1_steps: 10,
            w1_reps: 2,
            w2_starts: 30,
            w2_tokens: 5,
            w_in_flight: 10,
            w3_runs: 20,
            stream_chunks: 20,
            stream_timed: 5,
            handoff_runs: 5,
            scale_runs: 4,
            scale_steps: 2,
            schedule_ticks: 2,
            schedule_many: 20,
            schedule_window: 2,
            schedule_idle: 5,
            schedule_idle_secs: 1,
            history_steps: vec![20, 200],
            spans: 1_000,
        }
    }
}

/// What every scenario gets.
pub struct Ctx {
    pub trials: usize,
    pub pg_url: Option<String>,
    /// Stores chosen on the command line (`None`: each scenario's default).
    pub stores: Option<Vec<StoreKind>>,
    pub sizes: Sizes,
    /// `--payload-bytes`: W3's runs take and return a text of this many bytes (its step too)
    /// instead of a number.
    pub payload_bytes: Option<usize>,
}

impl Ctx {
    /// The stores to run a scenario on, less PostgreSQL when it is not configured (noted once).
    pub(crate) fn stores(&self, default: &[StoreKind], rep: &mut Report) -> Vec<StoreKind> {
        let wanted = self.stores.clone().unwrap_or_else(|| default.to_vec());
        let mut out = Vec::new();
        for k in wanted {
            if k == StoreKind::Postgres {
                let why = if !cfg!(feature = "postgres") {
                    Some(
                        "PostgreSQL scenarios skipped: built without the `postgres` feature \
                         (add `--features postgres`)",
                    )
                } else if self.pg_url.is_none() {
                    Some(
                        "PostgreSQL scenarios skipped: no `--postgres URL` and no \
                         WORKFLOW_BENCH_DATABASE_URL",
                    )
                } else {
                    None
                };
                if let Some(why) = why {
                    if !rep.notes.iter().any(|n| n == why) {
                        rep.note(why);
                    }
                    continue;
                }
            }
            out.push(k);
        }
        out
    }

    pub(crate) async fn fresh(&self, kind: StoreKind) -> BoxResult<Fresh> {
        Fresh::new(kind, self.pg_url.as_deref()).await
    }
}

pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Waits (polling every millisecond) until `cond` holds.
async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> BoxResult<()> {
    let t0 = Instant::now();
    while !cond() {
        if t0.elapsed() > limit {
            return Err(format!("timed out after {limit:?} waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// One short run so that a trial does not time the store's first use.
pub(crate) async fn warm_up(rt: &Runtime) -> BoxResult<()> {
    rt.start(sequential, (3,)).await?.return_value().await?;
    Ok(())
}

pub(crate) fn progress(what: impl std::fmt::Display) {
    eprintln!("  .. {what}");
}

// ---------------------------------------------------------------------------------------------
// 1. baseline

/// The durable-write floor of this machine: a single-row SQLite WAL commit with
/// `synchronous=FULL`, and a small write + fsync, both in the temporary directory (the disk
/// the SQLite scenarios use).
pub async fn baseline(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    let n = ctx.sizes.baseline_ops;
    let mut commit = Vec::new();
    let mut fsync = Vec::new();
    for _ in 0..ctx.trials {
        let dir = tempfile::Builder::new().prefix("wf-bench-").tempdir()?;
        let path = dir.path().to_owned();
        let (c, f) = tokio::task::spawn_blocking(move || -> BoxResult<(f64, f64)> {
            Ok((
                sqlite_commits(&path.join("baseline.db"), n)?,
                fsync_writes(&path.join("baseline.bin"), n)?,
            ))
        })
        .await??;
        commit.push(c);
        fsync.push(f);
    }
    rep.baseline_us = Some(median(&commit));
    rep.push(
        Row::new(
            "baseline",
            "sqlite",
            "1-row WAL commit, synchronous=FULL",
            Unit::Micros,
        )
        .samples(commit),
    );
    rep.push(Row::new("baseline", "file", "64-byte write + fsync", Unit::Micros).samples(fsync));
    Ok(())
}

/// Median time of one autocommitted single-row insert.
fn sqlite_commits(path: &Path, n: usize) -> BoxResult<f64> {
    let conn = rusqlite::Connection::open(path)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("journal_mode is {mode}, not WAL").into());
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")?;
    let mut insert = conn.prepare("INSERT INTO t (v) VALUES (?1)")?;
    let mut times = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t = Instant::now();
        insert.execute([format!("row {i}")])?;
        if i >= 10 {
            times.push(us(t.elapsed()));
        }
    }
    Ok(median(&times))
}

/// Median time of appending 64 bytes to a file and `fsync`ing it.
fn fsync_writes(path: &Path, n: usize) -> BoxResult<f64> {
    let mut f = std::fs::File::create(path)?;
    let mut times = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t = Instant::now();
        f.write_all(&[b'x'; 64])?;
        f.sync_all()?;
        if i >= 10 {
            times.push(us(t.elapsed()));
        }
    }
    Ok(median(&times))
}

// ---------------------------------------------------------------------------------------------
// 2. sequential

/// The store's own cost of one sequential step, without the runtime: one `append` of a step's
/// result and the next step's scheduling (the one commit a step needs), timed from a tokio
/// task as the driver calls it. Median over `n` appends to one leased run.
async fn append_floor(kind: StoreKind, ctx: &Ctx, n: usize) -> BoxResult<f64> {
    use workflow_core::store::{AcquireRequest, Append, NewEvent, NewRun, Store};
    let fresh = ctx.fresh(kind).await?;
    let store: Arc<dyn Store> = match kind {
        StoreKind::Memory => Arc::new(workflow_core::store::memory::MemoryStore::new()),
        StoreKind::Sqlite => Arc::new(
            workflow_core::store::sqlite::SqliteStore::open(
                fresh.sqlite_path().ok_or("no SQLite path")?,
            )
            .await?,
        ),
        StoreKind::Postgres => fresh.pg_store().ok_or("no PostgreSQL store")?,
    };
    // A workflow name no runtime registers: nothing else touches this run.
    let workflow = "bench.floor".to_owned();
    let id = workflow_core::RunId::new();
    store
        .create_run(NewRun::new(
            id,
            workflow.clone(),
            serde_json::json!([]),
            SystemTime::now(),
        ))
        .await?;
    let names = [workflow];
    let leased = store
        .acquire(AcquireRequest {
            worker_id: "bench",
            workflows: &names,
            lease: Duration::from_secs(600),
            limit: 1,
            now: SystemTime::now(),
        })
        .await?;
    let lease = leased
        .first()
        .ok_or("the floor run was not leased")?
        .lease
        .clone();
    let mut times = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let step = |k: usize| format!("bench.tick:{k}");
        let at = SystemTime::now();
        let write = Append {
            events: vec![
                NewEvent {
                    at,
                    event: Event::StepCompleted {
                        step_id: step(i),
                        result: Ok(serde_json::json!(i)),
                    },
                },
                NewEvent {
                    at,
                    event: Event::StepScheduled {
                        step_id: step(i + 1),
                        name: "bench.tick".to_owned(),
                        input: serde_json::json!([i + 1]),
                    },
                },
            ],
            ..Append::default()
        };
        let t = Instant::now();
        store.append(&lease, &write).await?;
        if i >= 10 {
            times.push(us(t.elapsed()));
        }
    }
    drop(store);
    fresh.cleanup().await?;
    Ok(median(&times))
}

pub async fn sequential_steps(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    let n = ctx.sizes.sequential_steps;
    let tenth = (n / 10) as usize;
    for kind in ctx.stores(&[Memory, Sqlite, Postgres], rep) {
        progress(format!("sequential {}", kind.name()));
        let (mut total, mut per, mut first, mut last) = (vec![], vec![], vec![], vec![]);
        let mut floor = vec![];
        for _ in 0..ctx.trials {
            floor.push(append_floor(kind, ctx, n as usize).await?);
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().build().await?;
            warm_up(&rt).await?;
            probe::record_ticks(true);
            let t0 = Instant::now();
            let run = rt.start(sequential, (n,)).await?;
            run.return_value().await?;
            let elapsed = t0.elapsed();
            probe::record_ticks(false);
            rt.shutdown();
            fresh.cleanup().await?;
            // Start times of steps 1..=n.
            let ticks = probe::ticks();
            if ticks.len() != n as usize {
                return Err(format!("{} step starts recorded, not {n}", ticks.len()).into());
            }
            let span = |a: usize, b: usize| us(ticks[b] - ticks[a]) / (b - a) as f64;
            total.push(us(elapsed));
            per.push(us(elapsed) / f64::from(n));
            first.push(span(0, tenth));
            last.push(span(ticks.len() - 1 - tenth, ticks.len() - 1));
        }
        let s = kind.name();
        let per_target = match kind {
            Memory => Some(Target::AtMost(20.0)),
            Sqlite => Some(Target::AtMostCommits(1.5)),
            Postgres => None,
        };
        let first_median = median(&first);
        rep.push(
            Row::new("sequential", s, format!("{n} steps, total"), Unit::Micros).samples(total),
        );
        let mut row = Row::new("sequential", s, "per step", Unit::Micros).samples(per);
        row.target = per_target;
        rep.push(row);
        rep.push(
            Row::new(
                "sequential",
                s,
                "store alone: one step's append",
                Unit::Micros,
            )
            .samples(floor),
        );
        rep.push(
            Row::new(
                "sequential",
                s,
                format!("per step, steps 1-{tenth}"),
                Unit::Micros,
            )
            .samples(first),
        );
        rep.push(
            Row::new(
                "sequential",
                s,
                format!("per step, steps {}-{n}", n as usize - tenth + 1),
                Unit::Micros,
            )
            .samples(last)
            .target(Target::NoSlowerThan(first_median, 1.25)),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. throughput

pub async fn throughput(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    let runs = ctx.sizes.throughput_runs;
    let steps = ctx.sizes.throughput_steps;
    for kind in ctx.stores(&[Sqlite, Postgres], rep) {
        progress(format!("throughput {}", kind.name()));
        let (mut sps, mut wps) = (vec![], vec![]);
        for _ in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().build().await?;
            warm_up(&rt).await?;
            let t0 = Instant::now();
            let tasks: Vec<_> = (0..runs)
                .map(|_| {
                    let rt = rt.clone();
                    tokio::spawn(async move {
                        let run = rt.start(sequential, (steps,)).await?;
                        run.return_value().await?;
                        BoxResult::Ok(())
                    })
                })
                .collect();
            for t in tasks {
                t.await??;
            }
            let wall = t0.elapsed().as_secs_f64();
            rt.shutdown();
            fresh.cleanup().await?;
            sps.push((runs as f64 * f64::from(steps)) / wall);
            wps.push(runs as f64 / wall);
        }
        let s = kind.name();
        let mut row = Row::new(
            "throughput",
            s,
            format!("{runs} runs × {steps} steps: steps/s"),
            Unit::PerSec,
        )
        .samples(sps);
        if kind == Sqlite {
            row = row.target(Target::AtLeast(20_000.0));
        }
        rep.push(row);
        rep.push(Row::new("throughput", s, "workflows/s", Unit::PerSec).samples(wps));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 4. recovery

/// Pause of the recovering workflow's durable sleep; the first runtime is gone long before.
const RECOVERY_PAUSE_MS: u64 = 200;

/// A history of `n` steps and a pending sleep: the first runtime runs the workflow to its
/// sleep, is evicted there (everything durable, lease released) and shut down. Returns the
/// number of recorded events and when the sleep ends.
pub(crate) async fn build_history(fresh: &Fresh, n: u32) -> BoxResult<(usize, SystemTime)> {
    probe::reset();
    let rt = fresh
        .builder()
        .evict_after(Duration::ZERO)
        .lease(Duration::from_millis(100))
        .build()
        .await?;
    let run = rt.start(recovering, (n, RECOVERY_PAUSE_MS)).await?;
    let limit = Duration::from_secs(600);
    until("the history to be built", limit, probe::has_reached).await?;
    until("the run to be evicted at its sleep", limit, || {
        rt.active_runs() == 0
    })
    .await?;
    rt.shutdown();
    let events = rt.store().events(&run.id()).await?;
    let fire_at = events
        .iter()
        .find_map(|e| match &e.event {
            Event::TimerScheduled { fire_at_ms, .. } => {
                Some(SystemTime::UNIX_EPOCH + Duration::from_millis(*fire_at_ms))
            }
            _ => None,
        })
        .ok_or("the recovering run recorded no sleep")?;
    if probe::progressed_at().is_some() {
        return Err("the first runtime went past the sleep".into());
    }
    Ok((events.len(), fire_at))
}

/// From the build of a new runtime until the recovered run runs its first live step.
pub(crate) async fn recover(fresh: &Fresh, fire_at: SystemTime) -> BoxResult<Duration> {
    if let Ok(d) = fire_at.duration_since(SystemTime::now()) {
        tokio::time::sleep(d + Duration::from_millis(5)).await;
    }
    probe::reset();
    let t0 = Instant::now();
    let rt = fresh.builder().build().await?;
    until(
        "the recovered run to progress",
        Duration::from_secs(600),
        || probe::progressed_at().is_some(),
    )
    .await?;
    let at = probe::progressed_at().ok_or("no progress mark")?;
    rt.shutdown();
    Ok(at - t0)
}

pub async fn recovery(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    for kind in ctx.stores(&[Memory, Sqlite, Postgres], rep) {
        let sizes = if kind == Postgres {
            ctx.sizes.recovery_steps_pg.clone()
        } else {
            ctx.sizes.recovery_steps.clone()
        };
        for &n in &sizes {
            progress(format!("recovery {} {n}", kind.name()));
            let mut times = Vec::new();
            let mut events = 0;
            if kind == Sqlite {
                // Built once, copied for every trial: each trial still opens its own file.
                let template = ctx.fresh(kind).await?;
                let (ev, fire_at) = build_history(&template, n).await?;
                events = ev;
                let src = template.sqlite_path().ok_or("no SQLite path")?;
                let copy = tempfile::Builder::new().prefix("wf-bench-").tempdir()?;
                let snapshot = copy.path().join("template.db");
                rusqlite::Connection::open(&src)?
                    .execute("VACUUM INTO ?1", [snapshot.to_string_lossy()])?;
                template.cleanup().await?;
                for _ in 0..ctx.trials {
                    let fresh = ctx.fresh(kind).await?;
                    std::fs::copy(&snapshot, fresh.sqlite_path().ok_or("no SQLite path")?)?;
                    times.push(us(recover(&fresh, fire_at).await?));
                    fresh.cleanup().await?;
                }
            } else {
                for _ in 0..ctx.trials {
                    let fresh = ctx.fresh(kind).await?;
                    let (ev, fire_at) = build_history(&fresh, n).await?;
                    events = ev;
                    times.push(us(recover(&fresh, fire_at).await?));
                    fresh.cleanup().await?;
                }
            }
            let mut row = Row::new(
                "recovery",
                kind.name(),
                format!("{n}-step history ({events} events)"),
                Unit::Micros,
            )
            .samples(times);
            if n == 10_000 {
                row = row.target(Target::AtMost(100_000.0));
            }
            rep.push(row);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 5. start storm

pub async fn start_storm(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    let n = ctx.sizes.storm_starts;
    for kind in ctx.stores(&[Memory, Sqlite, Postgres], rep) {
        progress(format!("start storm {}", kind.name()));
        let (mut p50, mut p99, mut created) = (vec![], vec![], vec![]);
        for trial in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().build().await?;
            warm_up(&rt).await?;
            let token = format!("storm-{trial}");
            let barrier = Arc::new(tokio::sync::Barrier::new(n));
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let (rt, token, barrier) = (rt.clone(), token.clone(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        let t = Instant::now();
                        let r = rt.start(parked, (token.clone(),)).hook(token).await;
                        (t.elapsed(), r.map(|run| run.id()))
                    })
                })
                .collect();
            let mut lat = Vec::with_capacity(n);
            let mut admitted = Vec::new();
            let mut owners = HashSet::new();
            for t in tasks {
                let (d, r) = t.await?;
                lat.push(us(d));
                match r {
                    Ok(id) => {
                        admitted.push(id);
                        owners.insert(id);
                    }
                    Err(StartError::HookConflict(e)) => {
                        owners.insert(e.conflicting_run_id);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            // The owner waits on its hook through the storm; let it finish.
            rt.resume_hook(&token, 0u64).await?;
            for id in &admitted {
                rt.get_run(id).return_value().await?;
            }
            rt.shutdown();
            fresh.cleanup().await?;
            p50.push(percentile(&lat, 50.0));
            p99.push(percentile(&lat, 99.0));
            // Runs admitted, and any other run a conflict named.
            created.push(admitted.len().max(owners.len()) as f64);
        }
        let s = kind.name();
        rep.push(
            Row::new(
                "start storm",
                s,
                format!("{n} starts, one token: p50"),
                Unit::Micros,
            )
            .samples(p50),
        );
        rep.push(
            Row::new("start storm", s, "p99", Unit::Micros)
                .samples(p99)
                .target(Target::AtMost(50_000.0)),
        );
        rep.push(
            Row::new("start storm", s, "runs created", Unit::Count)
                .samples(created)
                .target(Target::Exactly(1.0)),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 6. hook latency

/// Payloads discarded at the start of each trial (the first includes the run's first pick-up).
const HOOK_WARM_UP: usize = 3;

async fn hook_trial(
    ctx: &Ctx,
    kind: StoreKind,
    evicted: bool,
    trial: usize,
) -> BoxResult<Vec<f64>> {
    let count = if evicted {
        ctx.sizes.hooks_evicted
    } else {
        ctx.sizes.hooks_live
    } + HOOK_WARM_UP as u64;
    let fresh = ctx.fresh(kind).await?;
    let mut b = fresh.builder();
    if evicted {
        b = b.evict_after(Duration::ZERO);
    }
    let rt = b.build().await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    probe::set_observer(Some(tx));
    let token = format!("hook-{trial}");
    let run = rt
        .start(listener, (token.clone(), count))
        .hook(&token)
        .await?;
    let limit = Duration::from_secs(60);
    let mut lat = Vec::new();
    for seq in 0..count {
        if evicted {
            until("the listener to be evicted", limit, || {
                rt.active_runs() == 0
            })
            .await?;
        }
        let t = Instant::now();
        rt.resume_hook(&token, seq).await?;
        loop {
            let (s, at) = tokio::time::timeout(limit, rx.recv())
                .await?
                .ok_or("observer closed")?;
            if s == seq {
                lat.push(us(at - t));
                break;
            }
        }
    }
    run.return_value().await?;
    probe::set_observer(None);
    rt.shutdown();
    fresh.cleanup().await?;
    Ok(lat.split_off(HOOK_WARM_UP))
}

pub async fn hook_latency(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    for kind in ctx.stores(&[Memory, Sqlite, Postgres], rep) {
        for evicted in [false, true] {
            let mode = if evicted { "evicted run" } else { "live run" };
            progress(format!("hook latency {} {mode}", kind.name()));
            let (mut p50, mut p99) = (vec![], vec![]);
            for trial in 0..ctx.trials {
                let lat = hook_trial(ctx, kind, evicted, trial).await?;
                p50.push(percentile(&lat, 50.0));
                p99.push(percentile(&lat, 99.0));
            }
            let s = kind.name();
            let mut row =
                Row::new("hook latency", s, format!("{mode}: p50"), Unit::Micros).samples(p50);
            if !evicted {
                row = row.target(Target::AtMost(1000.0));
            }
            rep.push(row);
            rep.push(
                Row::new("hook latency", s, format!("{mode}: p99"), Unit::Micros).samples(p99),
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 7. memory

/// Resident set size of this process, from /proc/self/status.
pub(crate) fn vm_rss() -> BoxResult<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS in /proc/self/status")?;
    let kib: f64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib * 1024.0)
}

/// Gives freed heap pages back to the kernel, so RSS shows what is live.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim only releases free memory; any pad value is valid.
        unsafe {
            malloc_trim(0);
        }
    }
}

pub async fn memory(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    for kind in ctx.stores(&[Memory, Sqlite], rep) {
        let n = ctx.sizes.parked_runs;
        progress(format!("memory {} ({n} runs)", kind.name()));
        let (mut raw, mut trimmed) = (vec![], vec![]);
        for _ in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().evict_after(Duration::ZERO).build().await?;
            warm_up(&rt).await?;
            probe::reset();
            tokio::time::sleep(Duration::from_millis(200)).await;
            trim_heap();
            let before = vm_rss()?;
            let started: Vec<BoxResult<()>> = futures::stream::iter(0..n)
                .map(|i| {
                    let rt = rt.clone();
                    async move {
                        let token = format!("park-{i}");
                        rt.start(parked, (token.clone(),)).hook(token).await?;
                        BoxResult::Ok(())
                    }
                })
                .buffer_unordered(256)
                .collect()
                .await;
            started.into_iter().collect::<BoxResult<Vec<()>>>()?;
            until(
                "every run to park and be evicted",
                Duration::from_secs(1800),
                || probe::parked_count() == n as u64 && rt.active_runs() == 0,
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let after_raw = vm_rss()?;
            trim_heap();
            let after = vm_rss()?;
            rt.shutdown();
            fresh.cleanup().await?;
            raw.push((after_raw - before) / n as f64);
            trimmed.push((after - before) / n as f64);
        }
        let s = kind.name();
        rep.push(
            Row::new(
                "memory",
                s,
                format!("{n} runs on hooks, evicted: RSS per run"),
                Unit::Bytes,
            )
            .samples(raw)
            .target(Target::AtMost(2048.0)),
        );
        rep.push(
            Row::new("memory", s, "same, after malloc_trim(0)", Unit::Bytes)
                .samples(trimmed)
                .target(Target::AtMost(2048.0)),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 7b. replay test

/// What a replay test of a new build costs (`testing::replay`): a run of `replay_steps` sequential steps
/// on the memory store is exported once; each trial times `testing::replay` of that history
/// against the workflow (no store, no step bodies), from the JSON value a test reads.
pub async fn replay_test(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    let n = ctx.sizes.replay_steps;
    progress(format!("replay test {n}"));
    let rt = Runtime::builder().in_memory().build().await?;
    let run = rt.start(sequential, (n,)).await?;
    run.return_value().await?;
    let history = run.export().await?;
    rt.shutdown();
    let events = history["events"].as_array().map_or(0, Vec::len);
    let mut times = Vec::new();
    for _ in 0..ctx.trials {
        let t0 = Instant::now();
        workflow_core::testing::replay(sequential, &history)?;
        times.push(us(t0.elapsed()));
    }
    rep.push(
        Row::new(
            "replay test",
            "none",
            format!("testing::replay, {n}-step history ({events} events)"),
            Unit::Micros,
        )
        .samples(times),
    );
    Ok(())
}

/// A queue's slot handed over: runs of one 1-step workflow started at once into a queue of
/// concurrency 1, so each begins when the one before it ends. Per trial, the median time from
/// a run's step to the next run's step: the run's end written (its slot released), the next
/// run begun by a worker and its step started.
pub async fn queue_handoff(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    let n = ctx.sizes.handoff_runs;
    let stores = ctx.stores(
        &[StoreKind::Memory, StoreKind::Sqlite, StoreKind::Postgres],
        rep,
    );
    for kind in stores {
        let (mut p50, mut p99) = (Vec::new(), Vec::new());
        for _ in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh
                .builder()
                .queue(Queue::new("handoff").concurrency(1))
                .build()
                .await?;
            warm_up(&rt).await?;
            probe::record_ticks(true);
            let mut runs = Vec::with_capacity(n);
            for _ in 0..n {
                runs.push(rt.start(sequential, (1,)).queue("handoff").await?);
            }
            for run in runs {
                run.return_value().await?;
            }
            probe::record_ticks(false);
            let mut ticks = probe::ticks();
            ticks.sort();
            let mut gaps: Vec<f64> = ticks.windows(2).map(|w| us(w[1] - w[0])).collect();
            gaps.sort_by(f64::total_cmp);
            p50.push(percentile(&gaps, 50.0));
            p99.push(percentile(&gaps, 99.0));
            rt.shutdown();
            fresh.cleanup().await?;
        }
        let s = kind.name();
        rep.push(
            Row::new(
                "queue handoff",
                s,
                format!("slot released → next queued run's step, {n} runs, concurrency 1: p50"),
                Unit::Micros,
            )
            .samples(p50),
        );
        rep.push(Row::new("queue handoff", s, "… p99", Unit::Micros).samples(p99));
    }
    Ok(())
}
