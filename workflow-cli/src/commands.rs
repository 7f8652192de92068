//! One function per command: each runs its command on the opened store and returns what to
//! print on standard output, a table (or a line) for people or JSON for scripts (`--json`).
//! The arguments were checked before the store was opened (`cli::execute`).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;
use workflow_core::store::{HookFilter, RunFilter};
use workflow_core::{RunStatus, Runtime};

use crate::args::{Command, StatusArg};
use crate::connect::Target;
use crate::error::CliError;
use crate::ops;
use crate::show;
use crate::text::{self, Table};
use crate::view::{ChunkView, Time};

/// Runs `command` on `rt`. `payload` is the parsed payload of `resume` and `send`, read before
/// the store was opened.
pub async fn dispatch(
    rt: Runtime,
    target: &Target,
    command: Command,
    json: bool,
    payload: Option<Value>,
) -> Result<String, CliError> {
    match command {
        Command::Runs {
            status,
            workflow,
            queue,
            version,
            limit,
            after,
        } => {
            let filter = RunsFilter {
                status,
                workflow,
                version,
                limit,
                after,
            };
            runs(&rt, filter, queue, json).await
        }
        Command::Queues => queues(&rt, json).await,
        Command::Schedules => schedules(&rt, json).await,
        Command::Schedule { name, action } => {
            crate::schedules::command(&rt, &name, action, json).await
        }
        Command::Run { id } => run(&rt, &id, json).await,
        Command::Events {
            run_id,
            published: true,
        } => published(&rt, &run_id, json).await,
        Command::Events { run_id, .. } => events(&rt, &run_id, json).await,
        Command::Hooks { token, run, limit } => hooks(&rt, token, run, limit, json).await,
        Command::Cancel { run_id } => cancel(&rt, &run_id, json).await,
        Command::Retry { run_id } => retry(&rt, &run_id, json).await,
        Command::Fork { run_id, from_step } => fork(&rt, &run_id, from_step, json).await,
        Command::Export {
            run_id,
            output,
            decrypt,
        } => export(&rt, &run_id, output, decrypt, json).await,
        Command::Stream {
            run_id,
            name,
            from,
            follow,
        } => stream(&rt, &run_id, &name, from, follow, json).await,
        Command::Resume { token, .. } => {
            resume(&rt, &token, payload.unwrap_or_default(), json).await
        }
        Command::Send {
            run_id, topic, key, ..
        } => send(&rt, &run_id, &topic, payload.unwrap_or_default(), key, json).await,
        Command::Rekey { batch, limit } => rekey(&rt, batch, limit, json).await,
        Command::Prune { older_than } => prune(&rt, older_than, json).await,
        Command::Web {
            listen,
            port,
            token,
        } => {
            let addr = crate::args::web_address(listen, port, token.as_deref())?;
            crate::web::serve(rt, target.clone(), addr, token).await?;
            Ok(String::new())
        }
    }
}

/// The filters of `workflow runs` other than `--queue`.
struct RunsFilter {
    status: Option<StatusArg>,
    workflow: Option<String>,
    version: Option<String>,
    limit: usize,
    after: Option<String>,
}

impl RunsFilter {
    fn into_filter(self) -> Result<RunFilter, CliError> {
        let mut filter = RunFilter::new().limit(self.limit);
        if let Some(v) = self.version {
            filter = filter.version(v);
        }
        if let Some(id) = self.after {
            filter = filter.after(&ops::parse_run_id(&id)?);
        }
        if let Some(s) = self.status {
            filter = filter.status(s.into());
        }
        if let Some(w) = self.workflow {
            filter = filter.workflow(w);
        }
        Ok(filter)
    }
}

