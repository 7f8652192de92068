//! Talking to a running run: how long a message takes from `run.send` to the
//! workflow's `recv` in the sender's own runtime and in a worker process (p50, the latter by
//! the wall clock both processes share), how long a `run.request` takes to get
//! the workflow's reply (p50) in the caller's runtime and from a client process whose run
//! another process drives (this binary re-executed, as the streams scenario's writer), and how
//! many messages per second one run takes in when eight senders send to it at once. On SQLite
//! and PostgreSQL (and memory, in-process only, for reference).
//!
//! Sizes: the payloads of the hook latency scenario (`hooks_live`) for the two latencies, the
//! chunks of the streams scenario (`stream_chunks`) for the burst.

use std::io::BufRead as _;
use std::time::{Duration, Instant, SystemTime};

use workflow_core::prelude::*;

use crate::flows::probe;
use crate::report::{percentile, Report, Row, Target, Unit};
use crate::scenarios::{progress, Ctx};
use crate::stores::StoreKind;
use crate::streams::{Writer, OBSERVE};
use crate::BoxResult;

/// Messages (and requests) discarded at the start of each trial (the run's first pick-up).
const WARM_UP: usize = 3;
/// Concurrent senders of the burst.
const SENDERS: usize = 8;

/// Receives `count` messages on "ping", telling the probe when each arrived.
#[workflow(name = "bench.inbox")]
async fn inbox(count: u64) -> Result<u64> {
    for _ in 0..count {
        let seq = recv::<u64>("ping").await?;
        probe::observed(seq);
    }
    Ok(count)
}

/// Answers `count` requests "echo" with their body.
#[workflow(name = "bench.echo")]
async fn echo(count: u64) -> Result<u64> {
    let mut asks = requests::<u64, u64>("echo");
    for _ in 0..count {
        let Some(req) = asks.next().await else {
            return Err(Error::fatal("the stream of requests ended"));
        };
        req.reply(*req.body())?;
    }
    Ok(count)
}

/// Receives `count` messages on "burst".
#[workflow(name = "bench.sink")]
async fn sink(count: u64) -> Result<u64> {
    let mut sum = 0;
    for _ in 0..count {
        sum += recv::<u64>("burst").await?;
    }
    Ok(sum)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `run.send` → the workflow's `recv`, in the sender's runtime: µs per message.
async fn send_trial(ctx: &Ctx, kind: StoreKind) -> BoxResult<Vec<f64>> {
    let count = ctx.sizes.hooks_live + WARM_UP as u64;
    let fresh = ctx.fresh(kind).await?;
    let rt = fresh.builder().build().await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    probe::set_observer(Some(tx));
    let run = rt.start(inbox, (count,)).await?;
    let limit = Duration::from_secs(60);
    let mut lat = Vec::new();
    for seq in 0..count {
        let t = Instant::now();
        run.send("ping", seq).await?;
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
    Ok(lat.split_off(WARM_UP))
}

/// `run.send` from this process → the workflow's `recv` in a worker process (this binary
/// re-executed, printing when each message arrived): µs per message, by the wall clock both
/// processes share.
async fn remote_send_trial(ctx: &Ctx, kind: StoreKind) -> BoxResult<Vec<f64>> {
    let count = ctx.sizes.hooks_live + WARM_UP as u64;
    let fresh = ctx.fresh(kind).await?;
    let rt = fresh.builder().worker(false).build().await?;
    let mut worker = Writer::spawn_with(&fresh, &[(OBSERVE, "1".to_owned())])?;
    let out = worker
        .take_output()
        .ok_or("the worker's output was taken")?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, u128)>();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let mut words = line.split_whitespace();
            if words.next() != Some("OBSERVED") {
                continue;
            }
            let seq = words.next().and_then(|w| w.parse().ok());
            let ns = words.next().and_then(|w| w.parse().ok());
            if let (Some(seq), Some(ns)) = (seq, ns) {
                if tx.send((seq, ns)).is_err() {
                    return;
                }
            }
        }
    });
    let run = rt.start(inbox, (count,)).await?;
    let limit = Duration::from_secs(60);
    let mut lat = Vec::new();
    for seq in 0..count {
        let sent = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)?;
        run.send("ping", seq).await?;
        loop {
            let (s, at_ns) = tokio::time::timeout(limit, rx.recv())
                .await?
                .ok_or("the worker process ended")?;
            if s == seq {
                lat.push((at_ns.saturating_sub(sent.as_nanos())) as f64 / 1e3);
                break;
            }
        }
    }
    run.return_value().await?;
    drop(worker);
    rt.shutdown();
    fresh.cleanup().await?;
    Ok(lat.split_off(WARM_UP))
}

