//! Delayed starts and run versions as a user sees them, on every store: a run
//! started with `.delay(d)` is admitted at once (pending, its start recorded, its token
//! claimed) and begins at its start, not before, even when a payload reaches its token first;
//! it survives a restart of the runtime; a `.start_at(t)` already passed begins at once. A
//! runtime built with `.version(v)` records `v` on every run it starts (its children and the
//! runs its schedules fire too), and `RunFilter::version` lists them.
//!
//! When a run began is read from its history (the time of its first event, on the clock
//! that also timed its start), not from the test's clock. How late after its start each
//! delayed run began is printed as a figure; the assertion on it is only a generous bound.

mod common;

use std::time::{Duration, SystemTime};

use common::{Backend, TestDb};
use workflow_core::prelude::*;
use workflow_core::store::{EventRecord, RunRecord};
use workflow_core::RunId;

#[step]
async fn stamp() -> Result<u64> {
    Ok(1)
}

#[workflow(name = "starts.stamped")]
async fn stamped(label: String) -> Result<String> {
    stamp().await?;
    Ok(label)
}

/// Receives one payload through its start token.
#[workflow(name = "starts.hooked")]
async fn hooked(token: String) -> Result<String> {
    stamp().await?;
    let mut hook = create_hook::<String>(token);
    hook.recv().await
}

#[workflow(name = "starts.parent")]
async fn parent(label: String) -> Result<String> {
    let child = start_child(stamped, (label,)).await?;
    child.result().await
}

#[workflow(name = "starts.ticked")]
async fn ticked(tick: ScheduleTick) -> Result<bool> {
    Ok(tick.backfill)
}

/// How long the generous bound lets a delayed run begin after its start: far above what a
/// wake-up takes, so that a loaded machine does not fail the test; the figure is printed.
const LATE_BOUND: Duration = Duration::from_secs(3);

