//! Many worker processes on one PostgreSQL database: scale-out, failover after a
//! SIGKILL, fencing of a paused worker, and atomic starts across processes. Each test uses a
//! schema of its own; the worker processes are this test binary re-executed (`child_main`).
#![cfg(feature = "postgres")]

mod common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use common::{fresh_schema, log_execution, postgres_url, read_log, read_log_timed, Worker};
use workflow_core::prelude::*;
use workflow_core::store::postgres::PostgresStore;
use workflow_core::store::Event;

const LEASE: Duration = Duration::from_millis(1000);

#[step]
async fn unit(run: u64, i: u64, pause_ms: u64) -> Result<u64> {
    log_execution(&format!("r{run}s{i}"));
    if pause_ms > 0 {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    }
    Ok(i)
}

#[workflow]
async fn ten_steps(run: u64, pause_ms: u64) -> Result<u64> {
    let mut sum = 0;
    for i in 0..10 {
        sum += unit(run, i, pause_ms).await?;
    }
    Ok(sum)
}

#[step]
async fn slow_pid(ms: u64) -> Result<u32> {
    log_execution("slow");
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(std::process::id())
}

#[workflow]
async fn fenced(ms: u64) -> Result<u32> {
    slow_pid(ms).await
}

#[workflow]
async fn waits_for_hook(token: String) -> Result<String> {
    let mut h = create_hook::<String>(token);
    h.recv().await
}

async fn runtime(url: &str, schema: &str, worker: bool) -> Runtime {
    let lease = std::env::var("WF_LEASE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(LEASE, Duration::from_millis);
    Runtime::builder()
        .postgres(url)
        .schema(schema)
        .lease(lease)
        .poll_interval(Duration::from_millis(50))
        .retry_backoff(Duration::from_millis(10))
        .worker(worker)
        .build()
        .await
        .expect("runtime on PostgreSQL")
}

/// The worker process: `WF_MODE` is `work` or `storm:<token>:<n>`.
#[test]
#[ignore = "entry point of the worker processes the cluster tests spawn"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = std::env::var("WF_PG_URL").unwrap();
        let schema = std::env::var("WF_SCHEMA").unwrap();
        let mode = std::env::var("WF_MODE").unwrap();
        let parts: Vec<&str> = mode.split(':').collect();
        match parts.as_slice() {
            ["work"] => {
                let _rt = runtime(&url, &schema, true).await;
                println!("READY");
                std::io::stdout().flush().unwrap();
                std::future::pending::<()>().await;
            }
            ["storm", token, n] => {
                let rt = runtime(&url, &schema, false).await;
                let starts = (0..n.parse::<u64>().unwrap())
                    .map(|i| {
                        let (rt, token) = (rt.clone(), token.to_string());
                        tokio::spawn(async move {
                            rt.start(ten_steps, (i, 0))
                                .hook(token)
                                .await
                                .map(|r| r.id())
                        })
                    })
                    .collect();
                common::report_storm(starts).await;
            }
            other => panic!("unknown mode {other:?}"),
        }
    });
}

struct Cluster {
    url: String,
    schema: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn new() -> Option<Cluster> {
        let url = postgres_url()?;
        let dir = tempfile::tempdir().unwrap();
        Some(Cluster {
            url,
            schema: fresh_schema(),
            log: dir.path().join("steps.log"),
            _dir: dir,
        })
    }

    fn spawn(&self, mode: &str) -> Worker {
        self.spawn_with_lease(mode, LEASE)
    }

    fn spawn_with_lease(&self, mode: &str, lease: Duration) -> Worker {
        Worker::spawn(&[
            ("WF_PG_URL", &self.url),
            ("WF_SCHEMA", &self.schema),
            ("WF_LOG", self.log.to_str().unwrap()),
            ("WF_MODE", mode),
            ("WF_LEASE_MS", &lease.as_millis().to_string()),
        ])
    }

    fn workers(&self, n: usize) -> Vec<Worker> {
        self.workers_with_lease(n, LEASE)
    }

