//! Streams: how many chunks one writer appends per second, and how long a
//! chunk takes from `write` to a reader of `run.stream(..)`: in the writer's own runtime (woken
//! at once), and in another process (this binary re-executed as the worker that writes: woken
//! by PostgreSQL's notices, or by the poll interval on SQLite).
//!
//! A timed chunk carries the wall-clock time of its `write` call (µs since the Unix epoch); the
//! reader subtracts it from the time it receives the chunk. Both processes run on this machine,
//! so they read one clock.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use workflow_core::prelude::*;

use crate::report::{percentile, Report, Row, Unit};
use crate::scenarios::Ctx;
use crate::stores::{Fresh, StoreKind};
use crate::BoxResult;

/// Chunks of each latency trial discarded first (the run's first pick-up, the first reads).
const WARM_UP: usize = 3;
/// The environment variable that makes this binary the writer process of a trial.
const CHILD: &str = "WF_BENCH_STREAM_WRITER";

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Writes `n` chunks one after the other, then closes: the µs it took.
#[step]
async fn write_chunks(n: u32) -> Result<u64> {
    let out = stream::<u32>("bench");
    let t = Instant::now();
    for i in 0..n {
        out.write(i).await?;
    }
    out.close().await?;
    Ok(t.elapsed().as_micros() as u64)
}

#[workflow]
async fn chunk_writer(n: u32) -> Result<u64> {
    write_chunks(n).await
}

/// Writes `n` chunks `gap_ms` apart, each holding the time its write began, then closes.
#[step]
async fn write_timed(n: u32, gap_ms: u64) -> Result<()> {
    let out = stream::<u64>("timed");
    for _ in 0..n {
        out.write(now_us()).await?;
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
    }
    out.close().await
}

#[workflow]
async fn timed_writer(n: u32, gap_ms: u64) -> Result<()> {
    write_timed(n, gap_ms).await
}

/// Whether this process is a writer started by [`cross_process_trial`]; if so, serves as the
/// worker of the store its parent named until its parent closes its standard input.
pub async fn child() -> Option<BoxResult<()>> {
    let store = std::env::var(CHILD).ok()?;
    Some(
        async move {
            let var = |k: &str| std::env::var(k).map_err(|e| format!("{k}: {e}"));
            let b = Runtime::builder();
            let b = match store.as_str() {
                "sqlite" => b.sqlite(var("WF_BENCH_DB")?),
                #[cfg(feature = "postgres")]
                "postgres" => b
                    .postgres(var("WF_BENCH_PG_URL")?)
                    .schema(var("WF_BENCH_SCHEMA")?),
                other => return Err(format!("unknown store {other:?}").into()),
            };
            // The scale-out scenario's failover trial shortens the lease.
            let b = match std::env::var("WF_BENCH_LEASE_MS")
                .ok()
                .and_then(|v| v.parse().ok())
            {
                Some(ms) => b.lease(Duration::from_millis(ms)),
                None => b,
            };
            let _rt = b.build().await?;
            // The messages scenario's cross-process trial: when each message reached `recv`.
            if std::env::var_os(OBSERVE).is_some() {
                report_observations();
            }
            println!("READY");
            std::io::stdout().flush()?;
            // Until the parent is done (or gone): its end of the pipe closes.
            tokio::task::spawn_blocking(|| {
                let mut sink = String::new();
                while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
            })
            .await?;
            Ok(())
        }
        .await,
    )
}

/// Set for a worker process that prints `OBSERVED <seq> <unix ns>` for each payload its
/// workflows observe ([`crate::flows::probe::observed`]).
pub(crate) const OBSERVE: &str = "WF_BENCH_OBSERVE";

/// Prints each observation of this process's workflows with its wall-clock time, which the
/// parent compares with its own (one machine, one clock).
fn report_observations() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant)>();
    crate::flows::probe::set_observer(Some(tx));
    tokio::spawn(async move {
        while let Some((seq, at)) = rx.recv().await {
            let wall = SystemTime::now() - at.elapsed();
            let ns = wall
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "OBSERVED {seq} {ns}");
            let _ = out.flush();
        }
    });
}

/// A worker process (this binary re-executed) on `fresh`'s store, driving every workflow of
/// the benchmark; killed when dropped. The streams scenario's writer, the scale-out
/// scenario's workers.
pub(crate) struct Writer(pub(crate) Child, Option<BufReader<ChildStdout>>);

impl Writer {
    pub(crate) fn spawn(fresh: &Fresh) -> BoxResult<Writer> {
        Self::spawn_with(fresh, &[])
    }

