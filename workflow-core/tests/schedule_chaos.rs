//! Schedules under SIGKILL: three worker processes on one store each declare the same two
//! schedules, an every-second period and a 6-field cron of every second, while a random one
//! is SIGKILLed every 2 s and started again at once, for 60 s. Afterwards, read from the
//! store: every nominal second of the window has exactly one tick record per schedule, started,
//! with exactly one run whose argument names that tick; no nominal second has two runs; every
//! run completed with its tick's time. The worker processes are this test binary re-executed
//! (`child_main`). Each test prints a summary line on stderr.
//!
//! What the catch-up policy implies here: at every instant at least two of the three workers
//! are up (one is killed at a time and its replacement starts at once), so no tick's nominal
//! time passes while no worker is up: no tick is missed, and the policy
//! (the default, `CatchUp::Latest`) never applies. A tick recorded as skipped (missed, or for
//! any other reason) in the window is a failure. The overlap policy is `AllowAll`: a run whose
//! worker was killed goes on under another worker after its lease, and the next ticks must
//! not wait for it.
//!
//! The killer's choices come from a seed it prints; `WF_CHAOS_SEED=<seed>` replays them.
//!
//! Also, on every store, a worker stalled (its thread blocked for 4.5 s, its firing loop
//! with it) while it is the only one up: the ticks that fell due meanwhile fell due while a
//! worker was up, so they were not missed and start late, even with `CatchUp::None`.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{Backend, Place, TestDb, Worker};
use workflow_core::prelude::*;
use workflow_core::store::to_millis;
use workflow_core::{RunRecord, TickOutcome, TickRecord};

const WORKERS: usize = 3;
const KILL_EVERY: Duration = Duration::from_secs(2);
const CHAOS: Duration = Duration::from_secs(60);
/// A killed worker's runs go on elsewhere after this.
const LEASE: Duration = Duration::from_secs(2);
/// How long the runs may take to end, and the window's last tick to be recorded, after the
/// chaos.
const DRAIN: Duration = Duration::from_secs(30);
/// The whole test, from its first line to its last check.
const LIMIT: Duration = Duration::from_secs(150);

const EVERY: &str = "every-second";
const CRON: &str = "cron-second";

// ---------------------------------------------------------------------------------------------
// The workflows and the worker process

/// The every-second schedule's workflow: returns its tick's time (ms since the epoch).
#[workflow(name = "schedule_chaos.every")]
async fn every_beat(tick: ScheduleTick) -> Result<u64> {
    Ok(to_millis(tick.nominal))
}

/// The cron schedule's workflow.
#[workflow(name = "schedule_chaos.cron")]
async fn cron_beat(tick: ScheduleTick) -> Result<u64> {
    Ok(to_millis(tick.nominal))
}

/// The schedule named `name`, declared alike by every worker.
fn schedule(name: &str) -> Schedule {
    let s = match name {
        EVERY => Schedule::every(EVERY, every_beat, Duration::from_secs(1)),
        _ => Schedule::cron(CRON, cron_beat, "* * * * * *").expect("a valid expression"),
    };
    s.overlap(Overlap::AllowAll)
}

/// The worker process: declares both schedules on the store `WF_STORE` names and fires them
/// (and executes their runs) until it is killed.
#[test]
#[ignore = "entry point of the worker processes the schedule chaos tests spawn"]
fn child_main() {
    common::serve_worker(|b| {
        b.schedule(schedule(EVERY))
            .schedule(schedule(CRON))
            .lease(LEASE)
            .poll_interval(Duration::from_millis(50))
    });
}

// ---------------------------------------------------------------------------------------------
// The parent side

