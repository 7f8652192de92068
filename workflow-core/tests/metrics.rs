//! The runtime's metrics as an application's recorder receives them: counts after completed,
//! failed and retried runs on every store, every attempt outcome (`ok`, `error`, `timeout`,
//! `panic`), histograms with samples, and no run id in any label.
//!
//! A recorder is global to the process, so this binary installs one and its one test runs the
//! stores one after another, reading each store's counts as the difference of two snapshots.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use common::{available, Backend, TestDb};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use workflow_core::prelude::*;
use workflow_core::telemetry;

/// Failures left for [`m_flaky`] before it succeeds.
static FLAKY_FAILS: AtomicU32 = AtomicU32::new(0);

#[step]
async fn m_ok(n: u32) -> Result<u32> {
    Ok(n + 1)
}

#[step(max_retries = 3)]
async fn m_flaky(n: u32) -> Result<u32> {
    if FLAKY_FAILS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
        .is_ok()
    {
        return Err(Error::retryable("not yet"));
    }
    Ok(n)
}

#[step]
async fn m_fatal(n: u32) -> Result<u32> {
    Err(Error::fatal(format!("refused {n}")))
}

#[step(timeout = "50ms", max_retries = 0)]
async fn m_slow(n: u32) -> Result<u32> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(n)
}

#[step(max_retries = 0)]
async fn m_panics(n: u32) -> Result<u32> {
    if n < 1000 {
        panic!("step body panicked on purpose");
    }
    Ok(n)
}

/// One step, then a wait for a message: driven by one runtime up to the wait, replayed by
/// the next.
#[workflow]
async fn m_waits(n: u32) -> Result<u32> {
    let a = m_ok(n).await?;
    let b = recv::<u32>("go").await?;
    Ok(a + b)
}

/// A scheduled workflow, triggered by hand.
#[workflow]
async fn m_tick(tick: ScheduleTick) -> Result<bool> {
    Ok(tick.backfill)
}

/// Completes: two ok attempts, one flaky step that fails twice first.
#[workflow]
async fn m_completes(n: u32) -> Result<u32> {
    let a = m_ok(n).await?;
    let b = m_flaky(a).await?;
    Ok(b)
}

/// Fails: a fatal step, then the run fails with its error.
#[workflow]
async fn m_fails(n: u32) -> Result<u32> {
    m_fatal(n).await
}

/// Fails after a timed-out attempt and a panicking one, both handled.
#[workflow]
async fn m_times_out(n: u32) -> Result<u32> {
    let slow = m_slow(n).await;
    let panicked = m_panics(n).await;
    match (slow, panicked) {
        (Err(_), Err(_)) => Err(Error::fatal("both failed as planned")),
        _ => Ok(n),
    }
}

fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this process");
        snapshotter
    })
}

/// What a snapshot held: counters by (name, sorted labels), histogram sample counts likewise,
/// and every label value seen.
#[derive(Default)]
struct Seen {
    counters: HashMap<(String, Vec<(String, String)>), u64>,
    samples: HashMap<(String, Vec<(String, String)>), usize>,
    label_values: Vec<String>,
}

fn read() -> Seen {
    let mut seen = Seen::default();
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        seen.label_values
            .extend(labels.iter().map(|(_, v)| v.clone()));
        let id = (key.name().to_owned(), labels);
        match value {
            DebugValue::Counter(n) => {
                seen.counters.insert(id, n);
            }
            DebugValue::Histogram(v) => {
                *seen.samples.entry(id).or_default() += v.len();
            }
            DebugValue::Gauge(_) => {}
        }
    }
    seen
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    v.sort();
    v
}

fn count(seen: &Seen, name: &str, pairs: &[(&str, &str)]) -> u64 {
    seen.counters
        .get(&(name.to_owned(), labels(pairs)))
        .copied()
        .unwrap_or(0)
}

/// The workflow's registered name as the metrics label it.
fn name_of(store_name: &str, runs: &[(String, RunStatus)]) -> String {
    runs.iter()
        .find(|(w, _)| w.ends_with(store_name))
        .map(|(w, _)| w.clone())
        .unwrap_or_default()
}