    /// [`Writer::spawn`] with more environment for the process.
    pub(crate) fn spawn_with(fresh: &Fresh, env: &[(&str, String)]) -> BoxResult<Writer> {
        let mut cmd = Command::new(std::env::current_exe()?);
        if cfg!(test) {
            // The test binary: its ignored entry point serves as the writer.
            cmd.args([
                "--ignored",
                "--exact",
                "tests::stream_writer_child",
                "--nocapture",
                "--test-threads=1",
            ]);
        }
        cmd.env(CHILD, fresh.kind.name())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in fresh.child_env() {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        // (Under libtest, the line may follow the harness's own output.)
        let mut line = String::new();
        let ready = loop {
            line.clear();
            match out.read_line(&mut line) {
                Ok(0) | Err(_) => break false,
                Ok(_) if line.contains("READY") => break true,
                Ok(_) => {}
            }
        };
        if !ready {
            return Err("the writer process ended before it was ready".into());
        }
        Ok(Writer(child, Some(out)))
    }

    /// What the process prints after `READY`, once.
    pub(crate) fn take_output(&mut self) -> Option<BufReader<ChildStdout>> {
        self.1.take()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One writer, `n` chunks one after the other: chunks per second.
async fn throughput_trial(ctx: &Ctx, kind: StoreKind) -> BoxResult<f64> {
    let n = ctx.sizes.stream_chunks;
    let fresh = ctx.fresh(kind).await?;
    let rt = fresh.builder().build().await?;
    rt.start(chunk_writer, (3,)).await?.return_value().await?;
    let run = rt.start(chunk_writer, (n,)).await?;
    let took_us = run.return_value().await?;
    let read = run
        .stream::<u32>("bench")
        .fold(0u32, |n, _| async move { n + 1 })
        .await;
    if read != n {
        return Err(format!("wrote {n} chunks, read {read}").into());
    }
    rt.shutdown();
    fresh.cleanup().await?;
    Ok(f64::from(n) / (took_us.max(1) as f64 / 1e6))
}

/// Reads the timed stream of `run` to its end: each chunk's latency in µs, warm-up dropped.
async fn latencies<T>(run: &Run<T>) -> BoxResult<Vec<f64>> {
    let mut chunks = run.stream::<u64>("timed");
    let mut lat = Vec::new();
    while let Some(c) = chunks.next().await {
        lat.push(now_us().saturating_sub(c?.value) as f64);
    }
    Ok(lat.split_off(WARM_UP.min(lat.len())))
}

/// The reader in the writer's runtime.
async fn in_process_trial(ctx: &Ctx, kind: StoreKind) -> BoxResult<Vec<f64>> {
    let fresh = ctx.fresh(kind).await?;
    let rt = fresh.builder().build().await?;
    let n = ctx.sizes.stream_timed + WARM_UP as u32;
    let run = rt.start(timed_writer, (n, 5)).await?;
    let lat = latencies(&run).await?;
    run.return_value().await?;
    rt.shutdown();
    fresh.cleanup().await?;
    Ok(lat)
}

/// The reader in this process (a client: it drives no runs), the writer another process.
async fn cross_process_trial(ctx: &Ctx, kind: StoreKind) -> BoxResult<Vec<f64>> {
    let fresh = ctx.fresh(kind).await?;
    let rt = fresh.builder().worker(false).build().await?;
    let writer = Writer::spawn(&fresh)?;
    let n = ctx.sizes.stream_timed + WARM_UP as u32;
    let run = rt.start(timed_writer, (n, 5)).await?;
    let lat = latencies(&run).await?;
    run.return_value().await?;
    drop(writer);
    rt.shutdown();
    fresh.cleanup().await?;
    Ok(lat)
}

pub async fn streams(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    let limit = Duration::from_secs(300);
    for kind in ctx.stores(&[Memory, Sqlite, Postgres], rep) {
        let s = kind.name();
        eprintln!("  .. streams {s}");
        let mut rates = Vec::new();
        let (mut local, mut remote) = (Vec::new(), Vec::new());
        for _ in 0..ctx.trials {
            rates.push(tokio::time::timeout(limit, throughput_trial(ctx, kind)).await??);
            let lat = tokio::time::timeout(limit, in_process_trial(ctx, kind)).await??;
            local.push(percentile(&lat, 50.0));
            if kind != Memory {
                let lat = tokio::time::timeout(limit, cross_process_trial(ctx, kind)).await??;
                remote.push(percentile(&lat, 50.0));
            }
        }
        let n = ctx.sizes.stream_chunks;
        rep.push(
            Row::new(
                "streams",
                s,
                format!("one writer, {n} chunks: chunks/s"),
                Unit::PerSec,
            )
            .samples(rates),
        );
        rep.push(
            Row::new(
                "streams",
                s,
                "write → reader, same runtime: p50",
                Unit::Micros,
            )
            .samples(local),
        );
        if !remote.is_empty() {
            let how = if kind == Postgres {
                "LISTEN/NOTIFY"
            } else {
                "poll every 200 ms"
            };
            rep.push(
                Row::new(
                    "streams",
                    s,
                    format!("write → reader, another process ({how}): p50"),
                    Unit::Micros,
                )
                .samples(remote),
            );
        }
    }
    Ok(())
}