/// `run.request` → its reply: µs per round trip, the caller in the runtime that drives the
/// run, or (`remote`) a client while a worker process drives it.
async fn request_trial(ctx: &Ctx, kind: StoreKind, remote: bool) -> BoxResult<Vec<f64>> {
    let count = ctx.sizes.hooks_live + WARM_UP as u64;
    let fresh = ctx.fresh(kind).await?;
    let rt = fresh.builder().worker(!remote).build().await?;
    let worker = if remote {
        Some(Writer::spawn(&fresh)?)
    } else {
        None
    };
    let run = rt.start(echo, (count,)).await?;
    let limit = Duration::from_secs(60);
    let mut lat = Vec::new();
    for seq in 0..count {
        let t = Instant::now();
        let got: u64 = run.request::<u64, u64>("echo", seq).timeout(limit).await?;
        lat.push(us(t.elapsed()));
        if got != seq {
            return Err(format!("request {seq} got the reply {got}").into());
        }
    }
    run.return_value().await?;
    drop(worker);
    rt.shutdown();
    fresh.cleanup().await?;
    Ok(lat.split_off(WARM_UP))
}

/// Eight senders send `stream_chunks` messages to one run at once: messages per second, from
/// the first send to the run's end (every message received).
async fn burst_trial(ctx: &Ctx, kind: StoreKind) -> BoxResult<f64> {
    let per_sender = (ctx.sizes.stream_chunks as usize).div_ceil(SENDERS) as u64;
    let total = per_sender * SENDERS as u64;
    let fresh = ctx.fresh(kind).await?;
    let rt = fresh.builder().build().await?;
    let run = rt.start(sink, (total,)).await?;
    let t = Instant::now();
    let mut senders = Vec::new();
    for _ in 0..SENDERS {
        let run = run.clone();
        senders.push(tokio::spawn(async move {
            for i in 0..per_sender {
                run.send("burst", i).await?;
            }
            Ok::<_, workflow_core::RunError>(())
        }));
    }
    for s in senders {
        s.await??;
    }
    let sum = tokio::time::timeout(Duration::from_secs(300), run.return_value()).await??;
    let elapsed = t.elapsed();
    let expected = SENDERS as u64 * per_sender * per_sender.saturating_sub(1) / 2;
    if sum != expected {
        return Err(format!("the run summed {sum}, not {expected}").into());
    }
    rt.shutdown();
    fresh.cleanup().await?;
    Ok(total as f64 / elapsed.as_secs_f64())
}

pub async fn messages(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    for kind in ctx.stores(&[Memory, Sqlite, Postgres], rep) {
        let s = kind.name();
        progress(format!("messages {s}"));
        let (mut send, mut request, mut remote, mut burst) = (vec![], vec![], vec![], vec![]);
        let mut remote_send = vec![];
        for _ in 0..ctx.trials {
            send.push(percentile(&send_trial(ctx, kind).await?, 50.0));
            request.push(percentile(&request_trial(ctx, kind, false).await?, 50.0));
            if kind != Memory {
                remote_send.push(percentile(&remote_send_trial(ctx, kind).await?, 50.0));
                remote.push(percentile(&request_trial(ctx, kind, true).await?, 50.0));
            }
            burst.push(burst_trial(ctx, kind).await?);
        }
        let mut row =
            Row::new("messages", s, "send → recv in-process: p50", Unit::Micros).samples(send);
        if kind == Sqlite {
            row = row.target(Target::AtMost(500.0));
        }
        rep.push(row);
        rep.push(
            Row::new(
                "messages",
                s,
                "request → reply, same runtime: p50",
                Unit::Micros,
            )
            .samples(request),
        );
        if !remote.is_empty() {
            let how = if kind == Postgres {
                "LISTEN/NOTIFY"
            } else {
                "poll interval"
            };
            let mut row = Row::new(
                "messages",
                s,
                format!("send → recv, run driven by another process ({how}): p50"),
                Unit::Micros,
            )
            .samples(remote_send);
            if kind == Postgres {
                row = row.target(Target::AtMost(3000.0));
            }
            rep.push(row);
            rep.push(
                Row::new(
                    "messages",
                    s,
                    format!("request → reply, run driven by another process ({how}): p50"),
                    Unit::Micros,
                )
                .samples(remote),
            );
        }
        rep.push(
            Row::new(
                "messages",
                s,
                format!("{SENDERS} senders into one run"),
                Unit::PerSec,
            )
            .samples(burst),
        );
    }
    Ok(())
}
