//! The dashboard's HTML as maud templates: a layout, the runs list, a run page, the queues
//! and the hooks list. maud escapes every value spliced into a page; markup a function builds
//! itself is a [`Markup`], so text from the database cannot become markup by a forgotten call.

use std::fmt::Write as _;
use std::time::SystemTime;

use axum::http::StatusCode;
use maud::{html, Markup, PreEscaped};
use workflow_core::store::RunFilter;
use workflow_core::{RunId, RunStatus};

use super::activity::{self, Activity};
use super::timeline;
use crate::schedules::{ScheduleDetail, ScheduleView};
use crate::text;
use crate::view::{DivergenceView, EventView, HookSummary, QueueView, QueuedRun, RunDetail, Time};

/// A message at the top of a page, after an action.
pub enum Banner<'a> {
    None,
    Notice(&'a str),
    Error(&'a str),
}

/// `s` as a query-string value.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

fn layout(title: &str, nav: &str, database: &str, banner: Banner<'_>, body: Markup) -> String {
    let tab = |href: &str, name: &str, label: &str| {
        html! { a href=(href) aria-current=[(nav == name).then_some("page")] { (label) } }
    };
    html! {
        (PreEscaped("<!doctype html>\n"))
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · workflow" }
                link rel="icon" href="/favicon.ico" type="image/svg+xml";
                link rel="stylesheet" href="/assets/style.css";
                script src="/assets/app.js" defer {}
            }
            body {
                header class="top" {
                    a class="brand" href="/" { "workflow" }
                    nav {
                        (tab("/", "runs", "Runs"))
                        (tab("/hooks", "hooks", "Hooks"))
                        (tab("/queues", "queues", "Queues"))
                        (tab("/schedules", "schedules", "Schedules"))
                        (tab("/activity", "activity", "Activity"))
                    }
                    span class="db" title="database" { (database) }
                    label class="live" { input type="checkbox" id="live-toggle" checked; " live" }
                    span id="live-status" class="muted" {}
                }
                @match banner {
                    Banner::None => {},
                    Banner::Notice(m) => p class="banner notice" role="status" { (m) },
                    Banner::Error(m) => p class="banner error" role="alert" { (m) },
                }
                main id="live" { (body) }
            }
        }
    }
    .into_string()
}

fn badge(status: RunStatus) -> Markup {
    let s = status.as_str();
    html! { span class={ "badge " (s) } data-status=(s) { (s) } }
}

pub fn error(status: StatusCode, message: &str) -> String {
    let body = html! {
        h1 { (status) }
        p class="error-message" { (message) }
        p { a href="/" { "All runs" } }
    };
    layout("Error", "", "", Banner::None, body)
}

