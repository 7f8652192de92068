//! Schedules: a heartbeat every second and a nightly report at 02:00 in Paris, fired by
//! every worker on the store with exactly one run per nominal time; a backfill of the last
//! three nights, repeated to show it starts nothing twice; the ticks as recorded.
//!
//! ```text
//! cargo run --example nightly
//! ```
//!
//! The database is a fresh SQLite file in the temporary directory (`WORKFLOW_DB` overrides
//! it). The program runs for about three seconds.

use std::time::{Duration, SystemTime};

use workflow_core::prelude::*;
use workflow_core::TickRecord;

/// The nightly report: the tick says which night it is for.
#[workflow(name = "nightly.report")]
pub async fn nightly_report(tick: ScheduleTick) -> Result<String> {
    let night = tick
        .nominal
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs()
        / 86_400;
    Ok(format!(
        "report for day {night} since 1970{}",
        if tick.backfill { " (backfilled)" } else { "" }
    ))
}

/// The heartbeat: one run per second.
#[workflow(name = "nightly.heartbeat")]
pub async fn ping(tick: ScheduleTick) -> Result<()> {
    let _ = tick;
    Ok(())
}

/// The two schedules.
pub fn schedules() -> Result<Vec<Schedule>, workflow_core::ScheduleError> {
    Ok(vec![
        Schedule::cron("nightly", nightly_report, "0 2 * * *")?
            .timezone("Europe/Paris")?
            .overlap(Overlap::Skip)
            .catch_up(CatchUp::Latest)
            .catch_up_window(Duration::from_secs(24 * 3600))
            .jitter(Duration::from_secs(5)),
        Schedule::every("heartbeat", ping, Duration::from_secs(1)),
    ])
}

/// Waits until the heartbeat has started `n` runs; then backfills the last three nights
/// twice. The heartbeat's ticks, latest first, and the runs each backfill started.
pub async fn demo(
    rt: &Runtime,
    n: usize,
) -> Result<(Vec<TickRecord>, usize, usize), Box<dyn std::error::Error>> {
    let beats = loop {
        let ticks = rt.schedule_ticks("heartbeat", 100).await?;
        if ticks.iter().filter(|t| t.run_id.is_some()).count() >= n {
            break ticks;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let now = SystemTime::now();
    let from = now - Duration::from_secs(3 * 86_400);
    let first = rt.backfill_schedule("nightly", from, now).await?;
    let again = rt.backfill_schedule("nightly", from, now).await?;
    Ok((beats, first, again))
}

/// `t` as an RFC 3339 time.
fn shown(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map_or_else(|_| format!("{t:?}"), |ts| ts.to_string())
}

/// `t`, if any, as an RFC 3339 time.
fn shown_opt(t: Option<SystemTime>) -> String {
    t.map_or_else(|| "-".to_owned(), shown)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = std::env::var("WORKFLOW_DB").map_or_else(
        |_| std::env::temp_dir().join(format!("nightly-{}.db", RunId::new())),
        Into::into,
    );
    let mut builder = Runtime::builder().sqlite(&db);
    for s in schedules()? {
        builder = builder.schedule(s);
    }
    let rt = builder.build().await?;
    println!("schedules on {}", db.display());
    let (beats, first, again) = demo(&rt, 3).await?;
    for t in beats.iter().rev() {
        let run = t.run_id.map_or_else(|| "-".to_owned(), |r| r.to_string());
        println!(
            "  heartbeat {}: {} (run {run})",
            shown(t.nominal),
            t.outcome
        );
    }
    println!("backfill of the last three nights: {first} runs; repeated: {again}");
    for t in rt.schedule_ticks("nightly", 10).await? {
        let report: String = rt
            .get_run(&t.run_id.expect("backfilled"))
            .return_value()
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned();
        println!("  nightly {}: {report}", shown(t.nominal));
    }
    for s in rt.schedules().await? {
        println!(
            "  {}: next {}, last {}",
            s.name,
            shown_opt(s.next),
            shown_opt(s.last)
        );
    }
    rt.shutdown();
    Ok(())
}
