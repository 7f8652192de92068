//! How the command line prints a run's detail and a queue's runs for people (`workflow run`,
//! `workflow runs --queue`); `--json` prints the same views as JSON instead.

use std::fmt::Write as _;
use std::time::SystemTime;

use crate::text::{self, Table};
use crate::view::{AttemptOutcome, QueueView, QueuedRun, RunDetail, Time};

/// `workflow runs --queue`: the queue's limits and occupancy, then its runs with the waiting
/// ones' positions.
pub fn queue_table(queue: &QueueView, runs: &[QueuedRun]) -> String {
    let mut out = format!(
        "queue {}: {}; {} waiting\n",
        text::printable(&queue.name, false),
        queue.limits(),
        queue.waiting
    );
    let now = Time(SystemTime::now());
    let mut t = Table::new([
        "RUN", "WORKFLOW", "STATUS", "POSITION", "KEY", "PRIORITY", "CREATED",
    ]);
    for r in runs {
        let entry = r.run.queue.as_ref();
        t.row(vec![
            r.run.id.to_string(),
            r.run.workflow.clone(),
            r.run.status_text(now),
            r.position.map(|p| p.to_string()).unwrap_or_default(),
            entry
                .and_then(|q| q.partition_key.clone())
                .unwrap_or_default(),
            entry.map_or(0, |q| q.priority).to_string(),
            r.run.created_at.to_string(),
        ]);
    }
    if t.is_empty() {
        out.push_str("no runs\n");
    } else {
        out.push_str(&t.to_string());
    }
    out
}

/// `workflow run <id>` for people: the run's fields, then a section per kind of thing it did.
pub fn run_text(d: &RunDetail) -> String {
    let mut out = String::new();
    fields(&mut out, d);
    children_section(&mut out, d);
    steps_section(&mut out, d);
    sleeps_section(&mut out, d);
    hooks_section(&mut out, d);
    talk_sections(&mut out, d);
    streams_section(&mut out, d);
    out
}

/// One line per field, whatever the store holds: a newline in an error must not forge a field.
fn field(out: &mut String, name: &str, value: &str) {
    let _ = writeln!(out, "{name:<10} {}", text::printable(value, false));
}

/// The run's own fields, one per line: what and when, where it sits among other runs, its
/// input and output, why it stands still or failed, and what it waits on.
fn fields(out: &mut String, d: &RunDetail) {
    let r = &d.run;
    field(out, "run", &r.id.to_string());
    field(out, "workflow", &r.workflow);
    field(out, "status", &r.status_text(d.as_of));
    field(out, "created", &r.created_at.to_string());
    if let Some(t) = r.start_at {
        field(out, "starts", &t.to_string());
    }
    if let Some(v) = &r.version {
        field(out, "version", v);
    }
    if let Some(t) = &r.traceparent {
        field(out, "trace", t);
    }
    if r.status.is_terminal() {
        field(out, "ended", &r.updated_at.to_string());
        field(
            out,
            "duration",
            &text::duration_ms(r.duration_ms.unwrap_or_default()),
        );
    } else {
        field(out, "age", &text::duration_ms(r.created_at.until(d.as_of)));
    }
    relation_fields(out, d);
    field(out, "input", &r.input.to_string());
    if let Some(output) = &r.output {
        field(out, "output", &output.to_string());
    }
    outcome_fields(out, d);
    if !d.waiting_on.is_empty() {
        let _ = writeln!(out, "waiting on");
        for w in &d.waiting_on {
            let _ = writeln!(out, "  - {}", text::printable(w, false));
        }
    }
}

/// Its hook token, the runs it came from or led to, and its place in a queue.
fn relation_fields(out: &mut String, d: &RunDetail) {
    let r = &d.run;
    if let Some(token) = &r.hook_token {
        field(out, "token", token);
    }
    if let Some(parent) = &r.parent {
        field(out, "parent", &parent.to_string());
    }
    if let Some(previous) = &r.previous_run {
        field(out, "previous run", &previous.to_string());
    }
    if let Some(next) = &r.next_run {
        field(out, "next run", &next.to_string());
    }
    if let Some(q) = &r.queue {
        let mut place = format!("{}, priority {}", q.name, q.priority);
        if let Some(k) = &q.partition_key {
            let _ = write!(place, ", key {k}");
        }
        field(out, "queue", &place);
    }
}

