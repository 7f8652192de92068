//! What the commands and the dashboard do, on a client-only runtime: list, show, cancel,
//! resume, retry, fork, export and prune. Both front ends call these, so a run looks the same in a terminal and a
//! browser.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;
use workflow_core::store::{CancelOutcome, HookFilter, RunFilter};
use workflow_core::{ExportedHistory, HookError, RunId, RunStatus, Runtime};

pub use crate::error::not_found;
use crate::error::CliError;
use crate::view::{
    positions, ChunkView, EventView, HookSummary, OpenRequest, QueueView, QueuedRun, RunDetail,
    RunSummary, StreamView,
};

/// The time on the store's clock (on PostgreSQL the server's, which the workers time their
/// runs by), so that a wrong clock here neither misdates a cancellation nor misstates how long
/// ago something happened.
pub async fn store_now(rt: &Runtime) -> Result<SystemTime, CliError> {
    Ok(rt.store().now().await?.unwrap_or_else(SystemTime::now))
}

/// A run id typed by a person.
pub fn parse_run_id(s: &str) -> Result<RunId, CliError> {
    s.trim()
        .parse()
        .map_err(|e| CliError::Usage(format!("invalid run id: {e}")))
}

/// A status name from the dashboard's query string.
pub fn parse_status(s: &str) -> Result<RunStatus, CliError> {
    RunStatus::parse(s).ok_or_else(|| {
        CliError::Usage(format!(
            "unknown status `{s}` (expected pending, running, blocked, completed, failed, \
             cancelled or continued_as_new)"
        ))
    })
}

/// A hook payload typed by a person: JSON, or a clear error pointing at the mistake.
pub fn parse_payload(s: &str) -> Result<Value, CliError> {
    if s.trim().is_empty() {
        return Err(CliError::Usage(
            "empty payload: a payload is JSON, e.g. {\"approved\": true}, \"text\" or null"
                .to_owned(),
        ));
    }
    serde_json::from_str(s).map_err(|e| {
        CliError::Usage(format!(
            "malformed JSON payload: {e} (in `{}`); a payload is JSON, e.g. \
             {{\"approved\": true}}, \"text\" (with the quotes) or null",
            crate::text::cut(s, 60)
        ))
    })
}

/// `--older-than`: an age as typed, and how long it is.
#[derive(Debug, Clone)]
pub struct Age {
    /// As typed (trimmed), to say it back.
    pub text: String,
    /// Its length.
    pub duration: Duration,
}

/// An age typed by a person (clap's value parser of `--older-than`), in the grammar of
/// `#[step(timeout = "..")]`: jiff's friendly durations (`30d`, `12h`, `90m`, `45s`, `1h30m`,
/// `2 weeks`) or ISO 8601 (`P30D`). Days and weeks are 24 hours and 7 days; months and years,
/// whose length depends on the date, are refused, as are negative ages.
pub fn parse_age(s: &str) -> Result<Age, String> {
    let invalid = |why: &str| {
        format!(
            "invalid age `{s}`: {why}; give a number and a unit, e.g. 30d, 12h, 90m, 45s or 1h30m"
        )
    };
    let text = s.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid("the unit is missing"));
    }
    let span: jiff::Span = text.parse().map_err(|e: jiff::Error| {
        let e = e.to_string();
        // jiff's reason without its preamble, which names a format the user did not choose.
        invalid(
            e.split_once("duration format: ")
                .map_or(&*e, |(_, why)| why),
        )
    })?;
    if span.is_negative() {
        return Err(invalid("an age cannot be negative"));
    }
    if span.get_years() != 0 || span.get_months() != 0 {
        return Err(invalid(
            "months and years have no fixed length; use days (30d) or weeks",
        ));
    }
    span.to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .ok()
        .and_then(|d| Duration::try_from(d).ok())
        .map(|duration| Age {
            text: text.to_owned(),
            duration,
        })
        .ok_or_else(|| invalid("too large"))
}

/// The runs `filter` lists, every payload opened with the keys given (`--keys`) or shown as
/// `encrypted (key <id>)`.
async fn runs(rt: &Runtime, filter: RunFilter) -> Result<Vec<workflow_core::RunRecord>, CliError> {
    let runs = rt.runs(filter).await?;
    Ok(runs.into_iter().map(|r| rt.reveal_record(r)).collect())
}

pub async fn list_runs(rt: &Runtime, filter: &RunFilter) -> Result<Vec<RunSummary>, CliError> {
    let runs = runs(rt, filter.clone()).await?;
    Ok(runs.into_iter().map(RunSummary::new).collect())
}

