//! Chaos: three worker processes share one store while a killer SIGKILLs a random
//! one every 300 ms (and starts a replacement) and now and then SIGSTOPs one for longer than
//! its lease before SIGCONTing it, for 30 s. Afterwards every run must have its exact result,
//! every step exactly one recorded completion, and the step bodies must have run again no more
//! often than the kills and stops explain. The worker processes are this test binary
//! re-executed (`child_main`); they count step bodies in an append-only log file, so the
//! executions of killed processes are counted too. Each test prints its figures.
//!
//! The killer's choices come from a seed it prints; `WF_CHAOS_SEED=<seed>` replays them
//! (the timing of the processes, of course, differs from one try to the next).
#![cfg(any(feature = "sqlite", feature = "postgres"))]

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use common::{log_execution, read_log, Place, Worker};
use workflow_core::prelude::*;
use workflow_core::store::{Event, RunFilter, Store};
use workflow_core::RunId;

const RUNS: u64 = 500;
const STEPS: u64 = 20;
const WORKERS: usize = 3;
/// Runs one worker drives at once: its steps in flight, since each run awaits its steps one
/// after the other. A kill or a stop can send at most this many bodies to run again.
const MAX_ACTIVE: usize = 8;
const LEASE: Duration = Duration::from_millis(2000);
const KILL_EVERY: Duration = Duration::from_millis(300);
/// Longer than the lease: the other workers take the stopped one's runs over.
const STOP_FOR: Duration = Duration::from_millis(3000);
/// From the start of one stop to the start of the next.
const STOP_EVERY: Duration = Duration::from_millis(6000);
const CHAOS: Duration = Duration::from_secs(30);
/// How long the runs may take to end once the chaos is over.
const DRAIN: Duration = Duration::from_secs(45);
/// How long the probe for a write lock held by a stopped SQLite worker waits for it; the
/// other workers hold it for milliseconds at a time.
const PROBE: Duration = Duration::from_millis(500);
/// The whole test, from its first line to its last check.
const LIMIT: Duration = Duration::from_secs(120);
const STEP_MS: u64 = 50;

// ---------------------------------------------------------------------------------------------
// The workflow the workers run

/// Under chaos one step may be interrupted several times in a row, and an interrupted attempt
/// counts against `max_retries`: the result of a run must not depend on the killer's luck.
#[step(max_retries = 1000)]
async fn chaos_step(run: u64, i: u64) -> Result<u64> {
    log_execution(&format!("r{run}s{i}"));
    tokio::time::sleep(Duration::from_millis(STEP_MS)).await;
    Ok(value(run, i))
}

#[workflow]
async fn twenty_steps(run: u64) -> Result<u64> {
    let mut sum = 0;
    for i in 0..STEPS {
        sum += chaos_step(run, i).await?;
    }
    Ok(sum)
}

/// Step `i` of run `run` returns this: a result delivered to the wrong step or run shows.
fn value(run: u64, i: u64) -> u64 {
    run * 1000 + i * i
}

fn expected(run: u64) -> u64 {
    (0..STEPS).map(|i| value(run, i)).sum()
}

// ---------------------------------------------------------------------------------------------
// The worker process

/// The worker process: executes runs on the store `WF_STORE` names until it is killed. A panic
/// anywhere in it is appended to `WF_PANICS`, for the parent to report.
#[test]
#[ignore = "entry point of the worker processes the chaos tests spawn"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let panics = std::env::var("WF_PANICS").unwrap();
    std::panic::set_hook(Box::new(move |info| {
        let text = format!(
            "pid {}: {info}\n{}\n",
            std::process::id(),
            std::backtrace::Backtrace::force_capture()
        );
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&panics)
        {
            let _ = f.write_all(text.as_bytes());
        }
    }));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = Place::from_env();
        let _worker = store
            .builder()
            .worker(true)
            .lease(LEASE)
            .max_active_runs(MAX_ACTIVE)
            .poll_interval(Duration::from_millis(50))
            .retry_backoff(Duration::from_millis(10))
            .build()
            .await
            .expect("worker runtime");
        println!("READY");
        std::io::stdout().flush().unwrap();
        std::future::pending::<()>().await;
    });
}

