//! How much CPU an idle worker costs: builds a runtime, registers this binary's workflows, does
//! nothing for a while, and prints the process's CPU time over that window.
//!
//! ```text
//! cargo run --release --example idle_worker -- [sqlite path | postgres URL] [seconds]
//! cargo run --release --example idle_worker --features postgres -- postgres://postgres@127.0.0.1/test 10
//! ```

use std::time::{Duration, Instant};

use workflow_core::prelude::*;

#[step]
async fn ping() -> Result<()> {
    Ok(())
}

#[workflow]
async fn pinger() -> Result<()> {
    ping().await
}

/// User + system CPU time of this process.
fn cpu_time() -> std::result::Result<Duration, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').ok_or("unexpected /proc/self/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()?;
    let hz: u64 = String::from_utf8(out.stdout)?.trim().parse()?;
    Ok(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_else(|| "idle.db".into());
    let secs: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10);
    let builder = Runtime::builder();
    let builder = if target.starts_with("postgres://") || target.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            builder.postgres(&target)
        }
        #[cfg(not(feature = "postgres"))]
        return Err("build with --features postgres for a PostgreSQL URL".into());
    } else {
        builder.sqlite(&target)
    };
    let rt = builder.build().await?;
    // One run first, so the worker is warm and the store's connections are open.
    rt.start(pinger, ()).await?.return_value().await?;
    let (cpu0, t0) = (cpu_time()?, Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (cpu, wall) = (cpu_time()? - cpu0, t0.elapsed());
    println!(
        "idle worker on {target}: {:.1} ms CPU over {:.1} s = {:.3} % of one core",
        cpu.as_secs_f64() * 1e3,
        wall.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
    Ok(())
}
