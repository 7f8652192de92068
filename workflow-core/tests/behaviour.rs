//! The durable-core behaviour suite, run on every store.

mod common;

use std::collections::HashMap;
use std::future::IntoFuture;
use std::pin::pin;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use common::{bounded, until_no_active_runs, until_status, Backend, TestDb};
use futures::future::Either;
use serde_json::json;
use workflow_core::prelude::*;
use workflow_core::store::{Event, NewRun};
use workflow_core::RunError;

/// (step name, step id, attempt) of one step execution.
type Execution = (String, String, u32);

/// What step bodies did, per run, in execution order.
fn executions() -> &'static Mutex<HashMap<RunId, Vec<Execution>>> {
    static E: OnceLock<Mutex<HashMap<RunId, Vec<Execution>>>> = OnceLock::new();
    E.get_or_init(Default::default)
}

fn record(name: &str) -> StepMetadata {
    let m = step_metadata();
    executions()
        .lock()
        .unwrap()
        .entry(m.run_id)
        .or_default()
        .push((name.to_owned(), m.step_id.clone(), m.attempt));
    m
}

fn executed(run: RunId) -> Vec<Execution> {
    executions()
        .lock()
        .unwrap()
        .get(&run)
        .cloned()
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Sequential and concurrent steps

#[step]
async fn add(a: u64, b: u64) -> Result<u64> {
    record("add");
    Ok(a + b)
}

#[step]
async fn pure_add(a: u64, b: u64) -> Result<u64> {
    assert!(
        workflow_core::try_step_metadata().is_none(),
        "called as a plain fn"
    );
    Ok(a + b)
}

#[step]
async fn double(x: u64) -> Result<u64> {
    record("double");
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(x * 2)
}

#[workflow]
async fn arithmetic(start: u64) -> Result<u64> {
    let a = add(start, 1).await?;
    let b = add(a, 10).await?;
    let (x, y, z) = futures::join!(double(a), double(b), add(a, b));
    let total = futures::future::try_join_all((0..3).map(double)).await?;
    Ok(x? + y? + z? + total.iter().sum::<u64>())
}

async fn sequential_and_concurrent_steps(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(arithmetic, (5,)).await.unwrap();
    // a = 6, b = 16, x = 12, y = 32, z = 22, total = 0 + 2 + 4
    assert_eq!(run.return_value().await.unwrap(), 12 + 32 + 22 + 6);
    assert_eq!(run.status().await.unwrap(), RunStatus::Completed);

    let ran = executed(run.id());
    assert_eq!(ran.len(), 8, "each step body ran exactly once: {ran:?}");
    let mut ids: Vec<&String> = ran.iter().map(|(_, id, _)| id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8, "step ids are distinct");
    for (_, id, attempt) in &ran {
        assert!(id.is_ascii() && id.len() <= 255, "{id}");
        assert_eq!(*attempt, 1);
    }
    // The recorded ids are the ones the bodies saw.
    let events = rt.store().events(&run.id()).await.unwrap();
    let mut recorded: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepScheduled { step_id, .. } => Some(step_id.clone()),
            _ => None,
        })
        .collect();
    recorded.sort();
    let mut seen: Vec<String> = ran.iter().map(|(_, id, _)| id.clone()).collect();
    seen.sort();
    assert_eq!(recorded, seen);
    assert!(matches!(
        events.last().unwrap().event,
        Event::RunCompleted { .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// Retries

#[step]
async fn always_fails() -> Result<()> {
    record("always_fails");
    Err(Error::new(std::io::Error::other("disk on fire")))
}

#[step(max_retries = 5)]
async fn fails_fatally() -> Result<()> {
    record("fails_fatally");
    Err(Error::fatal("card declined"))
}

#[step]
async fn fails_then_succeeds(delay_ms: u64) -> Result<u32> {
    let m = record("fails_then_succeeds");
    if m.attempt < 3 {
        return Err(Error::retryable("try later").retry_after(Duration::from_millis(delay_ms)));
    }
    Ok(m.attempt)
}

#[step]
async fn panics_once() -> Result<String> {
    let m = record("panics_once");
    if m.attempt == 1 {
        panic!("boom in step");
    }
    Ok("recovered".into())
}

#[workflow]
async fn retrying(which: String) -> Result<String> {
    match which.as_str() {
        "always" => always_fails().await.map(|_| "ok".into()),
        "fatal" => fails_fatally().await.map(|_| "ok".into()),
        "after" => fails_then_succeeds(150)
            .await
            .map(|a| format!("attempt {a}")),
        "panic" => panics_once().await,
        "handled" => match always_fails().await {
            Ok(()) => Ok("impossible".into()),
            Err(e) => Ok(format!("handled: {e}")),
        },
        other => Err(Error::fatal(format!("unknown case {other}"))),
    }
}

async fn retries_follow_the_policy(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;

    let run = rt.start(retrying, ("always".to_string(),)).await.unwrap();
    let err = run.return_value().await.unwrap_err();
    assert!(err.to_string().contains("disk on fire"), "{err}");
    let ran = executed(run.id());
    assert_eq!(ran.iter().map(|r| r.2).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert!(
        ran.iter().all(|r| r.1 == ran[0].1),
        "same step id on every attempt"
    );
    assert_eq!(run.status().await.unwrap(), RunStatus::Failed);

    let run = rt.start(retrying, ("fatal".to_string(),)).await.unwrap();
    let err = run.return_value().await.unwrap_err();
    assert!(err.is_fatal() && err.to_string().contains("card declined"));
    assert_eq!(executed(run.id()).len(), 1, "fatal errors are not retried");

    let started = Instant::now();
    let run = rt.start(retrying, ("after".to_string(),)).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), "attempt 3");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "retry_after honoured twice"
    );
    let events = rt.store().events(&run.id()).await.unwrap();
    let failures: Vec<u64> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepAttemptFailed { retry_at_ms, .. } => Some(*retry_at_ms),
            _ => None,
        })
        .collect();
    assert_eq!(failures.len(), 2);
    for e in &events {
        if let Event::StepAttemptStarted { .. } = e.event {
            let at = workflow_core::store::to_millis(e.at);
            assert!(
                failures.iter().any(|r| at >= *r),
                "attempt started before its retry time"
            );
        }
    }

    let run = rt.start(retrying, ("panic".to_string(),)).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), "recovered");
    assert_eq!(executed(run.id()).len(), 2);

    let run = rt.start(retrying, ("handled".to_string(),)).await.unwrap();
    let v = run.return_value().await.unwrap();
    assert!(v.starts_with("handled: disk on fire"), "{v}");
}

#[workflow]
async fn panicking_workflow(n: u32) -> Result<u32> {
    let x = add(n as u64, 1).await?;
    if x > 0 {
        panic!("workflow body exploded at {x}");
    }
    Ok(n)
}

async fn panics_fail_the_run_and_the_worker_goes_on(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let bad = rt.start(panicking_workflow, (1,)).await.unwrap();
    let good = rt.start(arithmetic, (1,)).await.unwrap();
    let err = bad.return_value().await.unwrap_err();
    assert!(
        err.to_string().contains("workflow body exploded at 2"),
        "{err}"
    );
    assert_eq!(bad.status().await.unwrap(), RunStatus::Failed);
    // a = 2, b = 12: 4 + 24 + 14 + (0 + 2 + 4).
    assert_eq!(good.return_value().await.unwrap(), 48);
    // And later work still runs: a = 3, b = 13: 6 + 26 + 16 + 6.
    let again = rt.start(arithmetic, (2,)).await.unwrap();
    assert_eq!(again.return_value().await.unwrap(), 54);
}

// ---------------------------------------------------------------------------------------------
// Sleep, clock, random, metadata

