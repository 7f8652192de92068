//! A run's timeline as HTML: one lane per step, sleep and hook, ordered by start, on a shared
//! time axis from the run's admission to its end (or now). Each step attempt is one bar, failed
//! and interrupted attempts are marked, the waits between retries are drawn apart, and payloads
//! are ticks on their hook's bar. Positions are percentages, so the page needs no script.

use maud::{html, Markup};

use crate::text;
use crate::view::{AttemptOutcome, HookView, MarkKind, RunDetail, StepStatus, Time, TimerStatus};

/// Lanes start where their first bar starts; the axis shows `+offset` from the run's start.
struct Axis {
    start: u64,
    span: u64,
}

impl Axis {
    fn pct(&self, t: Time) -> f64 {
        let off = t.ms().saturating_sub(self.start).min(self.span);
        off as f64 * 100.0 / self.span as f64
    }

    /// `left` and `width` of a bar from `a` to `b`.
    fn place(&self, a: Time, b: Time) -> String {
        let left = self.pct(a);
        let width = (self.pct(b) - left).max(0.0);
        format!("left:{left:.3}%;width:{width:.3}%")
    }

    /// Tick offsets (ms) at a round step giving at most 8 intervals.
    fn ticks(&self) -> Vec<u64> {
        let mut step = 1u64;
        'search: for scale in [1u64, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000] {
            for m in [1u64, 2, 5] {
                step = m * scale;
                if self.span / step <= 8 {
                    break 'search;
                }
            }
        }
        // Minutes, hours and days read better than 100 000 ms.
        for nice in [
            60_000u64, 300_000, 600_000, 1_800_000, 3_600_000, 21_600_000, 86_400_000,
        ] {
            if step > 10_000 && step <= nice {
                step = nice;
                break;
            }
        }
        let step = step.max(self.span.div_ceil(8)).max(1);
        (0..=self.span / step).map(|i| i * step).collect()
    }
}

struct Lane {
    start: Time,
    order: usize,
    html: Markup,
}

pub fn render(d: &RunDetail) -> Markup {
    let start = d.run.created_at;
    let end = d.end();
    let axis = Axis {
        start: start.ms(),
        span: start.until(end).max(1),
    };
    let live = !d.run.status.is_terminal();
    let mut lanes: Vec<Lane> = Vec::new();

    for s in &d.steps {
        let bars = html! {
            @for (i, a) in s.attempts.iter().enumerate() {
                @let to = a.ended_at.unwrap_or(end);
                @let class = a.outcome.as_str();
                div class={ "bar attempt " (class) } style=(axis.place(a.started_at, to))
                    data-step-id=(s.step_id) data-attempt=(a.attempt)
                    title={
                        (s.label()) " attempt " (a.attempt) ": " (class) ", "
                        (text::duration_ms(a.started_at.until(to)))
                        @if let Some(e) = &a.error { " — " (text::cut(&e.to_string(), 200)) }
                    } {}
                // The backoff between a failed attempt and the next one (or, while retrying, now).
                @if let (Some(from), Some(to)) = (a.ended_at, retry_wait_end(s, i, end)) {
                    div class="bar retry-wait" style=(axis.place(from, to))
                        title={ "waiting to retry, " (text::duration_ms(from.until(to))) } {}
                }
            }
        };
        lanes.push(Lane {
            start: s.scheduled_at,
            order: lanes.len(),
            html: lane(
                "step",
                &s.label(),
                &format!("{} · {} attempt(s)", s.status.as_str(), s.attempts.len()),
                bars,
            ),
        });
    }

    for t in &d.timers {
        let to = t.fired_at.unwrap_or(end).max(t.scheduled_at);
        let open = matches!(t.status, TimerStatus::Waiting | TimerStatus::Due);
        let bar = html! {
            div class={ "bar sleep " (t.status.as_str()) @if open { " open" } }
                style=(axis.place(t.scheduled_at, to)) data-timer-id=(t.timer_id)
                title={ "sleep " (t.timer_id) " until " (t.fire_at) " (" (t.status.as_str()) ")" } {}
        };
        lanes.push(Lane {
            start: t.scheduled_at,
            order: lanes.len(),
            html: lane(
                "sleep",
                &format!("sleep {}", t.timer_id),
                &format!(
                    "{} · {}",
                    t.status.as_str(),
                    text::duration_ms(t.scheduled_at.until(t.fire_at))
                ),
                bar,
            ),
        });
    }

    for h in &d.hooks {
        lanes.push(Lane {
            start: h.registered_at,
            order: lanes.len(),
            html: hook_lane(&axis, h, end),
        });
    }

    // One lane per kind of mark: patches taken, retries; each mark a tick at its time.
    for kind in [MarkKind::Patch, MarkKind::Retried] {
        let marks: Vec<_> = d.marks.iter().filter(|m| m.kind == kind).collect();
        let Some(first) = marks.first() else { continue };
        let (class, name) = match kind {
            MarkKind::Patch => ("patch", "patches"),
            MarkKind::Retried => ("retried", "retried"),
        };
        let bars = html! {
            @for m in &marks {
                div class={ "mark " (class) } style=(format!("left:{:.3}%", axis.pct(m.at)))
                    title={ (m.label) " at " (m.at) } {}
            }
        };
        let sub = marks
            .iter()
            .map(|m| m.label.as_str())
            .collect::<Vec<_>>()
            .join(" · ");
        lanes.push(Lane {
            start: first.at,
            order: lanes.len(),
            html: lane(class, name, &sub, bars),
        });
    }

    lanes.sort_by_key(|l| (l.start, l.order));
    html! {
        div class="timeline" role="figure" aria-label="Run timeline" {
            div class="lane axis" {
                div class="label" {}
                div class="track" {
                    @for off in axis.ticks() {
                        span class="tick" style=(format!("left:{:.3}%", off as f64 * 100.0 / axis.span as f64)) {
                            @if off == 0 { "0" } @else { "+" (text::duration_ms(off)) }
                        }
                    }
                }
            }
            @if lanes.is_empty() {
                p class="empty" { "Nothing has happened in this run yet." }
            }
            @for l in &lanes { (l.html) }
            div class="lane foot" {
                div class="label" {}
                div class="track" {
                    span class="end-label" { (if live { "now" } else { "ended" }) " " (end) }
                }
            }
        }
        p class="legend small" {
            @for (key, label) in [
                ("attempt ok", "attempt ok"),
                ("attempt failed", "failed"),
                ("attempt interrupted", "interrupted"),
                ("attempt running", "running"),
                ("retry-wait", "retry wait"),
                ("sleep", "sleep"),
                ("hook", "hook open"),
                ("payload", "payload"),
                ("patch", "patch taken"),
                ("retried", "retried"),
            ] {
                span { span class={ "key " (key) } {} (label) }
            }
        }
    }
}

