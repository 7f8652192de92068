//! The common workload (`common`: W0 to W3) and the children scenario, which reads as W0 plus
//! a parent: what every engine is compared on (BENCHMARKS.md, "The scenarios").

use std::time::{Duration, Instant};

use futures::StreamExt;
use workflow_core::{Queue, Start, StartError, WorkflowDef};

use crate::flows::{one_step, one_step_text, parent_of_one, probe, sequential};
use crate::report::{median, percentile, Report, Row, Target, Unit};
use crate::scenarios::{progress, us, warm_up, Ctx};
use crate::stores::StoreKind;
use crate::BoxResult;

/// The W lines' figure: the median over trials.
fn wline(rep: &mut Report, w: &str, store: &str, samples: &[f64], unit: &str, div: f64) {
    let m = median(samples) / div;
    let figure = if m >= 100.0 {
        format!("{m:.0}")
    } else {
        format!("{m:.3}")
    };
    let line = format!("{w} {store} {figure} {unit}");
    println!("{line}");
    rep.wlines.push(line);
}

fn w_stores(ctx: &Ctx, rep: &mut Report) -> Vec<StoreKind> {
    ctx.stores(&[StoreKind::Sqlite, StoreKind::Postgres], rep)
}

/// Child runs (`start_child`): twenty parents one at a time, each starting a 1-step child and
/// awaiting its result; p50 from the parent's start to its result, next to the same runs'
/// W0 (a lone 1-step run) measured in the same trial, so the child's cost reads as the
/// difference.
pub async fn children(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    use StoreKind::*;
    for kind in ctx.stores(&[Memory, Sqlite, Postgres], rep) {
        progress(format!("children {}", kind.name()));
        let (mut parent, mut alone) = (Vec::new(), Vec::new());
        for _ in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().build().await?;
            warm_up(&rt).await?;
            let (mut with_child, mut lone) = (Vec::new(), Vec::new());
            for i in 0..ctx.sizes.w0_runs {
                let t = Instant::now();
                rt.start(parent_of_one, (i as u64,))
                    .await?
                    .return_value()
                    .await?;
                with_child.push(us(t.elapsed()));
                let t = Instant::now();
                rt.start(one_step, (i as u64,))
                    .await?
                    .return_value()
                    .await?;
                lone.push(us(t.elapsed()));
            }
            rt.shutdown();
            fresh.cleanup().await?;
            parent.push(percentile(&with_child, 50.0));
            alone.push(percentile(&lone, 50.0));
        }
        let s = kind.name();
        rep.push(
            Row::new(
                "children",
                s,
                "parent → 1-step child → result: p50",
                Unit::Micros,
            )
            .samples(parent),
        );
        rep.push(
            Row::new(
                "children",
                s,
                "the same 1-step run alone (W0): p50",
                Unit::Micros,
            )
            .samples(alone),
        );
    }
    Ok(())
}

/// W0: twenty 1-step workflows one at a time; p50 start→result latency.
pub async fn w0(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    for kind in w_stores(ctx, rep) {
        let mut p50 = Vec::new();
        for _ in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().build().await?;
            warm_up(&rt).await?;
            let mut lat = Vec::new();
            for i in 0..ctx.sizes.w0_runs {
                let t = Instant::now();
                rt.start(one_step, (i as u64,))
                    .await?
                    .return_value()
                    .await?;
                lat.push(us(t.elapsed()));
            }
            rt.shutdown();
            fresh.cleanup().await?;
            p50.push(percentile(&lat, 50.0));
        }
        let s = kind.name();
        wline(rep, "W0", s, &p50, "ms", 1000.0);
        let mut row = Row::new(
            "W0",
            s,
            format!("{} 1-step runs one at a time: p50", ctx.sizes.w0_runs),
            Unit::Micros,
        )
        .samples(p50);
        if kind == StoreKind::Sqlite {
            row = row.target(Target::AtMost(1000.0));
        }
        rep.push(row);
    }
    Ok(())
}

/// W1: one 100-step sequential workflow, 5 times; time per step.
pub async fn w1(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    let (steps, reps) = (ctx.sizes.w1_steps, ctx.sizes.w1_reps);
    for kind in w_stores(ctx, rep) {
        let mut per = Vec::new();
        for _ in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().build().await?;
            warm_up(&rt).await?;
            let t = Instant::now();
            for _ in 0..reps {
                rt.start(sequential, (steps,)).await?.return_value().await?;
            }
            per.push(us(t.elapsed()) / (f64::from(steps) * reps as f64));
            rt.shutdown();
            fresh.cleanup().await?;
        }
        let s = kind.name();
        wline(rep, "W1", s, &per, "ms/step", 1000.0);
        let mut row = Row::new(
            "W1",
            s,
            format!("{steps}-step run × {reps}: per step"),
            Unit::Micros,
        )
        .samples(per);
        if kind == StoreKind::Sqlite {
            row = row.target(Target::AtMost(250.0));
        }
        rep.push(row);
    }
    Ok(())
}