pub fn runs(
    database: &str,
    filter: &RunFilter,
    queue: Option<&QueueView>,
    runs: &[QueuedRun],
    banner: Banner<'_>,
) -> String {
    let status = filter.status.map(RunStatus::as_str).unwrap_or_default();
    let now = Time(SystemTime::now());
    let body = html! {
        h1 { "Runs" }
        form class="filters" method="get" action="/" {
            label {
                "Status "
                select name="status" {
                    option value="" { "any status" }
                    @for s in ["pending", "running", "blocked", "completed", "failed", "cancelled", "continued_as_new"] {
                        option value=(s) selected[s == status] { (s) }
                    }
                }
            }
            label {
                "Workflow "
                input name="workflow" value=(filter.workflow.as_deref().unwrap_or_default())
                    placeholder="any workflow";
            }
            label {
                "Queue "
                input name="queue" value=(filter.queue.as_deref().unwrap_or_default())
                    placeholder="any queue";
            }
            label {
                "Version "
                input name="version" value=(filter.version.as_deref().unwrap_or_default())
                    placeholder="any version";
            }
            label {
                "Limit "
                input name="limit" type="number" min="1" max="10000" value=(filter.limit);
            }
            button type="submit" { "Filter" }
        }
        @if let Some(q) = queue {
            p class="queue-summary" data-queue=(q.name) {
                "Queue " strong { (q.name) } ": " (q.limits()) "; " (q.waiting) " waiting."
            }
        }
        @if runs.is_empty() {
            p class="empty" { "No runs match." }
        } @else {
            table class="runs" {
                thead {
                    tr {
                        th { "Run" } th { "Workflow" } th { "Status" }
                        @if queue.is_some() { th { "Position" } th { "Key" } th { "Priority" } }
                        th { "Created" } th { "Duration" } th { "Version" } th { "Result" }
                    }
                }
                tbody {
                    @for QueuedRun { run: r, position } in runs {
                        tr data-run-id=(r.id) {
                            td class="mono" { a href={ "/runs/" (r.id) } { (r.id) } }
                            td { (r.workflow) }
                            td {
                                (badge(r.status))
                                @if let Some(t) = r.starts_later(now) {
                                    " " span class="starts small" data-start-at=(t.ms()) {
                                        "starts at " (t)
                                    }
                                }
                            }
                            @if queue.is_some() {
                                @let entry = r.queue.as_ref();
                                td class="position" { @if let Some(p) = position { (p) } }
                                td class="mono" {
                                    (entry.and_then(|e| e.partition_key.as_deref()).unwrap_or_default())
                                }
                                td { (entry.map_or(0, |e| e.priority)) }
                            }
                            td class="time" { (r.created_at) }
                            td class="time" { (r.duration_ms.map(text::duration_ms).unwrap_or_default()) }
                            td class="mono version" { (r.version.as_deref().unwrap_or_default()) }
                            td class="mono small" {
                                @match (&r.output, &r.error) {
                                    (Some(v), _) => (text::json_line(v, 60)),
                                    (_, Some(e)) => (text::cut(&e.to_string(), 60)),
                                    _ => {},
                                }
                            }
                        }
                    }
                }
            }
        }
        p class="muted small" {
            (runs.len()) " run(s), newest first"
            @if let (true, Some(last)) = (runs.len() >= filter.limit, runs.last()) {
                " " a class="older" href=(older_runs(filter, last.run.id)) { "Older runs" }
            }
            "."
        }
    };
    layout("Runs", "runs", database, banner, body)
}

/// Every declared queue: its limits and occupancy, linking to its runs.
pub fn queues(database: &str, queues: &[QueueView]) -> String {
    let body = html! {
        h1 { "Queues" }
        @if queues.is_empty() {
            p class="empty" { "No queues are declared." }
        } @else {
            table class="queues" {
                thead {
                    tr {
                        th { "Queue" } th { "Concurrency" } th { "Rate limit" } th { "Occupied" }
                        th { "Waiting" } th { "Begun in window" }
                    }
                }
                tbody {
                    @for q in queues {
                        tr data-queue=(q.name) {
                            td { a href={ "/?queue=" (url_encode(&q.name)) } { (q.name) } }
                            td {
                                @match q.concurrency { Some(c) => (c), None => "none" }
                            }
                            td {
                                @match q.rate_limit {
                                    Some(r) => { (r.runs) " per " (text::duration_ms(r.period_ms)) }
                                    None => "none",
                                }
                            }
                            td { (q.occupied) }
                            td { (q.waiting) }
                            td { @if q.rate_limit.is_some() { (q.begun_in_window) } }
                        }
                    }
                }
            }
        }
    };
    layout("Queues", "queues", database, Banner::None, body)
}

/// Runs per minute and step latencies ([`activity`](mod@super::activity)).
pub fn activity(database: &str, a: &Activity) -> String {
    layout(
        "Activity",
        "activity",
        database,
        Banner::None,
        activity::body(a),
    )
}