    fn workers_with_lease(&self, n: usize, lease: Duration) -> Vec<Worker> {
        let ws: Vec<Worker> = (0..n)
            .map(|_| self.spawn_with_lease("work", lease))
            .collect();
        for w in &ws {
            w.line("READY", Duration::from_secs(60));
        }
        ws
    }

    async fn drop_schema(&self) {
        if let Ok(s) = PostgresStore::connect(&self.url, &self.schema).await {
            let _ = s.drop_schema().await;
        }
    }
}

/// Runs one cluster test at a time: each starts several worker processes, and on a 2-core
/// machine several clusters at once would starve heartbeats of CPU.
fn bounded<F: std::future::Future>(f: F) -> F::Output {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(180), f)
            .await
            .expect("test timed out")
    })
}

#[test]
fn scale_out_three_workers_three_hundred_runs() {
    let Some(c) = Cluster::new() else { return };
    bounded(async {
        let client = runtime(&c.url, &c.schema, false).await;
        // A lease long enough that a worker starved of CPU by the other processes of this
        // test keeps its runs: here, a step may run twice only around a kill.
        let workers = c.workers_with_lease(3, Duration::from_secs(10));
        let started = Instant::now();
        let mut runs = Vec::new();
        for n in 0..300 {
            runs.push(client.start(ten_steps, (n, 0)).await.unwrap());
        }
        for run in &runs {
            assert_eq!(run.return_value().await.unwrap(), 45);
        }
        let elapsed = started.elapsed();
        let lines = read_log(&c.log);
        println!(
            "scale-out: 300 runs x 10 steps on 3 worker processes in {:.2} s = {:.0} steps/s",
            elapsed.as_secs_f64(),
            3000.0 / elapsed.as_secs_f64()
        );
        let mut seen = HashMap::new();
        for l in &lines {
            *seen.entry(&l.0).or_insert(0) += 1;
        }
        let twice: Vec<_> = lines.iter().filter(|l| seen[&l.0] > 1).collect();
        assert!(twice.is_empty(), "no step body ran twice: {twice:?}");
        assert_eq!(lines.len(), 3000);
        let ids: HashSet<&String> = lines.iter().map(|l| &l.0).collect();
        assert_eq!(ids.len(), 3000);
        let mut per_pid: HashMap<u32, usize> = HashMap::new();
        for l in &lines {
            *per_pid.entry(l.3).or_default() += 1;
        }
        println!(
            "steps per process: {:?}",
            per_pid.values().collect::<Vec<_>>()
        );
        assert_eq!(per_pid.len(), 3, "every process completed a share");
        for run in &runs {
            let events = client.store().events(&run.id()).await.unwrap();
            let ends = events
                .iter()
                .filter(|e| matches!(e.event, Event::RunCompleted { .. }))
                .count();
            assert_eq!(ends, 1, "each run completed once");
        }
        drop(workers);
        c.drop_schema().await;
    });
}

#[test]
fn failover_after_sigkill() {
    let Some(c) = Cluster::new() else { return };
    bounded(async {
        let client = runtime(&c.url, &c.schema, false).await;
        let mut workers = c.workers(3);
        let mut runs = Vec::new();
        for n in 0..30 {
            runs.push(client.start(ten_steps, (n, 30)).await.unwrap());
        }
        // Kill one worker once everyone is busy.
        while read_log(&c.log).len() < 60 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let victim = workers.remove(0);
        let victim_pid = victim.pid();
        victim.kill();
        let killed_at = workflow_core::store::to_millis(SystemTime::now());
        for run in &runs {
            assert_eq!(run.return_value().await.unwrap(), 45, "every run finished");
        }
        let lines = read_log_timed(&c.log);
        // Steps the victim had in flight ran again elsewhere, same id, higher attempt.
        let victim_steps: HashSet<&String> = lines
            .iter()
            .filter(|l| l.3 == victim_pid)
            .map(|l| &l.0)
            .collect();
        let rerun: Vec<_> = lines
            .iter()
            .filter(|l| l.3 != victim_pid && l.1 > 1 && victim_steps.contains(&l.0))
            .collect();
        assert!(!rerun.is_empty(), "a step in flight at the kill ran again");
        let resumed_at = rerun.iter().map(|l| l.4).min().unwrap();
        println!(
            "failover: in-flight steps resumed {} ms after the SIGKILL (lease {} ms); {} step(s) re-run",
            resumed_at.saturating_sub(killed_at),
            LEASE.as_millis(),
            rerun.len()
        );
        let mut count: HashMap<&String, usize> = HashMap::new();
        for l in &lines {
            *count.entry(&l.0).or_default() += 1;
        }
        for (id, n) in count {
            assert!(
                n == 1 || victim_steps.contains(id),
                "{id} ran {n} times without a kill"
            );
        }
        drop(workers);
        c.drop_schema().await;
    });
}