/// The run's history once it has one (the run has begun).
async fn first_event(rt: &Runtime, id: RunId) -> EventRecord {
    loop {
        let events = rt.store().events(&id).await.unwrap();
        if let Some(first) = events.into_iter().next() {
            return first;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Checks that `run` began at or after its start and not later than [`LATE_BOUND`]; prints
/// how late it began.
fn began_on_time(b: Backend, what: &str, run: &RunRecord, first: &EventRecord) {
    let start = run.start_at.expect("a delayed run records its start");
    let late = first.at.duration_since(start).unwrap_or_else(|e| {
        panic!(
            "{what}: began {:?} before its start (first event at {:?}, start {start:?})",
            e.duration(),
            first.at
        )
    });
    eprintln!(
        "figure: {b:?} {what}: began {} ms after its start",
        late.as_millis()
    );
    assert!(late <= LATE_BOUND, "{what}: began {late:?} after its start");
}

/// A delayed start is admitted at once, pending with its start (its timeout counted from
/// there), and begins at its start.
async fn a_delayed_start_begins_at_its_time_not_before(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let delay = Duration::from_millis(600);
    let run = rt
        .start(stamped, ("later".to_owned(),))
        .delay(delay)
        .timeout(Duration::from_secs(60))
        .await
        .unwrap();
    let info = run.info().await.unwrap();
    let start = info.start_at.expect("its start is recorded");
    assert_eq!(
        start.duration_since(info.created_at).unwrap(),
        delay,
        "the delay counts from admission"
    );
    assert_eq!(
        info.deadline,
        Some(start + Duration::from_secs(60)),
        "the timeout counts from the start"
    );
    // Nothing can have begun it before its start: it is pending while its start lies ahead.
    let seen = rt
        .store()
        .now()
        .await
        .unwrap()
        .unwrap_or_else(SystemTime::now);
    let pending = run.info().await.unwrap();
    if seen < start {
        assert_eq!(pending.status, RunStatus::Pending, "before its start");
        assert!(rt.store().events(&run.id()).await.unwrap().is_empty());
    }
    assert_eq!(run.return_value().await.unwrap(), "later");
    let first = first_event(&rt, run.id()).await;
    began_on_time(b, "delayed start", &run.info().await.unwrap(), &first);
}

/// A payload sent to a delayed run's token before its start waits for it: the run still
/// begins at its start, and then receives the payload.
async fn a_payload_does_not_begin_a_delayed_run_early(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("delayed-{}", RunId::new());
    let run = rt
        .start(hooked, (token.clone(),))
        .hook(token.clone())
        .delay(Duration::from_millis(500))
        .await
        .unwrap();
    let hook = rt
        .resume_hook(&token, "early".to_owned())
        .await
        .expect("the token is claimed at admission");
    assert_eq!(hook.run_id, run.id());
    assert_eq!(run.return_value().await.unwrap(), "early");
    let first = first_event(&rt, run.id()).await;
    began_on_time(
        b,
        "delayed start with a payload",
        &run.info().await.unwrap(),
        &first,
    );
}

/// A delayed run survives a restart: the runtime that admitted it stops before its start, a
/// new one on the same store begins it after its start.
async fn a_delayed_run_survives_a_restart(b: Backend) {
    let db = TestDb::new(b);
    let first_rt = db.runtime().await;
    let run = first_rt
        .start(stamped, ("after a restart".to_owned(),))
        .delay(Duration::from_millis(800))
        .await
        .unwrap();
    let id = run.id();
    first_rt.shutdown();
    drop(run);
    drop(first_rt);
    let second_rt = db.runtime().await;
    let info = second_rt.get_run(&id).info().await.unwrap();
    assert!(info.start_at.is_some(), "its start was stored");
    let out = second_rt
        .get_run(&id)
        .typed::<String>()
        .return_value()
        .await
        .unwrap();
    assert_eq!(out, "after a restart");
    let first = first_event(&second_rt, id).await;
    began_on_time(
        b,
        "delayed start after a restart",
        &second_rt.get_run(&id).info().await.unwrap(),
        &first,
    );
}

/// A start already passed begins at once: leased at admission like any start.
async fn a_start_at_in_the_past_begins_at_once(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let past = SystemTime::now() - Duration::from_secs(3600);
    let run = rt
        .start(stamped, ("now".to_owned(),))
        .start_at(past)
        .await
        .unwrap();
    let info = run.info().await.unwrap();
    assert_ne!(
        info.status,
        RunStatus::Pending,
        "leased at admission, not left for a worker's poll"
    );
    assert_eq!(
        info.start_at.map(|t| t
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis()),
        Some(
            past.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_millis()
        ),
        "the start is kept as given"
    );
    assert_eq!(run.return_value().await.unwrap(), "now");
}

/// Every run a runtime built with `.version(v)` starts records `v`: its own starts, the
/// children its runs start and the runs its schedules fire; `RunFilter::version` lists them
/// and no other run. A runtime without a version records none.
async fn runs_record_the_version_of_the_build_that_started_them(b: Backend) {
    let db = TestDb::new(b);
    let old = db.builder().version("1.0.0").build().await.unwrap();
    let before = old.start(stamped, ("old".to_owned(),)).await.unwrap();
    assert_eq!(before.return_value().await.unwrap(), "old");
    old.shutdown();
    drop(old);

    let rt = db
        .builder()
        .version("1.1.0")
        .schedule(Schedule::cron("starts.yearly", ticked, "0 0 1 1 *").unwrap())
        .build()
        .await
        .unwrap();
    let run = rt.start(parent, ("new".to_owned(),)).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), "new");
    let child = rt.runs(RunFilter::new().parent(run.id())).await.unwrap();
    assert_eq!(child.len(), 1);
    let fired = rt.trigger_schedule("starts.yearly").await.unwrap();
    assert!(!rt
        .get_run(&fired)
        .typed::<bool>()
        .return_value()
        .await
        .unwrap());

    let version = |id: RunId| {
        let rt = rt.clone();
        async move { rt.get_run(&id).info().await.unwrap().version }
    };
    assert_eq!(version(before.id()).await.as_deref(), Some("1.0.0"));
    for id in [run.id(), child[0].id, fired] {
        assert_eq!(version(id).await.as_deref(), Some("1.1.0"), "run {id}");
    }
    let listed = |v: &str| {
        let (rt, f) = (rt.clone(), RunFilter::new().version(v));
        async move {
            let mut ids: Vec<RunId> = rt.runs(f).await.unwrap().iter().map(|r| r.id).collect();
            ids.sort();
            ids
        }
    };
    let mut new = vec![run.id(), child[0].id, fired];
    new.sort();
    assert_eq!(listed("1.1.0").await, new);
    assert_eq!(listed("1.0.0").await, [before.id()]);
    assert!(listed("0.9.0").await.is_empty());

    let unversioned = db.runtime().await;
    let plain = unversioned
        .start(stamped, ("plain".to_owned(),))
        .await
        .unwrap();
    assert_eq!(plain.info().await.unwrap().version, None);
    assert_eq!(listed("1.1.0").await, new);
}

on_every_store!(
    a_delayed_start_begins_at_its_time_not_before,
    a_payload_does_not_begin_a_delayed_run_early,
    a_delayed_run_survives_a_restart,
    a_start_at_in_the_past_begins_at_once,
    runs_record_the_version_of_the_build_that_started_them,
);