/// The worker processes; dropping it kills and reaps every one of them.
struct Fleet {
    env: Vec<(&'static str, String)>,
    workers: Vec<Worker>,
    /// Workers that exited without being killed: (pid, exit status).
    exits: Vec<(u32, String)>,
}

impl Fleet {
    fn start(env: Vec<(&'static str, String)>) -> Fleet {
        let mut fleet = Fleet {
            env,
            workers: Vec::new(),
            exits: Vec::new(),
        };
        fleet.workers = (0..WORKERS).map(|_| fleet.spawn()).collect();
        for w in &fleet.workers {
            w.line("READY", Duration::from_secs(30));
        }
        fleet
    }

    fn spawn(&self) -> Worker {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Worker::spawn(&env)
    }

    /// SIGKILLs worker `i` and starts its replacement at once (not waiting for it to be
    /// ready).
    fn kill_and_restart(&mut self, i: usize) {
        let victim = self.workers.swap_remove(i);
        victim.kill();
        let fresh = self.spawn();
        self.workers.push(fresh);
    }

    /// Replaces workers that exited by themselves, noting them.
    fn reap(&mut self) {
        for i in 0..self.workers.len() {
            if let Ok(Some(status)) = self.workers[i].child.try_wait() {
                self.exits.push((self.workers[i].pid(), status.to_string()));
                self.workers[i] = self.spawn();
            }
        }
    }
}

/// Keeps a failed test's files (the SQLite database) and says where they are.
struct KeepOnFailure(Option<tempfile::TempDir>);

impl Drop for KeepOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.0.take() {
                eprintln!(
                    "schedule chaos: the failed test's files are kept in {}",
                    dir.keep().display()
                );
            }
        }
    }
}

fn bounded<F: Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(LIMIT, f)
            .await
            .unwrap_or_else(|_| panic!("schedule chaos test timed out after {LIMIT:?}"))
    })
}

/// The first whole second at or after `t`, in ms since the epoch.
fn ceil_second(t: SystemTime) -> u64 {
    to_millis(t).div_ceil(1000) * 1000
}

/// What one schedule's record says about the window.
#[derive(Default)]
struct Tally {
    /// Nominal seconds in the window.
    expected: usize,
    /// Runs of the schedule's workflow whose tick lies in the window.
    runs: usize,
    /// Runs beyond the first for one nominal time (over the whole test, not only the window).
    duplicates: usize,
    /// Nominal seconds of the window without a started tick and its one run.
    missed: usize,
}

/// Checks schedule `name` (whose runs are of `workflow`) over the nominal seconds `from..=to`
/// (ms), adding what is wrong to `problems`.
fn check(
    name: &str,
    ticks: &[TickRecord],
    runs: &[RunRecord],
    (from, to): (u64, u64),
    problems: &mut Vec<String>,
) -> Tally {
    let mut tally = Tally::default();
    // Runs by the nominal time of their tick, read from their argument.
    let mut by_nominal: HashMap<u64, Vec<&RunRecord>> = HashMap::new();
    for r in runs {
        match serde_json::from_value::<ScheduleTick>(r.input[0].clone()) {
            Ok(t) if t.schedule == name && !t.backfill => {
                by_nominal.entry(to_millis(t.nominal)).or_default().push(r)
            }
            Ok(t) => problems.push(format!("{name}: run {} has the argument {t:?}", r.id)),
            Err(e) => problems.push(format!("{name}: run {} has no tick: {e}", r.id)),
        }
    }
    for (nominal, rs) in &by_nominal {
        if rs.len() > 1 {
            tally.duplicates += rs.len() - 1;
            let ids: Vec<String> = rs.iter().map(|r| r.id.to_string()).collect();
            problems.push(format!("{name}: the tick of {nominal} ms has {ids:?}"));
        }
        for r in rs {
            let want = serde_json::json!(nominal);
            if r.status != RunStatus::Completed || r.output.as_ref() != Some(&want) {
                problems.push(format!(
                    "{name}: run {} of the tick of {nominal} ms is {} with {:?} ({:?})",
                    r.id, r.status, r.output, r.error
                ));
            }
        }
    }
    let records: HashMap<u64, &TickRecord> =
        ticks.iter().map(|t| (to_millis(t.nominal), t)).collect();
    let mut missed = Vec::new();
    for second in (from..=to).step_by(1000) {
        tally.expected += 1;
        let rs = by_nominal.get(&second).map_or(&[][..], Vec::as_slice);
        tally.runs += rs.len();
        let ok = match records.get(&second) {
            Some(t) => {
                t.outcome == TickOutcome::Started && rs.len() == 1 && t.run_id == Some(rs[0].id)
            }
            None => false,
        };
        if !ok {
            tally.missed += 1;
            missed.push(format!(
                "{second}: {:?}, runs {:?}",
                records.get(&second).map(|t| (t.outcome, t.run_id)),
                rs.iter().map(|r| r.id).collect::<Vec<_>>()
            ));
        }
    }
    if !missed.is_empty() {
        problems.push(format!(
            "{name}: {} of {} nominal seconds lack one started tick with its one run: {missed:?}",
            missed.len(),
            tally.expected
        ));
    }
    tally
}