/// Every declared queue with its limits and occupancy.
pub async fn list_queues(rt: &Runtime) -> Result<Vec<QueueView>, CliError> {
    let queues = rt.queues().await?;
    Ok(queues.into_iter().map(QueueView::new).collect())
}

/// Queue `name` (its limits and occupancy) and its runs matching `filter`, the waiting ones
/// numbered in the order they begin. Positions count every waiting run of the queue, even
/// those beyond `filter`'s limit or status.
pub async fn queue_runs(
    rt: &Runtime,
    name: &str,
    filter: &RunFilter,
) -> Result<(QueueView, Vec<QueuedRun>), CliError> {
    let queue = list_queues(rt)
        .await?
        .into_iter()
        .find(|q| q.name == name)
        .ok_or_else(|| CliError::NotFound(format!("no queue {name:?} is declared")))?;
    let waiting = runs(
        rt,
        RunFilter::new()
            .queue(name)
            .status(RunStatus::Pending)
            .limit(usize::try_from(queue.waiting).unwrap_or(usize::MAX).max(1)),
    )
    .await?;
    let numbered = positions(waiting.into_iter().map(RunSummary::new).collect());
    let runs = runs(rt, filter.clone()).await?;
    let runs = runs
        .into_iter()
        .map(|r| {
            let position = numbered
                .iter()
                .find(|n| n.run.id == r.id)
                .and_then(|n| n.position);
            QueuedRun {
                run: RunSummary::new(r),
                position,
            }
        })
        .collect();
    Ok((queue, runs))
}

pub async fn run_detail(rt: &Runtime, id: RunId) -> Result<RunDetail, CliError> {
    Ok(run_with_events(rt, id).await?.0)
}

/// The run's view and its history, from one read of each.
pub async fn run_with_events(
    rt: &Runtime,
    id: RunId,
) -> Result<(RunDetail, Vec<EventView>), CliError> {
    let stored = rt.get_run(&id).info().await?;
    let store = rt.store();
    let mut events = store.events(&id).await?;
    rt.reveal_history(&stored, &mut events);
    let run = rt.reveal_record(stored);
    let hooks = rt.hooks(&HookFilter::new().run_id(id)).await?;
    let children = runs(rt, RunFilter::new().parent(id).limit(10_000)).await?;
    let mut detail =
        RunDetail::new(run, &events, &hooks, store_now(rt).await?).with_children(&children);
    detail.streams = streams(rt, id).await?;
    detail.published = published(rt, id).await?;
    detail.waiting_messages = store
        .payloads(&id, 0)
        .await?
        .into_iter()
        .filter_map(|e| match e.what {
            workflow_core::store::Inbound::Message { topic, payload } => {
                Some((e.id, topic, payload))
            }
            _ => None,
        })
        .collect();
    let received: std::collections::HashSet<u64> = events
        .iter()
        .filter_map(|e| match &e.event {
            workflow_core::store::Event::RequestReceived { payload_id, .. } => Some(*payload_id),
            _ => None,
        })
        .collect();
    detail.open_requests = store
        .run_requests(&id)
        .await?
        .into_iter()
        .filter(|r| !r.replied)
        .map(|r| OpenRequest {
            received: received.contains(&r.id),
            id: r.id,
            name: r.name,
            key: r.idempotency_key,
        })
        .collect();
    Ok((detail, events.into_iter().map(EventView::new).collect()))
}

/// The run's streams, each with its last [`StreamView::RECENT`] chunks.
pub async fn streams(rt: &Runtime, id: RunId) -> Result<Vec<StreamView>, CliError> {
    let store = rt.store();
    let mut views = Vec::new();
    for s in rt.get_run(&id).streams().await? {
        let from = s.len.saturating_sub(StreamView::RECENT);
        let page = store
            .read_stream(&id, &s.name, from, StreamView::RECENT as usize)
            .await?;
        views.push(StreamView {
            recent: page
                .chunks
                .into_iter()
                .map(|c| chunk_view(rt, id, &s.name, c))
                .collect(),
            name: s.name,
            chunks: s.len,
            closed: s.closed,
        });
    }
    Ok(views)
}

fn chunk_view(
    rt: &Runtime,
    run: RunId,
    stream: &str,
    mut c: workflow_core::store::StoredChunk,
) -> ChunkView {
    rt.reveal_chunk(run, stream, &mut c.value);
    ChunkView {
        index: c.index,
        attempt: c.attempt,
        value: c.value,
    }
}

