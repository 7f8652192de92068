//! Scale-out: steps per second with 1, 2 and 3 worker processes on one
//! database, and the CPU each step costs in the workers and, on PostgreSQL, in the database
//! server (every `postgres` process of this host), so the scaling can be projected beyond this
//! 2-core machine. The workers are this binary re-executed ([`Writer`]); this process only
//! starts runs and waits for them (a client runtime, no worker).

use std::time::{Duration, Instant};

use crate::flows::{napping, sequential};
use crate::report::{Report, Row, Unit};
use crate::scenarios::Ctx;
use crate::stores::StoreKind;
use crate::streams::Writer;
use crate::BoxResult;

/// CPU time (user + system) of process `pid` so far, in seconds; 0 when it is gone.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name, which is in parentheses and may hold spaces.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / clock_ticks()
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`), 100 if it cannot be read.
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The pids of this host's PostgreSQL server processes.
fn postgres_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .collect()
}

/// CPU seconds of the server's processes so far (those gone meanwhile are not counted).
fn postgres_cpu(pids: &[u32]) -> f64 {
    pids.iter().map(|p| cpu_seconds(*p)).sum()
}

/// One trial: `workers` processes drive `runs` runs of `steps` steps, all started at once.
/// (steps/s, worker CPU µs per step, database CPU µs per step).
async fn trial(
    ctx: &Ctx,
    kind: StoreKind,
    workers: usize,
    runs: usize,
    steps: u32,
) -> BoxResult<(f64, f64, f64)> {
    let fresh = ctx.fresh(kind).await?;
    let rt = fresh.builder().worker(false).build().await?;
    let procs: Vec<Writer> = (0..workers)
        .map(|_| Writer::spawn(&fresh))
        .collect::<BoxResult<_>>()?;
    // Warm up every worker's connections.
    for _ in 0..workers * 2 {
        rt.start(sequential, (2,)).await?.return_value().await?;
    }
    let pids: Vec<u32> = procs.iter().map(|w| w.0.id()).collect();
    let server = if kind == StoreKind::Postgres {
        postgres_pids()
    } else {
        Vec::new()
    };
    let (workers_before, server_before) = (
        pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>(),
        postgres_cpu(&server),
    );
    let t = Instant::now();
    let mut started = Vec::with_capacity(runs);
    for _ in 0..runs {
        started.push(rt.start(sequential, (steps,)).await?);
    }
    for run in started {
        run.return_value().await?;
    }
    let took = t.elapsed().as_secs_f64();
    let workers_cpu = pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - workers_before;
    let server_cpu = postgres_cpu(&server) - server_before;
    drop(procs);
    rt.shutdown();
    fresh.cleanup().await?;
    let total = (runs as f64) * f64::from(steps);
    Ok((
        total / took,
        workers_cpu / total * 1e6,
        server_cpu / total * 1e6,
    ))
}

/// The lease of the failover trial's workers.
const FAILOVER_LEASE: Duration = Duration::from_secs(2);

/// Failover: one worker process takes `runs` runs of slow steps, a second one starts, and the
/// first is SIGKILLed. The time from the kill until every run has recorded a new event: the
/// last of the killed worker's runs resuming on the other (its lease expiring, then the
/// other's poll).
async fn failover_trial(ctx: &Ctx, kind: StoreKind, runs: usize) -> BoxResult<f64> {
    let fresh = ctx.fresh(kind).await?;
    let rt = fresh.builder().worker(false).build().await?;
    let lease = [("WF_BENCH_LEASE_MS", FAILOVER_LEASE.as_millis().to_string())];
    // The doomed worker alone takes every run; the survivor starts only then.
    let mut doomed = Writer::spawn_with(&fresh, &lease)?;
    let mut started = Vec::with_capacity(runs);
    for _ in 0..runs {
        started.push(rt.start(napping, (10_000, 20)).await?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let survivor = Writer::spawn_with(&fresh, &lease)?;
    let store = rt.store().clone();
    let mut seen = Vec::with_capacity(runs);
    for run in &started {
        seen.push(store.events(&run.id()).await?.len());
    }
    doomed.0.kill()?;
    let killed = Instant::now();
    let _ = doomed.0.wait();
    let mut moved = vec![false; runs];
    while moved.iter().any(|m| !m) {
        if killed.elapsed() > FAILOVER_LEASE * 10 {
            return Err("the killed worker's runs did not resume in time".into());
        }
        for (i, run) in started.iter().enumerate() {
            if !moved[i] {
                moved[i] = store.events(&run.id()).await?.len() > seen[i];
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = killed.elapsed().as_secs_f64() * 1e6;
    for run in &started {
        let _ = run.cancel().await;
    }
    drop(survivor);
    rt.shutdown();
    fresh.cleanup().await?;
    Ok(took)
}

/// Steps/s and CPU per step with 1, 2 and 3 worker processes, on SQLite and PostgreSQL.
pub async fn scale_out(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    let (runs, steps) = (ctx.sizes.scale_runs, ctx.sizes.scale_steps);
    for kind in ctx.stores(&[Sqlite, Postgres], rep) {
        if kind == Memory {
            continue;
        }
        for workers in 1..=3 {
            crate::scenarios::progress(format!("scale-out {} × {workers}", kind.name()));
            let (mut rate, mut cpu, mut db) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ctx.trials {
                let (r, c, d) = trial(ctx, kind, workers, runs, steps).await?;
                rate.push(r);
                cpu.push(c);
                db.push(d);
            }
            let s = kind.name();
            let what = format!(
                "{workers} worker process{}, {runs} runs × {steps} steps",
                if workers == 1 { "" } else { "es" }
            );
            rep.push(
                Row::new("scale-out", s, format!("{what}: steps/s"), Unit::PerSec).samples(rate),
            );
            rep.push(
                Row::new(
                    "scale-out",
                    s,
                    format!("{what}: workers' CPU per step"),
                    Unit::Micros,
                )
                .samples(cpu),
            );
            if kind == Postgres {
                rep.push(
                    Row::new(
                        "scale-out",
                        s,
                        format!("{what}: server's CPU per step"),
                        Unit::Micros,
                    )
                    .samples(db),
                );
            }
        }
        crate::scenarios::progress(format!("failover {}", kind.name()));
        let mut took = Vec::new();
        for _ in 0..ctx.trials {
            took.push(failover_trial(ctx, kind, ctx.sizes.scale_runs.min(20)).await?);
        }
        rep.push(
            Row::new(
                "scale-out",
                kind.name(),
                format!(
                    "a worker SIGKILLed (lease {} s): until all its runs resumed elsewhere",
                    FAILOVER_LEASE.as_secs()
                ),
                Unit::Micros,
            )
            .samples(took),
        );
    }
    Ok(())
}