async fn exercise(backend: Backend) {
    let db = TestDb::new(backend);
    let before = read();
    // A run whose step is recorded by a runtime that then stops: the next one replays it.
    // A short lease: the stopped runtime's lease expires soon for the next one.
    let first = db.runtime_with_lease(Duration::from_secs(1)).await;
    let waits = first.start(m_waits, (10,)).await.unwrap().id();
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let events = first.store().events(&waits).await.unwrap();
            if events
                .iter()
                .any(|e| matches!(e.event, workflow_core::store::Event::StepCompleted { .. }))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the first runtime records the step");
    first.shutdown();
    drop(first);
    let rt = db.runtime().await;
    rt.get_run(&waits).send("go", 5u32).await.unwrap();
    FLAKY_FAILS.store(2, Ordering::SeqCst);
    let ok = rt.start(m_completes, (1,)).await.unwrap();
    let failed = rt.start(m_fails, (2,)).await.unwrap();
    let timed = rt.start(m_times_out, (3,)).await.unwrap();
    let limit = Duration::from_secs(30);
    let ok_value = tokio::time::timeout(limit, ok.return_value())
        .await
        .unwrap();
    assert_eq!(ok_value.unwrap(), 2);
    assert!(tokio::time::timeout(limit, failed.return_value())
        .await
        .unwrap()
        .is_err());
    assert!(tokio::time::timeout(limit, timed.return_value())
        .await
        .unwrap()
        .is_err());
    // Ticks fall on multiples of the period since the epoch: with an hourly period a test
    // running across the top of an hour saw a second tick. This one's first is centuries away,
    // so the trigger's is the only one.
    rt.create_schedule(workflow_core::Schedule::every(
        "m-rare",
        m_tick,
        Duration::from_secs(1_000 * 365 * 86_400),
    ))
    .await
    .unwrap();
    let ticked = rt.trigger_schedule("m-rare").await.unwrap();
    tokio::time::timeout(limit, rt.get_run(&ticked).typed::<bool>().return_value())
        .await
        .expect("the triggered run ends")
        .unwrap();
    let resumed = tokio::time::timeout(limit, rt.get_run(&waits).typed::<u32>().return_value())
        .await
        .expect("the replayed run ends");
    assert_eq!(resumed.unwrap(), 16);
    let ids = [ok.id(), failed.id(), timed.id(), waits].map(|id| id.to_string());
    let records = [&ok, &failed, &timed];
    let mut names = Vec::new();
    for r in records {
        let info = r.info().await.unwrap();
        names.push((info.workflow.clone(), info.status));
    }
    let tick_workflow = rt.get_run(&ticked).info().await.unwrap().workflow;
    let after = read();
    let delta = |name: &str, pairs: &[(&str, &str)]| {
        count(&after, name, pairs) - count(&before, name, pairs)
    };
    let completes = name_of("m_completes", &names);
    let fails = name_of("m_fails", &names);
    let times_out = name_of("m_times_out", &names);
    for w in [&completes, &fails, &times_out] {
        assert_eq!(
            delta(telemetry::RUNS_STARTED, &[("workflow", w)]),
            1,
            "{w} started"
        );
    }
    let ended = |w: &str, status: &str| {
        delta(
            telemetry::RUNS_ENDED,
            &[("workflow", w), ("status", status)],
        )
    };
    assert_eq!(ended(&completes, "completed"), 1, "{backend:?}");
    assert_eq!(ended(&fails, "failed"), 1, "{backend:?}");
    assert_eq!(ended(&times_out, "failed"), 1, "{backend:?}");
    assert_eq!(ended(&completes, "failed"), 0, "{backend:?}");

    let step_names: Vec<String> = after
        .counters
        .keys()
        .filter(|(n, _)| n == telemetry::STEP_ATTEMPTS)
        .flat_map(|(_, l)| {
            l.iter()
                .filter(|(k, _)| k == "step")
                .map(|(_, v)| v.clone())
        })
        .collect();
    let step = |suffix: &str| {
        step_names
            .iter()
            .find(|s| s.ends_with(suffix))
            .cloned()
            .unwrap_or_else(|| panic!("no attempts of a step named *{suffix}: {step_names:?}"))
    };
    let attempts = |s: &str, outcome: &str| {
        delta(
            telemetry::STEP_ATTEMPTS,
            &[("step", s), ("outcome", outcome)],
        )
    };
    assert_eq!(
        attempts(&step("m_ok"), "ok"),
        2,
        "m_completes's and m_waits's (not again when m_waits is replayed)"
    );
    assert_eq!(attempts(&step("m_flaky"), "error"), 2, "two failed tries");
    assert_eq!(attempts(&step("m_flaky"), "ok"), 1, "then one that worked");
    assert_eq!(
        attempts(&step("m_fatal"), "error"),
        1,
        "a fatal error is not retried"
    );
    assert_eq!(attempts(&step("m_slow"), "timeout"), 1);
    assert_eq!(attempts(&step("m_panics"), "panic"), 1);

    for s in ["m_ok", "m_flaky", "m_slow"] {
        let n = after
            .samples
            .get(&(
                telemetry::STEP_DURATION.to_owned(),
                labels(&[("step", &step(s))]),
            ))
            .copied()
            .unwrap_or(0);
        assert!(n > 0, "{s}'s duration histogram has samples");
    }
    if backend != Backend::Memory {
        let store = if backend == Backend::Sqlite {
            "sqlite"
        } else {
            "postgres"
        };
        let commits: usize = after
            .samples
            .iter()
            .filter(|((n, l), _)| n == telemetry::STORE_COMMIT && *l == labels(&[("store", store)]))
            .map(|(_, n)| *n)
            .sum();
        assert!(commits > 0, "{store}'s commit histogram has samples");
    }
    assert_eq!(
        delta(
            telemetry::SCHEDULE_TICKS,
            &[("schedule", "m-rare"), ("outcome", "started")]
        ),
        1,
        "{backend:?}: the triggered tick"
    );
    assert_eq!(
        delta(telemetry::RUNS_STARTED, &[("workflow", &tick_workflow)]),
        1,
        "{backend:?}: the triggered tick's run counts among the runs started"
    );
    let replays = after
        .samples
        .get(&(telemetry::REPLAY.to_owned(), Vec::new()))
        .copied()
        .unwrap_or(0);
    assert!(replays > 0, "{backend:?}: the replay histogram has samples");
    for v in &after.label_values {
        assert!(
            !ids.iter().any(|id| v.contains(id.as_str())),
            "a label holds a run id: {v}"
        );
    }
    rt.shutdown();
    drop(rt);
    takeovers_and_cancels(&db).await;
}