/// `workflow runs`: the runs, newest first; with `--queue`, the queue and its runs.
async fn runs(
    rt: &Runtime,
    filters: RunsFilter,
    queue: Option<String>,
    json: bool,
) -> Result<String, CliError> {
    let limit = filters.limit;
    let filter = filters.into_filter()?;
    if let Some(q) = queue {
        let (queue, runs) = ops::queue_runs(rt, &q, &filter.queue(&q)).await?;
        if json {
            return to_json(&serde_json::json!({"queue": queue, "runs": runs}));
        }
        return Ok(show::queue_table(&queue, &runs));
    }
    let runs = ops::list_runs(rt, &filter).await?;
    if json {
        return to_json(&runs);
    }
    if let (true, Some(last)) = (runs.len() >= limit, runs.last()) {
        // For people, beside the listing: stdout stays the runs alone (scripts page
        // with `--json` and the last id).
        eprintln!(
            "older runs: workflow runs --after {} (with the same filters)",
            last.id
        );
    }
    let now = Time(SystemTime::now());
    let mut t = Table::new([
        "RUN", "WORKFLOW", "STATUS", "CREATED", "DURATION", "VERSION",
    ]);
    for r in &runs {
        t.row(vec![
            r.id.to_string(),
            r.workflow.clone(),
            r.status_text(now),
            r.created_at.to_string(),
            r.duration_ms.map(text::duration_ms).unwrap_or_default(),
            r.version.clone().unwrap_or_default(),
        ]);
    }
    Ok(table_or(t, "no runs\n"))
}

/// `workflow queues`: the declared queues with their limits and occupancy.
async fn queues(rt: &Runtime, json: bool) -> Result<String, CliError> {
    let queues = ops::list_queues(rt).await?;
    if json {
        return to_json(&queues);
    }
    let mut t = Table::new(["QUEUE", "CONCURRENCY", "RATE LIMIT", "OCCUPIED", "WAITING"]);
    for q in &queues {
        t.row(vec![
            q.name.clone(),
            q.concurrency
                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
            q.rate_limit.map_or_else(
                || "-".to_owned(),
                |r| format!("{} per {}", r.runs, text::duration_ms(r.period_ms)),
            ),
            q.occupied.to_string(),
            q.waiting.to_string(),
        ]);
    }
    Ok(table_or(t, "no queues\n"))
}

/// `workflow schedules`: every schedule.
async fn schedules(rt: &Runtime, json: bool) -> Result<String, CliError> {
    let schedules = crate::schedules::list_schedules(rt).await?;
    if json {
        return to_json(&schedules);
    }
    Ok(crate::schedules::table(&schedules))
}

/// `workflow run ID`: one run in detail.
async fn run(rt: &Runtime, id: &str, json: bool) -> Result<String, CliError> {
    let detail = ops::run_detail(rt, ops::parse_run_id(id)?).await?;
    if json {
        return to_json(&detail);
    }
    Ok(show::run_text(&detail))
}

/// `workflow events ID --published`: the latest value of each key the run published.
async fn published(rt: &Runtime, run_id: &str, json: bool) -> Result<String, CliError> {
    let id = ops::parse_run_id(run_id)?;
    let values = ops::published(rt, id).await?;
    if json {
        return to_json(&values);
    }
    let mut t = Table::new(["KEY", "VALUE"]);
    for (key, value) in &values {
        t.row(vec![key.clone(), text::json_line(value, 120)]);
    }
    Ok(if t.is_empty() {
        format!("run {id} published no events\n")
    } else {
        t.to_string()
    })
}

/// `workflow events ID`: the run's event history.
async fn events(rt: &Runtime, run_id: &str, json: bool) -> Result<String, CliError> {
    let events = ops::events(rt, ops::parse_run_id(run_id)?).await?;
    if json {
        return to_json(&events);
    }
    let start = events.first().map(|e| e.at);
    let mut t = Table::new(["SEQ", "AT", "+", "EVENT", "DETAILS"]);
    for e in &events {
        t.row(vec![
            e.seq.to_string(),
            e.at.to_string(),
            start
                .map(|s| text::duration_ms(s.until(e.at)))
                .unwrap_or_default(),
            e.kind(),
            e.details(),
        ]);
    }
    Ok(table_or(t, "no events yet\n"))
}

