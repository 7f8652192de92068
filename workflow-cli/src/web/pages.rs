//! The dashboard's HTML, written out here: a layout, the runs list, a run page and the hooks
//! list. Everything that comes from the database passes through [`esc`].

use std::fmt::Write as _;

use axum::http::StatusCode;
use workflow_core::store::RunFilter;
use workflow_core::RunStatus;

use super::timeline;
use crate::text;
use crate::view::{
    AttemptOutcome, DivergenceView, EventView, HookSummary, QueueView, QueuedRun, RunDetail,
};

/// A message at the top of a page, after an action.
pub enum Banner<'a> {
    None,
    Notice(&'a str),
    Error(&'a str),
}

/// `s` safe inside HTML text and double-quoted attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
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

fn layout(title: &str, nav: &str, database: &str, banner: Banner<'_>, body: &str) -> String {
    let banner = match banner {
        Banner::None => String::new(),
        Banner::Notice(m) => format!(r#"<p class="banner notice" role="status">{}</p>"#, esc(m)),
        Banner::Error(m) => format!(r#"<p class="banner error" role="alert">{}</p>"#, esc(m)),
    };
    let tab = |href: &str, name: &str, label: &str| {
        let current = if nav == name {
            r#" aria-current="page""#
        } else {
            ""
        };
        format!(r#"<a href="{href}"{current}>{label}</a>"#)
    };
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · workflow</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<link rel="stylesheet" href="/assets/style.css">
<script src="/assets/app.js" defer></script>
</head>
<body>
<header class="top">
  <a class="brand" href="/">workflow</a>
  <nav>{runs}{hooks}{queues}</nav>
  <span class="db" title="database">{database}</span>
  <label class="live"><input type="checkbox" id="live-toggle" checked> live</label>
  <span id="live-status" class="muted"></span>
</header>
{banner}
<main id="live">
{body}
</main>
</body>
</html>
"#,
        title = esc(title),
        runs = tab("/", "runs", "Runs"),
        hooks = tab("/hooks", "hooks", "Hooks"),
        queues = tab("/queues", "queues", "Queues"),
        database = esc(database),
    )
}

fn badge(status: RunStatus) -> String {
    format!(
        r#"<span class="badge {s}" data-status="{s}">{s}</span>"#,
        s = status.as_str()
    )
}

pub fn error(status: StatusCode, message: &str) -> String {
    let body = format!(
        r#"<h1>{}</h1><p class="error-message">{}</p><p><a href="/">All runs</a></p>"#,
        esc(&status.to_string()),
        esc(message)
    );
    layout("Error", "", "", Banner::None, &body)
}

pub fn runs(
    database: &str,
    filter: &RunFilter,
    queue: Option<&QueueView>,
    runs: &[QueuedRun],
    banner: Banner<'_>,
) -> String {
    let mut body = String::new();
    let status = filter.status.map(RunStatus::as_str).unwrap_or_default();
    let mut options = String::from(r#"<option value="">any status</option>"#);
    for s in [
        "pending",
        "running",
        "blocked",
        "completed",
        "failed",
        "cancelled",
    ] {
        let selected = if s == status { " selected" } else { "" };
        let _ = write!(options, r#"<option value="{s}"{selected}>{s}</option>"#);
    }
    let _ = write!(
        body,
        r#"<h1>Runs</h1>
<form class="filters" method="get" action="/">
  <label>Status <select name="status">{options}</select></label>
  <label>Workflow <input name="workflow" value="{workflow}" placeholder="any workflow"></label>
  <label>Queue <input name="queue" value="{queue}" placeholder="any queue"></label>
  <label>Limit <input name="limit" type="number" min="1" max="10000" value="{limit}"></label>
  <button type="submit">Filter</button>
</form>
"#,
        workflow = esc(filter.workflow.as_deref().unwrap_or_default()),
        queue = esc(filter.queue.as_deref().unwrap_or_default()),
        limit = filter.limit,
    );
    if let Some(q) = queue {
        let _ = write!(
            body,
            r#"<p class="queue-summary" data-queue="{name}">Queue <strong>{name}</strong>: {limits}; {waiting} waiting.</p>"#,
            name = esc(&q.name),
            limits = esc(&q.limits()),
            waiting = q.waiting,
        );
    }
    let position_header = if queue.is_some() {
        "<th>Position</th><th>Key</th><th>Priority</th>"
    } else {
        ""
    };
    if runs.is_empty() {
        body.push_str(r#"<p class="empty">No runs match.</p>"#);
    } else {
        let _ = write!(
            body,
            r#"<table class="runs"><thead><tr><th>Run</th><th>Workflow</th><th>Status</th>{position_header}<th>Created</th><th>Duration</th><th>Result</th></tr></thead><tbody>"#,
        );
        for QueuedRun { run: r, position } in runs {
            let place = if queue.is_some() {
                let entry = r.queue.as_ref();
                format!(
                    r#"<td class="position">{}</td><td class="mono">{}</td><td>{}</td>"#,
                    position.map(|p| p.to_string()).unwrap_or_default(),
                    esc(entry
                        .and_then(|e| e.partition_key.as_deref())
                        .unwrap_or_default()),
                    entry.map_or(0, |e| e.priority),
                )
            } else {
                String::new()
            };
            let result = match (&r.output, &r.error) {
                (Some(v), _) => text::json_line(v, 60),
                (_, Some(e)) => text::cut(&e.to_string(), 60),
                _ => String::new(),
            };
            let _ = write!(
                body,
                r#"<tr data-run-id="{id}"><td class="mono"><a href="/runs/{id}">{id}</a></td><td>{wf}</td><td>{badge}</td>{place}<td class="time">{created}</td><td class="time">{duration}</td><td class="mono small">{result}</td></tr>"#,
                id = r.id,
                wf = esc(&r.workflow),
                badge = badge(r.status),
                created = r.created_at,
                duration = r.duration_ms.map(text::duration_ms).unwrap_or_default(),
                result = esc(&result),
            );
        }
        body.push_str("</tbody></table>");
    }
    let _ = write!(
        body,
        r#"<p class="muted small">{} run(s), newest first{}.</p>"#,
        runs.len(),
        if runs.len() >= filter.limit {
            " (limit reached: raise it to see older runs)"
        } else {
            ""
        }
    );
    layout("Runs", "runs", database, banner, &body)
}

/// Every declared queue: its limits and occupancy, linking to its runs.
pub fn queues(database: &str, queues: &[QueueView]) -> String {
    let mut body = String::from("<h1>Queues</h1>\n");
    if queues.is_empty() {
        body.push_str(r#"<p class="empty">No queues are declared.</p>"#);
        return layout("Queues", "queues", database, Banner::None, &body);
    }
    body.push_str(
        r#"<table class="queues"><thead><tr><th>Queue</th><th>Concurrency</th><th>Rate limit</th><th>Occupied</th><th>Waiting</th><th>Begun in window</th></tr></thead><tbody>"#,
    );
    for q in queues {
        let _ = write!(
            body,
            r#"<tr data-queue="{name}"><td><a href="/?queue={link}">{name}</a></td><td>{concurrency}</td><td>{rate}</td><td>{occupied}</td><td>{waiting}</td><td>{begun}</td></tr>"#,
            name = esc(&q.name),
            link = url_encode(&q.name),
            concurrency = q
                .concurrency
                .map_or_else(|| "none".to_owned(), |c| c.to_string()),
            rate = q.rate_limit.map_or_else(
                || "none".to_owned(),
                |r| format!("{} per {}", r.runs, text::duration_ms(r.period_ms))
            ),
            occupied = q.occupied,
            waiting = q.waiting,
            begun = q
                .rate_limit
                .map_or_else(String::new, |_| q.begun_in_window.to_string()),
        );
    }
    body.push_str("</tbody></table>");
    layout("Queues", "queues", database, Banner::None, &body)
}

pub fn run(database: &str, d: &RunDetail, events: &[EventView], banner: Banner<'_>) -> String {
    let r = &d.run;
    let mut body = String::new();
    let _ = write!(
        body,
        r#"<p class="crumbs"><a href="/">Runs</a> / <span class="mono">{id}</span></p>
<div class="run-head">
  <h1>{wf} {badge}</h1>
"#,
        id = r.id,
        wf = esc(&r.workflow),
        badge = badge(r.status),
    );
    body.push_str("  <div class=\"actions\">\n");
    if !r.status.is_terminal() {
        let _ = write!(
            body,
            r#"  <form method="post" action="/runs/{id}/cancel" data-confirm="Cancel this run? Its worker stops at the next await point.">
    <button type="submit" class="danger" id="cancel">cancel run</button>
  </form>
"#,
            id = r.id
        );
    }
    if matches!(r.status, RunStatus::Failed | RunStatus::Blocked) {
        let _ = write!(
            body,
            r#"  <form method="post" action="/runs/{id}/retry">
    <button type="submit" class="primary" id="retry" title="{title}">retry run</button>
  </form>
"#,
            id = r.id,
            title = if r.status == RunStatus::Failed {
                "Re-open the run: recorded steps are kept, the failed step gets a fresh set of attempts."
            } else {
                "Hand the run to a worker now: it goes on if the deployed code fits its history."
            },
        );
    }
    body.push_str("  </div>\n</div>\n");
    if let Some(div) = &d.divergence {
        divergence_section(&mut body, r.id, div);
    }
    body.push_str("<dl class=\"facts\">");
    let mut fact = |k: &str, v: String| {
        let _ = write!(body, "<dt>{k}</dt><dd>{v}</dd>");
    };
    fact("run", format!(r#"<span class="mono">{}</span>"#, r.id));
    fact("created", r.created_at.to_string());
    if r.status.is_terminal() {
        fact("ended", r.updated_at.to_string());
        fact(
            "duration",
            text::duration_ms(r.duration_ms.unwrap_or_default()),
        );
    } else {
        fact("age", text::duration_ms(r.created_at.until(d.as_of)));
    }
    if let Some(t) = &r.hook_token {
        fact(
            "start token",
            format!(r#"<span class="mono">{}</span>"#, esc(t)),
        );
    }
    if let Some(p) = &r.parent {
        fact(
            "parent",
            format!(r#"<a class="mono" id="parent" href="/runs/{p}">{p}</a>"#),
        );
    }
    if let Some(q) = &r.queue {
        let mut place = format!(
            r#"<a href="/?queue={}">{}</a>, priority {}"#,
            url_encode(&q.name),
            esc(&q.name),
            q.priority
        );
        if let Some(k) = &q.partition_key {
            let _ = write!(place, r#", key <span class="mono">{}</span>"#, esc(k));
        }
        fact("queue", place);
    }
    body.push_str("</dl>\n");
    if !d.waiting_on.is_empty() {
        body.push_str(r#"<div class="waiting"><strong>Waiting on</strong><ul>"#);
        for w in &d.waiting_on {
            let _ = write!(body, "<li>{}</li>", esc(w));
        }
        body.push_str("</ul></div>\n");
    }

    body.push_str("<section><h2>Timeline</h2>\n");
    body.push_str(&timeline::render(d));
    body.push_str("</section>\n");

    children_section(&mut body, d);
    hooks_section(&mut body, d);
    streams_section(&mut body, d);
    steps_section(&mut body, d);
    timers_section(&mut body, d);

    body.push_str(r#"<section><h2>Input and result</h2><div class="io">"#);
    let _ = write!(
        body,
        r#"<div><h3>Input</h3><pre class="json">{}</pre></div>"#,
        esc(&pretty(&r.input))
    );
    match (&r.output, &r.error) {
        (Some(v), _) => {
            let _ = write!(
                body,
                r#"<div><h3>Output</h3><pre class="json" id="output">{}</pre></div>"#,
                esc(&pretty(v))
            );
        }
        (_, Some(e)) => {
            let _ = write!(
                body,
                r#"<div><h3>Error</h3><pre class="json error-text" id="error">{:?}: {}</pre></div>"#,
                e.kind(),
                esc(&e.to_string())
            );
        }
        _ => body.push_str(r#"<div><h3>Result</h3><p class="muted">not yet</p></div>"#),
    }
    body.push_str("</div></section>\n");

    let _ = write!(
        body,
        r#"<section><h2>Events <span class="muted small">({})</span></h2>"#,
        events.len()
    );
    if events.is_empty() {
        body.push_str(r#"<p class="empty">No events yet.</p>"#);
    } else {
        let start = events[0].at;
        body.push_str(
            r#"<table class="events"><thead><tr><th>#</th><th>At</th><th>+</th><th>Event</th><th>Details</th></tr></thead><tbody>"#,
        );
        for e in events {
            let kind = e.kind();
            let _ = write!(
                body,
                r#"<tr class="ev-{kind}"><td>{seq}</td><td class="time">{at}</td><td>{off}</td><td class="mono">{kind}</td><td class="mono small">{details}</td></tr>"#,
                seq = e.seq,
                at = e.at,
                off = text::duration_ms(start.until(e.at)),
                kind = esc(&kind),
                details = esc(&e.details()),
            );
        }
        body.push_str("</tbody></table>");
    }
    body.push_str("</section>\n");
    layout(&r.workflow, "", database, banner, &body)
}

/// The child runs the run started, each linked to its own page.
fn children_section(body: &mut String, d: &RunDetail) {
    if d.children.is_empty() {
        return;
    }
    body.push_str(
        r#"<section id="children"><h2>Child runs</h2><table><thead><tr><th>Child</th><th>Workflow</th><th>Status</th><th>Started</th><th>Result received</th></tr></thead><tbody>"#,
    );
    for c in &d.children {
        let child = match (c.child_id, c.conflict) {
            (_, Some(owner)) => format!(
                r#"not started: its token is owned by <a class="mono" href="/runs/{owner}">{owner}</a>"#
            ),
            (_, None) if c.refused.is_some() => format!(
                "not started: {}",
                esc(c.refused.as_deref().unwrap_or_default())
            ),
            (Some(id), None) => format!(r#"<a class="mono" href="/runs/{id}">{id}</a>"#),
            (None, None) => String::new(),
        };
        let status = match c.status {
            Some(s) => badge(s),
            None if c.conflict.is_some() || c.refused.is_some() => String::new(),
            None => r#"<span class="muted">pruned</span>"#.to_owned(),
        };
        let received = match (&c.ended_at, &c.output, &c.error) {
            (Some(at), Some(v), _) => format!("{at}: {}", esc(&text::json_line(v, 60))),
            (Some(at), _, Some(e)) => {
                format!("{at}: error: {}", esc(&text::cut(&e.to_string(), 80)))
            }
            _ => r#"<span class="muted">not yet</span>"#.to_owned(),
        };
        let _ = write!(
            body,
            r#"<tr data-child="{key}"><td>{child}</td><td>{wf}</td><td>{status}</td><td class="time">{started}</td><td class="small">{received}</td></tr>"#,
            key = esc(&c.child_key),
            wf = esc(&c.workflow),
            started = c.started_at,
        );
    }
    body.push_str("</tbody></table></section>\n");
}

/// Why a blocked run stands still, above everything else on its page.
fn divergence_section(body: &mut String, id: workflow_core::RunId, div: &DivergenceView) {
    body.push_str(r#"<section class="divergence" id="divergence" role="alert"><h2>Blocked: replay diverged from the recorded history</h2>"#);
    let _ = write!(
        body,
        r#"<p class="mono divergence-message">{}</p>"#,
        esc(&div.message)
    );
    if let (Some(expected), Some(found)) = (&div.expected, &div.found) {
        let _ = write!(
            body,
            r#"<dl class="facts"><dt>at event</dt><dd>{event}</dd><dt>history expects</dt><dd class="mono" id="div-expected">{expected}</dd><dt>code did</dt><dd class="mono" id="div-found">{found}</dd></dl>"#,
            event = div.event.map(|n| n.to_string()).unwrap_or_default(),
            expected = esc(expected),
            found = esc(found),
        );
    }
    let _ = writeln!(
        body,
        r#"<p class="small">Nothing was written to its history. Deploy code that fits it (guard the change with <code>patched()</code>), then retry; or start a copy with <code>workflow fork {id} --from-step N</code>.</p></section>"#
    );
}

fn hooks_section(body: &mut String, d: &RunDetail) {
    if d.hooks.is_empty() {
        return;
    }
    body.push_str(r#"<section><h2>Hooks</h2><table class="hooks"><thead><tr><th>Token</th><th>State</th><th>Since</th><th>Payloads</th><th></th></tr></thead><tbody>"#);
    for h in &d.hooks {
        let state = match (h.conflict, h.active) {
            (Some(owner), _) => {
                format!(r#"conflict: owned by <a class="mono" href="/runs/{owner}">{owner}</a>"#)
            }
            (None, true) => r#"<span class="badge running">open</span>"#.to_owned(),
            (None, false) => "released".to_owned(),
        };
        let mut payloads = String::new();
        for p in &h.payloads {
            let _ = write!(
                payloads,
                r#"<div class="mono small">#{} {}</div>"#,
                p.payload_id,
                esc(&text::json_line(&p.payload, 60))
            );
        }
        let action = if h.active {
            resume_form(&h.token, &format!("/runs/{}", d.run.id))
        } else {
            String::new()
        };
        let _ = write!(
            body,
            r#"<tr data-token="{token}"><td class="mono">{token}</td><td>{state}</td><td class="time">{since}</td><td>{payloads}</td><td>{action}</td></tr>"#,
            token = esc(&h.token),
            since = h.registered_at,
        );
    }
    body.push_str("</tbody></table></section>\n");
}

/// The run's streams, each with its last chunks; the page's live refresh shows new ones. The
/// whole stream, as JSON: `/api/runs/<id>/streams/<name>?from=N`.
fn streams_section(body: &mut String, d: &RunDetail) {
    if d.streams.is_empty() {
        return;
    }
    body.push_str(r#"<section><h2>Streams</h2>"#);
    for s in &d.streams {
        let state = if s.closed {
            "closed".to_owned()
        } else {
            r#"<span class="badge running">open</span>"#.to_owned()
        };
        let shown = s.recent.len();
        let _ = write!(
            body,
            r#"<div class="stream" data-stream="{name}"><h3><span class="mono">{name}</span> {state} <span class="muted small">{n} {chunks}{last}</span> <a class="small" href="/api/runs/{id}/streams/{path}">JSON</a></h3>"#,
            name = esc(&s.name),
            n = s.chunks,
            chunks = if s.chunks == 1 { "chunk" } else { "chunks" },
            last = if (shown as u64) < s.chunks {
                format!(", the last {shown} shown")
            } else {
                String::new()
            },
            id = d.run.id,
            path = url_encode(&s.name),
        );
        if s.recent.is_empty() {
            body.push_str(r#"<p class="empty">No chunks yet.</p></div>"#);
            continue;
        }
        body.push_str(r#"<table class="chunks"><thead><tr><th>#</th><th>Attempt</th><th>Value</th></tr></thead><tbody>"#);
        for c in &s.recent {
            let _ = write!(
                body,
                r#"<tr data-index="{i}"><td class="mono">{i}</td><td>{a}</td><td class="mono">{v}</td></tr>"#,
                i = c.index,
                a = c.attempt,
                v = esc(&text::json_line(&c.value, 200)),
            );
        }
        body.push_str("</tbody></table></div>");
    }
    body.push_str("</section>\n");
}

fn resume_form(token: &str, back: &str) -> String {
    format!(
        r#"<form class="resume" method="post" action="/hooks/resume">
<input type="hidden" name="token" value="{token}">
<input type="hidden" name="back" value="{back}">
<textarea name="payload" rows="1" required spellcheck="false" placeholder="JSON, e.g. {{&quot;approved&quot;: true}}" aria-label="JSON payload for {token}"></textarea>
<button type="submit" class="resume-button">resume</button>
</form>"#,
        token = esc(token),
        back = esc(back),
    )
}

fn steps_section(body: &mut String, d: &RunDetail) {
    let _ = write!(
        body,
        r#"<section><h2>Steps <span class="muted small">({})</span></h2>"#,
        d.steps.len()
    );
    if d.steps.is_empty() {
        body.push_str(r#"<p class="empty">No steps yet.</p></section>"#);
        return;
    }
    body.push_str(r#"<table class="steps"><thead><tr><th>Step</th><th>Status</th><th>Attempt</th><th>Started</th><th>Duration</th><th>Details</th></tr></thead><tbody>"#);
    for s in &d.steps {
        let details = match (&s.output, &s.error) {
            (Some(v), _) => format!("ok = {}", text::json_line(v, 80)),
            (_, Some(e)) => format!("{:?}: {e}", e.kind()),
            _ => String::new(),
        };
        let _ = write!(
            body,
            r#"<tr class="step" data-step-id="{id}"><td><span title="{id}">{label}</span></td><td><span class="badge {status}">{status}</span></td><td>{n}</td><td class="time">{started}</td><td class="time">{duration}</td><td class="mono small">{details}</td></tr>"#,
            id = esc(&s.step_id),
            label = esc(&s.label()),
            status = s.status.as_str(),
            n = s.attempts.len(),
            started = s.scheduled_at,
            duration = s.duration_ms.map(text::duration_ms).unwrap_or_default(),
            details = esc(&details),
        );
        if s.attempts.len() > 1 || s.attempts.iter().any(|a| a.error.is_some()) {
            for a in &s.attempts {
                let outcome = attempt_class(a.outcome);
                let mut details = a.error.as_ref().map(|e| e.to_string()).unwrap_or_default();
                if let Some(at) = a.retry_at {
                    let _ = write!(details, " (retry at {at})");
                }
                let _ = write!(
                    body,
                    r#"<tr class="attempt"><td class="indent">attempt {n}</td><td><span class="badge {outcome}">{outcome}</span></td><td></td><td class="time">{started}</td><td class="time">{duration}</td><td class="mono small">{details}</td></tr>"#,
                    n = a.attempt,
                    started = a.started_at,
                    duration = a.duration_ms.map(text::duration_ms).unwrap_or_default(),
                    details = esc(&details),
                );
            }
        }
    }
    body.push_str("</tbody></table></section>\n");
}

pub fn attempt_class(o: AttemptOutcome) -> &'static str {
    match o {
        AttemptOutcome::Ok => "ok",
        AttemptOutcome::Failed => "failed",
        AttemptOutcome::Running => "running",
        AttemptOutcome::Interrupted => "interrupted",
    }
}

fn timers_section(body: &mut String, d: &RunDetail) {
    if d.timers.is_empty() {
        return;
    }
    body.push_str(r#"<section><h2>Sleeps</h2><table class="timers"><thead><tr><th>Timer</th><th>Status</th><th>Scheduled</th><th>Until</th><th>Fired</th></tr></thead><tbody>"#);
    for t in &d.timers {
        let _ = write!(
            body,
            r#"<tr><td class="mono">{id}</td><td><span class="badge {s}">{s}</span></td><td class="time">{sched}</td><td class="time">{until}</td><td class="time">{fired}</td></tr>"#,
            id = esc(&t.timer_id),
            s = t.status.as_str(),
            sched = t.scheduled_at,
            until = t.fire_at,
            fired = t.fired_at.map(|f| f.to_string()).unwrap_or_default(),
        );
    }
    body.push_str("</tbody></table></section>\n");
}

pub fn hooks(database: &str, token: &str, hooks: &[HookSummary], banner: Banner<'_>) -> String {
    let mut body = format!(
        r#"<h1>Open hooks</h1>
<form class="filters" method="get" action="/hooks">
  <label>Token <input name="token" value="{}" placeholder="exact token"></label>
  <button type="submit">Filter</button>
</form>
"#,
        esc(token)
    );
    if hooks.is_empty() {
        body.push_str(r#"<p class="empty">No open hooks.</p>"#);
    } else {
        body.push_str(r#"<table class="hooks"><thead><tr><th>Token</th><th>Run</th><th>Open since</th><th>Resume with a JSON payload</th></tr></thead><tbody>"#);
        for h in hooks {
            let _ = write!(
                body,
                r#"<tr data-token="{token}"><td class="mono">{token}</td><td class="mono"><a href="/runs/{run}">{run}</a></td><td class="time">{since}</td><td>{form}</td></tr>"#,
                token = esc(&h.token),
                run = h.run_id,
                since = h.created_at,
                form = resume_form(&h.token, "/hooks"),
            );
        }
        body.push_str("</tbody></table>");
    }
    layout("Hooks", "hooks", database, banner, &body)
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_encodes() {
        assert_eq!(
            esc(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(url_encode("run 1/é&x"), "run+1%2F%C3%A9%26x");
    }
}