/// Waits until `done` holds, polling every 200 ms, at most until `deadline`; whether it held.
async fn until<F: Future<Output = bool>>(deadline: Instant, mut done: impl FnMut() -> F) -> bool {
    loop {
        if done().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The whole test on `place`.
async fn schedule_chaos(place: Place) {
    let client = place
        .builder()
        .worker(false)
        .build()
        .await
        .expect("client runtime");
    let mut fleet = Fleet::start(place.env());
    // From the first whole second after every worker is up.
    let from = ceil_second(SystemTime::now()) + 1000;

    let seed = std::env::var("WF_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()) ^ to_millis(SystemTime::now()));
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let begin = Instant::now();
    let mut kills = 0;
    while begin.elapsed() < CHAOS {
        tokio::time::sleep(KILL_EVERY).await;
        fleet.reap();
        let i = rng.random_range(0..fleet.workers.len());
        fleet.kill_and_restart(i);
        kills += 1;
    }
    // To the last whole second before the chaos ended: the workers are still up.
    let to = ceil_second(SystemTime::now()) - 1000;

    // The window's last ticks recorded and every run ended, the workers still up.
    let deadline = Instant::now() + DRAIN;
    let c = &client;
    let recorded = until(deadline, || async move {
        let mut done = true;
        for name in [EVERY, CRON] {
            let ticks = c.schedule_ticks(name, 1).await.expect("ticks");
            done &= ticks.first().is_some_and(|t| to_millis(t.nominal) >= to);
        }
        done
    })
    .await;
    let ended = until(deadline, || async move {
        let runs = c.runs(RunFilter::new().limit(100_000)).await.expect("runs");
        runs.iter().all(|r| r.status.is_terminal())
    })
    .await;
    let exits = std::mem::take(&mut fleet.exits);
    drop(fleet);

    let mut problems = Vec::new();
    if !recorded {
        problems.push(format!(
            "the tick of {to} ms was not recorded within {DRAIN:?}"
        ));
    }
    if !ended {
        problems.push(format!("runs still going {DRAIN:?} after the chaos"));
    }
    if !exits.is_empty() {
        problems.push(format!("workers exited without being killed: {exits:?}"));
    }
    let mut summary = Vec::new();
    for (name, workflow) in [
        (EVERY, "schedule_chaos.every"),
        (CRON, "schedule_chaos.cron"),
    ] {
        let ticks = client.schedule_ticks(name, 1000).await.expect("ticks");
        let runs = client
            .runs(RunFilter::new().workflow(workflow).limit(100_000))
            .await
            .expect("runs");
        let t = check(name, &ticks, &runs, (from, to), &mut problems);
        summary.push(format!(
            "{name}: ticks expected {}, runs found {}, duplicates {}, missed {}",
            t.expected, t.runs, t.duplicates, t.missed
        ));
    }
    client.shutdown();
    // On the process's stderr itself: libtest captures `eprintln!`.
    let _ = writeln!(
        std::io::stderr(),
        "schedule chaos on {}: {WORKERS} workers, {kills} kills (every {} s, seed {seed}) over \
         {:.0} s; {}",
        place.name(),
        KILL_EVERY.as_secs(),
        CHAOS.as_secs_f64(),
        summary.join("; ")
    );
    assert!(
        problems.is_empty(),
        "schedule chaos on {} broke {} invariant(s):\n{}",
        place.name(),
        problems.len(),
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The tests: the two stores run in parallel (libtest's threads), each with its own workers.

#[cfg(feature = "postgres")]
#[test]
fn every_nominal_second_runs_once_while_workers_are_killed_on_postgres() {
    use workflow_core::store::postgres::PostgresStore;

    let Some(url) = common::postgres_url() else {
        return;
    };
    let schema = common::fresh_schema();
    bounded(async {
        if !common::postgres_reachable(&url, &schema).await {
            return;
        }
        schedule_chaos(Place::Postgres {
            url: url.clone(),
            schema: schema.clone(),
        })
        .await;
        // Only on success: a failed test's schema stays for a post-mortem.
        if let Ok(s) = PostgresStore::connect(&url, &schema).await {
            let _ = s.drop_schema().await;
        }
    });
}

#[cfg(feature = "sqlite")]
#[test]
fn every_nominal_second_runs_once_while_workers_are_killed_on_sqlite() {
    let dir = KeepOnFailure(Some(tempfile::tempdir().unwrap()));
    let path = dir.0.as_ref().unwrap().path().join("wf.db");
    bounded(schedule_chaos(Place::Sqlite { path }));
}

// ---------------------------------------------------------------------------------------------
// A stalled worker

#[workflow(name = "schedule_chaos.stalled")]
async fn stalled_beat(tick: ScheduleTick) -> Result<u64> {
    Ok(to_millis(tick.nominal))
}

/// The only worker, on a current-thread runtime whose thread the test blocks for 4.5 s: its
/// firing loop wakes late, with ticks due up to 4.5 s ago. They fell due while a worker was
/// up, so none was missed: with `CatchUp::None`, every one starts.
async fn a_stalled_worker_starts_the_ticks_that_fell_due_meanwhile(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .schedule(
            Schedule::every("stalled", stalled_beat, Duration::from_secs(1))
                .catch_up(CatchUp::None)
                .overlap(Overlap::AllowAll),
        )
        .build()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        let t = rt.schedule_ticks("stalled", 1).await.unwrap();
        if let Some(t) = t.first().filter(|t| t.outcome == TickOutcome::Started) {
            break to_millis(t.nominal);
        }
        assert!(Instant::now() < deadline, "no tick started within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Every task of this runtime, the firing loop included, waits for the thread.
    std::thread::sleep(Duration::from_millis(4500));
    let stalled_until = to_millis(SystemTime::now());
    let last = stalled_until.div_ceil(1000) * 1000 + 1000;
    let ticks = loop {
        let t = rt.schedule_ticks("stalled", 1000).await.unwrap();
        if t.first().is_some_and(|t| to_millis(t.nominal) >= last) {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "the ticks after the stall: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    rt.shutdown();
    let mut seen: Vec<(u64, TickOutcome)> = ticks
        .iter()
        .map(|t| (to_millis(t.nominal), t.outcome))
        .filter(|(n, _)| (first..=last).contains(n))
        .collect();
    seen.sort_unstable_by_key(|(n, _)| *n);
    let want: Vec<(u64, TickOutcome)> = (first..=last)
        .step_by(1000)
        .map(|n| (n, TickOutcome::Started))
        .collect();
    // At least four ticks fell due during the stall.
    assert!(want.len() >= 6, "{want:?}");
    assert_eq!(seen, want, "stalled from {first} ms to {stalled_until} ms");
}

/// One current-thread runtime per store (the stall must stop the firing loop too).
fn on_one_thread(b: Backend) {
    if !common::available(b) {
        return;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(common::bounded(
            a_stalled_worker_starts_the_ticks_that_fell_due_meanwhile(b),
        ));
}

#[test]
fn a_stalled_worker_starts_the_ticks_that_fell_due_meanwhile_on_memory() {
    on_one_thread(Backend::Memory);
}

#[test]
fn a_stalled_worker_starts_the_ticks_that_fell_due_meanwhile_on_sqlite() {
    on_one_thread(Backend::Sqlite);
}

#[test]
fn a_stalled_worker_starts_the_ticks_that_fell_due_meanwhile_on_postgres() {
    on_one_thread(Backend::Postgres);
}
