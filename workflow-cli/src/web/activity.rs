//! `GET /activity`: what the store's recent runs did, drawn without a script. Runs started
//! and ended per minute over the last hour (a bar chart in inline SVG), and the latency of step
//! attempts per step name (p50 / p99), read from the histories of the latest ended runs. The
//! numbers come from the store, like `/metrics`, so every process on the database shows the
//! same; they are a sample (the latest [`RUNS_READ`] runs, the histories of the latest
//! [`HISTORIES_READ`] ended ones), said on the page.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use maud::{html, Markup};
use workflow_core::store::{Event, RunFilter};
use workflow_core::Runtime;

use crate::error::CliError;

/// Runs read for the per-minute counts, newest first.
pub const RUNS_READ: usize = 2000;
/// Ended runs whose histories give the step latencies.
pub const HISTORIES_READ: usize = 100;
/// Minutes drawn.
const MINUTES: usize = 60;

/// The page's numbers.
#[derive(Debug, Default)]
pub struct Activity {
    /// Per minute, oldest first: runs admitted, runs ended.
    pub minutes: Vec<(u64, u64)>,
    /// Runs read (at most [`RUNS_READ`]); when it is the limit, older minutes may be short.
    pub runs_read: usize,
    /// Per step name: the durations of its attempts that ended (ok or failed).
    pub steps: BTreeMap<String, Vec<Duration>>,
    /// Histories read.
    pub histories_read: usize,
}

/// Reads the activity of the last hour before the store's `now`.
pub async fn gather(rt: &Runtime) -> Result<Activity, CliError> {
    let now = crate::ops::store_now(rt).await?;
    let hour_ago = now - Duration::from_secs(60 * MINUTES as u64);
    let mut runs = rt
        .store()
        .list_runs(&RunFilter::new().limit(RUNS_READ))
        .await?;
    let runs_read = runs.len();
    let mut minutes = vec![(0u64, 0u64); MINUTES];
    let minute_of = |t: SystemTime| -> Option<usize> {
        let ago = now.duration_since(t).ok()?;
        let back = usize::try_from(ago.as_secs() / 60).ok()?;
        (back < MINUTES).then(|| MINUTES - 1 - back)
    };
    for r in &runs {
        if let Some(m) = minute_of(r.created_at) {
            minutes[m].0 += 1;
        }
        if r.status.is_terminal() {
            if let Some(m) = minute_of(r.updated_at) {
                minutes[m].1 += 1;
            }
        }
    }
    runs.retain(|r| r.status.is_terminal() && r.updated_at >= hour_ago);
    runs.truncate(HISTORIES_READ);
    let mut steps: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    for r in &runs {
        let events = rt.store().events(&r.id).await?;
        let mut names: HashMap<&str, &str> = HashMap::new();
        let mut began: HashMap<&str, SystemTime> = HashMap::new();
        for e in &events {
            match &e.event {
                Event::StepScheduled { step_id, name, .. } => {
                    names.insert(step_id, name);
                    began.insert(step_id, e.at);
                }
                Event::StepAttemptStarted { step_id, .. } => {
                    began.insert(step_id, e.at);
                }
                Event::StepAttemptFailed { step_id, .. } | Event::StepCompleted { step_id, .. } => {
                    if let (Some(name), Some(start)) =
                        (names.get(step_id.as_str()), began.remove(step_id.as_str()))
                    {
                        let took = e.at.duration_since(start).unwrap_or_default();
                        steps.entry((*name).to_owned()).or_default().push(took);
                    }
                }
                _ => {}
            }
        }
    }
    for d in steps.values_mut() {
        d.sort_unstable();
    }
    Ok(Activity {
        minutes,
        runs_read,
        steps,
        histories_read: runs.len(),
    })
}

/// The `q` quantile (0 to 1) of sorted `xs`, by the nearest rank.
fn quantile(xs: &[Duration], q: f64) -> Duration {
    if xs.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * xs.len() as f64).ceil() as usize;
    xs[rank.clamp(1, xs.len()) - 1]
}

fn millis(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 10_000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

/// The bar chart: per minute, a bar of started runs and one of ended runs, scaled to the
/// busiest minute; each bar's `<title>` says its count.
fn chart(minutes: &[(u64, u64)]) -> Markup {
    const W: usize = 10;
    const H: u64 = 100;
    let top = minutes
        .iter()
        .map(|(s, e)| (*s).max(*e))
        .max()
        .unwrap_or(0)
        .max(1);
    let height = |n: u64| n * H / top;
    let width = minutes.len() * W;
    html! {
        svg class="activity" role="img" viewBox={ "0 0 " (width) " " (H + 2) }
            width=(width * 2) height=((H + 2) * 2)
            aria-label="Runs started and ended per minute, the last hour" {
            @for (i, (started, ended)) in minutes.iter().enumerate() {
                @let x = i * W;
                @let ago = minutes.len() - i - 1;
                rect class="started" x=(x) y=(H + 1 - height(*started)) width=(W / 2 - 1)
                    height=(height(*started)) data-started=(started) {
                    title { (started) " started, " (ago) " min ago" }
                }
                rect class="ended" x=(x + W / 2) y=(H + 1 - height(*ended)) width=(W / 2 - 1)
                    height=(height(*ended)) data-ended=(ended) {
                    title { (ended) " ended, " (ago) " min ago" }
                }
            }
        }
    }
}

/// The page's body.
pub fn body(a: &Activity) -> Markup {
    let started: u64 = a.minutes.iter().map(|m| m.0).sum();
    let ended: u64 = a.minutes.iter().map(|m| m.1).sum();
    html! {
        h1 { "Activity" }
        h2 { "Runs per minute, the last hour" }
        p class="legend" {
            span class="key started" {} " started (" span id="started-total" { (started) } ") "
            span class="key ended" {} " ended (" span id="ended-total" { (ended) } ")"
        }
        (chart(&a.minutes))
        @if a.runs_read >= RUNS_READ {
            p class="muted" { "From the latest " (RUNS_READ) " runs: earlier minutes may count fewer." }
        }
        h2 { "Step attempts" }
        @if a.steps.is_empty() {
            p class="empty" { "No step attempt ended in the runs of the last hour." }
        } @else {
            table class="steps" {
                thead { tr { th { "Step" } th { "Attempts" } th { "p50" } th { "p99" } } }
                tbody {
                    @for (name, took) in &a.steps {
                        tr data-step=(name) {
                            td { code { (name) } }
                            td class="attempts" { (took.len()) }
                            td { (millis(quantile(took, 0.5))) }
                            td { (millis(quantile(took, 0.99))) }
                        }
                    }
                }
            }
            p class="muted" {
                "From the histories of the latest " (a.histories_read)
                " runs that ended in the last hour (at most " (HISTORIES_READ) "); an attempt lasts from its start to its result or failure."
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let xs: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&xs, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&xs, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&xs[..1], 0.99), Duration::from_millis(1));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn bars_scale_to_the_busiest_minute() {
        let page = chart(&[(0, 0), (4, 2), (1, 0)]).into_string();
        assert!(page.contains(r#"height="100" data-started="4""#), "{page}");
        assert!(page.contains(r#"height="50" data-ended="2""#), "{page}");
        assert!(page.contains(r#"height="25" data-started="1""#), "{page}");
        assert!(page.contains("4 started, 1 min ago"), "{page}");
    }
}