/// Where the wait after attempt `i` of `s` ends, if it failed: the next attempt's start, or
/// `end` while the step is still retrying.
fn retry_wait_end(s: &crate::view::StepView, i: usize, end: Time) -> Option<Time> {
    if s.attempts[i].outcome != AttemptOutcome::Failed {
        return None;
    }
    match s.attempts.get(i + 1) {
        Some(next) => Some(next.started_at),
        None if s.status == StepStatus::Retrying => Some(end),
        None => None,
    }
}

fn lane(kind: &str, label: &str, sub: &str, bars: Markup) -> Markup {
    html! {
        div class={ "lane " (kind) } {
            div class="label" { span class="name" { (label) } span class="sub" { (sub) } }
            div class="track" { (bars) }
        }
    }
}

fn hook_lane(axis: &Axis, h: &HookView, end: Time) -> Markup {
    if let Some(owner) = h.conflict {
        let bar = html! {
            div class="mark conflict" style=(format!("left:{:.3}%", axis.pct(h.registered_at)))
                title={ "token owned by run " (owner) } {}
        };
        return lane("hook", &format!("hook {}", h.token), "conflict", bar);
    }
    let to = h.released_at.unwrap_or(end).max(h.registered_at);
    let title = format!(
        "hook {:?}: {} for {}, {} payload(s)",
        h.token,
        if h.active { "open" } else { "was open" },
        text::duration_ms(h.registered_at.until(to)),
        h.payloads.len()
    );
    let bars = html! {
        div class={ "bar hook" @if h.active { " open" } } style=(axis.place(h.registered_at, to))
            data-token=(h.token) title=(title) {}
        @for p in &h.payloads {
            div class="mark payload" style=(format!("left:{:.3}%", axis.pct(p.at)))
                title={ "payload #" (p.payload_id) " at " (p.at) ": " (text::json_line(&p.payload, 120)) } {}
        }
    };
    let sub = format!(
        "{} · {} payload(s)",
        if h.active { "open" } else { "released" },
        h.payloads.len()
    );
    lane("hook", &format!("hook {}", h.token), &sub, bars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_few() {
        let ticks = |span| Axis { start: 0, span }.ticks();
        assert_eq!(ticks(1), [0, 1]);
        assert_eq!(ticks(1_000), [0, 200, 400, 600, 800, 1_000]);
        assert_eq!(
            ticks(7_300),
            [0, 1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000]
        );
        let hour = ticks(3_600_000);
        assert!(hour.len() <= 9 && hour[1] % 60_000 == 0, "{hour:?}");
        let week = ticks(7 * 86_400_000);
        assert!(week.len() <= 9 && week[1] % 3_600_000 == 0, "{week:?}");
    }
}
