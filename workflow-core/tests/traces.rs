//! OpenTelemetry traces of runs (feature `otel`): every step attempt's span is a
//! child of the span that started the run, in one trace, whatever process runs it and after
//! any crash; replayed steps open no span.
//!
//! In process, on every store: an in-memory exporter collects the spans of a run that waits,
//! is evicted and is replayed. Across processes, on SQLite and PostgreSQL: this binary
//! re-executes itself as worker processes (`child_main`), each writing the spans it finished
//! to one file as JSON lines; the first is SIGKILLed in the middle of the run, the second
//! takes the run over and finishes it.

mod common;

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use common::{available, log_execution, read_log, Backend, Place, TestDb, Worker};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData, SpanExporter};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use workflow_core::prelude::*;

/// A finished span as the tests read it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Seen {
    pid: u32,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attrs: BTreeMap<String, String>,
}

impl Seen {
    fn of(span: &SpanData) -> Seen {
        Seen {
            pid: std::process::id(),
            name: span.name.to_string(),
            trace_id: format!("{:032x}", span.span_context.trace_id()),
            span_id: format!("{:016x}", span.span_context.span_id()),
            parent_span_id: format!("{:016x}", span.parent_span_id),
            attrs: span
                .attributes
                .iter()
                .map(|kv| (kv.key.to_string(), kv.value.as_str().into_owned()))
                .collect(),
        }
    }

    fn attr(&self, key: &str) -> &str {
        self.attrs.get(key).map(String::as_str).unwrap_or("")
    }
}

/// Installs, once per process, a `tracing` subscriber whose OpenTelemetry layer exports every
/// finished span at once to `exporter`.
fn install<E: SpanExporter + 'static>(exporter: E) {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter)
        .build();
    let tracer = provider.tracer("workflow-traces-test");
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
}

// ---------------------------------------------------------------------------------------------
// In process, every store

/// Failures left for [`tr_flaky`] before it succeeds, per run input.
static FLAKY: AtomicU32 = AtomicU32::new(0);

#[step]
async fn tr_add(n: u32) -> Result<u32> {
    Ok(n + 1)
}

#[step(max_retries = 3)]
async fn tr_flaky(n: u32) -> Result<u32> {
    if FLAKY
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
        .is_ok()
    {
        return Err(Error::retryable("not yet"));
    }
    Ok(n * 10)
}

/// Two steps (the second fails once), a wait for a message during which the run is evicted,
/// then a step after its replay.
#[workflow]
async fn tr_flow(n: u32) -> Result<u32> {
    let a = tr_add(n).await?;
    let b = tr_flaky(a).await?;
    let go = recv::<u32>("go").await?;
    tr_add(b + go).await
}

fn memory_exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        install(exporter.clone());
        exporter
    })
}

/// The finished spans of trace `trace_id`.
fn spans_of(trace_id: &str) -> Vec<Seen> {
    memory_exporter()
        .get_finished_spans()
        .unwrap()
        .iter()
        .map(Seen::of)
        .filter(|s| s.trace_id == trace_id)
        .collect()
}