/// Why a blocked run stands still and what to do about it, or the error a run failed with.
fn outcome_fields(out: &mut String, d: &RunDetail) {
    let r = &d.run;
    if let Some(div) = &d.divergence {
        // The reason the run stands still, first: on call, this is what one needs to read.
        field(out, "blocked", &div.message);
        if let Some(n) = div.event {
            field(out, "  event", &n.to_string());
        }
        if let Some(e) = &div.expected {
            field(out, "  expected", e);
        }
        if let Some(f) = &div.found {
            field(out, "  found", f);
        }
        field(
            out,
            "  then",
            &format!(
                "deploy code that fits (guard the change with `patched()`), then \
                 `workflow retry {id}`; or `workflow fork {id} --from-step N`",
                id = r.id
            ),
        );
    } else if let Some(error) = &r.error {
        field(out, "error", &format!("{:?}: {error}", error.kind()));
    }
}

/// The runs it started (or failed to start), when it has any.
fn children_section(out: &mut String, d: &RunDetail) {
    if !d.children.is_empty() {
        let _ = writeln!(out, "\nchildren");
        let mut t = Table::new(["  CHILD", "WORKFLOW", "STATUS", "DETAILS"]);
        for c in &d.children {
            let status = match (c.status, c.conflict) {
                (_, Some(_)) => "not started".to_owned(),
                _ if c.refused.is_some() => "not started".to_owned(),
                (Some(s), _) => s.as_str().to_owned(),
                (None, _) => "pruned".to_owned(),
            };
            let details = match (&c.conflict, &c.output, &c.error) {
                (Some(owner), _, _) => format!("token owned by run {owner}"),
                _ if c.refused.is_some() => c.refused.clone().unwrap_or_default(),
                (_, Some(v), _) => format!("received ok={}", text::json_line(v, 60)),
                (_, _, Some(e)) => format!("received error: {}", text::cut(&e.to_string(), 80)),
                _ => c.child_key.clone(),
            };
            t.row(vec![
                format!(
                    "  {}",
                    c.child_id.map(|id| id.to_string()).unwrap_or_default()
                ),
                c.workflow.clone(),
                status,
                details,
            ]);
        }
        out.push_str(&t.to_string());
    }
}

/// Each step, with a row per attempt unless a lone attempt went well.
fn steps_section(out: &mut String, d: &RunDetail) {
    let _ = writeln!(out, "\nsteps");
    if d.steps.is_empty() {
        let _ = writeln!(out, "  none");
    } else {
        let mut t = Table::new(["  STEP", "STATUS", "ATTEMPTS", "DURATION", "DETAILS"]);
        for s in &d.steps {
            let details = match (&s.output, &s.error) {
                (Some(v), _) => format!("ok={}", text::json_line(v, 60)),
                (_, Some(e)) => format!("error: {}", text::cut(&e.to_string(), 80)),
                _ => s.step_id.clone(),
            };
            t.row(vec![
                format!("  {}", s.label()),
                s.status.as_str().to_owned(),
                s.attempts.len().to_string(),
                s.duration_ms.map(text::duration_ms).unwrap_or_default(),
                details,
            ]);
            // A lone attempt that went well adds nothing to the step's own row.
            let plain = s.attempts.len() == 1 && s.attempts[0].outcome == AttemptOutcome::Ok;
            for a in s.attempts.iter().filter(|_| !plain) {
                let outcome = a.outcome.as_str();
                let mut details = format!("started {}", a.started_at);
                if let Some(e) = &a.error {
                    let _ = write!(details, "; {}", text::cut(&e.to_string(), 60));
                }
                if let Some(at) = a.retry_at {
                    let _ = write!(details, "; retry at {at}");
                }
                t.row(vec![
                    format!("    attempt {}", a.attempt),
                    outcome.to_owned(),
                    String::new(),
                    a.duration_ms.map(text::duration_ms).unwrap_or_else(|| {
                        format!("{}+", text::duration_ms(a.started_at.until(d.as_of)))
                    }),
                    details,
                ]);
            }
        }
        out.push_str(&t.to_string());
    }
}