impl Place {
    /// Whether someone holds the store's write lock for all of [`PROBE`] (if not, the probe
    /// takes it and gives it back at once). On SQLite a process stopped inside a write
    /// transaction keeps every other process from writing, their lease renewals included,
    /// until it resumes. (PostgreSQL has no such lock: a stopped worker holds only the rows
    /// of its own runs.)
    async fn write_lock_held(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => false,
            #[cfg(feature = "sqlite")]
            Place::Sqlite { path } => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || {
                    let conn = rusqlite::Connection::open(path).unwrap();
                    conn.busy_timeout(PROBE).unwrap();
                    match conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK") {
                        Ok(()) => false,
                        Err(e) => {
                            assert_eq!(
                                e.sqlite_error_code(),
                                Some(rusqlite::ErrorCode::DatabaseBusy),
                                "{e}"
                            );
                            true
                        }
                    }
                })
                .await
                .unwrap()
            }
        }
    }

    /// Where a failed test's data stays for a post-mortem.
    fn location(&self) -> String {
        match self {
            #[cfg(feature = "postgres")]
            Place::Postgres { schema, .. } => format!("schema {schema}"),
            #[cfg(feature = "sqlite")]
            Place::Sqlite { path } => path.display().to_string(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The parent side

/// The worker processes. Dropping it (also when a test fails) resumes a stopped worker and
/// kills and reaps every worker, so no process outlives the test.
struct Fleet {
    env: Vec<(&'static str, String)>,
    workers: Vec<Worker>,
    /// The stopped worker's pid, and when to resume it.
    stopped: Option<(u32, Instant)>,
    /// Workers that exited without being killed: (pid, exit status).
    exits: Vec<(u32, String)>,
}

impl Fleet {
    fn start(env: Vec<(&'static str, String)>, n: usize) -> Fleet {
        let mut fleet = Fleet {
            env,
            workers: Vec::new(),
            stopped: None,
            exits: Vec::new(),
        };
        fleet.workers = (0..n).map(|_| fleet.spawn()).collect();
        for w in &fleet.workers {
            w.line("READY", Duration::from_secs(20));
        }
        fleet
    }

    fn spawn(&self) -> Worker {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Worker::spawn(&env)
    }

    /// A random worker that is not stopped.
    fn pick(&self, rng: &mut ChaCha8Rng) -> usize {
        let stopped = self.stopped.map(|(pid, _)| pid);
        let candidates: Vec<usize> = (0..self.workers.len())
            .filter(|&i| Some(self.workers[i].pid()) != stopped)
            .collect();
        candidates[rng.random_range(0..candidates.len())]
    }

    /// SIGKILLs worker `i` and starts a replacement.
    fn kill_and_restart(&mut self, i: usize) {
        let victim = self.workers.swap_remove(i);
        victim.kill();
        let fresh = self.spawn();
        self.workers.push(fresh);
    }

    fn stop(&mut self, i: usize, until: Instant) {
        let w = &self.workers[i];
        w.signal("-STOP");
        self.stopped = Some((w.pid(), until));
    }

    /// Resumes the stopped worker, if any, once its time is up.
    fn resume_when_due(&mut self) {
        if let Some((pid, until)) = self.stopped {
            if Instant::now() >= until {
                cont(pid);
                self.stopped = None;
            }
        }
    }

    /// Replaces workers that exited by themselves, noting them.
    fn reap(&mut self) {
        for i in 0..self.workers.len() {
            if let Ok(Some(status)) = self.workers[i].child.try_wait() {
                self.exits.push((self.workers[i].pid(), status.to_string()));
                let fresh = self.spawn();
                self.workers[i] = fresh;
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // A stopped process is resumed before it is killed, as the test promised.
        for w in &self.workers {
            cont(w.pid());
        }
        // Each `Worker` kills and reaps its process when dropped.
        self.workers.clear();
    }
}

/// SIGCONT, ignoring failure (the process may be gone).
fn cont(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status();
}

/// Keeps a failed test's files (database, step log, panics) and says where they are.
struct KeepOnFailure(Option<tempfile::TempDir>);

impl Drop for KeepOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.0.take() {
                eprintln!(
                    "chaos: the failed test's files are kept in {}",
                    dir.keep().display()
                );
            }
        }
    }
}

/// Runs one chaos test at a time (each loads both cores of the test machine with its worker
/// processes), bounded so that a bug fails the test instead of hanging it.
fn bounded<F: Future>(f: F) -> F::Output {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(LIMIT, f)
            .await
            .unwrap_or_else(|_| panic!("chaos test timed out after {LIMIT:?}"))
    })
}

/// How many of the runs ended, and how many of those completed.
async fn progress(store: &dyn Store) -> (usize, usize) {
    let runs = store
        .list_runs(&RunFilter::new().limit(RUNS as usize + 1))
        .await
        .expect("list runs");
    let ended = runs.iter().filter(|r| r.status.is_terminal()).count();
    let completed = runs
        .iter()
        .filter(|r| r.status == RunStatus::Completed)
        .count();
    (ended, completed)
}

/// What the chaos did.
#[derive(Default)]
struct Chaos {
    kills: usize,
    stops: usize,
    /// Kills and stops per worker pid.
    faults: HashMap<u32, usize>,
    /// Stops that froze every process (SQLite: stopped inside a write transaction).
    freezes: usize,
    /// Per worker pid, the freezes it lived through without being the stopped one: its
    /// leases may lapse as if it had been stopped itself.
    frozen: HashMap<u32, usize>,
    took: Duration,
    seed: u64,
}

/// The whole test on `place`: start the runs, three workers, the chaos, then check.
async fn chaos(place: Place, files: &Path) {
    let started = Instant::now();
    let log = files.join("steps.log");
    let panics = files.join("panics.log");
    let client = place
        .builder()
        .worker(false)
        .build()
        .await
        .expect("client runtime");
    let store = client.store().clone();

    let starts = (0..RUNS).map(|n| {
        let client = client.clone();
        async move { (n, client.start(twenty_steps, (n,)).await.unwrap().id()) }
    });
    let runs: Vec<(u64, RunId)> = futures::future::join_all(starts).await;

    let mut env = place.env();
    env.push(("WF_LOG", log.to_str().unwrap().to_owned()));
    env.push(("WF_PANICS", panics.to_str().unwrap().to_owned()));
    let mut fleet = Fleet::start(env, WORKERS);

    let done = run_chaos(&place, &mut fleet, &*store).await;
    // A stop that began near the end still lasts longer than the lease.
    if let Some((_, until)) = fleet.stopped {
        tokio::time::sleep_until(until.into()).await;
    }
    fleet.resume_when_due();
    let drained = Instant::now();
    loop {
        let (ended, _) = progress(&*store).await;
        if ended == RUNS as usize {
            break;
        }
        if drained.elapsed() > DRAIN {
            // Stop here with the figures so far: the checks below name the runs.
            eprintln!(
                "chaos on {}: only {ended} of {RUNS} runs ended within {DRAIN:?} after the chaos",
                place.name()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed();
    let exits = std::mem::take(&mut fleet.exits);
    drop(fleet);

    let mut problems = Vec::new();
    check_results(&*store, &runs, &mut problems).await;
    let duplicates = check_histories(&*store, &runs, &mut problems).await;
    let bodies = check_log(&log, &done, &mut problems);
    let frozen: usize = done.frozen.values().sum();
    let bound = (done.kills + done.stops + frozen) * MAX_ACTIVE;
    println!(
        "chaos on {}: {RUNS} runs x {STEPS} steps on {WORKERS} worker processes \
         (max {MAX_ACTIVE} runs each, lease {} ms, seed {})\n  \
         chaos {:.1} s: kills {}, stops {} ({} ms each; {} of them froze the other \
         processes, {frozen} in all, by holding the store's write lock)\n  \
         step bodies executed {}, re-executed {} \
         (bound (kills + stops + processes frozen) x {MAX_ACTIVE} = {bound}; \
         {} after a kill, stop or freeze of the process, {} in processes that had none), \
         duplicate completions {duplicates}\n  \
         wall time {:.1} s from the first start to the end of the last run",
        place.name(),
        LEASE.as_millis(),
        done.seed,
        done.took.as_secs_f64(),
        done.kills,
        done.stops,
        STOP_FOR.as_millis(),
        done.freezes,
        bodies.executed,
        bodies.re_executed,
        bodies.re_executed - bodies.unexplained,
        bodies.unexplained,
        wall.as_secs_f64(),
    );
    if bodies.re_executed > bound {
        problems.push(format!(
            "{} step bodies ran again, more than (kills + stops + processes frozen) x \
             {MAX_ACTIVE} = {bound}",
            bodies.re_executed
        ));
    }
    if !exits.is_empty() {
        problems.push(format!("workers exited without being killed: {exits:?}"));
    }
    let panicked = std::fs::read_to_string(&panics).unwrap_or_default();
    if !panicked.is_empty() {
        problems.push(format!("a worker panicked:\n{panicked}"));
    }
    assert!(
        problems.is_empty(),
        "chaos on {} ({}) broke {} invariant(s):\n{}",
        place.name(),
        place.location(),
        problems.len(),
        problems.join("\n")
    );
}

/// Kills a random worker every [`KILL_EVERY`] and stops one every [`STOP_EVERY`], for
/// [`CHAOS`] or until every run ended.
async fn run_chaos(place: &Place, fleet: &mut Fleet, store: &dyn Store) -> Chaos {
    let seed = std::env::var("WF_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            u64::from(std::process::id())
                ^ workflow_core::store::to_millis(std::time::SystemTime::now())
        });
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut chaos = Chaos {
        seed,
        ..Chaos::default()
    };
    let begin = Instant::now();
    let mut next_stop = begin + STOP_EVERY / 2;
    let mut next_look = begin;
    while begin.elapsed() < CHAOS {
        tokio::time::sleep(KILL_EVERY).await;
        fleet.reap();
        fleet.resume_when_due();
        let now = Instant::now();
        if fleet.stopped.is_none() && now >= next_stop {
            let i = fleet.pick(&mut rng);
            let stopped = fleet.workers[i].pid();
            *chaos.faults.entry(stopped).or_default() += 1;
            fleet.stop(i, now + STOP_FOR);
            chaos.stops += 1;
            next_stop = now + STOP_EVERY;
            if place.write_lock_held().await {
                chaos.freezes += 1;
                for w in fleet.workers.iter().filter(|w| w.pid() != stopped) {
                    *chaos.frozen.entry(w.pid()).or_default() += 1;
                }
            }
        }
        let i = fleet.pick(&mut rng);
        *chaos.faults.entry(fleet.workers[i].pid()).or_default() += 1;
        fleet.kill_and_restart(i);
        chaos.kills += 1;
        if now >= next_look {
            next_look = now + Duration::from_secs(1);
            if progress(store).await.0 == RUNS as usize {
                break;
            }
        }
    }
    chaos.took = begin.elapsed();
    chaos
}

/// Every run completed with its exact expected result.
async fn check_results(store: &dyn Store, runs: &[(u64, RunId)], problems: &mut Vec<String>) {
    let records: HashMap<RunId, _> = store
        .list_runs(&RunFilter::new().limit(RUNS as usize + 1))
        .await
        .expect("list runs")
        .into_iter()
        .map(|r| (r.id, r))
        .collect();
    let mut wrong = Vec::new();
    for (n, id) in runs {
        let Some(r) = records.get(id) else {
            wrong.push(format!("run {n} ({id}) is missing"));
            continue;
        };
        let want = serde_json::json!(expected(*n));
        if r.status != RunStatus::Completed || r.output.as_ref() != Some(&want) {
            wrong.push(format!(
                "run {n} ({id}): {} output {:?} error {:?}, expected completed with {want}",
                r.status, r.output, r.error
            ));
        }
    }
    if !wrong.is_empty() {
        problems.push(format!(
            "{} of {RUNS} runs did not complete with the expected result; the first: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        ));
    }
}

/// Each run's history: every step scheduled once and completed once, successfully; the run
/// completed once. Returns the number of extra completions (duplicates).
async fn check_histories(
    store: &dyn Store,
    runs: &[(u64, RunId)],
    problems: &mut Vec<String>,
) -> usize {
    let mut duplicates = 0;
    let mut bad = Vec::new();
    for (n, id) in runs {
        let events = store.events(id).await.expect("events");
        let (mut scheduled, mut completed) = (HashMap::new(), HashMap::new());
        let mut run_ends = 0;
        for e in &events {
            match &e.event {
                Event::StepScheduled { step_id, .. } => *scheduled.entry(step_id).or_insert(0) += 1,
                Event::StepCompleted { step_id, result } => {
                    *completed.entry(step_id).or_insert(0) += 1;
                    if let Err(err) = result {
                        bad.push(format!("run {n} ({id}): step {step_id} failed: {err}"));
                    }
                }
                Event::RunCompleted { .. } | Event::RunFailed { .. } | Event::RunCancelled => {
                    run_ends += 1
                }
                _ => {}
            }
        }
        let extra: usize = completed.values().map(|c| c - 1).sum();
        if extra > 0 || scheduled.values().any(|&c| c > 1) {
            let kinds: Vec<String> = events
                .iter()
                .map(|e| format!("{}:{}", e.seq, e.event.kind()))
                .collect();
            bad.push(format!(
                "run {n} ({id}): a step completed or was scheduled twice: {kinds:?}"
            ));
        }
        duplicates += extra;
        if completed.len() != STEPS as usize || run_ends != 1 {
            bad.push(format!(
                "run {n} ({id}): {} steps completed, {run_ends} end(s) recorded",
                completed.len()
            ));
        }
    }
    if !bad.is_empty() {
        problems.push(format!(
            "{} histories break the rules; the first: {:#?}",
            bad.len(),
            &bad[..bad.len().min(5)]
        ));
    }
    duplicates
}

/// What the step log says.
struct Bodies {
    executed: usize,
    /// Executions beyond the first of each step.
    re_executed: usize,
    /// Of those, the ones whose earlier attempt ran in a process never killed or stopped.
    unexplained: usize,
}

/// Every step's body ran at least once, each attempt at most once, and always for the same
/// step (the label) under one step id. A body runs again only because an earlier attempt did
/// not count: each such attempt is charged to the process that ran it, and a process may be
/// charged at most [`MAX_ACTIVE`] per kill, stop or freeze it suffered.
fn check_log(log: &Path, chaos: &Chaos, problems: &mut Vec<String>) -> Bodies {
    let lines = read_log(log);
    let mut label_of: HashMap<&str, &str> = HashMap::new();
    let mut attempts: HashMap<&str, Vec<(u32, u32)>> = HashMap::new();
    let mut bad = Vec::new();
    for (step_id, attempt, label, pid) in &lines {
        let first = label_of.entry(step_id).or_insert(label);
        if first != label {
            bad.push(format!("step id {step_id} ran as {first} and as {label}"));
        }
        attempts.entry(step_id).or_default().push((*attempt, *pid));
    }
    // Attempts that did not count, by the process that ran them.
    let mut charged: HashMap<u32, usize> = HashMap::new();
    for (step_id, runs) in &mut attempts {
        runs.sort_unstable();
        for pair in runs.windows(2) {
            if pair[0].0 == pair[1].0 {
                bad.push(format!(
                    "step {step_id} ran attempt {} twice (pids {} and {})",
                    pair[0].0, pair[0].1, pair[1].1
                ));
            }
        }
        for &(_, pid) in &runs[..runs.len() - 1] {
            *charged.entry(pid).or_default() += 1;
        }
    }
    if !bad.is_empty() {
        problems.push(format!(
            "{} step log entries break the rules, e.g. {:?}",
            bad.len(),
            &bad[..bad.len().min(5)]
        ));
    }
    let distinct = label_of.len();
    if distinct != (RUNS * STEPS) as usize {
        problems.push(format!(
            "{distinct} distinct steps ran, expected {}",
            RUNS * STEPS
        ));
    }
    let mut unexplained = 0;
    for (pid, n) in &charged {
        let faults = chaos.faults.get(pid).copied().unwrap_or(0)
            + chaos.frozen.get(pid).copied().unwrap_or(0);
        if faults == 0 {
            unexplained += n;
        } else if *n > faults * MAX_ACTIVE {
            problems.push(format!(
                "{n} attempts of process {pid} ran again after its {faults} kill(s), stop(s) \
                 and freeze(s), more than {MAX_ACTIVE} each"
            ));
        }
    }
    Bodies {
        executed: lines.len(),
        re_executed: lines.len() - distinct,
        unexplained,
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

#[cfg(feature = "postgres")]
#[test]
fn chaos_on_postgres() {
    use workflow_core::store::postgres::PostgresStore;

    let Some(url) = common::postgres_url() else {
        return;
    };
    let schema = common::fresh_schema();
    let dir = KeepOnFailure(Some(tempfile::tempdir().unwrap()));
    let files = dir.0.as_ref().unwrap().path().to_owned();
    bounded(async {
        if !common::postgres_reachable(&url, &schema).await {
            return;
        }
        let place = Place::Postgres {
            url: url.clone(),
            schema: schema.clone(),
        };
        chaos(place, &files).await;
        // Only on success: a failed test's schema stays for a post-mortem.
        if let Ok(s) = PostgresStore::connect(&url, &schema).await {
            let _ = s.drop_schema().await;
        }
    });
}

#[cfg(feature = "sqlite")]
#[test]
fn chaos_on_sqlite() {
    let dir = KeepOnFailure(Some(tempfile::tempdir().unwrap()));
    let files = dir.0.as_ref().unwrap().path().to_owned();
    bounded(chaos(
        Place::Sqlite {
            path: files.join("wf.db"),
        },
        &files,
    ));
}