async fn in_process(backend: Backend) {
    memory_exporter();
    let db = TestDb::new(backend);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Duration::from_millis(10))
        .evict_after(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    // Only this run's flaky step fails once: the stores' tests run one after another here.
    FLAKY.store(1, Ordering::SeqCst);
    let request = tracing::info_span!("request", store = ?backend);
    let run = rt
        .start(tr_flow, (1,))
        .into_future()
        .instrument(request.clone())
        .await
        .unwrap();
    drop(request);
    // Waiting for the message: the run is evicted, and replayed when it arrives.
    common::until_no_active_runs(&rt, "the waiting run is evicted").await;
    run.send("go", 5u32).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(30), run.return_value())
        .await
        .expect("the run ends")
        .unwrap();
    assert_eq!(out, 26, "((1 + 1) * 10 + 5) + 1");

    let record = run.info().await.unwrap();
    let stored = record.trace_context.expect("the start's context is kept");
    let trace_id = stored.trace_id().unwrap().to_owned();
    let id = run.id().to_string();
    // Spans are exported as they end; the last attempt's may trail the run's end a little.
    let mut spans = Vec::new();
    for _ in 0..500 {
        spans = spans_of(&trace_id);
        if spans.iter().filter(|s| s.name == "step").count() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let request = spans
        .iter()
        .find(|s| s.name == "request")
        .expect("the caller's span is in the trace");
    let start = spans
        .iter()
        .find(|s| s.name == "workflow.start")
        .unwrap_or_else(|| panic!("{backend:?}: no start span in {spans:#?}"));
    assert_eq!(start.parent_span_id, request.span_id, "the caller's child");
    assert_eq!(start.attr("workflow.run_id"), id);
    assert_eq!(
        stored.traceparent,
        format!("00-{}-{}-01", start.trace_id, start.span_id),
        "the run keeps the start span's context"
    );
    let steps: Vec<&Seen> = spans.iter().filter(|s| s.name == "step").collect();
    let seen: Vec<(String, &str, &str)> = steps
        .iter()
        .map(|s| {
            assert_eq!(s.parent_span_id, start.span_id, "{backend:?}: {s:?}");
            assert_eq!(s.attr("workflow.run_id"), id, "{s:?}");
            assert!(s.attr("workflow.name").ends_with("::tr_flow"), "{s:?}");
            assert!(s.attr("step.id").starts_with("stp_"), "{s:?}");
            let name = s.attr("step.name").rsplit("::").next().unwrap().to_owned();
            (name, s.attr("step.attempt"), s.attr("step.outcome"))
        })
        .collect();
    let mut seen = seen;
    seen.sort();
    assert_eq!(
        seen,
        [
            ("tr_add".to_owned(), "1", "ok"),
            ("tr_add".to_owned(), "1", "ok"),
            ("tr_flaky".to_owned(), "1", "error"),
            ("tr_flaky".to_owned(), "2", "ok"),
        ],
        "{backend:?}: one span per attempt, none for the steps replayed after the eviction"
    );
    let ids: std::collections::BTreeSet<&str> = steps.iter().map(|s| s.attr("step.id")).collect();
    assert_eq!(ids.len(), 3, "three steps, the flaky one tried twice");
    rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_spans_are_children_of_the_start_on_every_store() {
    for backend in [Backend::Memory, Backend::Sqlite, Backend::Postgres] {
        if available(backend) {
            tokio::time::timeout(Duration::from_secs(120), in_process(backend))
                .await
                .unwrap_or_else(|_| panic!("{backend:?} took over 120 s"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Across processes

/// Appends each finished span to the file `WF_SPANS` names, one JSON line each, at once.
#[derive(Debug)]
struct FileExporter(std::path::PathBuf);

impl SpanExporter for FileExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut text = String::new();
        for span in &batch {
            text.push_str(&serde_json::to_string(&Seen::of(span)).unwrap());
            text.push('\n');
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.0)
            .expect("open the spans file");
        f.write_all(text.as_bytes()).expect("write the spans file");
        Ok(())
    }
}

#[step]
async fn tr_step(n: u32) -> Result<u32> {
    log_execution(&format!("step-{n}"));
    Ok(n)
}

/// Hangs in the first process (`WF_HANG`), which is killed meanwhile.
#[step]
async fn tr_hang(n: u32) -> Result<u32> {
    log_execution("hang");
    if std::env::var("WF_HANG").is_ok() {
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
    Ok(n)
}

#[workflow]
async fn tr_crash(n: u32) -> Result<u32> {
    let a = tr_step(n).await?;
    let b = tr_step(n + 1).await?;
    let c = tr_hang(n + 2).await?;
    let d = tr_step(n + 3).await?;
    Ok(a + b + c + d)
}

const LEASE: Duration = Duration::from_millis(500);

/// The worker process. `WF_MODE` is `start` (start a run inside a `request` span and drive
/// it) or `finish:<run id>` (drive whatever is due and print `DONE` when the run ended).
#[test]
#[ignore = "entry point of the worker processes the cross-process test spawns"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    install(FileExporter(std::env::var("WF_SPANS").unwrap().into()));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let worker = Place::from_env()
            .builder()
            .lease(LEASE)
            .poll_interval(Duration::from_millis(20))
            .retry_backoff(Duration::from_millis(10))
            .build()
            .await
            .expect("worker runtime");
        let mode = std::env::var("WF_MODE").unwrap();
        let id = match mode.split_once(':') {
            None => {
                let run = worker
                    .start(tr_crash, (1,))
                    .into_future()
                    .instrument(tracing::info_span!("request"))
                    .await
                    .unwrap();
                println!("RUN {}", run.id());
                std::io::stdout().flush().unwrap();
                std::future::pending::<()>().await;
                unreachable!()
            }
            Some((_, id)) => id.parse::<RunId>().unwrap(),
        };
        let out = tokio::time::timeout(
            Duration::from_secs(50),
            worker.get_run(&id).typed::<u32>().return_value(),
        )
        .await;
        println!("DONE {out:?}");
        std::io::stdout().flush().unwrap();
        std::future::pending::<()>().await;
    });
}

fn spawn(place: &Place, mode: &str, spans: &Path, log: &Path, hang: bool) -> Worker {
    let mut env: Vec<(&str, String)> = place.env();
    env.push(("WF_MODE", mode.to_owned()));
    env.push(("WF_SPANS", spans.to_str().unwrap().to_owned()));
    env.push(("WF_LOG", log.to_str().unwrap().to_owned()));
    if hang {
        env.push(("WF_HANG", "1".to_owned()));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Worker::spawn(&env)
}

fn read_spans(path: &Path) -> Vec<Seen> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("a span line"))
        .collect()
}

/// Polls `f` every 10 ms until it holds, for at most 30 s.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn across_processes(place: Place) {
    let dir = tempfile::tempdir().unwrap();
    let (spans, log) = (dir.path().join("spans.jsonl"), dir.path().join("steps.log"));
    let first = spawn(&place, "start", &spans, &log, true);
    let id = first.line("RUN ", Duration::from_secs(30));
    until("the first process runs the hanging step", || {
        read_log(&log)
            .iter()
            .any(|(_, _, label, _)| label == "hang")
    });
    until("the first process exported its two attempts", || {
        read_spans(&spans)
            .iter()
            .filter(|s| s.name == "step" && s.attr("workflow.run_id") == id)
            .count()
            == 2
    });
    let first_pid = first.pid();
    first.kill();

    let second = spawn(&place, &format!("finish:{id}"), &spans, &log, false);
    let done = second.line("DONE ", Duration::from_secs(60));
    assert!(done.contains("Ok(10)"), "1 + 2 + 3 + 4: {done}");
    let second_pid = second.pid();
    // Each span is written as it ends; the last attempt's may trail the run's end a little.
    until("the second process exported its two attempts", || {
        read_spans(&spans)
            .iter()
            .filter(|s| s.name == "step" && s.pid == second_pid)
            .count()
            == 2
    });
    second.kill();

    let all = read_spans(&spans);
    let start = all
        .iter()
        .find(|s| s.name == "workflow.start" && s.attr("workflow.run_id") == id)
        .unwrap_or_else(|| panic!("{}: no start span in {all:#?}", place.name()));
    assert_eq!(start.pid, first_pid);
    let request = all
        .iter()
        .find(|s| s.name == "request" && s.pid == first_pid)
        .expect("the caller's span");
    assert_eq!(start.parent_span_id, request.span_id);
    assert_eq!(start.trace_id, request.trace_id);
    let mut attempts: Vec<(u32, String, String)> = all
        .iter()
        .filter(|s| s.name == "step" && s.attr("workflow.run_id") == id)
        .map(|s| {
            assert_eq!(
                s.trace_id,
                start.trace_id,
                "{}: one trace: {s:?}",
                place.name()
            );
            assert_eq!(s.parent_span_id, start.span_id, "the start's child: {s:?}");
            let step = s.attr("step.name").rsplit("::").next().unwrap().to_owned();
            let label = format!("{step}#{}", s.attr("step.attempt"));
            (s.pid, label, s.attr("step.outcome").to_owned())
        })
        .collect();
    attempts.sort();
    let mut want = vec![
        (first_pid, "tr_step#1".to_owned(), "ok".to_owned()),
        (first_pid, "tr_step#1".to_owned(), "ok".to_owned()),
        // The attempt the kill cut short counts: the next one is the second.
        (second_pid, "tr_hang#2".to_owned(), "ok".to_owned()),
        (second_pid, "tr_step#1".to_owned(), "ok".to_owned()),
    ];
    want.sort();
    assert_eq!(
        attempts,
        want,
        "{}: the two steps the second process replayed have no span",
        place.name()
    );
    println!(
        "traces across processes on {}: {} attempt spans in trace {}, all children of the start",
        place.name(),
        attempts.len(),
        start.trace_id
    );
}

#[cfg(feature = "sqlite")]
#[test]
fn attempts_in_two_processes_share_the_start_s_trace_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    across_processes(Place::Sqlite {
        path: dir.path().join("wf.db"),
    });
}

#[cfg(feature = "postgres")]
#[test]
fn attempts_in_two_processes_share_the_start_s_trace_on_postgres() {
    use workflow_core::store::postgres::PostgresStore;

    let Some(url) = common::postgres_url() else {
        return;
    };
    let schema = common::fresh_schema();
    let rt = tokio::runtime::Runtime::new().unwrap();
    if !rt.block_on(common::postgres_reachable(&url, &schema)) {
        return;
    }
    across_processes(Place::Postgres {
        url: url.clone(),
        schema: schema.clone(),
    });
    rt.block_on(async {
        if let Ok(s) = PostgresStore::connect(&url, &schema).await {
            let _ = s.drop_schema().await;
        }
    });
}