/// W2: 1000 starts over 100 distinct idempotency tokens, 100 in flight; wall time, and the
/// step bodies executed (must be exactly 100). A duplicate adopts the owner's result.
pub async fn w2(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    let (n, tokens, in_flight) = (
        ctx.sizes.w2_starts,
        ctx.sizes.w2_tokens,
        ctx.sizes.w_in_flight,
    );
    for kind in w_stores(ctx, rep) {
        let (mut wall, mut bodies) = (vec![], vec![]);
        for trial in 0..ctx.trials {
            let fresh = ctx.fresh(kind).await?;
            let rt = fresh.builder().build().await?;
            warm_up(&rt).await?;
            probe::reset();
            let t0 = Instant::now();
            let results: Vec<BoxResult<u64>> = futures::stream::iter(0..n)
                .map(|i| {
                    let rt = rt.clone();
                    let token = format!("w2-{trial}-{}", i % tokens);
                    async move {
                        let start = rt
                            .start(one_step, (i as u64,))
                            .hook(token)
                            .min_retention(Duration::from_secs(3600))
                            .await;
                        let v = match start {
                            Ok(run) => run.return_value().await?,
                            Err(StartError::HookConflict(e)) => {
                                rt.get_run(&e.conflicting_run_id)
                                    .typed::<u64>()
                                    .return_value()
                                    .await?
                            }
                            Err(e) => return Err(e.into()),
                        };
                        BoxResult::Ok(v)
                    }
                })
                .buffer_unordered(in_flight)
                .collect()
                .await;
            wall.push(us(t0.elapsed()));
            results.into_iter().collect::<BoxResult<Vec<u64>>>()?;
            bodies.push(probe::take_bodies() as f64);
            rt.shutdown();
            fresh.cleanup().await?;
        }
        let s = kind.name();
        wline(rep, "W2", s, &wall, "ms", 1000.0);
        rep.push(
            Row::new(
                "W2",
                s,
                format!("{n} starts over {tokens} tokens, {in_flight} in flight: wall"),
                Unit::Micros,
            )
            .samples(wall),
        );
        rep.push(
            Row::new("W2", s, "step bodies executed", Unit::Count)
                .samples(bodies)
                .target(Target::Exactly(tokens as f64)),
        );
    }
    Ok(())
}

/// W3: 1000 distinct 1-step workflows, 100 in flight; workflows per second. Then the same with
/// every run in one queue of concurrency 100 (W3q): what the queue costs (a queued run is
/// never leased at admission; a worker begins it within the queue's limit).
pub async fn w3(ctx: &Ctx, rep: &mut Report) -> BoxResult<()> {
    let (n, in_flight) = (ctx.sizes.w3_runs, ctx.sizes.w_in_flight);
    for kind in w_stores(ctx, rep) {
        for queued in [false, true] {
            let mut rate = Vec::new();
            for _ in 0..ctx.trials {
                let fresh = ctx.fresh(kind).await?;
                let mut builder = fresh.builder();
                if queued {
                    builder = builder.queue(Queue::new("w3").concurrency(in_flight as u32));
                }
                let rt = builder.build().await?;
                warm_up(&rt).await?;
                let t0 = Instant::now();
                let payload = ctx.payload_bytes;
                let results: Vec<BoxResult<()>> = futures::stream::iter(0..n)
                    .map(|i| {
                        let rt = rt.clone();
                        async move {
                            match payload {
                                None => {
                                    via_queue(rt.start(one_step, (i as u64,)), queued)
                                        .await?
                                        .return_value()
                                        .await?;
                                }
                                Some(bytes) => {
                                    let text = payload_text(i, bytes);
                                    let start = rt.start(one_step_text, (text.clone(),));
                                    let run = via_queue(start, queued).await?;
                                    if run.return_value().await? != text {
                                        return Err(format!("run {i} returned another text").into());
                                    }
                                }
                            }
                            BoxResult::Ok(())
                        }
                    })
                    .buffer_unordered(in_flight)
                    .collect()
                    .await;
                let wall = t0.elapsed().as_secs_f64();
                results.into_iter().collect::<BoxResult<Vec<()>>>()?;
                rate.push(n as f64 / wall);
                rt.shutdown();
                fresh.cleanup().await?;
            }
            let s = kind.name();
            let sized = match ctx.payload_bytes {
                Some(b) => format!(", {b}-byte texts"),
                None => String::new(),
            };
            let (w, what) = if queued {
                (
                    "W3q",
                    format!("{n} 1-step runs{sized}, {in_flight} in flight, one queue of concurrency {in_flight}"),
                )
            } else {
                (
                    "W3",
                    format!("{n} 1-step runs{sized}, {in_flight} in flight"),
                )
            };
            wline(rep, w, s, &rate, "workflows/s", 1.0);
            let mut row = Row::new("W3", s, what, Unit::PerSec).samples(rate);
            if kind == StoreKind::Sqlite && !queued {
                row = row.target(Target::AtLeast(10_000.0));
            }
            rep.push(row);
        }
    }
    Ok(())
}

/// `start`, through W3q's queue when `queued`.
fn via_queue<W: WorkflowDef>(start: Start<W>, queued: bool) -> Start<W> {
    if queued {
        start.queue("w3")
    } else {
        start
    }
}

/// Run `i`'s text of `bytes` bytes: its number, then letters and digits drawn from a generator
/// seeded by it: each run's own while the number fits, and about as compressible as a sealed
/// value's base64 (a text of one repeated letter would let PostgreSQL's TOAST shrink the plain
/// rows and not the sealed ones).
pub(crate) fn payload_text(i: usize, bytes: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut text = i.to_string();
    text.truncate(bytes);
    // xorshift64*: cheap and fixed, so every build measures the same texts.
    let mut state = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while text.len() < bytes {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        text.push(char::from(ALPHABET[(r >> 58) as usize % ALPHABET.len()]));
    }
    text
}
