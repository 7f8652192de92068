//! Crash recovery with real processes: this test binary re-executes itself as a worker
//! (`child_main`, ignored unless run as a child), the tests SIGKILL it at different points and
//! check the recorded history and what the step bodies did.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use common::{log_execution, read_log, Worker};

use workflow_core::prelude::*;
use workflow_core::store::{from_millis, Event};
use workflow_core::RunId;

const LEASE: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------------------------
// The workflows the child runs

#[step]
async fn square(i: u64) -> Result<u64> {
    log_execution(&format!("square-{i}"));
    tokio::time::sleep(Duration::from_millis(40)).await;
    Ok(i * i)
}

#[workflow]
async fn twenty_squares() -> Result<u64> {
    let mut sum = 0;
    for i in 0..20 {
        sum += square(i).await?;
    }
    Ok(sum)
}

#[workflow]
async fn sleep_between(ms: u64) -> Result<(u64, u64)> {
    let mut sum = 0;
    for i in 0..3 {
        sum += square(i).await?;
    }
    let before = now();
    sleep(Duration::from_millis(ms)).await;
    let slept = now().duration_since(before).unwrap_or_default().as_millis() as u64;
    for i in 3..6 {
        sum += square(i).await?;
    }
    Ok((sum, slept))
}

#[step]
async fn kills_its_worker() -> Result<()> {
    log_execution("abort");
    std::process::abort();
}

#[workflow]
async fn always_crashing() -> Result<String> {
    match kills_its_worker().await {
        Ok(()) => Ok("impossible".into()),
        Err(e) => Ok(format!("gave up: {e}")),
    }
}