pub fn schedules(database: &str, schedules: &[ScheduleView]) -> String {
    let body = html! {
        h1 { "Schedules" }
        @if schedules.is_empty() {
            p class="empty" { "No schedules are stored." }
        } @else {
            table class="schedules" {
                thead {
                    tr {
                        th { "Schedule" } th { "Workflow" } th { "Spec" } th { "State" }
                        th { "Last tick" } th { "Next tick" }
                    }
                }
                tbody {
                    @for s in schedules {
                        tr data-schedule=(s.name) {
                            td { a href={ "/schedules/" (url_encode(&s.name)) } { (s.name) } }
                            td { (s.workflow) }
                            td class="mono" { (s.spec) }
                            td { @if s.paused { "paused" } @else { "active" } }
                            td class="time" { (s.last.as_deref().unwrap_or("-")) }
                            td class="time" { (s.next.as_deref().unwrap_or("-")) }
                        }
                    }
                }
            }
        }
    };
    layout("Schedules", "schedules", database, Banner::None, body)
}

pub fn schedule(database: &str, d: &ScheduleDetail) -> String {
    let s = &d.schedule;
    let body = html! {
        p class="crumbs" { a href="/schedules" { "Schedules" } " / " (s.name) }
        h1 { (s.name) " " span class="muted" { @if s.paused { "paused" } @else { "active" } } }
        dl class="fields" {
            dt { "workflow" } dd { (s.workflow) }
            dt { "spec" } dd class="mono" { (s.spec) }
            dt { "overlap" } dd { (d.overlap) }
            dt { "catch-up" } dd { (d.catch_up) }
            dt { "next ticks" } dd class="time" { (d.upcoming.join(", ")) }
        }
        h2 { "Latest ticks" }
        @if d.ticks.is_empty() {
            p class="empty" { "No ticks yet." }
        } @else {
            table class="ticks" {
                thead { tr { th { "Nominal" } th { "Outcome" } th { "Run" } th { "Backfill" } } }
                tbody {
                    @for t in &d.ticks {
                        tr data-outcome=(t.outcome) {
                            td class="time" { (t.nominal) }
                            td { (t.outcome) }
                            td class="mono" {
                                @if let Some(id) = &t.run_id { a href={ "/runs/" (id) } { (id) } }
                            }
                            td { @if t.backfill { "yes" } }
                        }
                    }
                }
            }
        }
    };
    layout(&s.name, "schedules", database, Banner::None, body)
}