#[test]
fn a_paused_worker_cannot_write_after_takeover() {
    let Some(c) = Cluster::new() else { return };
    bounded(async {
        let client = runtime(&c.url, &c.schema, false).await;
        let a = c.spawn("work");
        a.line("READY", Duration::from_secs(60));
        let run = client.start(fenced, (2500,)).await.unwrap();
        while read_log(&c.log).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        a.signal("-STOP");
        tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
        let b = c.spawn("work");
        b.line("READY", Duration::from_secs(60));
        // B takes the run over and runs the step again; then A wakes up.
        while read_log(&c.log).len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        a.signal("-CONT");
        let winner = run.return_value().await.unwrap();
        assert_eq!(winner, b.pid(), "the result recorded is the new owner's");
        // Give A time to finish its stale attempt and try to record it.
        tokio::time::sleep(Duration::from_millis(3000)).await;
        let events = client.store().events(&run.id()).await.unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e.event.kind()).collect();
        assert_eq!(
            kinds,
            [
                "step_scheduled",
                "step_attempt_started",
                "step_completed",
                "run_completed"
            ],
            "the paused worker appended nothing"
        );
        let lines = read_log(&c.log);
        assert_eq!(
            lines.iter().map(|l| (l.1, l.3)).collect::<Vec<_>>(),
            [(1, a.pid()), (2, b.pid())]
        );
        drop((a, b));
        c.drop_schema().await;
    });
}

#[test]
fn atomic_start_across_processes_on_postgres() {
    let Some(c) = Cluster::new() else { return };
    bounded(async {
        // Create the schema first so the processes race on starts, not on migrations.
        let client = runtime(&c.url, &c.schema, false).await;
        let token = format!("storm-{}", RunId::new());
        let started = Instant::now();
        let ws: Vec<Worker> = (0..4)
            .map(|_| c.spawn(&format!("storm:{token}:50")))
            .collect();
        let (won, lost) = common::storm_outcome(&ws);
        println!(
            "4 processes x 50 starts on PostgreSQL: {} run(s), {} conflicts, {:?}",
            won.len(),
            lost.len(),
            started.elapsed()
        );
        assert_eq!(won.len(), 1);
        assert_eq!(lost.len(), 199);
        assert!(lost.iter().all(|o| *o == won[0]));
        let id: RunId = won[0].parse().unwrap();
        assert!(client.store().get_run(&id).await.unwrap().is_some());
        drop(ws);
        c.drop_schema().await;
    });
}

#[test]
fn a_payload_reaches_a_run_driven_by_another_process() {
    let Some(c) = Cluster::new() else { return };
    bounded(async {
        let client = runtime(&c.url, &c.schema, false).await;
        let workers = c.workers(1);
        let token = format!("cross-{}", RunId::new());
        let run = client
            .start(waits_for_hook, (token.clone(),))
            .await
            .unwrap();
        while client.get_hook_by_token(&token).await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let sent = Instant::now();
        client
            .resume_hook(&token, "hello".to_string())
            .await
            .unwrap();
        assert_eq!(run.return_value().await.unwrap(), "hello");
        println!(
            "payload to another process's run and its result back: {:?}",
            sent.elapsed()
        );
        drop(workers);
        c.drop_schema().await;
    });
}
