//! Flow control (SPEC 11) as a user sees it, on every store: a queue's concurrency counted in
//! the step bodies (a sleeping run keeps its slot), per-key order, priority order, the rate
//! window, unknown queues; and, with worker processes, three workers sharing one queue and a
//! worker killed holding a slot (SQLite, PostgreSQL).

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use common::{log_execution, read_log_timed, Backend, Place, TestDb, Worker};
use workflow_core::prelude::*;

/// Per test (a tag in the workflow's arguments, since the stores' tests run side by side):
/// runs between their `enter` and `leave` steps now, and the most at once.
fn gauges() -> &'static Mutex<HashMap<String, (i64, i64)>> {
    static G: OnceLock<Mutex<HashMap<String, (i64, i64)>>> = OnceLock::new();
    G.get_or_init(Default::default)
}

fn gauge(tag: &str, delta: i64) {
    let mut g = gauges().lock().unwrap();
    let (now, most) = g.entry(tag.to_owned()).or_default();
    *now += delta;
    *most = (*most).max(*now);
}

fn most_at_once(tag: &str) -> i64 {
    gauges().lock().unwrap().get(tag).map_or(0, |g| g.1)
}

/// What one step body marked, and when.
type Mark = (String, SystemTime);

/// Per test: what the step bodies marked, in order.
fn marks() -> &'static Mutex<HashMap<String, Vec<Mark>>> {
    static M: OnceLock<Mutex<HashMap<String, Vec<Mark>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

fn marked(tag: &str) -> Vec<Mark> {
    marks()
        .lock()
        .unwrap()
        .get(tag)
        .cloned()
        .unwrap_or_default()
}

#[step]
async fn enter(tag: String) -> Result<()> {
    gauge(&tag, 1);
    Ok(())
}

#[step]
async fn leave(tag: String) -> Result<()> {
    gauge(&tag, -1);
    Ok(())
}

#[step]
async fn mark(tag: String, what: String) -> Result<()> {
    let mut m = marks().lock().unwrap();
    m.entry(tag).or_default().push((what, SystemTime::now()));
    Ok(())
}

/// Counted from its first step to its last, with a durable sleep between: a sleeping run
/// still holds its slot.
#[workflow]
async fn held(tag: String, sleep_ms: u64) -> Result<()> {
    enter(tag.clone()).await?;
    sleep(Duration::from_millis(sleep_ms)).await;
    leave(tag).await
}

/// Marks `<label>+` and `<label>-` around a durable sleep.
#[workflow]
async fn bracketed(tag: String, label: String) -> Result<()> {
    mark(tag.clone(), format!("{label}+")).await?;
    sleep(Duration::from_millis(15)).await;
    mark(tag, format!("{label}-")).await
}

#[workflow]
async fn marks_once(tag: String, label: String) -> Result<()> {
    mark(tag, label).await
}

#[workflow]
async fn waits_for(token: String) -> Result<()> {
    create_hook::<()>(token).recv().await
}

#[workflow(queue = "nobody declared this")]
async fn in_an_undeclared_queue() -> Result<()> {
    Ok(())
}

fn tag(backend: Backend, test: &str) -> String {
    format!("{backend:?}-{test}-{}", RunId::new())
}

async fn runtime_with(db: &TestDb, queue: Queue) -> Runtime {
    db.builder()
        .queue(queue)
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Duration::from_millis(10))
        .build()
        .await
        .expect("runtime builds")
}

async fn in_flight_never_exceeds_the_concurrency(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime_with(&db, Queue::new("payments").concurrency(3)).await;
    let tag = tag(backend, "concurrency");
    let mut runs = Vec::new();
    for _ in 0..12 {
        let run = rt
            .start(held, (tag.clone(), 20))
            .queue("payments")
            .await
            .unwrap();
        runs.push(run);
    }
    for run in runs {
        run.return_value().await.unwrap();
    }
    let most = most_at_once(&tag);
    eprintln!("{backend:?}: at most {most} runs of 12 in flight at once (limit 3)");
    assert!(
        most <= 3,
        "{most} runs in flight at once, over the limit of 3"
    );
    assert!(most >= 1);
}