/// `workflow hooks`: the open hooks.
async fn hooks(
    rt: &Runtime,
    token: Option<String>,
    run: Option<String>,
    limit: usize,
    json: bool,
) -> Result<String, CliError> {
    let mut filter = HookFilter::new().limit(limit);
    if let Some(t) = token {
        filter = filter.token(t);
    }
    if let Some(r) = run {
        filter = filter.run_id(ops::parse_run_id(&r)?);
    }
    let hooks = ops::list_hooks(rt, &filter).await?;
    if json {
        return to_json(&hooks);
    }
    let mut t = Table::new(["TOKEN", "RUN", "OPEN SINCE"]);
    for h in &hooks {
        t.row(vec![
            h.token.clone(),
            h.run_id.to_string(),
            h.created_at.to_string(),
        ]);
    }
    Ok(table_or(t, "no open hooks\n"))
}

/// `workflow cancel ID`.
async fn cancel(rt: &Runtime, run_id: &str, json: bool) -> Result<String, CliError> {
    let done = ops::cancel(rt, ops::parse_run_id(run_id)?).await?;
    if json {
        return to_json(&done);
    }
    Ok(if done.cancelled {
        format!("cancelled run {}\n", done.run_id)
    } else {
        format!(
            "run {} had already ended ({}); nothing changed\n",
            done.run_id, done.status
        )
    })
}

/// `workflow retry ID`.
async fn retry(rt: &Runtime, run_id: &str, json: bool) -> Result<String, CliError> {
    let done = ops::retry(rt, ops::parse_run_id(run_id)?).await?;
    if json {
        return to_json(&done);
    }
    Ok(if done.was == RunStatus::Failed {
        format!(
            "re-opened run {} (it had failed); its failed step gets a fresh set of \
             attempts\n",
            done.run_id
        )
    } else {
        format!(
            "retrying run {} (it was {}); a worker picks it up now\n",
            done.run_id, done.was
        )
    })
}

/// `workflow fork ID --from-step N`.
async fn fork(
    rt: &Runtime,
    run_id: &str,
    from_step: usize,
    json: bool,
) -> Result<String, CliError> {
    let done = ops::fork(rt, ops::parse_run_id(run_id)?, from_step).await?;
    if json {
        return to_json(&done);
    }
    // The id alone, so that `new=$(workflow fork ..)` works.
    Ok(format!("{}\n", done.run_id))
}

/// `workflow export ID`: the history as JSON, on standard output or into `--output`.
async fn export(
    rt: &Runtime,
    run_id: &str,
    output: Option<PathBuf>,
    decrypt: bool,
    json: bool,
) -> Result<String, CliError> {
    let id = ops::parse_run_id(run_id)?;
    let history = ops::export(rt, id, decrypt).await?;
    let Some(path) = output else {
        return to_json(&history);
    };
    let events = history.events.len();
    let mut bytes = serde_json::to_vec_pretty(&history)
        .map_err(|e| CliError::Other(format!("cannot encode the history: {e}")))?;
    bytes.push(b'\n');
    tokio::fs::write(&path, bytes)
        .await
        .map_err(|e| CliError::Other(format!("cannot write {}: {e}", path.display())))?;
    if json {
        return to_json(&serde_json::json!({
            "run_id": id,
            "path": path,
            "events": events,
        }));
    }
    Ok(format!(
        "wrote the history of run {id} ({events} {}) to {}\n",
        if events == 1 { "event" } else { "events" },
        path.display()
    ))
}