#[step]
async fn tagged(n: u64) -> Result<u32> {
    log_execution(&format!("tagged-{n}"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(std::process::id())
}

#[workflow]
async fn three_tagged(n: u64) -> Result<Vec<u32>> {
    Ok(vec![
        tagged(n).await?,
        tagged(n + 1).await?,
        tagged(n + 2).await?,
    ])
}

/// The worker process. `WF_MODE` is `start:<workflow>[:<arg>]`, `resume:<run id>` or `work`.
#[test]
#[ignore = "entry point of the worker processes the crash tests spawn"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let db = std::env::var("WF_DB").unwrap();
        let mode = std::env::var("WF_MODE").unwrap();
        let runtime = |worker: bool| {
            Runtime::builder()
                .sqlite(&db)
                .worker(worker)
                .lease(LEASE)
                .poll_interval(Duration::from_millis(20))
                .retry_backoff(Duration::from_millis(10))
                // Small, so that one worker cannot take every run of the sharing test at once.
                .max_active_runs(4)
                .build()
        };
        // Runs are admitted by a client-only runtime, so none of their steps (which may kill
        // this process) runs before the run's id is printed.
        let client = runtime(false).await.unwrap();
        let parts: Vec<&str> = mode.split(':').collect();
        let id = match parts.as_slice() {
            ["start", "twenty_squares"] => client.start(twenty_squares, ()).await.unwrap().id(),
            ["start", "sleep_between", ms] => client
                .start(sleep_between, (ms.parse::<u64>().unwrap(),))
                .await
                .unwrap()
                .id(),
            ["start", "always_crashing"] => client.start(always_crashing, ()).await.unwrap().id(),
            ["resume", id] => id.parse().unwrap(),
            ["work"] => {
                let _worker = runtime(true).await.unwrap();
                std::future::pending().await
            }
            // The storm only admits runs; nobody needs to execute them.
            ["storm", token, n] => {
                let starts = (0..n.parse::<u64>().unwrap())
                    .map(|i| {
                        let (rt, token) = (client.clone(), token.to_string());
                        tokio::spawn(async move {
                            rt.start(three_tagged, (i,))
                                .hook(token)
                                .await
                                .map(|r| r.id())
                        })
                    })
                    .collect();
                common::report_storm(starts).await;
                return;
            }
            other => panic!("unknown mode {other:?}"),
        };
        println!("RUN {id}");
        std::io::stdout().flush().unwrap();
        let rt = runtime(true).await.unwrap();
        // The parent waits 60 s for `DONE`: within that, a run that never ends says so.
        let out = tokio::time::timeout(Duration::from_secs(50), rt.get_run(&id).return_value())
            .await
            .unwrap_or_else(|_| Err(Error::fatal("the run did not end within 50 s")));
        println!(
            "DONE {}",
            serde_json::to_string(&out.map_err(|e| e.to_string())).unwrap()
        );
        std::io::stdout().flush().unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// The parent side

/// A worker process on the SQLite file `db`, logging step executions to `log`.
fn spawn(db: &Path, log: &Path, mode: &str) -> Worker {
    Worker::spawn(&[
        ("WF_DB", db.to_str().unwrap()),
        ("WF_LOG", log.to_str().unwrap()),
        ("WF_MODE", mode),
    ])
}

fn wait_for_log_lines(log: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_log(log).len() < n {
        assert!(Instant::now() < deadline, "log never reached {n} lines");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The recorded events of run `id`, read straight from the SQLite file.
fn history(db: &Path, id: &str) -> Vec<(u64, Event)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT at, data FROM events WHERE run_id = ?1 ORDER BY seq")
        .unwrap();
    stmt.query_map([id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .unwrap()
        .map(|r| {
            let (at, data) = r.unwrap();
            (at as u64, serde_json::from_str(&data).unwrap())
        })
        .collect()
}

fn completed_steps(db: &Path, id: &str) -> Vec<String> {
    history(db, id)
        .into_iter()
        .filter_map(|(_, e)| match e {
            Event::StepCompleted { step_id, .. } => Some(step_id),
            _ => None,
        })
        .collect()
}

#[test]
fn killed_worker_resumes_twenty_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (db, log) = (dir.path().join("wf.db"), dir.path().join("steps.log"));
    let w = spawn(&db, &log, "start:twenty_squares");
    let id = w.line("RUN ", Duration::from_secs(30));
    let mut worker = Some(w);
    // (log lines at the kill, steps recorded complete at the kill)
    let mut kills: Vec<(usize, Vec<String>)> = Vec::new();
    for at in [3, 8, 14] {
        wait_for_log_lines(&log, at);
        worker.take().unwrap().kill();
        kills.push((read_log(&log).len(), completed_steps(&db, &id)));
        worker = Some(spawn(&db, &log, &format!("resume:{id}")));
    }
    let done = worker
        .as_ref()
        .unwrap()
        .line("DONE ", Duration::from_secs(60));
    assert_eq!(done, r#"{"Ok":2470}"#, "sum of i² for i < 20");

    let lines = read_log(&log);
    let mut ids: Vec<&String> = lines.iter().map(|l| &l.0).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20, "every step id appears");
    for (at, completed) in &kills {
        for later in &lines[*at..] {
            assert!(
                !completed.contains(&later.0),
                "step {} completed before a kill ran again",
                later.0
            );
        }
    }
    let reruns: Vec<_> = lines.iter().filter(|l| l.1 > 1).collect();
    assert!(
        reruns.len() <= kills.len(),
        "only steps in flight at a kill ran again: {reruns:?}"
    );
    for r in &reruns {
        let first = lines.iter().find(|l| l.0 == r.0).unwrap();
        assert_eq!(first.2, r.2, "same step id, same step");
        assert!(r.1 > first.1, "a higher attempt");
    }
    assert_eq!(completed_steps(&db, &id).len(), 20);
}

#[test]
fn durable_sleep_spans_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let (db, log) = (dir.path().join("wf.db"), dir.path().join("steps.log"));
    let w = spawn(&db, &log, "start:sleep_between:2000");
    let id = w.line("RUN ", Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(30);
    let fire_at = loop {
        let timer = history(&db, &id).into_iter().find_map(|(_, e)| match e {
            Event::TimerScheduled { fire_at_ms, .. } => Some(fire_at_ms),
            _ => None,
        });
        if let Some(t) = timer {
            break from_millis(t);
        }
        assert!(Instant::now() < deadline, "the sleep was never scheduled");
        std::thread::sleep(Duration::from_millis(10));
    };
    w.kill();
    let w = spawn(&db, &log, &format!("resume:{id}"));
    let done = w.line("DONE ", Duration::from_secs(60));
    assert!(
        SystemTime::now() >= fire_at,
        "completed before the deadline"
    );
    // sum of i² for i < 6 = 55; the workflow clock saw the whole sleep
    let out: serde_json::Value = serde_json::from_str(&done).unwrap();
    assert_eq!(out["Ok"][0], 55);
    assert!(out["Ok"][1].as_u64().unwrap() >= 2000, "{done}");
    let fired = history(&db, &id).into_iter().find_map(|(at, e)| match e {
        Event::TimerFired { .. } => Some(from_millis(at)),
        _ => None,
    });
    assert!(
        fired.unwrap() >= fire_at,
        "fired no earlier than its deadline"
    );
    let lines = read_log(&log);
    assert_eq!(
        lines.len(),
        6,
        "no step before the sleep ran again: {lines:?}"
    );
}

#[test]
fn a_step_that_kills_its_worker_every_time_stops_after_max_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let (db, log) = (dir.path().join("wf.db"), dir.path().join("steps.log"));
    let w = spawn(&db, &log, "start:always_crashing");
    let id = w.line("RUN ", Duration::from_secs(30));
    let mut w = w;
    let mut restart = 0;
    while restart < 10 {
        match w.lines.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.contains("DONE ") => {
                assert!(l.contains("gave up") && l.contains("interrupted"), "{l}");
                let attempts: Vec<u32> = read_log(&log).iter().map(|l| l.1).collect();
                assert_eq!(attempts, [1, 2, 3, 4], "exactly max_retries + 1 attempts");
                return;
            }
            Ok(_) => continue,
            Err(_) => {
                let status = w.wait_exit(Duration::from_secs(5));
                assert!(!status.success(), "restart {restart}: the worker died");
                restart += 1;
                w = spawn(&db, &log, &format!("resume:{id}"));
            }
        }
    }
    panic!("the run never gave up on the crashing step");
}

#[test]
fn processes_share_one_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let (db, log) = (dir.path().join("wf.db"), dir.path().join("steps.log"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // A client-only runtime creates the file; two worker processes execute.
        let client = Runtime::builder()
            .sqlite(&db)
            .worker(false)
            .poll_interval(Duration::from_millis(20))
            .build()
            .await
            .unwrap();
        let workers = [spawn(&db, &log, "work"), spawn(&db, &log, "work")];
        let mut runs = Vec::new();
        for n in 0..30 {
            runs.push(client.start(three_tagged, (n * 10,)).await.unwrap());
        }
        for run in &runs {
            let pids = tokio::time::timeout(Duration::from_secs(60), run.return_value())
                .await
                .expect("run finished in time")
                .unwrap();
            assert_eq!(pids.len(), 3);
        }
        let lines = read_log(&log);
        assert_eq!(lines.len(), 90, "each step body ran once");
        let mut pids: Vec<u32> = lines.iter().map(|l| l.3).collect();
        pids.sort();
        pids.dedup();
        assert_eq!(pids.len(), 2, "both processes did work");

        // A cancel from this process reaches the run another process drives.
        let run = client.start(sleep_between, (60_000,)).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while run.status().await.unwrap() != RunStatus::Running {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        run.cancel().await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(60), run.return_value())
            .await
            .expect("the cancelled run did not end within 60 s");
        assert!(out.unwrap_err().is_cancelled());
        drop(workers);
    });
}

#[test]
fn atomic_start_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let (db, log) = (dir.path().join("wf.db"), dir.path().join("steps.log"));
    // Create the file first so that the four processes race on starts, not on the schema.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        Runtime::builder()
            .sqlite(&db)
            .worker(false)
            .build()
            .await
            .unwrap()
    });
    let token = format!("storm-{}", RunId::new());
    let started = Instant::now();
    let workers: Vec<Worker> = (0..4)
        .map(|_| spawn(&db, &log, &format!("storm:{token}:50")))
        .collect();
    let (won, owners) = common::storm_outcome(&workers);
    println!(
        "4 processes x 50 starts: {} run(s), {} conflicts, {:?}",
        won.len(),
        owners.len(),
        started.elapsed()
    );
    assert_eq!(won.len(), 1, "exactly one run: {won:?}");
    assert_eq!(owners.len(), 199);
    assert!(
        owners.iter().all(|o| *o == won[0]),
        "every loser names the winner"
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    let runs: i64 = conn
        .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
        .unwrap();
    let events: i64 = conn
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!((runs, events), (1, 0), "the losers left no trace");
}