/// Chunks read at a time by [`chunks`].
const CHUNK_PAGE: usize = 500;

/// The chunks of the run's stream `name` from index `from` on, at most `limit`, as they are
/// now (no waiting for more).
pub async fn chunks(
    rt: &Runtime,
    id: RunId,
    name: &str,
    from: u64,
    limit: usize,
) -> Result<Vec<ChunkView>, CliError> {
    let store = rt.store();
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let want = CHUNK_PAGE.min(limit - out.len());
        let page = store.read_stream(&id, name, next, want).await?;
        if page.run.is_none() {
            return Err(not_found(id));
        }
        let got = page.chunks.len();
        if let Some(last) = page.chunks.last() {
            next = last.index + 1;
        }
        out.extend(page.chunks.into_iter().map(|c| chunk_view(rt, id, name, c)));
        if got < want || out.len() >= limit {
            return Ok(out);
        }
    }
}

/// Follows the run's stream `name` from index `from`, handing each chunk to `each` as it is
/// written, until the stream is closed or the run ends (or `each` says stop).
pub async fn follow(
    rt: &Runtime,
    id: RunId,
    name: &str,
    from: u64,
    mut each: impl FnMut(ChunkView) -> bool,
) -> Result<(), CliError> {
    use futures::StreamExt as _;
    let run = rt.get_run(&id);
    run.info().await?;
    let mut chunks = run.stream::<Value>(name).from(from);
    while let Some(c) = chunks.next().await {
        let c = c.map_err(|e| CliError::Database(e.to_string()))?;
        let view = ChunkView {
            index: c.index,
            attempt: c.attempt,
            value: c.value,
        };
        if !each(view) {
            break;
        }
    }
    Ok(())
}

pub async fn events(rt: &Runtime, id: RunId) -> Result<Vec<EventView>, CliError> {
    // An unknown run has no history either; say which it is.
    let run = rt.get_run(&id).info().await?;
    let mut events = rt.store().events(&id).await?;
    rt.reveal_history(&run, &mut events);
    Ok(events.into_iter().map(EventView::new).collect())
}

pub async fn list_hooks(rt: &Runtime, filter: &HookFilter) -> Result<Vec<HookSummary>, CliError> {
    let hooks = rt.hooks(filter).await?;
    Ok(hooks.into_iter().map(HookSummary::from).collect())
}

/// What `cancel` did.
#[derive(Debug, Clone, Serialize)]
pub struct Cancelled {
    pub run_id: RunId,
    /// False when the run had already ended.
    pub cancelled: bool,
    /// The run's status now.
    pub status: RunStatus,
}

pub async fn cancel(rt: &Runtime, id: RunId) -> Result<Cancelled, CliError> {
    // The store's answer says whether this call ended the run or it had ended before.
    let outcome = rt.store().cancel(&id, store_now(rt).await?).await?;
    Ok(match outcome {
        CancelOutcome::Cancelled => Cancelled {
            run_id: id,
            cancelled: true,
            status: RunStatus::Cancelled,
        },
        CancelOutcome::AlreadyEnded(status) => Cancelled {
            run_id: id,
            cancelled: false,
            status,
        },
    })
}

/// Where `send` delivered a message.
#[derive(Debug, Clone, Serialize)]
pub struct Sent {
    pub run_id: RunId,
    pub topic: String,
}

/// `run.send(topic, payload)`, with an idempotency key if given.
pub async fn send(
    rt: &Runtime,
    id: RunId,
    topic: &str,
    payload: Value,
    key: Option<String>,
) -> Result<Sent, CliError> {
    let mut send = rt.get_run(&id).send(topic, payload);
    if let Some(k) = key {
        send = send.idempotency_key(k);
    }
    match send.await {
        Ok(()) => Ok(Sent {
            run_id: id,
            topic: topic.to_owned(),
        }),
        Err(workflow_core::RunError::InvalidMessage(why)) => Err(CliError::Usage(why)),
        Err(e) => Err(e.into()),
    }
}

/// The latest value of each key the run published (`set_event`).
pub async fn published(
    rt: &Runtime,
    id: RunId,
) -> Result<std::collections::BTreeMap<String, Value>, CliError> {
    Ok(rt.get_run(&id).events().await?)
}

/// Where `resume` delivered a payload.
#[derive(Debug, Clone, Serialize)]
pub struct Resumed {
    pub token: String,
    pub run_id: RunId,
}