async fn per_key_order_equals_start_order(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime_with(&db, Queue::new("accounts").concurrency(10)).await;
    let tag = tag(backend, "keys");
    let mut runs = Vec::new();
    for i in 0..4 {
        for key in ["a", "b"] {
            let run = rt
                .start(bracketed, (tag.clone(), format!("{key}{i}")))
                .queue("accounts")
                .partition_key(key)
                .await
                .unwrap();
            runs.push(run);
        }
    }
    for run in runs {
        run.return_value().await.unwrap();
    }
    let marks: Vec<String> = marked(&tag).into_iter().map(|(m, _)| m).collect();
    for key in ["a", "b"] {
        let of_key: Vec<&String> = marks.iter().filter(|m| m.starts_with(key)).collect();
        let want: Vec<String> = (0..4)
            .flat_map(|i| [format!("{key}{i}+"), format!("{key}{i}-")])
            .collect();
        assert_eq!(
            of_key,
            want.iter().collect::<Vec<_>>(),
            "runs of key {key} one at a time, in start order; all marks: {marks:?}"
        );
    }
}

async fn priority_order_holds(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime_with(&db, Queue::new("one-at-a-time").concurrency(1)).await;
    let tag = tag(backend, "priority");
    // The blocker takes the only slot and waits for its hook: the others queue behind it.
    let token = format!("{tag}-blocker");
    let blocker = rt
        .start(waits_for, (token.clone(),))
        .queue("one-at-a-time")
        .await
        .unwrap();
    while rt.get_hook_by_token(&token).await.is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut runs = Vec::new();
    for (label, priority) in [("p0", 0), ("p5", 5), ("p1", 1), ("p5-later", 5), ("n1", -1)] {
        let run = rt
            .start(marks_once, (tag.clone(), label.to_owned()))
            .queue("one-at-a-time")
            .priority(priority)
            .await
            .unwrap();
        runs.push(run);
    }
    for run in &runs {
        assert_eq!(
            run.status().await.unwrap(),
            RunStatus::Pending,
            "waits for the slot"
        );
    }
    rt.resume_hook(&token, ()).await.unwrap();
    blocker.return_value().await.unwrap();
    for run in runs {
        run.return_value().await.unwrap();
    }
    let order: Vec<String> = marked(&tag).into_iter().map(|(m, _)| m).collect();
    assert_eq!(order, ["p5", "p5-later", "p1", "p0", "n1"]);
}

async fn the_rate_window_holds(backend: Backend) {
    const PERIOD: Duration = Duration::from_millis(400);
    let db = TestDb::new(backend);
    let rt = runtime_with(&db, Queue::new("api").rate_limit(3, PERIOD)).await;
    let tag = tag(backend, "rate");
    // No run can begin before it is started: the first window opens after this.
    let started = SystemTime::now();
    let mut runs = Vec::new();
    for i in 0..7 {
        let run = rt
            .start(marks_once, (tag.clone(), format!("r{i}")))
            .queue("api")
            .await
            .unwrap();
        runs.push(run);
    }
    for run in runs {
        run.return_value().await.unwrap();
    }
    let mut at: Vec<SystemTime> = marked(&tag).into_iter().map(|(_, t)| t).collect();
    at.sort();
    let after = |i: usize| at[i].duration_since(started).unwrap_or_default();
    eprintln!(
        "{backend:?}: steps at {:?} ms after the first start",
        (0..at.len())
            .map(|i| after(i).as_millis())
            .collect::<Vec<_>>()
    );
    // The 4th run began at least a period after the 1st, the 7th two periods after it (the
    // stores keep milliseconds: a begin may count from up to 1 ms earlier).
    let slack = Duration::from_millis(2);
    assert!(
        after(3) + slack >= PERIOD,
        "4th began {:?} after the start",
        after(3)
    );
    assert!(
        after(6) + slack >= PERIOD * 2,
        "7th began {:?} after the start",
        after(6)
    );
}

async fn an_unknown_queue_is_an_error_at_start(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime_with(&db, Queue::new("known")).await;
    let tag = tag(backend, "unknown");
    let err = rt
        .start(marks_once, (tag.clone(), "x".to_owned()))
        .queue("unknown")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StartError::UnknownQueue { queue } if queue == "unknown"),
        "{err}"
    );
    assert!(err.to_string().contains("Queue::new(\"unknown\")"), "{err}");
    let err = rt.start(in_an_undeclared_queue, ()).await.unwrap_err();
    assert!(matches!(err, StartError::UnknownQueue { .. }), "{err}");
    // `.queue(..)` replaces the workflow's queue.
    let run = rt
        .start(in_an_undeclared_queue, ())
        .queue("known")
        .await
        .unwrap();
    run.return_value().await.unwrap();
    assert_eq!(run.info().await.unwrap().queue.unwrap().name, "known");

    // A queue another runtime on the store declared is known here.
    let other = db
        .builder()
        .queue(Queue::new("declared elsewhere").concurrency(1))
        .worker(false)
        .build()
        .await
        .unwrap();
    drop(other);
    let run = rt
        .start(marks_once, (tag, "y".to_owned()))
        .queue("declared elsewhere")
        .await
        .unwrap();
    run.return_value().await.unwrap();

    // Invalid declarations fail the build.
    for bad in [
        Queue::new(""),
        Queue::new("q").concurrency(0),
        Queue::new("q").rate_limit(0, Duration::from_secs(1)),
        Queue::new("q").rate_limit(1, Duration::ZERO),
    ] {
        let err = db.builder().queue(bad).build().await.unwrap_err();
        assert!(
            matches!(err, workflow_core::BuildError::InvalidQueue { .. }),
            "{err}"
        );
    }
}

