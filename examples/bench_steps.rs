//! Per-step cost of a long sequential workflow, on memory and on SQLite.
//!
//! ```text
//! cargo run --release --example bench_steps [steps] [trials]
//! ```
//!
//! Prints, per store, the median, min and max over the trials of the time per step, and the
//! per-step time of the first and the last tenth of the run (equal when the cost per step does
//! not grow with the step number).

use std::time::{Duration, Instant};

use workflow_core::prelude::*;
use workflow_core::store::Event;

#[step]
async fn noop(i: u32) -> Result<u32> {
    Ok(i)
}

#[workflow]
async fn sequential(n: u32) -> Result<u32> {
    let mut last = 0;
    for i in 0..n {
        last = noop(i).await?;
    }
    Ok(last)
}

struct Trial {
    per_step: Duration,
    first_tenth: Duration,
    last_tenth: Duration,
}

async fn trial(rt: &Runtime, n: u32) -> std::result::Result<Trial, Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let run = rt.start(sequential, (n,)).await?;
    let last = run.return_value().await?;
    let total = t0.elapsed();
    assert_eq!(last, n - 1);
    // Completion times of the steps, from the history.
    let done: Vec<std::time::SystemTime> = rt
        .store()
        .events(&run.id())
        .await?
        .into_iter()
        .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
        .map(|e| e.at)
        .collect();
    let tenth = (done.len() / 10).max(1);
    let span =
        |a: usize, b: usize| done[b].duration_since(done[a]).unwrap_or_default() / (b - a) as u32;
    Ok(Trial {
        per_step: total / n,
        first_tenth: span(0, tenth),
        last_tenth: span(done.len() - 1 - tenth, done.len() - 1),
    })
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let trials: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let dir = std::env::temp_dir().join(format!("wf-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    println!("{n} sequential no-op steps, {trials} trials; figures: median (min .. max)");
    println!(
        "{:<8} {:>28} {:>28} {:>28}",
        "store", "per step", "first tenth", "last tenth"
    );
    for store in ["memory", "sqlite"] {
        let rt = match store {
            "memory" => Runtime::builder().in_memory().build().await?,
            _ => {
                Runtime::builder()
                    .sqlite(dir.join("bench.db"))
                    .build()
                    .await?
            }
        };
        let mut per = Vec::new();
        let mut first = Vec::new();
        let mut last = Vec::new();
        for _ in 0..trials {
            let t = trial(&rt, n).await?;
            per.push(t.per_step);
            first.push(t.first_tenth);
            last.push(t.last_tenth);
        }
        let fmt = |(m, lo, hi): (Duration, Duration, Duration)| {
            format!("{:>8.1} µs ({:.1} .. {:.1})", us(m), us(lo), us(hi))
        };
        println!(
            "{store:<8} {:>28} {:>28} {:>28}",
            fmt(stats(per)),
            fmt(stats(first)),
            fmt(stats(last))
        );
        rt.shutdown();
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