#[step]
async fn observe(label: String) -> Result<String> {
    let m = step_metadata();
    Ok(format!("{label}:{}", m.run_id))
}

#[workflow]
async fn sleepy(ms: u64) -> Result<(u64, u64, bool, String)> {
    let meta = workflow_metadata();
    let t0 = now();
    assert_eq!(t0, meta.started_at, "the clock starts at the run's start");
    let r1: u64 = random();
    sleep(Duration::from_millis(ms)).await;
    let t1 = now();
    let seen = observe("after-sleep".into()).await?;
    let elapsed = t1.duration_since(t0).unwrap().as_millis() as u64;
    Ok((
        elapsed,
        r1,
        seen.ends_with(&meta.run_id.to_string()),
        meta.workflow_name,
    ))
}

async fn durable_sleep_and_deterministic_helpers(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let started = SystemTime::now();
    let run = rt.start(sleepy, (200,)).await.unwrap();
    let (elapsed, _r, seen, name) = run.return_value().await.unwrap();
    assert!(
        elapsed >= 200,
        "workflow clock advanced by the sleep: {elapsed}"
    );
    assert!(started.elapsed().unwrap() >= Duration::from_millis(200));
    assert!(seen, "step_metadata names the run");
    assert!(name.ends_with("sleepy"), "{name}");
    let events = rt.store().events(&run.id()).await.unwrap();
    assert!(events
        .iter()
        .any(|e| matches!(e.event, Event::TimerFired { .. })));

    // Outside a workflow the helpers are their plain counterparts.
    assert!(now() >= started);
    let t = Instant::now();
    sleep(Duration::from_millis(20)).await;
    assert!(t.elapsed() >= Duration::from_millis(20));
    assert!(workflow_core::try_step_metadata().is_none());
    assert!(workflow_core::try_workflow_metadata().is_none());
    // A step called outside a workflow is a plain async fn.
    assert_eq!(pure_add(2, 3).await.unwrap(), 5);
}

// ---------------------------------------------------------------------------------------------
// Cancellation

fn gates() -> &'static Mutex<HashMap<String, std::sync::Arc<tokio::sync::Notify>>> {
    static G: OnceLock<Mutex<HashMap<String, std::sync::Arc<tokio::sync::Notify>>>> =
        OnceLock::new();
    G.get_or_init(Default::default)
}

fn gate(key: &str) -> std::sync::Arc<tokio::sync::Notify> {
    gates()
        .lock()
        .unwrap()
        .entry(key.to_owned())
        .or_default()
        .clone()
}

#[step]
async fn wait_for_gate(key: String) -> Result<String> {
    record("wait_for_gate");
    gate(&format!("{key}:entered")).notify_one();
    gate(&key).notified().await;
    Ok(format!("released {key}"))
}

#[workflow]
async fn gated(key: String) -> Result<String> {
    let v = wait_for_gate(key).await?;
    let w = add(1, 1).await?;
    Ok(format!("{v} {w}"))
}

#[workflow]
async fn sleeps_long(secs: u64) -> Result<()> {
    sleep(Duration::from_secs(secs)).await;
    Ok(())
}

async fn cancel_stops_the_run(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;

    let run = rt.start(sleeps_long, (3600,)).await.unwrap();
    while run.status().await.unwrap() == RunStatus::Pending {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    run.cancel().await.unwrap();
    assert_eq!(run.status().await.unwrap(), RunStatus::Cancelled);
    assert!(run.return_value().await.unwrap_err().is_cancelled());
    run.cancel()
        .await
        .expect("cancelling an ended run is a no-op");

    // A step in flight at the cancel: its result is discarded.
    let key = format!("cancel-{}", RunId::new());
    let run = rt.start(gated, (key.clone(),)).await.unwrap();
    gate(&format!("{key}:entered")).notified().await;
    run.cancel().await.unwrap();
    gate(&key).notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(run.return_value().await.unwrap_err().is_cancelled());
    let events = rt.store().events(&run.id()).await.unwrap();
    assert!(matches!(events.last().unwrap().event, Event::RunCancelled));
    assert!(!events
        .iter()
        .any(|e| matches!(e.event, Event::StepCompleted { .. })));

    // A completed run stays completed.
    let done = rt.start(arithmetic, (0,)).await.unwrap();
    done.return_value().await.unwrap();
    done.cancel().await.unwrap();
    assert_eq!(done.status().await.unwrap(), RunStatus::Completed);
}

// ---------------------------------------------------------------------------------------------
// Replay: takeover, races, divergence

fn versions() -> &'static Mutex<HashMap<String, u32>> {
    static V: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    V.get_or_init(Default::default)
}

#[step]
async fn step_a(key: String) -> Result<String> {
    record("step_a");
    Ok(format!("a:{key}"))
}

#[step]
async fn step_b(key: String) -> Result<String> {
    record("step_b");
    Ok(format!("b:{key}"))
}

/// "Version 1" calls `step_a` first; "version 2" calls `step_b` first.
#[workflow]
async fn versioned(key: String) -> Result<String> {
    let version = versions().lock().unwrap().get(&key).copied().unwrap_or(1);
    let first = if version == 1 {
        step_a(key.clone()).await?
    } else {
        step_b(key.clone()).await?
    };
    sleep(Duration::from_millis(1500)).await;
    Ok(first)
}