pub fn run(database: &str, d: &RunDetail, events: &[EventView], banner: Banner<'_>) -> String {
    let r = &d.run;
    let body = html! {
        p class="crumbs" { a href="/" { "Runs" } " / " span class="mono" { (r.id) } }
        div class="run-head" {
            h1 { (r.workflow) " " (badge(r.status)) }
            div class="actions" {
                @if !r.status.is_terminal() {
                    form method="post" action={ "/runs/" (r.id) "/cancel" }
                        data-confirm="Cancel this run? Its worker stops at the next await point." {
                        button type="submit" class="danger" id="cancel" { "cancel run" }
                    }
                }
                @if matches!(r.status, RunStatus::Failed | RunStatus::Blocked) {
                    form method="post" action={ "/runs/" (r.id) "/retry" } {
                        button type="submit" class="primary" id="retry" title=(
                            if r.status == RunStatus::Failed {
                                "Re-open the run: recorded steps are kept, the failed step gets a fresh set of attempts."
                            } else {
                                "Hand the run to a worker now: it goes on if the deployed code fits its history."
                            }
                        ) { "retry run" }
                    }
                }
            }
        }
        @if let Some(div) = &d.divergence { (divergence_section(r.id, div)) }
        dl class="facts" {
            dt { "run" } dd { span class="mono" { (r.id) } }
            dt { "created" } dd { (r.created_at) }
            @if let Some(t) = r.start_at {
                dt { "starts" }
                dd id="start-at" {
                    (t)
                    @if r.starts_later(d.as_of).is_some() {
                        " (pending until then: started with a delay)"
                    }
                }
            }
            @if let Some(v) = &r.version {
                dt { "version" } dd { span class="mono" id="version" { (v) } }
            }
            @if let Some(t) = &r.traceparent {
                dt { "trace" } dd { span class="mono" id="traceparent" { (t) } }
            }
            @if r.status.is_terminal() {
                dt { "ended" } dd { (r.updated_at) }
                dt { "duration" } dd { (text::duration_ms(r.duration_ms.unwrap_or_default())) }
            } @else {
                dt { "age" } dd { (text::duration_ms(r.created_at.until(d.as_of))) }
            }
            @if let Some(t) = &r.hook_token {
                dt { "start token" } dd { span class="mono" { (t) } }
            }
            @if let Some(p) = &r.parent {
                dt { "parent" } dd { a class="mono" id="parent" href={ "/runs/" (p) } { (p) } }
            }
            @if let Some(p) = &r.previous_run {
                dt { "previous run" }
                dd { a class="mono" id="previous-run" href={ "/runs/" (p) } { (p) } }
            }
            @if let Some(n) = &r.next_run {
                dt { "continued as" }
                dd { a class="mono" id="next-run" href={ "/runs/" (n) } { (n) } }
            }
            @if let Some(q) = &r.queue {
                dt { "queue" }
                dd {
                    a href={ "/?queue=" (url_encode(&q.name)) } { (q.name) }
                    ", priority " (q.priority)
                    @if let Some(k) = &q.partition_key { ", key " span class="mono" { (k) } }
                }
            }
        }
        @if !d.waiting_on.is_empty() {
            div class="waiting" {
                strong { "Waiting on" }
                ul { @for w in &d.waiting_on { li { (w) } } }
            }
        }
        section { h2 { "Timeline" } (timeline::render(d)) }
        (children_section(d))
        (hooks_section(d))
        (streams_section(d))
        (talk_section(d))
        (steps_section(d))
        (timers_section(d))
        section {
            h2 { "Input and result" }
            div class="io" {
                div { h3 { "Input" } pre class="json" { (pretty(&r.input)) } }
                @match (&r.output, &r.error) {
                    (Some(v), _) => div { h3 { "Output" } pre class="json" id="output" { (pretty(v)) } },
                    (_, Some(e)) => div {
                        h3 { "Error" }
                        pre class="json error-text" id="error" { (format!("{:?}", e.kind())) ": " (e) }
                    },
                    _ => div { h3 { "Result" } p class="muted" { "not yet" } },
                }
            }
        }
        section {
            h2 { "Events " span class="muted small" { "(" (events.len()) ")" } }
            @if let Some(first) = events.first() {
                table class="events" {
                    thead { tr { th { "#" } th { "At" } th { "+" } th { "Event" } th { "Details" } } }
                    tbody {
                        @for e in events {
                            @let kind = e.kind();
                            tr class={ "ev-" (kind) } {
                                td { (e.seq) }
                                td class="time" { (e.at) }
                                td { (text::duration_ms(first.at.until(e.at))) }
                                td class="mono" { (kind) }
                                td class="mono small" { (e.details()) }
                            }
                        }
                    }
                }
            } @else {
                p class="empty" { "No events yet." }
            }
        }
    };
    layout(&r.workflow, "", database, banner, body)
}