async fn a_waiting_run_times_out_without_taking_a_slot(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime_with(&db, Queue::new("single").concurrency(1)).await;
    let tag = tag(backend, "deadline");
    let token = format!("{tag}-holder");
    let holder = rt
        .start(waits_for, (token.clone(),))
        .queue("single")
        .await
        .unwrap();
    while rt.get_hook_by_token(&token).await.is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let late = rt
        .start(marks_once, (tag.clone(), "late".to_owned()))
        .queue("single")
        .timeout(Duration::from_millis(100))
        .await
        .unwrap();
    let err = late.return_value().await.unwrap_err();
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(marked(&tag).is_empty(), "the late run's step never ran");
    // The holder kept its slot all along.
    assert_eq!(holder.status().await.unwrap(), RunStatus::Running);
    rt.resume_hook(&token, ()).await.unwrap();
    holder.return_value().await.unwrap();
}

on_every_store!(
    a_waiting_run_times_out_without_taking_a_slot,
    in_flight_never_exceeds_the_concurrency,
    per_key_order_equals_start_order,
    priority_order_holds,
    the_rate_window_holds,
    an_unknown_queue_is_an_error_at_start,
);

// ---------------------------------------------------------------------------------------------
// Three worker processes, one queue

/// One run of the shared queue: logs `in` and `out` from steps of its own, with a pause
/// between, to the step log of the test (`WF_LOG`).
#[step]
async fn log_in(run: u64) -> Result<()> {
    log_execution(&format!("in{run}"));
    Ok(())
}

#[step]
async fn log_out(run: u64) -> Result<()> {
    log_execution(&format!("out{run}"));
    Ok(())
}

#[workflow]
async fn shared_work(run: u64) -> Result<()> {
    log_in(run).await?;
    sleep(Duration::from_millis(60)).await;
    log_out(run).await
}

const SHARED: &str = "shared";

fn shared_queue() -> Queue {
    Queue::new(SHARED).concurrency(2)
}

/// The queue of the crash test: one slot.
const SOLO: &str = "solo";

/// Run 0's first attempt hangs (its worker is killed in it); later attempts and other runs
/// go on at once.
#[step]
async fn stall_first(run: u64) -> Result<()> {
    log_execution(&format!("stall{run}"));
    if run == 0 && step_metadata().attempt == 1 {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    Ok(())
}

#[workflow]
async fn stalls(run: u64) -> Result<()> {
    log_in(run).await?;
    stall_first(run).await?;
    log_out(run).await
}

/// A worker process: declares the shared queues, prints `READY`, and drives runs, with a
/// lease of `WF_LEASE_MS` (default 5 s).
#[test]
#[ignore = "entry point of the worker processes the cross-process queue tests spawn"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let lease = std::env::var("WF_LEASE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(5), Duration::from_millis);
        let _worker = Place::from_env()
            .builder()
            .queue(shared_queue())
            .queue(Queue::new(SOLO).concurrency(1))
            .poll_interval(Duration::from_millis(20))
            .lease(lease)
            .build()
            .await
            .unwrap();
        println!("READY");
        std::io::stdout().flush().unwrap();
        std::future::pending::<()>().await;
    });
}