/// `workflow_lease_takeovers_total` counts a run taken over from a worker whose lease expired
/// while it held the run, and nothing for runs begun, or given back on a wait and resumed;
/// `workflow_runs_ended_total{status="cancelled"}` counts a client's cancel once.
async fn takeovers_and_cancels(db: &TestDb) {
    let backend = db.backend;
    let before = read();
    let client = db.builder().worker(false).build().await.unwrap();
    let abandoned = client.start(m_completes, (7,)).await.unwrap();
    let workflow = abandoned.info().await.unwrap().workflow;
    // A worker that leases the run and dies: its lease is never renewed nor given back.
    let store = db.open_store().await;
    let now = store
        .now()
        .await
        .unwrap()
        .unwrap_or_else(std::time::SystemTime::now);
    let names = [workflow.clone()];
    let ghost = store
        .acquire(workflow_core::store::AcquireRequest {
            worker_id: "ghost",
            workflows: &names,
            lease: Duration::from_millis(300),
            limit: 1,
            now,
        })
        .await
        .unwrap();
    assert_eq!(
        ghost.len(),
        1,
        "{backend:?}: the ghost worker leases the run"
    );
    assert!(!ghost[0].took_over, "a fresh run is begun, not taken over");

    // The next worker takes it over once that lease expired, and finishes it. A run of its
    // own waits for a message meanwhile, is evicted, and is resumed: no takeover.
    let worker = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Duration::from_millis(10))
        .evict_after(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let limit = Duration::from_secs(30);
    let taken = tokio::time::timeout(limit, worker.get_run(&abandoned.id()).return_value())
        .await
        .expect("the run taken over ends");
    assert!(taken.is_ok(), "{backend:?}: {taken:?}");
    let waits = worker.start(m_waits, (1,)).await.unwrap();
    common::until_no_active_runs(&worker, "the waiting run is given back").await;
    waits.send("go", 1u32).await.unwrap();
    let resumed = tokio::time::timeout(limit, waits.return_value())
        .await
        .expect("the resumed run ends");
    assert_eq!(resumed.unwrap(), 3);

    // A client cancels a waiting run: counted once, by the process that cancelled it.
    let cancelled = worker.start(m_waits, (2,)).await.unwrap();
    client.get_run(&cancelled.id()).cancel().await.unwrap();
    client.get_run(&cancelled.id()).cancel().await.unwrap();
    assert_eq!(cancelled.info().await.unwrap().status, RunStatus::Cancelled);
    let waits_name = waits.info().await.unwrap().workflow;

    let after = read();
    let delta = |name: &str, pairs: &[(&str, &str)]| {
        count(&after, name, pairs) - count(&before, name, pairs)
    };
    assert_eq!(
        delta(telemetry::LEASE_TAKEOVERS, &[]),
        1,
        "{backend:?}: one run taken over; begun and resumed runs are not takeovers"
    );
    assert_eq!(
        delta(
            telemetry::RUNS_ENDED,
            &[("workflow", &waits_name), ("status", "cancelled")]
        ),
        1,
        "{backend:?}: the cancel, once"
    );
    assert_eq!(
        delta(
            telemetry::RUNS_ENDED,
            &[("workflow", &workflow), ("status", "completed")]
        ),
        1,
        "{backend:?}: the run taken over ended completed"
    );
    worker.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_outcomes_and_samples_on_every_store_without_run_ids() {
    snapshotter();
    for backend in [Backend::Memory, Backend::Sqlite, Backend::Postgres] {
        if available(backend) {
            tokio::time::timeout(Duration::from_secs(120), exercise(backend))
                .await
                .unwrap_or_else(|_| panic!("{backend:?} took over 120 s"));
        }
    }
}