/// `workflow stream ID NAME`: the chunks written so far, or with `--follow` each chunk as it
/// comes, printed at once.
async fn stream(
    rt: &Runtime,
    run_id: &str,
    name: &str,
    from: u64,
    follow: bool,
    json: bool,
) -> Result<String, CliError> {
    let id = ops::parse_run_id(run_id)?;
    if !follow {
        let chunks = ops::chunks(rt, id, name, from, usize::MAX).await?;
        let mut out = String::new();
        for c in &chunks {
            out.push_str(&chunk_line(c, json)?);
        }
        return Ok(out);
    }
    // Printed as they come, each line on its own, not all at the end.
    let mut failed = None;
    ops::follow(rt, id, name, from, |c| {
        let line = match chunk_line(&c, json) {
            Ok(line) => line,
            Err(e) => {
                failed = Some(e);
                return false;
            }
        };
        let mut stdout = std::io::stdout().lock();
        let line = text::printable(&line, true);
        match stdout
            .write_all(line.as_bytes())
            .and_then(|()| stdout.flush())
        {
            Ok(()) => true,
            // `workflow stream .. --follow | head` closes the pipe: stop, quietly.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => false,
            Err(e) => {
                failed = Some(CliError::Other(format!("cannot write the output: {e}")));
                false
            }
        }
    })
    .await?;
    match failed {
        Some(e) => Err(e),
        None => Ok(String::new()),
    }
}

/// One chunk of a stream as `workflow stream` prints it: `index attempt value` for people, a
/// JSON object for scripts; one line either way.
fn chunk_line(c: &ChunkView, json: bool) -> Result<String, CliError> {
    if json {
        let mut line = serde_json::to_string(c)
            .map_err(|e| CliError::Other(format!("cannot encode the output as JSON: {e}")))?;
        line.push('\n');
        return Ok(line);
    }
    Ok(format!(
        "{}  attempt {}  {}\n",
        c.index,
        c.attempt,
        text::printable(&c.value.to_string(), false)
    ))
}

/// `workflow resume TOKEN PAYLOAD`.
async fn resume(rt: &Runtime, token: &str, payload: Value, json: bool) -> Result<String, CliError> {
    let done = ops::resume(rt, token, payload).await?;
    if json {
        return to_json(&done);
    }
    Ok(format!(
        "delivered to run {} (hook {:?})\n",
        done.run_id, done.token
    ))
}

/// `workflow send ID TOPIC PAYLOAD`.
async fn send(
    rt: &Runtime,
    run_id: &str,
    topic: &str,
    payload: Value,
    key: Option<String>,
    json: bool,
) -> Result<String, CliError> {
    let id = ops::parse_run_id(run_id)?;
    let done = ops::send(rt, id, topic, payload, key).await?;
    if json {
        return to_json(&done);
    }
    Ok(format!(
        "sent to run {} on topic {:?}\n",
        done.run_id, done.topic
    ))
}

/// `workflow rekey`.
async fn rekey(
    rt: &Runtime,
    batch: Option<usize>,
    limit: Option<u64>,
    json: bool,
) -> Result<String, CliError> {
    let done = ops::rekey(rt, batch, limit).await?;
    if json {
        return to_json(&done);
    }
    Ok(show::rekey_text(&done))
}

/// `workflow prune --older-than AGE`.
async fn prune(rt: &Runtime, older_than: ops::Age, json: bool) -> Result<String, CliError> {
    let done = ops::prune(rt, older_than.duration).await?;
    if json {
        return to_json(&done);
    }
    Ok(format!(
        "deleted {} {} and {} {} (ended more than {} ago)\n",
        done.runs,
        if done.runs == 1 { "run" } else { "runs" },
        done.events,
        if done.events == 1 { "event" } else { "events" },
        older_than.text,
    ))
}

/// The table, or `empty` when it has no rows.
fn table_or(t: Table, empty: &str) -> String {
    if t.is_empty() {
        empty.to_owned()
    } else {
        t.to_string()
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<String, CliError> {
    let mut s = serde_json::to_string_pretty(v)
        .map_err(|e| CliError::Other(format!("cannot encode the output as JSON: {e}")))?;
    s.push('\n');
    Ok(s)
}