async fn three_workers_share_one_queue(place: Place, files: &std::path::Path) {
    const RUNS: u64 = 12;
    let log = files.join("steps.log");
    let mut env: Vec<(&str, String)> = place.env();
    env.push(("WF_LOG", log.to_str().unwrap().to_owned()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let workers: Vec<Worker> = (0..3).map(|_| Worker::spawn(&env)).collect();
    for w in &workers {
        w.line("READY", Duration::from_secs(60));
    }
    let client = place
        .builder()
        .queue(shared_queue())
        .worker(false)
        .build()
        .await
        .unwrap();
    let mut runs = Vec::new();
    for i in 0..RUNS {
        runs.push(client.start(shared_work, (i,)).queue(SHARED).await.unwrap());
    }
    for run in runs {
        run.return_value().await.unwrap();
    }
    // Each run logged `in` after it took its slot and `out` before it gave it back: at no
    // time were more than two between the two (at one millisecond, an `out` comes first).
    let mut edges: Vec<(u64, i64, u32)> = read_log_timed(&log)
        .into_iter()
        .map(|(_, _, label, pid, ms)| (ms, if label.starts_with("in") { 1 } else { -1 }, pid))
        .collect();
    assert_eq!(
        edges.len() as u64,
        RUNS * 2,
        "each run logged in and out once"
    );
    edges.sort();
    let (mut now, mut most) = (0, 0);
    for (_, d, _) in &edges {
        now += d;
        most = most.max(now);
    }
    let mut pids: Vec<u32> = edges.iter().map(|e| e.2).collect();
    pids.sort();
    pids.dedup();
    eprintln!(
        "{}: at most {most} runs of {RUNS} in flight at once (limit 2), on {} of 3 workers",
        place.name(),
        pids.len()
    );
    assert!(
        most <= 2,
        "{most} runs in flight at once across processes, over the limit"
    );
}

/// A worker dies holding the only slot: the waiting run does not begin until the run holding
/// the slot has ended, taken over by another worker once its lease expired.
async fn a_dead_worker_s_slot_returns_with_its_run(place: Place, files: &std::path::Path) {
    let log = files.join("steps.log");
    let mut env: Vec<(&str, String)> = place.env();
    env.push(("WF_LOG", log.to_str().unwrap().to_owned()));
    env.push(("WF_LEASE_MS", "1000".to_owned()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let doomed = Worker::spawn(&env);
    doomed.line("READY", Duration::from_secs(60));
    let client = place
        .builder()
        .queue(Queue::new(SOLO).concurrency(1))
        .worker(false)
        .build()
        .await
        .unwrap();
    let first = client.start(stalls, (0,)).queue(SOLO).await.unwrap();
    let labels = || -> Vec<(String, u32, u32)> {
        read_log_timed(&log)
            .into_iter()
            .map(|(_, attempt, label, pid, _)| (label, attempt, pid))
            .collect()
    };
    while !labels().iter().any(|(l, _, _)| l == "stall0") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = client.start(stalls, (1,)).queue(SOLO).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(second.status().await.unwrap(), RunStatus::Pending);
    let doomed_pid = doomed.pid();
    doomed.kill();

    let heir = Worker::spawn(&env);
    heir.line("READY", Duration::from_secs(60));
    first.return_value().await.unwrap();
    second.return_value().await.unwrap();
    let lines = read_log_timed(&log);
    let at = |label: &str| {
        lines
            .iter()
            .filter(|l| l.2 == label)
            .map(|l| l.4)
            .max()
            .unwrap_or_else(|| panic!("no {label} in {lines:?}"))
    };
    assert!(
        at("in1") >= at("out0"),
        "the second run began before the first ended: {lines:?}"
    );
    let stalls: Vec<(u32, u32)> = lines
        .iter()
        .filter(|l| l.2 == "stall0")
        .map(|l| (l.1, l.3))
        .collect();
    assert_eq!(stalls.len(), 2, "{lines:?}");
    assert_eq!(stalls[0], (1, doomed_pid));
    assert_eq!(stalls[1], (2, heir.pid()), "taken over by the other worker");
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_s_slot_returns_with_its_run_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let place = Place::Sqlite {
        path: dir.path().join("wf.db"),
    };
    common::bounded(a_dead_worker_s_slot_returns_with_its_run(place, dir.path())).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_s_slot_returns_with_its_run_on_postgres() {
    let Some(url) = common::postgres_url() else {
        eprintln!("skipped: WORKFLOW_TEST_DATABASE_URL is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let place = Place::Postgres {
        url,
        schema: common::fresh_schema(),
    };
    common::bounded(a_dead_worker_s_slot_returns_with_its_run(place, dir.path())).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_one_queue_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let place = Place::Sqlite {
        path: dir.path().join("wf.db"),
    };
    common::bounded(three_workers_share_one_queue(place, dir.path())).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_one_queue_on_postgres() {
    let Some(url) = common::postgres_url() else {
        eprintln!("skipped: WORKFLOW_TEST_DATABASE_URL is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let place = Place::Postgres {
        url,
        schema: common::fresh_schema(),
    };
    common::bounded(three_workers_share_one_queue(place, dir.path())).await;
}