async fn wait_for_event(rt: &Runtime, id: RunId, pred: impl Fn(&Event) -> bool) {
    loop {
        let events = rt.store().events(&id).await.unwrap();
        if events.iter().any(|e| pred(&e.event)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Returns once `rt` drives no run.
async fn no_active_runs(rt: &Runtime) {
    while rt.active_runs() != 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// "Version 1" calls `step_a` first; "version 2" puts `step_b` under a patch.
#[workflow]
async fn patched_versions(key: String) -> Result<String> {
    let version = versions().lock().unwrap().get(&key).copied().unwrap_or(1);
    let first = if version == 1 || !patched("use-step-b") {
        step_a(key.clone()).await?
    } else {
        step_b(key.clone()).await?
    };
    sleep(Duration::from_millis(1500)).await;
    Ok(first)
}

/// A deploy while runs sleep: under the new build, the run whose code changed
/// without a patch is blocked (divergence in its info, history untouched, `return_value`
/// still waiting) and the patched workflow's old run completes on the old path while a new
/// run takes the new one; `retry()` under a build that fits again lets the blocked run
/// continue where it was.
async fn deploys_block_divergent_runs_and_patches_keep_old_ones(b: Backend) {
    let db = TestDb::new(b);
    let (key, pkey, fresh) = (
        format!("div-{}", RunId::new()),
        format!("pat-{}", RunId::new()),
        format!("new-{}", RunId::new()),
    );
    let rt1 = db.runtime_with_lease(Duration::from_millis(300)).await;
    let run = rt1.start(versioned, (key.clone(),)).await.unwrap();
    let old = rt1.start(patched_versions, (pkey.clone(),)).await.unwrap();
    for id in [run.id(), old.id()] {
        bounded(wait_for_event(&rt1, id, |e| {
            matches!(e, Event::TimerScheduled { .. })
        }))
        .await;
    }
    rt1.shutdown();
    let before = rt1.store().events(&run.id()).await.unwrap();

    // The new build.
    for k in [&key, &pkey, &fresh] {
        versions().lock().unwrap().insert(k.clone(), 2);
    }
    let rt2 = db.runtime_with_lease(Duration::from_millis(300)).await;
    let blocked = bounded(until_status(&rt2, run.id(), RunStatus::Blocked)).await;
    let err = blocked.error.expect("the divergence is shown");
    assert!(err.is_diverged(), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("step_a") && msg.contains("step_b") && msg.contains("at event 1"),
        "names the event, expected and found: {msg}"
    );
    eprintln!("divergence as shown: {msg}");
    let d = err
        .divergence()
        .expect("the divergence is data on the error");
    assert_eq!(d.event, 1, "{d:?}");
    assert!(
        d.expected.contains("step_a") && d.found.contains("step_b"),
        "{d:?}"
    );
    assert!(
        msg.contains(&d.to_string()),
        "the message says the same: {msg}"
    );
    let exported = rt2.get_run(&run.id()).export().await.unwrap();
    let at = exported["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["seq"] == d.event)
        .expect("`event` is a seq of the export");
    assert_eq!(at["event"]["type"], "step_scheduled", "{at}");
    let waiting = tokio::time::timeout(
        Duration::from_millis(200),
        rt2.get_run(&run.id()).return_value(),
    )
    .await;
    assert!(
        waiting.is_err(),
        "return_value keeps waiting on a blocked run"
    );
    assert_eq!(
        rt2.store().events(&run.id()).await.unwrap(),
        before,
        "history untouched"
    );
    assert_eq!(executed(run.id()).len(), 1, "step_b never ran");

    let new = rt2.start(patched_versions, (fresh.clone(),)).await.unwrap();
    let old_out: String = bounded(old.typed().return_value()).await.unwrap();
    assert_eq!(
        old_out,
        format!("a:{pkey}"),
        "the old run keeps the old path"
    );
    let new_out: String = bounded(new.clone().typed().return_value()).await.unwrap();
    assert_eq!(
        new_out,
        format!("b:{fresh}"),
        "a new run takes the patched path"
    );
    let marked = rt2.store().events(&new.id()).await.unwrap();
    assert!(
        marked.iter().any(
            |e| matches!(&e.event, Event::PatchMarked { patch_id } if patch_id == "use-step-b")
        ),
        "{marked:?}"
    );

    // A build that fits the blocked run again, and `retry`.
    versions().lock().unwrap().insert(key.clone(), 1);
    rt2.get_run(&run.id()).retry().await.unwrap();
    let out: String = bounded(run.clone().typed().return_value()).await.unwrap();
    assert_eq!(out, format!("a:{key}"));
    assert_eq!(
        executed(run.id()).len(),
        1,
        "step_a ran once, before the deploy"
    );
}

#[step(max_retries = 1)]
async fn flaky_until_fixed(key: String) -> Result<String> {
    record("flaky");
    if versions().lock().unwrap().get(&key).copied().unwrap_or(1) == 1 {
        return Err(Error::retryable("the service is down"));
    }
    Ok(format!("fixed:{key}"))
}

#[workflow]
async fn fails_then_fixed(key: String) -> Result<String> {
    let a = step_a(key.clone()).await?;
    let b = flaky_until_fixed(key).await?;
    Ok(format!("{a}+{b}"))
}

/// `retry()` re-opens a failed run: recorded steps do not run again, the step whose retries
/// ran out gets a fresh set of attempts; a completed run cannot be retried. `fork(1)` starts
/// a new run holding the first step's recorded result and running the rest again.
async fn retry_reopens_failed_runs_and_fork_copies_a_prefix(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .retry_backoff(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let key = format!("retry-{}", RunId::new());
    let run = rt.start(fails_then_fixed, (key.clone(),)).await.unwrap();
    let err = bounded(run.return_value()).await.unwrap_err();
    assert!(err.to_string().contains("the service is down"), "{err}");
    let flaky = |id| {
        executed(id)
            .iter()
            .filter(|(name, _, _)| name == "flaky")
            .count()
    };
    assert_eq!(flaky(run.id()), 2);

    // The fix is deployed; a fork from the first step copies step_a's result.
    versions().lock().unwrap().insert(key.clone(), 2);
    let fork = bounded(run.fork(1)).await.unwrap();
    bounded(run.retry()).await.unwrap();
    let out = bounded(run.return_value()).await.unwrap();
    assert_eq!(out, format!("a:{key}+fixed:{key}"));
    let steps_a = |id| {
        executed(id)
            .iter()
            .filter(|(name, _, _)| name == "step_a")
            .count()
    };
    assert_eq!(steps_a(run.id()), 1, "the recorded step did not run again");
    assert_eq!(flaky(run.id()), 3, "one fresh attempt succeeded");
    let events = rt.store().events(&run.id()).await.unwrap();
    assert!(events.iter().any(|e| matches!(e.event, Event::RunRetried)));
    assert!(matches!(
        bounded(run.retry()).await,
        Err(RunError::NotRetryable {
            status: RunStatus::Completed,
            ..
        })
    ));

    let forked = bounded(fork.return_value()).await.unwrap();
    assert_eq!(forked, format!("a:{key}+fixed:{key}"));
    assert_eq!(steps_a(fork.id()), 0, "the copied step did not run");
    assert_eq!(flaky(fork.id()), 1);
    assert!(matches!(
        bounded(run.fork(5)).await,
        Err(RunError::CannotFork { .. })
    ));
}

#[step]
async fn slow_step() -> Result<String> {
    record("slow");
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok("slow".into())
}

#[step]
async fn fast_step() -> Result<String> {
    record("fast");
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok("fast".into())
}

/// Takes whichever branch finishes first, then waits for the other; both results end up
/// recorded, so a replay that delivered everything at once would let `slow` (polled first) win.
#[workflow]
async fn racing() -> Result<String> {
    let slow = pin!(slow_step());
    let fast = pin!(fast_step());
    let (winner, rest) = match futures::future::select(slow, fast).await {
        Either::Left((v, rest)) => (v?, Either::Left(rest)),
        Either::Right((v, rest)) => (v?, Either::Right(rest)),
    };
    let other = match rest {
        Either::Left(f) => f.await?,
        Either::Right(f) => f.await?,
    };
    // A sleep or a step, raced: the step wins live and must win on replay.
    let timer = pin!(sleep(Duration::from_millis(400)));
    let quick = pin!(step_a("race".into()));
    let second = match futures::future::select(timer, quick).await {
        Either::Left(((), _)) => "timer".to_string(),
        Either::Right((v, _)) => v?,
    };
    sleep(Duration::from_millis(1500)).await;
    Ok(format!("{winner} then {other}; {second}"))
}

async fn races_replay_the_way_they_ran(b: Backend) {
    let db = TestDb::new(b);
    let rt1 = db.runtime_with_lease(Duration::from_millis(300)).await;
    let run = rt1.start(racing, ()).await.unwrap();
    // Wait until the final sleep is scheduled (the 3rd timer command: tmr_1).
    wait_for_event(
        &rt1,
        run.id(),
        |e| matches!(e, Event::TimerScheduled { timer_id, .. } if timer_id == "tmr_1"),
    )
    .await;
    rt1.shutdown();
    let ran_live = executed(run.id()).len();
    assert_eq!(ran_live, 3);

    let rt2 = db.runtime_with_lease(Duration::from_millis(300)).await;
    let out = rt2
        .get_run(&run.id())
        .typed::<String>()
        .return_value()
        .await
        .unwrap();
    assert_eq!(out, "fast then slow; a:race");
    assert_eq!(
        executed(run.id()).len(),
        ran_live,
        "replay ran no step body"
    );
}

async fn takeover_after_lease_expiry_resumes_in_flight_step(b: Backend) {
    let db = TestDb::new(b);
    let key = format!("takeover-{}", RunId::new());
    let rt1 = db.runtime_with_lease(Duration::from_millis(300)).await;
    let run = rt1.start(gated, (key.clone(),)).await.unwrap();
    gate(&format!("{key}:entered")).notified().await;
    rt1.shutdown(); // the worker "dies" with the step in flight

    let rt2 = db.runtime_with_lease(Duration::from_millis(300)).await;
    gate(&format!("{key}:entered")).notified().await; // the step runs again, elsewhere
    gate(&key).notify_one();
    let out = rt2
        .get_run(&run.id())
        .typed::<String>()
        .return_value()
        .await
        .unwrap();
    assert_eq!(out, format!("released {key} 2"));
    let ran: Vec<_> = executed(run.id())
        .into_iter()
        .filter(|r| r.0 == "wait_for_gate")
        .collect();
    assert_eq!(ran.len(), 2);
    assert_eq!(ran[0].1, ran[1].1, "same step id after takeover");
    assert_eq!(
        (ran[0].2, ran[1].2),
        (1, 2),
        "a higher attempt after takeover"
    );
}

#[step]
async fn echo_draw(value: u64, at_ms: u64) -> Result<(u64, u64)> {
    record("echo_draw");
    Ok((value, at_ms))
}

/// Draws a random number and reads the clock before a takeover, records them through a step,
/// and compares after the replay.
#[workflow]
async fn draws() -> Result<(bool, bool)> {
    let r: u64 = random();
    let t = workflow_core::store::to_millis(now());
    let (recorded_r, recorded_t) = echo_draw(r, t).await?;
    sleep(Duration::from_millis(1500)).await;
    Ok((r == recorded_r, t == recorded_t))
}

async fn random_and_now_replay_identically(b: Backend) {
    let db = TestDb::new(b);
    // Long enough that a heartbeat late on a loaded machine does not let the first runtime
    // take its own run over (which runs the step again, as a takeover may).
    let rt1 = db.runtime_with_lease(Duration::from_millis(1000)).await;
    let run = rt1.start(draws, ()).await.unwrap();
    wait_for_event(&rt1, run.id(), |e| {
        matches!(e, Event::TimerScheduled { .. })
    })
    .await;
    rt1.shutdown();
    let rt2 = db.runtime_with_lease(Duration::from_millis(300)).await;
    let out = rt2
        .get_run(&run.id())
        .typed::<(bool, bool)>()
        .return_value()
        .await
        .unwrap();
    assert_eq!(
        out,
        (true, true),
        "random() and now() gave the recorded values on replay"
    );
    assert_eq!(executed(run.id()).len(), 1);
}

#[workflow]
async fn sleeps_between_steps(ms: u64) -> Result<u64> {
    let a = add(1, 2).await?;
    sleep(Duration::from_millis(ms)).await;
    add(a, 4).await
}

async fn long_sleeps_are_evicted_and_resumed(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .evict_after(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let started = Instant::now();
    let run = rt.start(sleeps_between_steps, (800,)).await.unwrap();
    wait_for_event(&rt, run.id(), |e| matches!(e, Event::TimerScheduled { .. })).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(run.status().await.unwrap(), RunStatus::Running);
    assert_eq!(
        rt.active_runs(),
        0,
        "the sleeping run is not held in memory"
    );
    assert_eq!(run.return_value().await.unwrap(), 7);
    assert!(started.elapsed() >= Duration::from_millis(800));
    assert_eq!(
        executed(run.id()).len(),
        2,
        "the step before the sleep did not run again"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input

/// Its argument type is serializable, but JSON has only string keys: some values fail.
#[workflow]
async fn by_cell(cells: HashMap<(u32, u32), u64>) -> Result<u64> {
    Ok(cells.values().sum())
}

async fn bad_input_gives_clear_errors(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;

    let unknown = RunId::new();
    let err = rt.get_run(&unknown).status().await.unwrap_err();
    assert!(matches!(err, workflow_core::RunError::NotFound(id) if id == unknown));
    let err = rt.get_run(&unknown).return_value().await.unwrap_err();
    assert!(
        err.to_string().contains(&unknown.to_string()) && err.to_string().contains("not found"),
        "{err}"
    );
    assert!("garbage".parse::<RunId>().is_err());

    // Arguments that fail to serialize: the start fails, naming the workflow.
    let err = rt
        .start(by_cell, (HashMap::from([((1, 2), 3)]),))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StartError::Serialize { workflow, .. } if workflow.ends_with("::by_cell")),
        "{err}"
    );

    // A run whose recorded arguments do not fit this binary's workflow (another version started it).
    let id = RunId::new();
    fn name_of<F: workflow_core::IntoWorkflow<(u64,)>>(_: F) -> &'static str {
        <F::Def as workflow_core::WorkflowDef>::NAME
    }
    rt.store()
        .create_run(NewRun::new(
            id,
            name_of(arithmetic).to_owned(),
            json!({"order": "not a tuple of u64"}),
            SystemTime::now(),
        ))
        .await
        .unwrap();
    let err = rt.get_run(&id).return_value().await.unwrap_err();
    assert!(err.to_string().contains("do not match"), "{err}");
    assert_eq!(
        rt.get_run(&id).info().await.unwrap().input,
        json!({"order": "not a tuple of u64"}),
        "the recorded input is kept"
    );
}

#[step]
async fn first_of_one(n: u32) -> Result<u32> {
    Ok(n + 1)
}

#[workflow]
async fn one_step(n: u32) -> Result<u32> {
    first_of_one(n).await
}

/// A run started here is driven before its admission, which carries the start of its first
/// step: a one-step run writes twice (its admission with the step's start, then the step's
/// result with its end) instead of three times (the admission alone first), on every store;
/// its history is what it was.
async fn a_run_started_here_is_admitted_with_the_start_of_its_first_step(b: Backend) {
    let db = TestDb::new(b);
    let (store, rt) = common::failing_store(&db, 0).await;
    store.pass_first_writes();
    let run = bounded(rt.start(one_step, (41,)).into_future())
        .await
        .unwrap();
    assert_eq!(bounded(run.return_value()).await.unwrap(), 42);
    let kinds: Vec<&str> = rt
        .store()
        .events(&run.id())
        .await
        .unwrap()
        .iter()
        .map(|e| e.event.kind())
        .collect();
    assert_eq!(kinds, ["step_scheduled", "step_completed", "run_completed"]);
    assert_eq!(store.writes(), ["admit+1", "end+2"], "on {b:?}");
}

/// A queued run started here is admitted with the start of its first step too when its
/// queue lets it begin at once (memory and SQLite decide both in one transaction; PostgreSQL
/// admits it and appends after). When the queue is full, the run waits for its slot and
/// nothing of the round its driver polled before the admission is written: whoever begins it
/// later decides its first step again, and its history is a single one.
async fn a_queued_run_started_here_is_admitted_with_its_first_step_when_it_may_begin(b: Backend) {
    let db = TestDb::new(b);
    let store = common::FailingAdmissions::new(db.open_store().await, 0);
    store.pass_first_writes();
    let rt = db
        .builder()
        .store(store.clone())
        .queue(Queue::new("one").concurrency(1))
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let kinds = |id: RunId| {
        let rt = rt.clone();
        async move {
            rt.store()
                .events(&id)
                .await
                .unwrap()
                .iter()
                .map(|e| e.event.kind())
                .collect::<Vec<_>>()
        }
    };
    let run = bounded(rt.start(one_step, (1,)).queue("one").into_future())
        .await
        .unwrap();
    assert_eq!(bounded(run.return_value()).await.unwrap(), 2);
    assert_eq!(
        kinds(run.id()).await,
        ["step_scheduled", "step_completed", "run_completed"]
    );
    let writes = store.writes();
    match b {
        Backend::Postgres => assert_eq!(writes.first().map(String::as_str), Some("admit")),
        _ => assert_eq!(writes, ["admit+1", "end+2"], "on {b:?}"),
    }

    // The slot held by a run that sleeps: the next one waits, with nothing written of it.
    let holder = bounded(rt.start(sleeps_forever, ()).queue("one").into_future())
        .await
        .unwrap();
    bounded(wait_for_event(&rt, holder.id(), |e| {
        matches!(e, Event::TimerScheduled { .. })
    }))
    .await;
    let before = store.writes().len();
    let waiting = bounded(rt.start(one_step, (7,)).queue("one").into_future())
        .await
        .unwrap();
    let info = waiting.info().await.unwrap();
    assert_eq!(info.status, RunStatus::Pending, "it waits for its slot");
    assert!(
        kinds(waiting.id()).await.is_empty(),
        "nothing of its first round is written"
    );
    assert_eq!(
        store.writes()[before..],
        ["admit"],
        "admitted without its first events"
    );
    bounded(holder.cancel()).await.unwrap();
    assert_eq!(bounded(waiting.return_value()).await.unwrap(), 8);
    assert_eq!(
        kinds(waiting.id()).await,
        ["step_scheduled", "step_completed", "run_completed"]
    );
}

/// A start can be awaited from a thread outside tokio (a blocking handler, another executor):
/// its admission runs on the runtime's own tokio runtime.
/// A panic in the runtime's own code for a run (here: inside a store call the driver makes)
/// never leaves the run leased and undriven: the run is released, taken up again and
/// completes, and it is no longer counted as active here.
async fn a_driver_panic_releases_the_run(b: Backend) {
    let db = TestDb::new(b);
    let (store, rt) = common::failing_store(&db, 0).await;
    store.panic_on_appends(1);
    let run = bounded(rt.start(arithmetic, (3,)).into_future())
        .await
        .unwrap();
    let out = bounded(run.return_value())
        .await
        .expect("the run completes");
    // a = 4, b = 14, x = 8, y = 28, z = 18, total = 0 + 2 + 4
    assert_eq!(out, 8 + 28 + 18 + 6);
    // The panic hit the scheduling write, before any attempt ran.
    assert_eq!(executed(run.id()).len(), 8, "each step body ran once");
    bounded(no_active_runs(&rt)).await;
}

#[workflow]
async fn sleeps_forever() -> Result<u64> {
    let one = add(0, 1).await?;
    sleep(Duration::MAX).await;
    Ok(one)
}

/// `Duration::MAX` wherever a user may pass a duration means "as long as representable": no
/// panic, no zombie, the run sleeps until it is cancelled and its token stays retained.
async fn huge_durations_saturate(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .lease(Duration::MAX)
        .evict_after(Duration::MAX)
        .poll_interval(Duration::MAX)
        .retry_backoff(Duration::MAX)
        .build()
        .await
        .unwrap();
    let token = format!("forever:{}", RunId::new());
    let run = bounded(
        rt.start(sleeps_forever, ())
            .hook(&token)
            .min_retention(Duration::MAX)
            .into_future(),
    )
    .await
    .unwrap();
    bounded(wait_for_event(&rt, run.id(), |e| {
        matches!(e, Event::TimerScheduled { .. })
    }))
    .await;
    assert_eq!(rt.active_runs(), 1, "the sleeping run is still driven here");
    bounded(run.cancel()).await.unwrap();
    let err = bounded(run.return_value()).await.unwrap_err();
    assert!(err.is_cancelled(), "{err}");
    let again = bounded(rt.start(sleeps_forever, ()).hook(&token).into_future()).await;
    match again {
        Err(StartError::HookConflict(c)) => assert_eq!(c.conflicting_run_id, run.id()),
        other => panic!("the token is retained for as long as representable: {other:?}"),
    }
    bounded(no_active_runs(&rt)).await;
}

#[step]
async fn wait_for_attempt_gate(key: String) -> Result<u32> {
    let attempt = step_metadata().attempt;
    gate(&format!("{key}:entered:{attempt}")).notify_one();
    gate(&format!("{key}:{attempt}")).notified().await;
    Ok(attempt)
}

#[workflow]
async fn attempt_gated(key: String) -> Result<u32> {
    wait_for_attempt_gate(key).await
}

/// A worker that stalls past its lease and leases the same run again runs a second driver for
/// it; the first one stops, and its leaving does not drop the second from the active runs.
async fn a_second_driver_here_keeps_its_place(b: Backend) {
    let db = TestDb::new(b);
    let store = common::FailingAdmissions::new(db.open_store().await, 0);
    let rt = db
        .builder()
        .store(store.clone())
        .lease(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let key = format!("stall-{}", RunId::new());
    let entered = |attempt: u32| gate(&format!("{key}:entered:{attempt}"));
    let (first, second) = (entered(1), entered(2));
    store.fail_heartbeats(true);
    let run = bounded(rt.start(attempt_gated, (key.clone(),)).into_future())
        .await
        .unwrap();
    bounded(first.notified()).await;
    // No heartbeat: the lease expires and this worker takes the run again (attempt 2).
    bounded(second.notified()).await;
    // The first attempt finishes now; its driver must already have stopped.
    gate(&format!("{key}:1")).notify_one();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rt.active_runs(), 1, "the second driver is still listed");
    store.fail_heartbeats(false);
    gate(&format!("{key}:2")).notify_one();
    assert_eq!(bounded(run.return_value()).await.unwrap(), 2);
    let completions = rt
        .store()
        .events(&run.id())
        .await
        .unwrap()
        .into_iter()
        .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
        .count();
    assert_eq!(completions, 1, "the stale driver recorded nothing");
}

#[workflow]
async fn parent_of_one_child() -> Result<usize> {
    let child = start_child(big_child, ("ab".to_owned(),)).await?;
    child.result().await
}

/// Each run's end carries what the driver knows of the run's ties, for the store's choice of
/// statement: a run tied to nothing, one with a start token, a child.
async fn each_end_carries_what_the_driver_knows_of_the_run(b: Backend) {
    use workflow_core::store::EndHint;
    let db = TestDb::new(b);
    let store = common::FailingAdmissions::new(db.open_store().await, 0);
    let rt = db.builder().store(store.clone()).build().await.unwrap();
    let alone = bounded(rt.start(big_child, ("a".to_owned(),)).into_future())
        .await
        .unwrap();
    assert_eq!(bounded(alone.return_value()).await.unwrap(), 1);
    let token = format!("ties-{}", RunId::new());
    let tokened = bounded(
        rt.start(big_child, ("bc".to_owned(),))
            .hook(&token)
            .into_future(),
    )
    .await
    .unwrap();
    assert_eq!(bounded(tokened.return_value()).await.unwrap(), 2);
    let parent = bounded(rt.start(parent_of_one_child, ()).into_future())
        .await
        .unwrap();
    assert_eq!(bounded(parent.return_value()).await.unwrap(), 2);
    let children = rt.runs(RunFilter::new().parent(parent.id())).await.unwrap();
    assert_eq!(children.len(), 1);
    let hint_of = |run: RunId| {
        let hints: Vec<EndHint> = store
            .end_hints()
            .into_iter()
            .filter(|(id, _)| *id == run)
            .map(|(_, hint)| hint)
            .collect();
        assert_eq!(hints.len(), 1, "one end of {run}: {hints:?}");
        hints[0]
    };
    assert_eq!(hint_of(alone.id()), EndHint::Alone);
    assert_eq!(hint_of(tokened.id()), EndHint::NoParent);
    assert_eq!(hint_of(children[0].id), EndHint::Child);
    assert_eq!(hint_of(parent.id()), EndHint::Alone);
}

#[step]
async fn measure(text: String) -> Result<usize> {
    record("measure");
    Ok(text.len())
}

#[step]
async fn produce(len: usize) -> Result<String> {
    record("produce");
    Ok("x".repeat(len))
}

#[workflow]
async fn limited(_note: String, len: usize) -> Result<(String, String)> {
    let show = |r: Result<String>| r.unwrap_or_else(|e| format!("err: {e}"));
    let args = show(measure("y".repeat(len)).await.map(|n| n.to_string()));
    let result = show(produce(len).await.map(|s| s.len().to_string()));
    Ok((args, result))
}

/// `max_payload_bytes` bounds workflow arguments, step arguments and results and hook
/// payloads: a start or resume over it fails and writes nothing, a step call with larger
/// arguments fails without running, and a larger result fails its attempt for good.
async fn payloads_over_the_limit_are_refused(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .max_payload_bytes(1000)
        .retry_backoff(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    match rt.start(limited, ("a".repeat(2000), 1)).await {
        Err(StartError::TooLarge(e)) => {
            assert_eq!(e.limit, 1000);
            assert!(e.size > 2000, "{e}");
            assert!(e.to_string().contains("arguments of workflow"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let runs = rt
        .store()
        .list_runs(&workflow_core::store::RunFilter::new())
        .await
        .unwrap();
    assert!(runs.is_empty(), "nothing written: {runs:?}");
    match rt.resume_hook("any-token", "z".repeat(2000)).await {
        Err(workflow_core::HookError::TooLarge(e)) => {
            assert!(e.to_string().contains("payload for hook"), "{e}")
        }
        other => panic!("{other:?}"),
    }

    let run = bounded(rt.start(limited, ("small".into(), 2000)).into_future())
        .await
        .unwrap();
    let (args, result) = bounded(run.return_value()).await.unwrap();
    assert!(args.contains("the arguments of step"), "{args}");
    assert!(args.contains("over the limit of 1000 bytes"), "{args}");
    assert!(result.contains("the result of step"), "{result}");
    let ran: Vec<(String, u32)> = executed(run.id())
        .into_iter()
        .map(|(name, _, attempt)| (name, attempt))
        .collect();
    assert_eq!(ran, [("produce".to_owned(), 1)], "one attempt, no retry");

    // Within the limit, the same workflow runs through.
    let run = bounded(rt.start(limited, ("small".into(), 10)).into_future())
        .await
        .unwrap();
    let out = bounded(run.return_value()).await.unwrap();
    assert_eq!(out, ("10".to_owned(), "10".to_owned()));
}

#[workflow]
async fn big_child(text: String) -> Result<usize> {
    Ok(text.len())
}

/// Each bounded payload's error, with whether it was fatal.
#[workflow]
async fn every_limit(len: usize) -> Result<Vec<(String, bool)>> {
    let show = |r: Result<String>| match r {
        Ok(v) => (v, false),
        Err(e) => (e.to_string(), e.is_fatal()),
    };
    let args = show(measure("y".repeat(len)).await.map(|n| n.to_string()));
    let result = show(produce(len).await.map(|s| s.len().to_string()));
    let child = match start_child(big_child, ("z".repeat(len),)).await {
        Ok(c) => show(c.result().await.map(|n| n.to_string())),
        Err(e) => show(Err(e)),
    };
    Ok(vec![args, result, child])
}

/// Every entry point of a bounded payload names the value, its size as serialized and the
/// limit: a start and a resume fail and write nothing; inside a run, a step's arguments, a
/// step's result and a child's arguments fail as fatal (the step's body runs once, no child
/// is started).
async fn every_payload_over_the_limit_names_its_size_and_the_limit(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .max_payload_bytes(1000)
        .retry_backoff(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let over = "over the limit of 1000 bytes (`max_payload_bytes`)";
    let note = "a".repeat(2000);
    let size = serde_json::to_string(&(note.clone(), 1usize))
        .unwrap()
        .len();
    let err = rt.start(limited, (note, 1)).await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with("the arguments of workflow `")
            && message.ends_with(&format!("` is {size} bytes serialized, {over}")),
        "{message}"
    );
    assert!(matches!(err, StartError::TooLarge(e) if e.size == size && e.limit == 1000));
    let err = rt.resume_hook("t", "z".repeat(2000)).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("the payload for hook \"t\" is 2002 bytes serialized, {over}")
    );
    assert!(
        rt.runs(RunFilter::new()).await.unwrap().is_empty(),
        "nothing written"
    );

    let run = bounded(rt.start(every_limit, (2000,)).into_future())
        .await
        .unwrap();
    let errors = bounded(run.return_value()).await.unwrap();
    let expect = [
        ("the arguments of step `", 2004),
        ("the result of step `", 2002),
        ("the arguments of child workflow `", 2004),
    ];
    assert_eq!(errors.len(), expect.len());
    for ((message, fatal), (starts, size)) in errors.iter().zip(expect) {
        assert!(*fatal, "{message}");
        assert!(
            message.starts_with(starts)
                && message.ends_with(&format!("` is {size} bytes serialized, {over}")),
            "{message}"
        );
    }
    let ran: Vec<(String, u32)> = executed(run.id())
        .into_iter()
        .map(|(name, _, attempt)| (name, attempt))
        .collect();
    assert_eq!(ran, [("produce".to_owned(), 1)], "one attempt, no retry");
    let children = rt.runs(RunFilter::new().parent(run.id())).await.unwrap();
    assert!(children.is_empty(), "no child: {children:?}");
}

#[workflow]
async fn listed_ok(n: u32) -> Result<u32> {
    Ok(n)
}

#[workflow]
async fn listed_failing(n: u32) -> Result<u32> {
    Err(Error::fatal(format!("no {n}")))
}

/// `rt.runs` lists the runs the newest first, filtered by status and workflow, and bounded
/// by the filter's limit.
async fn runs_are_listed_newest_first_by_status_and_workflow(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let a = rt.start(listed_ok, (1,)).await.unwrap();
    bounded(a.return_value()).await.unwrap();
    let f = rt.start(listed_failing, (2,)).await.unwrap();
    bounded(f.return_value()).await.unwrap_err();
    let c = rt.start(listed_ok, (3,)).await.unwrap();
    bounded(c.return_value()).await.unwrap();
    let ids = |runs: Vec<workflow_core::RunRecord>| runs.iter().map(|r| r.id).collect::<Vec<_>>();

    let all = rt.runs(RunFilter::new()).await.unwrap();
    assert_eq!(ids(all.clone()), [c.id(), f.id(), a.id()]);
    assert!(all.windows(2).all(|w| w[0].created_at >= w[1].created_at));
    assert_eq!(
        ids(rt.runs(RunFilter::new().limit(2)).await.unwrap()),
        [c.id(), f.id()]
    );
    let failed = rt
        .runs(RunFilter::new().status(RunStatus::Failed))
        .await
        .unwrap();
    assert_eq!(ids(failed.clone()), [f.id()]);
    assert!(failed[0]
        .error
        .as_ref()
        .unwrap()
        .to_string()
        .contains("no 2"));
    let ok_name = a.info().await.unwrap().workflow;
    assert_eq!(
        ids(rt
            .runs(RunFilter::new().workflow(ok_name.clone()))
            .await
            .unwrap()),
        [c.id(), a.id()]
    );
    assert_eq!(
        ids(rt
            .runs(
                workflow_core::RunFilter::new()
                    .workflow(ok_name)
                    .status(RunStatus::Failed)
            )
            .await
            .unwrap()),
        []
    );
    // The listing is the store's, through the client API.
    let stored = rt
        .store()
        .list_runs(&workflow_core::store::RunFilter::new())
        .await
        .unwrap();
    assert_eq!(all, stored);
}

async fn a_start_can_be_awaited_outside_tokio(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let client = rt.clone();
    // A plain thread has no tokio context at all (unlike `spawn_blocking`'s threads).
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let started = futures::executor::block_on(async {
            let run = client.start(arithmetic, (5,)).await?;
            Ok::<_, StartError>(run.id())
        });
        let _ = tx.send(started);
    });
    let id = rx.await.unwrap().unwrap();
    let total: u64 = rt.get_run(&id).typed().return_value().await.unwrap();
    assert_eq!(total, 12 + 32 + 22 + 6);
}

/// A store error that is not transient and repeats on the same run (here: every write of
/// events is refused) fails the run after `MAX_FAILED_TRIES` tries, with an error naming the
/// cause; the run is not leased and driven again forever.
async fn a_store_error_that_repeats_fails_the_run(b: Backend) {
    use workflow_core::store::MAX_FAILED_TRIES;
    let db = TestDb::new(b);
    let (store, rt) = common::failing_store(&db, 0).await;
    store.fail_appends(usize::MAX, common::AppendFailure::Refused);
    let run = bounded(rt.start(arithmetic, (3,)).into_future())
        .await
        .unwrap();
    let err = bounded(run.return_value())
        .await
        .expect_err("the run fails");
    let message = err.to_string();
    assert!(
        message.contains(&format!("after {MAX_FAILED_TRIES} failed tries"))
            && message.contains("injected append failure"),
        "{message}"
    );
    assert_eq!(run.status().await.unwrap(), RunStatus::Failed);
    assert!(executed(run.id()).is_empty(), "no step was ever scheduled");
    let events = rt.store().events(&run.id()).await.unwrap();
    assert!(
        matches!(&events[..], [e] if matches!(e.event, Event::RunFailed { .. })),
        "{events:?}"
    );
    bounded(no_active_runs(&rt)).await;
}

/// Transient store errors (a lost connection) are retried with the lease kept, and a write
/// whose answer was lost after it committed is not written twice: the run completes, each
/// step body ran once, and each step is scheduled and completed once in the history.
async fn transient_store_errors_are_retried_without_duplicates(b: Backend) {
    let db = TestDb::new(b);
    let (store, rt) = common::failing_store(&db, 0).await;
    for how in [
        common::AppendFailure::Lost,
        common::AppendFailure::LostAfterCommit,
    ] {
        store.fail_appends(3, how);
        let run = bounded(rt.start(arithmetic, (3,)).into_future())
            .await
            .unwrap();
        let out = bounded(run.return_value())
            .await
            .expect("the run completes");
        assert_eq!(out, 8 + 28 + 18 + 6, "{how:?}");
        assert_eq!(
            executed(run.id()).len(),
            8,
            "{how:?}: each step body ran once"
        );
        let events = rt.store().events(&run.id()).await.unwrap();
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
        let mut scheduled = HashMap::new();
        let mut completed = HashMap::new();
        for e in &events {
            match &e.event {
                Event::StepScheduled { step_id, .. } => {
                    *scheduled.entry(step_id.clone()).or_insert(0) += 1
                }
                Event::StepCompleted { step_id, .. } => {
                    *completed.entry(step_id.clone()).or_insert(0) += 1
                }
                _ => {}
            }
        }
        assert_eq!(scheduled.len(), 8, "{how:?}");
        assert!(
            scheduled.values().all(|n| *n == 1),
            "{how:?}: {scheduled:?}"
        );
        assert_eq!(completed.len(), 8, "{how:?}");
        assert!(
            completed.values().all(|n| *n == 1),
            "{how:?}: {completed:?}"
        );
    }
    bounded(no_active_runs(&rt)).await;
}

/// Counts, per run, step futures dropped before they finished.
fn dropped() -> &'static Mutex<HashMap<RunId, usize>> {
    static D: OnceLock<Mutex<HashMap<RunId, usize>>> = OnceLock::new();
    D.get_or_init(Default::default)
}

struct CountsDrop(RunId);

/// Waits (bounded) until `run`'s first step body started.
async fn until_a_step_started(run: RunId) {
    bounded(async {
        while executed(run).is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// Waits (bounded) until a step future of `run` was dropped unfinished; how long after
/// `since` that was.
async fn until_a_step_dropped(run: RunId, since: std::time::Instant) -> Duration {
    bounded(async {
        while dropped().lock().unwrap().get(&run).is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        since.elapsed()
    })
    .await
}

impl Drop for CountsDrop {
    fn drop(&mut self) {
        *dropped().lock().unwrap().entry(self.0).or_default() += 1;
    }
}

/// A step body that works for an hour, counting its future's drop if it is cut short.
async fn an_hour_of_work(name: &str) -> Result<()> {
    let guard = CountsDrop(record(name).run_id);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    std::mem::forget(guard);
    Ok(())
}

#[step(timeout = "100ms", max_retries = 1)]
async fn hangs() -> Result<()> {
    an_hour_of_work("hangs").await
}

#[workflow]
async fn waits_on_a_hanging_step() -> Result<()> {
    hangs().await
}

#[step]
async fn sends_emails_for_an_hour() -> Result<()> {
    an_hour_of_work("emails").await
}

#[workflow]
async fn mailing() -> Result<()> {
    sends_emails_for_an_hour().await
}

/// Cancellation reaches steps: `cancel()` drops the run's in-flight step future in
/// the process running it within a second, and no new attempt starts.
async fn cancel_drops_the_step_in_flight(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(mailing, ()).await.unwrap();
    until_a_step_started(run.id()).await;
    let cancelled = std::time::Instant::now();
    run.cancel().await.unwrap();
    let dropped_in = until_a_step_dropped(run.id(), cancelled).await;
    eprintln!("the step's future was dropped {dropped_in:?} after cancel() returned");
    assert!(dropped_in < Duration::from_secs(1), "{dropped_in:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(executed(run.id()).len(), 1, "no new attempt started");
    assert!(run.return_value().await.unwrap_err().is_cancelled());
}

/// `#[step(timeout = "..")]`: at the deadline the attempt's future is dropped and the attempt
/// fails ("timed out after 100ms"), retried by the policy like any failed attempt.
async fn a_step_over_its_timeout_is_dropped_and_retried(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .retry_backoff(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let run = rt.start(waits_on_a_hanging_step, ()).await.unwrap();
    let err = bounded(run.return_value()).await.unwrap_err();
    assert!(err.to_string().contains("timed out after 100ms"), "{err}");
    assert_eq!(executed(run.id()).len(), 2, "two attempts");
    assert_eq!(dropped().lock().unwrap().get(&run.id()), Some(&2));
    let events = rt.store().events(&run.id()).await.unwrap();
    let failed = events
        .iter()
        .filter(|e| matches!(&e.event, Event::StepAttemptFailed { error, .. } if error.to_string().contains("timed out")))
        .count();
    assert_eq!(failed, 1, "the first attempt failed and was retried");
}

/// Cancellation reaches steps in another process: a client runtime with a store of
/// its own (PostgreSQL: its notices; SQLite and memory: the worker's poll) cancels a run that
/// a worker runtime is driving; the worker drops the step's future within its poll interval
/// and starts no new attempt.
async fn a_cancel_from_elsewhere_drops_the_step_in_flight(b: Backend) {
    let db = TestDb::new(b);
    let worker = db
        .builder()
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    // Its own store instance (SQLite and PostgreSQL open one per runtime): nothing is shared
    // in memory with the worker but the database.
    let client = db.builder().worker(false).build().await.unwrap();
    let run = worker.start(mailing, ()).await.unwrap();
    until_a_step_started(run.id()).await;
    let cancelled = std::time::Instant::now();
    client.get_run(&run.id()).cancel().await.unwrap();
    let dropped_in = until_a_step_dropped(run.id(), cancelled).await;
    eprintln!("dropped {dropped_in:?} after cancel() returned in another runtime");
    assert!(dropped_in < Duration::from_secs(1), "{dropped_in:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(executed(run.id()).len(), 1, "no new attempt started");
    bounded(no_active_runs(&worker)).await;
}

#[workflow]
async fn sleeps_then_mails(ms: u64) -> Result<()> {
    sleep(Duration::from_millis(ms)).await;
    sends_emails_for_an_hour().await
}

/// A run deadline (`start(..).timeout(d)`): a run still working at its deadline
/// fails ("timed out after …"), its in-flight step dropped; a run evicted in a long sleep is
/// woken at its deadline to fail; a run that ends before its deadline is not affected.
async fn runs_fail_at_their_deadline(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .evict_after(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let run = rt
        .start(mailing, ())
        .timeout(Duration::from_millis(300))
        .await
        .unwrap();
    let err = bounded(run.return_value()).await.unwrap_err();
    assert!(err.to_string().contains("timed out after 300ms"), "{err}");
    // Aborted before the end was written; dropped as soon as its task runs again.
    until_a_step_dropped(run.id(), std::time::Instant::now()).await;
    let info = run.info().await.unwrap();
    assert_eq!(info.status, RunStatus::Failed);
    assert!(info.deadline.is_some());

    // Evicted while sleeping an hour: woken at the deadline to fail.
    let sleeper = rt
        .start(sleeps_then_mails, (3_600_000,))
        .timeout(Duration::from_secs(2))
        .await
        .unwrap();
    until_no_active_runs(&rt, "the run sleeping an hour was not evicted").await;
    assert_eq!(
        sleeper.status().await.unwrap(),
        RunStatus::Running,
        "evicted before its deadline, not ended by it"
    );
    let err = bounded(sleeper.return_value()).await.unwrap_err();
    assert!(err.to_string().contains("timed out after 2s"), "{err}");
    assert!(executed(sleeper.id()).is_empty());

    // Ends in time: unaffected.
    let quick = rt
        .start(arithmetic, (1,))
        .timeout(Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(bounded(quick.return_value()).await.unwrap(), 48);
}

/// After `prune` deleted a completed run, `return_value()` on a handle of it is an error
/// (the run is not found), in the runtime that drove the run and remembers its end as in any
/// other runtime on the store, whichever pruned it; the run that was not pruned still answers.
async fn a_pruned_run_is_gone_everywhere(b: Backend) {
    let db = TestDb::new(b);
    let driver = db.runtime().await;
    let other = db.runtime().await;
    for pruner in [&other, &driver] {
        let run = driver.start(arithmetic, (1,)).await.unwrap();
        let value = bounded(run.return_value()).await.unwrap();
        // The end is in the past when the prune reads its clock.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stats = pruner.prune(Duration::ZERO).await.unwrap();
        assert!(stats.runs >= 1, "{stats:?}");
        let kept = driver.start(arithmetic, (2,)).await.unwrap();
        for rt in [&driver, &other] {
            let gone = rt.get_run(&run.id());
            let err = bounded(gone.return_value()).await.unwrap_err();
            assert!(err.to_string().contains("not found"), "{err}");
            assert!(matches!(gone.status().await, Err(RunError::NotFound(_))));
        }
        assert!(bounded(kept.return_value()).await.unwrap() > value);
        let err = bounded(run.return_value()).await.unwrap_err();
        assert!(err.to_string().contains("not found"), "{err}");
    }
    // A run whose token is retained is pruned only once its retention ended; then it is gone
    // for the runtime that drove it too.
    let token = format!("retained-{}", RunId::new());
    let retained = driver
        .start(arithmetic, (3,))
        .hook(&token)
        .min_retention(Duration::from_millis(1500))
        .await
        .unwrap();
    let value = bounded(retained.return_value()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    other.prune(Duration::ZERO).await.unwrap();
    assert_eq!(retained.status().await.unwrap(), RunStatus::Completed);
    assert_eq!(bounded(retained.return_value()).await.unwrap(), value);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(other.prune(Duration::ZERO).await.unwrap().runs >= 1);
    assert!(matches!(
        retained.status().await,
        Err(RunError::NotFound(_))
    ));
    let err = bounded(retained.return_value()).await.unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
}

/// `return_value` after a run's end answers without reading the store only for a run that
/// completed here and whose token is retained (no prune can delete it yet): the duplicate
/// start reading its owner's result; any other run is read, so a pruned one is not found.
async fn only_retained_runs_are_answered_from_memory(b: Backend) {
    use std::sync::atomic::Ordering::SeqCst;
    let db = TestDb::new(b);
    let (store, rt) = common::failing_store(&db, 0).await;
    let token = format!("kept-{}", RunId::new());
    let owner = rt
        .start(arithmetic, (1,))
        .hook(&token)
        .min_retention(Duration::from_secs(3600))
        .await
        .unwrap();
    let value = bounded(owner.return_value()).await.unwrap();
    let plain = rt.start(arithmetic, (1,)).await.unwrap();
    bounded(plain.return_value()).await.unwrap();
    let reads = store.run_reads.load(SeqCst);
    for _ in 0..3 {
        let dup = rt.start(arithmetic, (2,)).hook(&token).await.unwrap_err();
        let StartError::HookConflict(c) = dup else {
            panic!("{dup}")
        };
        let got = rt.get_run(&c.conflicting_run_id).typed::<u64>();
        assert_eq!(bounded(got.return_value()).await.unwrap(), value);
    }
    assert_eq!(store.run_reads.load(SeqCst), reads, "answered from memory");
    for _ in 0..3 {
        bounded(plain.return_value()).await.unwrap();
    }
    assert_eq!(store.run_reads.load(SeqCst), reads + 3, "each one read");
}

on_every_store!(
    runs_fail_at_their_deadline,
    only_retained_runs_are_answered_from_memory,
    a_pruned_run_is_gone_everywhere,
    a_cancel_from_elsewhere_drops_the_step_in_flight,
    a_step_over_its_timeout_is_dropped_and_retried,
    cancel_drops_the_step_in_flight,
    a_store_error_that_repeats_fails_the_run,
    transient_store_errors_are_retried_without_duplicates,
    sequential_and_concurrent_steps,
    retries_follow_the_policy,
    panics_fail_the_run_and_the_worker_goes_on,
    durable_sleep_and_deterministic_helpers,
    cancel_stops_the_run,
    deploys_block_divergent_runs_and_patches_keep_old_ones,
    retry_reopens_failed_runs_and_fork_copies_a_prefix,
    races_replay_the_way_they_ran,
    takeover_after_lease_expiry_resumes_in_flight_step,
    bad_input_gives_clear_errors,
    random_and_now_replay_identically,
    long_sleeps_are_evicted_and_resumed,
    a_start_can_be_awaited_outside_tokio,
    a_driver_panic_releases_the_run,
    a_run_started_here_is_admitted_with_the_start_of_its_first_step,
    a_queued_run_started_here_is_admitted_with_its_first_step_when_it_may_begin,
    huge_durations_saturate,
    a_second_driver_here_keeps_its_place,
    each_end_carries_what_the_driver_knows_of_the_run,
    payloads_over_the_limit_are_refused,
    every_payload_over_the_limit_names_its_size_and_the_limit,
    runs_are_listed_newest_first_by_status_and_workflow,
);

/// A file that is not ours, or not a database at all, is refused with a clear error and left
/// untouched.
#[tokio::test]
async fn foreign_or_corrupt_sqlite_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    let err = Runtime::builder()
        .sqlite(&garbage)
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not a SQLite database"), "{err}");
    assert_eq!(std::fs::read(&garbage).unwrap(), vec![0x5a; 8192]);

    let foreign = dir.path().join("foreign.db");
    {
        let c = rusqlite::Connection::open(&foreign).unwrap();
        c.execute_batch("CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT); INSERT INTO customers VALUES (1, 'ada');")
            .unwrap();
    }
    let before = std::fs::read(&foreign).unwrap();
    let err = Runtime::builder()
        .sqlite(&foreign)
        .build()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("not a workflow-rs store")
            && err.to_string().contains("customers"),
        "{err}"
    );
    assert_eq!(std::fs::read(&foreign).unwrap(), before);
}
