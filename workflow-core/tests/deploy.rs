//! A deploy while runs are in flight, with real processes on SQLite and
//! PostgreSQL. Process A, "version 1" of the code, takes three runs to a durable sleep and is
//! SIGKILLed. Process B, "version 2", takes them over: in `patched_flow` the change sits behind
//! `patched`, so the old run completes on the old path while a new run takes the new one; in
//! `reshaped` the change is incompatible, so its two runs are blocked with the divergence in
//! `run.info()` and their histories untouched. Then B is switched to a build that fits again
//! (SIGUSR1: the same build as A) and `retry()` lets one blocked run complete where it was,
//! while the other stays blocked (its next automatic try is a minute away); process C, a new
//! deploy of that build, wakes and completes the other when it starts.
//!
//! The processes are this test binary re-executed (`child_main`). Which build a process is
//! comes from `WF_VERSION`, read into a process global that the workflow bodies consult: the
//! only difference between the builds, as a code change is between two deploys.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

mod common;

use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{log_execution, read_log, Place, Worker};
use workflow_core::prelude::*;
use workflow_core::store::{Event, RunRecord};
use workflow_core::RunId;

const LEASE: Duration = Duration::from_millis(500);
const SLEEP: Duration = Duration::from_millis(1500);
/// The whole test, from its first process to its last check.
const LIMIT: Duration = Duration::from_secs(120);
/// How long any one thing the test waits for may take.
const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The two builds

/// Which build this process is: 1 before the deploy, 2 after.
static VERSION: AtomicU32 = AtomicU32::new(1);

fn version() -> u32 {
    VERSION.load(Ordering::SeqCst)
}

#[step]
async fn step_a(key: String) -> Result<String> {
    log_execution("step_a");
    Ok(format!("a:{key}"))
}

#[step]
async fn step_b(key: String) -> Result<String> {
    log_execution("step_b");
    Ok(format!("b:{key}"))
}

/// Version 2 calls `step_b` where version 1 called `step_a`, with no patch: an incompatible
/// change for the runs that version 1 started.
#[workflow]
async fn reshaped(key: String) -> Result<String> {
    let first = if version() == 1 {
        step_a(key).await?
    } else {
        step_b(key).await?
    };
    sleep(SLEEP).await;
    Ok(first)
}

/// The same change behind `patched`: runs started by version 1 keep the old path.
#[workflow]
async fn patched_flow(key: String) -> Result<String> {
    let first = if version() == 1 || !patched("use-step-b") {
        step_a(key).await?
    } else {
        step_b(key).await?
    };
    sleep(SLEEP).await;
    Ok(first)
}

// ---------------------------------------------------------------------------------------------
// The processes

/// A worker process of build `WF_VERSION`. `WF_MODE` is `start:<key>` (admit two runs of
/// `reshaped` and one of `patched_flow`, print `RUNS <reshaped> <reshaped> <patched_flow>`,
/// drive them until all sleep, print
/// `SLEEPING` and wait to be killed) or `work` (print `READY` and drive runs; SIGUSR1 makes
/// this process build 1 and it prints `VERSION 1`).
#[test]
#[ignore = "entry point of the worker processes the deploy tests spawn"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let v: u32 = std::env::var("WF_VERSION").unwrap().parse().unwrap();
    VERSION.store(v, Ordering::SeqCst);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let place = Place::from_env();
        let mode = std::env::var("WF_MODE").unwrap();
        let say = |line: &str| {
            println!("{line}");
            std::io::stdout().flush().unwrap();
        };
        match mode.split(':').collect::<Vec<_>>().as_slice() {
            ["start", key] => {
                // Admitted by a client-only runtime, so the ids are known before any step runs.
                let client = place.runtime(false).await;
                let a = client.start(reshaped, (key.to_string(),)).await.unwrap();
                let b = client.start(reshaped, (key.to_string(),)).await.unwrap();
                let c = client
                    .start(patched_flow, (key.to_string(),))
                    .await
                    .unwrap();
                say(&format!("RUNS {} {} {}", a.id(), b.id(), c.id()));
                let worker = place.runtime(true).await;
                for id in [a.id(), b.id(), c.id()] {
                    until_event(&worker, id, |e| matches!(e, Event::TimerScheduled { .. })).await;
                }
                say("SLEEPING");
                std::future::pending::<()>().await;
            }
            ["work"] => {
                use tokio::signal::unix::{signal, SignalKind};
                let mut usr1 = signal(SignalKind::user_defined1()).unwrap();
                let _worker = place.runtime(true).await;
                say("READY");
                usr1.recv().await;
                VERSION.store(1, Ordering::SeqCst);
                say("VERSION 1");
                std::future::pending::<()>().await;
            }
            other => panic!("unknown mode {other:?}"),
        }
    });
}