/// Its timers.
fn sleeps_section(out: &mut String, d: &RunDetail) {
    let _ = writeln!(out, "\nsleeps");
    if d.timers.is_empty() {
        let _ = writeln!(out, "  none");
    } else {
        let mut t = Table::new(["  TIMER", "STATUS", "SCHEDULED", "UNTIL", "FIRED"]);
        for tm in &d.timers {
            t.row(vec![
                format!("  {}", tm.timer_id),
                tm.status.as_str().to_owned(),
                tm.scheduled_at.to_string(),
                tm.fire_at.to_string(),
                tm.fired_at.map(|t| t.to_string()).unwrap_or_default(),
            ]);
        }
        out.push_str(&t.to_string());
    }
}

/// Its hooks.
fn hooks_section(out: &mut String, d: &RunDetail) {
    let _ = writeln!(out, "\nhooks");
    if d.hooks.is_empty() {
        let _ = writeln!(out, "  none");
    } else {
        let mut t = Table::new(["  TOKEN", "STATE", "SINCE", "PAYLOADS"]);
        for h in &d.hooks {
            let state = match (h.conflict, h.active) {
                (Some(owner), _) => format!("conflict (owned by run {owner})"),
                (None, true) => "open".to_owned(),
                (None, false) => "released".to_owned(),
            };
            t.row(vec![
                format!("  {}", h.token),
                state,
                h.registered_at.to_string(),
                h.payloads.len().to_string(),
            ]);
        }
        out.push_str(&t.to_string());
    }
}

/// Its streams.
fn streams_section(out: &mut String, d: &RunDetail) {
    // Only runs that wrote to a stream have the section (`workflow stream` prints one).
    if !d.streams.is_empty() {
        let _ = writeln!(out, "\nstreams");
        let mut t = Table::new(["  STREAM", "STATE", "CHUNKS", "LAST"]);
        for s in &d.streams {
            t.row(vec![
                format!("  {}", s.name),
                if s.closed { "closed" } else { "open" }.to_owned(),
                s.chunks.to_string(),
                s.recent
                    .last()
                    .map(|c| text::json_line(&c.value, 60))
                    .unwrap_or_default(),
            ]);
        }
        out.push_str(&t.to_string());
    }
}

/// What the run published (`set_event`), the messages no `recv` took yet and the requests
/// it has not replied to: a section each, only when it has any.
fn talk_sections(out: &mut String, d: &RunDetail) {
    if !d.published.is_empty() {
        let _ = writeln!(out, "\nevents");
        let mut t = Table::new(["  KEY", "LATEST VALUE"]);
        for (key, value) in &d.published {
            t.row(vec![format!("  {key}"), text::json_line(value, 80)]);
        }
        out.push_str(&t.to_string());
    }
    if !d.waiting_messages.is_empty() {
        let _ = writeln!(out, "\nwaiting messages");
        let mut t = Table::new(["  #", "TOPIC", "MESSAGE"]);
        for (id, topic, value) in &d.waiting_messages {
            t.row(vec![
                format!("  {id}"),
                topic.clone(),
                text::json_line(value, 80),
            ]);
        }
        out.push_str(&t.to_string());
    }
    if !d.open_requests.is_empty() {
        let _ = writeln!(out, "\nopen requests");
        let mut t = Table::new(["  #", "NAME", "KEY", "STATE"]);
        for r in &d.open_requests {
            let state = if r.received {
                "received, no reply yet"
            } else {
                "waiting for the workflow"
            };
            t.row(vec![
                format!("  {}", r.id),
                r.name.clone(),
                r.key.clone().unwrap_or_default(),
                state.to_owned(),
            ]);
        }
        out.push_str(&t.to_string());
    }
}

/// What `workflow rekey` did, for people: the totals, then a line per kind of payload.
pub fn rekey_text(done: &crate::ops::Rekeyed) -> String {
    let mut out = format!(
        "rewritten {} payloads in {} rows under key {}; {} already current\n",
        done.rewritten, done.rows, done.key, done.already_current
    );
    let mut t = Table::new(["KIND", "REWRITTEN", "ALREADY CURRENT"]);
    for (kind, rewritten, current) in &done.kinds {
        t.row(vec![
            kind.clone(),
            rewritten.to_string(),
            current.to_string(),
        ]);
    }
    if !t.is_empty() {
        out.push_str(&t.to_string());
    }
    if done.changed > 0 {
        out.push_str(&format!(
            "{} rows changed under a live worker meanwhile and were left as it wrote them: \
             run `workflow rekey` again\n",
            done.changed
        ));
    }
    if done.stopped_early {
        out.push_str("stopped at --limit: run `workflow rekey` again to go on\n");
    }
    out
}