pub async fn resume(rt: &Runtime, token: &str, payload: Value) -> Result<Resumed, CliError> {
    match rt.resume_hook(token, payload).await {
        Ok(h) => Ok(Resumed {
            token: h.token,
            run_id: h.run_id,
        }),
        Err(HookError::NotFound(e)) => Err(CliError::NotFound(format!(
            "{e}: the run has not created that hook yet, released it, or ended \
             (`workflow hooks` lists the open ones)"
        ))),
        Err(HookError::InvalidToken(why)) => {
            Err(CliError::Usage(format!("invalid hook token: {why}")))
        }
        Err(HookError::Store(e)) => Err(e.into()),
        Err(e) => Err(CliError::Other(e.to_string())),
    }
}

/// What `prune` deleted.
#[derive(Debug, Clone, Serialize)]
pub struct Pruned {
    pub runs: u64,
    pub events: u64,
}

pub async fn prune(rt: &Runtime, older_than: Duration) -> Result<Pruned, CliError> {
    let stats = rt.prune(older_than).await?;
    Ok(Pruned {
        runs: stats.runs,
        events: stats.events,
    })
}

/// What `rekey` did, per kind of payload.
#[derive(Debug, Clone, Serialize)]
pub struct Rekeyed {
    /// The current key's id, which every rewritten payload is now sealed with.
    pub key: String,
    /// Payloads sealed again under it.
    pub rewritten: u64,
    /// Payloads already under it.
    pub already_current: u64,
    /// Rows written back.
    pub rows: u64,
    /// Rows a live worker changed meanwhile, left for a rerun.
    pub changed: u64,
    /// Whether it stopped at --limit before the end.
    pub stopped_early: bool,
    /// By kind: (kind, rewritten, already current).
    pub kinds: Vec<(String, u64, u64)>,
}

/// Seals every payload under an old key again under the current one (`workflow rekey`).
pub async fn rekey(
    rt: &Runtime,
    batch: Option<usize>,
    limit: Option<u64>,
) -> Result<Rekeyed, CliError> {
    let mut options = workflow_core::RekeyOptions::new();
    if let Some(b) = batch {
        options = options.batch(b);
    }
    if let Some(l) = limit {
        options = options.limit(l);
    }
    let report = rt.rekey(options).await?;
    Ok(Rekeyed {
        rewritten: report.rewritten(),
        already_current: report.current(),
        rows: report.rows_rewritten,
        changed: report.changed,
        stopped_early: report.stopped_early,
        kinds: report
            .kinds
            .iter()
            .map(|(k, c)| ((*k).to_owned(), c.rewritten, c.current))
            .collect(),
        key: report.key,
    })
}

/// What `retry` did.
#[derive(Debug, Clone, Serialize)]
pub struct Retried {
    pub run_id: RunId,
    /// The status the run was retried from: `blocked` (handed to a worker now) or `failed`
    /// (re-opened).
    pub was: RunStatus,
}

pub async fn retry(rt: &Runtime, id: RunId) -> Result<Retried, CliError> {
    let run = rt.get_run(&id);
    // Read first only to say what happened; the store decides atomically whether it may.
    let was = run.status().await?;
    run.retry().await?;
    Ok(Retried { run_id: id, was })
}

/// What `fork` created.
#[derive(Debug, Clone, Serialize)]
pub struct Forked {
    pub run_id: RunId,
    pub forked_from: RunId,
    pub from_step: usize,
}

pub async fn fork(rt: &Runtime, id: RunId, from_step: usize) -> Result<Forked, CliError> {
    let new = rt.get_run(&id).fork(from_step).await?;
    Ok(Forked {
        run_id: new.id(),
        forked_from: id,
        from_step,
    })
}

/// The run's history as the versioned JSON `workflow_core::testing::replay` reads, typed so
/// that it prints in the documented field order (`format` and `version` first; a `Value`'s
/// keys would come out sorted, with the events first).
/// Payloads stay encrypted as stored unless `decrypt` (`--decrypt`, with `--keys`).
pub async fn export(rt: &Runtime, id: RunId, decrypt: bool) -> Result<ExportedHistory, CliError> {
    let run = rt.get_run(&id);
    let v = if decrypt {
        run.export_decrypted().await?
    } else {
        run.export().await?
    };
    serde_json::from_value(v)
        .map_err(|e| CliError::Other(format!("cannot read the exported history: {e}")))
}