/// The child runs the run started, each linked to its own page.
fn children_section(d: &RunDetail) -> Markup {
    html! {
        @if !d.children.is_empty() {
            section id="children" {
                h2 { "Child runs" }
                table {
                    thead {
                        tr {
                            th { "Child" } th { "Workflow" } th { "Status" } th { "Started" }
                            th { "Result received" }
                        }
                    }
                    tbody {
                        @for c in &d.children {
                            tr data-child=(c.child_key) {
                                td {
                                    @match (c.child_id, c.conflict, &c.refused) {
                                        (_, Some(owner), _) => {
                                            "not started: its token is owned by "
                                            a class="mono" href={ "/runs/" (owner) } { (owner) }
                                        }
                                        (_, None, Some(why)) => { "not started: " (why) }
                                        (Some(id), None, None) => a class="mono" href={ "/runs/" (id) } { (id) },
                                        (None, None, None) => {},
                                    }
                                }
                                td { (c.workflow) }
                                td {
                                    @match c.status {
                                        Some(s) => (badge(s)),
                                        None if c.conflict.is_some() || c.refused.is_some() => {},
                                        None => span class="muted" { "pruned" },
                                    }
                                }
                                td class="time" { (c.started_at) }
                                td class="small" {
                                    @match (&c.ended_at, &c.output, &c.error) {
                                        (Some(at), Some(v), _) => { (at) ": " (text::json_line(v, 60)) }
                                        (Some(at), _, Some(e)) => {
                                            (at) ": error: " (text::cut(&e.to_string(), 80))
                                        }
                                        _ => span class="muted" { "not yet" },
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Why a blocked run stands still, above everything else on its page.
fn divergence_section(id: RunId, div: &DivergenceView) -> Markup {
    html! {
        section class="divergence" id="divergence" role="alert" {
            h2 { "Blocked: replay diverged from the recorded history" }
            p class="mono divergence-message" { (div.message) }
            @if let (Some(expected), Some(found)) = (&div.expected, &div.found) {
                dl class="facts" {
                    dt { "at event" } dd { @if let Some(n) = div.event { (n) } }
                    dt { "history expects" } dd class="mono" id="div-expected" { (expected) }
                    dt { "code did" } dd class="mono" id="div-found" { (found) }
                }
            }
            p class="small" {
                "Nothing was written to its history. Deploy code that fits it (guard the change with "
                code { "patched()" }
                "), then retry; or start a copy with "
                code { "workflow fork " (id) " --from-step N" }
                "."
            }
        }
    }
}

fn hooks_section(d: &RunDetail) -> Markup {
    html! {
        @if !d.hooks.is_empty() {
            section {
                h2 { "Hooks" }
                table class="hooks" {
                    thead {
                        tr { th { "Token" } th { "State" } th { "Since" } th { "Payloads" } th {} }
                    }
                    tbody {
                        @for h in &d.hooks {
                            tr data-token=(h.token) {
                                td class="mono" { (h.token) }
                                td {
                                    @match (h.conflict, h.active) {
                                        (Some(owner), _) => {
                                            "conflict: owned by "
                                            a class="mono" href={ "/runs/" (owner) } { (owner) }
                                        }
                                        (None, true) => span class="badge running" { "open" },
                                        (None, false) => "released",
                                    }
                                }
                                td class="time" { (h.registered_at) }
                                td {
                                    @for p in &h.payloads {
                                        div class="mono small" {
                                            "#" (p.payload_id) " " (text::json_line(&p.payload, 60))
                                        }
                                    }
                                }
                                td {
                                    @if h.active {
                                        (resume_form(&h.token, &format!("/runs/{}", d.run.id)))
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What the run published with `set_event` (latest value per key), the messages sent to it
/// that no `recv` took yet, and the requests it has not replied to.
fn talk_section(d: &RunDetail) -> Markup {
    html! {
        @if !d.published.is_empty() {
            section id="published" {
                h2 { "Events" }
                table {
                    thead { tr { th { "Key" } th { "Latest value" } } }
                    tbody {
                        @for (key, value) in &d.published {
                            tr data-key=(key) {
                                td class="mono" { (key) }
                                td class="mono" { (text::json_line(value, 200)) }
                            }
                        }
                    }
                }
            }
        }
        @if !d.waiting_messages.is_empty() {
            section id="waiting-messages" {
                h2 { "Waiting messages" }
                table {
                    thead { tr { th { "#" } th { "Topic" } th { "Message" } } }
                    tbody {
                        @for (id, topic, value) in &d.waiting_messages {
                            tr data-message=(id) {
                                td class="mono" { (id) }
                                td class="mono" { (topic) }
                                td class="mono" { (text::json_line(value, 200)) }
                            }
                        }
                    }
                }
            }
        }
        @if !d.open_requests.is_empty() {
            section id="open-requests" {
                h2 { "Open requests" }
                table {
                    thead { tr { th { "#" } th { "Name" } th { "Key" } th { "State" } } }
                    tbody {
                        @for r in &d.open_requests {
                            tr data-request=(r.id) {
                                td class="mono" { (r.id) }
                                td class="mono" { (r.name) }
                                td class="mono" { (r.key.as_deref().unwrap_or("")) }
                                td {
                                    @if r.received { "received, no reply yet" }
                                    @else { "waiting for the workflow" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The run's streams, each with its last chunks; the page's live refresh shows new ones. The
/// whole stream, as JSON: `/api/runs/<id>/streams/<name>?from=N`.
fn streams_section(d: &RunDetail) -> Markup {
    html! {
        @if !d.streams.is_empty() {
            section {
                h2 { "Streams" }
                @for s in &d.streams {
                    div class="stream" data-stream=(s.name) {
                        h3 {
                            span class="mono" { (s.name) }
                            " "
                            @if s.closed { "closed" } @else { span class="badge running" { "open" } }
                            " "
                            span class="muted small" {
                                (s.chunks) " " (if s.chunks == 1 { "chunk" } else { "chunks" })
                                @if (s.recent.len() as u64) < s.chunks {
                                    ", the last " (s.recent.len()) " shown"
                                }
                            }
                            " "
                            a class="small" href={
                                "/api/runs/" (d.run.id) "/streams/" (url_encode(&s.name))
                            } { "JSON" }
                        }
                        @if s.recent.is_empty() {
                            p class="empty" { "No chunks yet." }
                        } @else {
                            table class="chunks" {
                                thead { tr { th { "#" } th { "Attempt" } th { "Value" } } }
                                tbody {
                                    @for c in &s.recent {
                                        tr data-index=(c.index) {
                                            td class="mono" { (c.index) }
                                            td { (c.attempt) }
                                            td class="mono" { (text::json_line(&c.value, 200)) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn resume_form(token: &str, back: &str) -> Markup {
    html! {
        form class="resume" method="post" action="/hooks/resume" {
            input type="hidden" name="token" value=(token);
            input type="hidden" name="back" value=(back);
            textarea name="payload" rows="1" required spellcheck="false"
                placeholder=r#"JSON, e.g. {"approved": true}"#
                aria-label={ "JSON payload for " (token) } {}
            button type="submit" class="resume-button" { "resume" }
        }
    }
}

fn steps_section(d: &RunDetail) -> Markup {
    html! {
        section {
            h2 { "Steps " span class="muted small" { "(" (d.steps.len()) ")" } }
            @if d.steps.is_empty() {
                p class="empty" { "No steps yet." }
            } @else {
                table class="steps" {
                    thead {
                        tr {
                            th { "Step" } th { "Status" } th { "Attempt" } th { "Started" }
                            th { "Duration" } th { "Details" }
                        }
                    }
                    tbody {
                        @for s in &d.steps {
                            tr class="step" data-step-id=(s.step_id) {
                                td { span title=(s.step_id) { (s.label()) } }
                                td { span class={ "badge " (s.status.as_str()) } { (s.status.as_str()) } }
                                td { (s.attempts.len()) }
                                td class="time" { (s.scheduled_at) }
                                td class="time" { (s.duration_ms.map(text::duration_ms).unwrap_or_default()) }
                                td class="mono small" {
                                    @match (&s.output, &s.error) {
                                        (Some(v), _) => { "ok = " (text::json_line(v, 80)) }
                                        (_, Some(e)) => { (format!("{:?}", e.kind())) ": " (e) }
                                        _ => {},
                                    }
                                }
                            }
                            @if s.attempts.len() > 1 || s.attempts.iter().any(|a| a.error.is_some()) {
                                @for a in &s.attempts {
                                    @let outcome = a.outcome.as_str();
                                    tr class="attempt" {
                                        td class="indent" { "attempt " (a.attempt) }
                                        td { span class={ "badge " (outcome) } { (outcome) } }
                                        td {}
                                        td class="time" { (a.started_at) }
                                        td class="time" { (a.duration_ms.map(text::duration_ms).unwrap_or_default()) }
                                        td class="mono small" {
                                            @if let Some(e) = &a.error { (e) }
                                            @if let Some(at) = a.retry_at { " (retry at " (at) ")" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn timers_section(d: &RunDetail) -> Markup {
    html! {
        @if !d.timers.is_empty() {
            section {
                h2 { "Sleeps" }
                table class="timers" {
                    thead {
                        tr {
                            th { "Timer" } th { "Status" } th { "Scheduled" } th { "Until" }
                            th { "Fired" }
                        }
                    }
                    tbody {
                        @for t in &d.timers {
                            tr {
                                td class="mono" { (t.timer_id) }
                                td { span class={ "badge " (t.status.as_str()) } { (t.status.as_str()) } }
                                td class="time" { (t.scheduled_at) }
                                td class="time" { (t.fire_at) }
                                td class="time" { @if let Some(f) = t.fired_at { (f) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub fn hooks(database: &str, token: &str, hooks: &[HookSummary], banner: Banner<'_>) -> String {
    let body = html! {
        h1 { "Open hooks" }
        form class="filters" method="get" action="/hooks" {
            label { "Token " input name="token" value=(token) placeholder="exact token"; }
            button type="submit" { "Filter" }
        }
        @if hooks.is_empty() {
            p class="empty" { "No open hooks." }
        } @else {
            table class="hooks" {
                thead {
                    tr {
                        th { "Token" } th { "Run" } th { "Open since" }
                        th { "Resume with a JSON payload" }
                    }
                }
                tbody {
                    @for h in hooks {
                        tr data-token=(h.token) {
                            td class="mono" { (h.token) }
                            td class="mono" { a href={ "/runs/" (h.run_id) } { (h.run_id) } }
                            td class="time" { (h.created_at) }
                            td { (resume_form(&h.token, "/hooks")) }
                        }
                    }
                }
            }
        }
    };
    layout("Hooks", "hooks", database, banner, body)
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// The runs page's address for the page after `last` under `filter` (its filters kept).
fn older_runs(filter: &RunFilter, last: RunId) -> String {
    let query = [
        ("status", filter.status.map(|s| s.as_str().to_owned())),
        ("workflow", filter.workflow.clone()),
        ("queue", filter.queue.clone()),
        ("version", filter.version.clone()),
        ("limit", Some(filter.limit.to_string())),
        ("after", Some(last.to_string())),
    ];
    let present: Vec<(&str, String)> = query
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    // Plain strings always encode.
    format!(
        "/?{}",
        serde_urlencoded::to_string(present).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_query_values() {
        assert_eq!(url_encode("run 1/é&x"), "run+1%2F%C3%A9%26x");
    }

    #[test]
    fn values_are_escaped_in_text_and_attributes() {
        let page = hooks(
            "<db>",
            r#""><script>x</script>"#,
            &[],
            Banner::Error("<b>&'"),
        );
        assert!(
            page.contains(r#"value="&quot;&gt;&lt;script&gt;x&lt;/script&gt;""#),
            "{page}"
        );
        assert!(
            page.contains(r#"role="alert">&lt;b&gt;&amp;'</p>"#),
            "{page}"
        );
        assert!(
            page.contains(r#"title="database">&lt;db&gt;</span>"#),
            "{page}"
        );
        assert_eq!(page.matches("<script").count(), 1, "{page}");
    }
}