impl Place {
    /// A worker (`true`) or a client-only runtime on this store, tuned for tests.
    async fn runtime(&self, worker: bool) -> Runtime {
        let b = self.builder();
        b.worker(worker)
            .lease(LEASE)
            .poll_interval(Duration::from_millis(20))
            .retry_backoff(Duration::from_millis(10))
            .build()
            .await
            .expect("runtime builds")
    }

    /// A process of build `version` in `mode`, logging step executions to `log`.
    fn spawn(&self, log: &Path, version: u32, mode: &str) -> Worker {
        let mut env = self.env();
        env.push(("WF_LOG", log.to_str().unwrap().to_owned()));
        env.push(("WF_VERSION", version.to_string()));
        env.push(("WF_MODE", mode.to_owned()));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Worker::spawn(&env)
    }
}

async fn until_event(rt: &Runtime, id: RunId, pred: impl Fn(&Event) -> bool) {
    let deadline = Instant::now() + WAIT;
    while !rt
        .store()
        .events(&id)
        .await
        .unwrap()
        .iter()
        .any(|e| pred(&e.event))
    {
        assert!(
            Instant::now() < deadline,
            "run {id}: no such event in {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn until_status(rt: &Runtime, id: RunId, status: RunStatus) -> RunRecord {
    let deadline = Instant::now() + WAIT;
    loop {
        let run = rt.get_run(&id).info().await.unwrap();
        if run.status == status {
            return run;
        }
        assert!(
            Instant::now() < deadline,
            "run {id} is {:?}, not {status:?}, after {WAIT:?}",
            run.status
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {WAIT:?}"))
}

// ---------------------------------------------------------------------------------------------
// The test

async fn deploy(place: Place, files: &Path) {
    let log = files.join("steps.log");
    let key = format!("k-{}", RunId::new());
    let client = place.runtime(false).await;

    // Version 1 takes the runs to their sleep and dies there.
    let a = place.spawn(&log, 1, &format!("start:{key}"));
    let line = a.line("RUNS ", WAIT);
    let ids: Vec<RunId> = line.split(' ').map(|id| id.parse().unwrap()).collect();
    let [old_reshaped, other_reshaped, old_patched] = ids[..] else {
        panic!("bad RUNS line {line:?}")
    };
    a.line("SLEEPING", WAIT);
    a.kill();
    let before = client.get_run(&old_reshaped).export().await.unwrap();

    // Version 2 takes them over once A's leases expire.
    let b = place.spawn(&log, 2, "work");
    b.line("READY", WAIT);
    until_status(&client, other_reshaped, RunStatus::Blocked).await;
    let blocked = until_status(&client, old_reshaped, RunStatus::Blocked).await;
    let err = blocked.error.expect("a blocked run shows its divergence");
    assert!(err.is_diverged(), "{err:?}");
    let msg = err.to_string();
    eprintln!("divergence as shown by run.info(): {msg}");
    assert!(
        msg.contains("at event 1") && msg.contains("step_a") && msg.contains("step_b"),
        "the divergence names the event, the expected and the found command: {msg}"
    );
    let d = err
        .divergence()
        .expect("the divergence is data on the error");
    assert_eq!(d.event, 1, "{d:?}");
    assert!(
        d.expected.contains("step_a") && d.found.contains("step_b"),
        "{d:?}"
    );
    assert!(msg.contains(&d.to_string()), "{msg}");
    let reshaped_run = client.get_run(&old_reshaped).typed::<String>();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), reshaped_run.return_value())
            .await
            .is_err(),
        "return_value keeps waiting on a blocked run"
    );
    let after = client.get_run(&old_reshaped).export().await.unwrap();
    assert_eq!(
        after["events"], before["events"],
        "the history is untouched"
    );

    let out: String = within(
        "the patched workflow's old run",
        client.get_run(&old_patched).typed().return_value(),
    )
    .await
    .unwrap();
    assert_eq!(out, format!("a:{key}"), "the old run keeps the old path");
    let fresh = client.start(patched_flow, (key.clone(),)).await.unwrap();
    let out: String = within(
        "a new run of the patched workflow",
        fresh.clone().typed().return_value(),
    )
    .await
    .unwrap();
    assert_eq!(out, format!("b:{key}"), "a new run takes the patched path");
    let marked = client.store().events(&fresh.id()).await.unwrap();
    assert!(
        marked.iter().any(
            |e| matches!(&e.event, Event::PatchMarked { patch_id } if patch_id == "use-step-b")
        ),
        "{marked:?}"
    );
    assert_eq!(
        client.get_run(&old_reshaped).status().await.unwrap(),
        RunStatus::Blocked,
        "still blocked: the next automatic try is a minute away"
    );

    // A build that fits the blocked run again, and `retry`.
    b.signal("-USR1");
    b.line("VERSION 1", WAIT);
    client.get_run(&old_reshaped).retry().await.unwrap();
    let out = within("the retried run", reshaped_run.return_value())
        .await
        .unwrap();
    assert_eq!(out, format!("a:{key}"), "it continued where it was");
    assert_eq!(
        client.get_run(&other_reshaped).status().await.unwrap(),
        RunStatus::Blocked,
        "the run that was not retried waits for its next try"
    );

    // A new deploy of the fitting build wakes the other blocked run when it starts.
    b.kill();
    let c = place.spawn(&log, 1, "work");
    c.line("READY", WAIT);
    let out: String = within(
        "the other blocked run, under a new process",
        client.get_run(&other_reshaped).typed().return_value(),
    )
    .await
    .unwrap();
    assert_eq!(out, format!("a:{key}"));

    // Every step body ran once, and none on the blocked run's new path.
    let ran = |run: RunId| -> Vec<String> {
        let prefix = format!("stp_{run}_");
        read_log(&log)
            .into_iter()
            .filter(|(step, ..)| step.starts_with(&prefix))
            .map(|(_, _, label, _)| label)
            .collect()
    };
    assert_eq!(ran(old_reshaped), ["step_a"]);
    assert_eq!(ran(other_reshaped), ["step_a"]);
    assert_eq!(ran(old_patched), ["step_a"]);
    assert_eq!(ran(fresh.id()), ["step_b"]);
    c.kill();
    client.shutdown();
}

/// Runs one deploy test at a time (each has two processes of its own and this one on a
/// 2-core machine), bounded so that a bug fails the test instead of hanging it.
fn bounded<F: Future>(f: F) -> F::Output {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(LIMIT, f)
            .await
            .expect("test timed out")
    })
}

#[cfg(feature = "sqlite")]
#[test]
fn deploy_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    bounded(deploy(
        Place::Sqlite {
            path: dir.path().join("wf.db"),
        },
        dir.path(),
    ));
}

#[cfg(feature = "postgres")]
#[test]
fn deploy_on_postgres() {
    use workflow_core::store::postgres::PostgresStore;

    let Some(url) = common::postgres_url() else {
        return;
    };
    let schema = common::fresh_schema();
    let dir = tempfile::tempdir().unwrap();
    bounded(async {
        if !common::postgres_reachable(&url, &schema).await {
            return;
        }
        let place = Place::Postgres {
            url: url.clone(),
            schema: schema.clone(),
        };
        deploy(place, dir.path()).await;
        if let Ok(s) = PostgresStore::connect(&url, &schema).await {
            let _ = s.drop_schema().await;
        }
    });
}
