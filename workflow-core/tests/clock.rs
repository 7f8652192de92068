//! One clock on PostgreSQL: worker and client processes whose system clocks are an
//! hour off (run under `faketime`) neither steal live leases, nor fire timers early or late,
//! nor reopen a retained token, because every time they write or compare is on the database
//! server's clock. The processes are this test binary re-executed (`child_main`); each test
//! uses a schema of its own.
#![cfg(feature = "postgres")]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use common::{fresh_schema, log_execution, postgres_url, read_log, Worker};
use workflow_core::prelude::*;
use workflow_core::store::postgres::PostgresStore;
use workflow_core::store::{from_millis, Event, EventRecord, RunFilter};

/// Lease of the worker processes: short, so that a wrong clock would show within seconds.
const LEASE: Duration = Duration::from_millis(2000);
const POLL: Duration = Duration::from_millis(50);
/// The durable sleep of the timer tests.
const NAP: Duration = Duration::from_secs(8);
/// How far a recorded time may be from the database's clock around it: generous for a busy
/// 2-core machine, and 1800 times smaller than the skew under test.
const SLACK: Duration = Duration::from_secs(2);
/// The token retention of the retention tests.
const RETENTION: Duration = Duration::from_secs(30 * 60);
/// The skews under test: `faketime` offsets.
const AHEAD: &str = "+1h";
const BEHIND: &str = "-1h";
const HOUR_MS: i64 = 3_600_000;

#[step]
async fn hold_until(gate: String) -> Result<u32> {
    log_execution("hold");
    // Bounded: a test that never opens the gate still ends.
    let deadline = Instant::now() + Duration::from_secs(90);
    while !Path::new(&gate).exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(std::process::id())
}

/// Holds its worker's lease until the file `gate` exists; returns the pid that ran it.
#[workflow]
async fn holds(gate: String) -> Result<u32> {
    hold_until(gate).await
}

#[workflow]
async fn naps(ms: u64) -> Result<()> {
    sleep(Duration::from_millis(ms)).await;
    Ok(())
}

#[workflow]
async fn quick() -> Result<u32> {
    Ok(7)
}

fn env_ms(name: &str, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(default, Duration::from_millis)
}

async fn runtime(url: &str, schema: &str, worker: bool) -> Runtime {
    Runtime::builder()
        .postgres(url)
        .schema(schema)
        .lease(env_ms("WF_LEASE_MS", LEASE))
        .evict_after(env_ms("WF_EVICT_MS", Duration::from_secs(60)))
        .poll_interval(POLL)
        .retry_backoff(Duration::from_millis(10))
        .worker(worker)
        .build()
        .await
        .expect("runtime on PostgreSQL")
}

fn say(line: String) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// The worker and client processes. `WF_MODE`:
/// - `work`: a worker;
/// - `hold:<gate>`: a worker that starts `holds(gate)` and prints `RUN <id>`;
/// - `nap:<ms>`: a worker that starts `naps(ms)` and prints `RUN <id>`; with `WF_EVICT_MS=0`
///   it then waits until the run is evicted, stops working and prints `IDLE`;
/// - `once:<token>`: starts `quick` with the token retained for [`RETENTION`], waits for its
///   end and prints `RUN <id>`;
/// - `dup:<token>`: a client that prunes runs ended more than a minute ago, prints
///   `PRUNED <n>`, then starts `quick` with the token and prints `DUP conflict <owner>` or
///   `DUP started <id>`.
///
/// Every process first prints `READY <its wall clock in ms>`.
#[test]
#[ignore = "entry point of the processes the clock tests spawn"]
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
        let worker = matches!(parts[0], "work" | "hold" | "nap" | "once");
        let rt = runtime(&url, &schema, worker).await;
        say(format!(
            "READY {}",
            workflow_core::store::to_millis(SystemTime::now())
        ));
        match parts.as_slice() {
            ["work"] => std::future::pending::<()>().await,
            ["hold", gate] => {
                let run = rt.start(holds, (gate.to_string(),)).await.unwrap();
                say(format!("RUN {}", run.id()));
                std::future::pending::<()>().await
            }
            ["nap", ms] => {
                let run = rt.start(naps, (ms.parse::<u64>().unwrap(),)).await.unwrap();
                say(format!("RUN {}", run.id()));
                if env_ms("WF_EVICT_MS", Duration::from_secs(60)).is_zero() {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while rt.active_runs() > 0 && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    rt.shutdown();
                    say("IDLE".to_owned());
                }
                std::future::pending::<()>().await
            }
            ["once", token] => {
                let run = rt
                    .start(quick, ())
                    .hook(*token)
                    .min_retention(RETENTION)
                    .await
                    .unwrap();
                assert_eq!(run.return_value().await.unwrap(), 7);
                say(format!("RUN {}", run.id()));
            }
            ["dup", token] => {
                let pruned = rt.prune(Duration::from_secs(60)).await.unwrap();
                say(format!("PRUNED {}", pruned.runs));
                match rt
                    .start(quick, ())
                    .hook(*token)
                    .min_retention(RETENTION)
                    .await
                {
                    Ok(run) => say(format!("DUP started {}", run.id())),
                    Err(StartError::HookConflict(c)) => {
                        say(format!("DUP conflict {}", c.conflicting_run_id))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            other => panic!("unknown mode {other:?}"),
        }
    });
}

/// libfaketime, or `None` (the test is skipped) when it is not installed; under `CI=true` a
/// missing libfaketime fails the test instead. Preloaded directly rather than through the
/// `faketime` program, which forks: the worker's pid would not be the one killed.
fn libfaketime() -> Option<PathBuf> {
    let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
    let found = ["lib/faketime", &format!("lib/{multiarch}/faketime")]
        .iter()
        .flat_map(|dir| ["/usr", "/usr/local"].map(|prefix| Path::new(prefix).join(dir)))
        .flat_map(|dir| ["libfaketimeMT.so.1", "libfaketime.so.1"].map(|lib| dir.join(lib)))
        .find(|p| p.is_file());
    if found.is_none() {
        common::skip("libfaketime is not installed (apt-get install faketime)");
    }
    found
}

/// One test's schema, log and gate files, and the processes it spawns.
struct Cluster {
    url: String,
    schema: String,
    libfaketime: PathBuf,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn new() -> Option<Cluster> {
        let libfaketime = libfaketime()?;
        let url = postgres_url()?;
        Some(Cluster {
            url,
            schema: fresh_schema(),
            libfaketime,
            dir: tempfile::tempdir().unwrap(),
        })
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("steps.log")
    }

    /// A process in `mode`, its clock off by `skew` (a `faketime` offset) if given. Waits for
    /// its `READY` and checks that its clock reads what `skew` says, so that a libfaketime
    /// that had no effect cannot pass the test.
    fn spawn(&self, skew: Option<&str>, mode: &str, env: &[(&str, &str)]) -> Worker {
        let log = self.log();
        let mut vars = vec![
            ("WF_PG_URL", self.url.as_str()),
            ("WF_SCHEMA", self.schema.as_str()),
            ("WF_LOG", log.to_str().unwrap()),
            ("WF_MODE", mode),
        ];
        if let Some(skew) = skew {
            vars.extend([
                ("LD_PRELOAD", self.libfaketime.to_str().unwrap()),
                ("FAKETIME", skew),
                // Only the wall clock is off: tokio's timers (the monotonic clock) run true.
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ]);
        }
        vars.extend_from_slice(env);
        let w = Worker::spawn(&vars);
        let their: i64 = w.line("READY ", Duration::from_secs(60)).parse().unwrap();
        let ours = workflow_core::store::to_millis(SystemTime::now()) as i64;
        let expected = match skew {
            None => 0,
            Some(AHEAD) => HOUR_MS,
            Some(BEHIND) => -HOUR_MS,
            Some(other) => panic!("unknown skew {other}"),
        };
        let off = their - ours - expected;
        assert!(
            off.abs() < 60_000,
            "the process's clock reads {their}, ours {ours}: not off by {expected} ms"
        );
        w
    }

    async fn store(&self) -> PostgresStore {
        PostgresStore::connect(&self.url, &self.schema)
            .await
            .expect("store on PostgreSQL")
    }
}

impl Drop for Cluster {
    /// Drops the test's schema, also after a failure (the processes are gone by then: they
    /// are dropped inside the test's body).
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema.clone());
        // Drop cannot await: clean up on a thread and runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let connected = PostgresStore::connect(&url, &schema);
                if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(30), connected).await {
                    let _ = tokio::time::timeout(Duration::from_secs(30), s.drop_schema()).await;
                }
            });
        })
        .join();
    }
}

/// The database server's clock.
async fn db_now(store: &PostgresStore) -> SystemTime {
    store.now().await.unwrap().expect("PostgreSQL has a clock")
}

/// Runs one test at a time (each starts processes; a 2-core machine is easily starved), on a
/// runtime of its own, bounded.
fn bounded<F: std::future::Future>(f: F) -> F::Output {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(240), f)
            .await
            .expect("test timed out")
    })
}

/// Waits (bounded) until `check` says yes.
async fn until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `holder` drives a run that holds its lease (renewed by heartbeats) for several leases
/// while `taker`, with its own clock, polls for work the whole time: the run must stay with
/// `holder`, its step run once.
fn no_live_lease_is_stolen(holder_skew: Option<&str>, taker_skew: Option<&str>) {
    let Some(c) = Cluster::new() else { return };
    bounded(async {
        let client = runtime(&c.url, &c.schema, false).await;
        let gate = c.dir.path().join("gate");
        // The holder admits the run itself, so it holds the lease from the start.
        let holder = c.spawn(holder_skew, &format!("hold:{}", gate.display()), &[]);
        let id: RunId = holder
            .line("RUN ", Duration::from_secs(60))
            .parse()
            .unwrap();
        let run = client.get_run(&id).typed::<u32>();
        until(
            "the holder runs the step",
            Duration::from_secs(30),
            || async { !read_log(&c.log()).is_empty() },
        )
        .await;
        let taker = c.spawn(taker_skew, "work", &[]);
        // Three leases' worth of polls by the taker while the holder renews its lease.
        tokio::time::sleep(LEASE * 3).await;
        std::fs::write(&gate, b"open").unwrap();
        let winner = tokio::time::timeout(Duration::from_secs(60), run.return_value())
            .await
            .expect("the run ends")
            .unwrap();
        let lines = read_log(&c.log());
        println!(
            "holder {holder_skew:?}, taker {taker_skew:?}: step ran {} time(s), result from pid {winner} (holder {}, taker {})",
            lines.len(),
            holder.pid(),
            taker.pid()
        );
        assert_eq!(winner, holder.pid(), "the holder kept the run");
        assert_eq!(
            lines.iter().map(|l| (l.1, l.3)).collect::<Vec<_>>(),
            [(1, holder.pid())],
            "the step ran once, by the holder"
        );
        let events = client.store().events(&run.id()).await.unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e.event.kind()).collect();
        assert_eq!(
            kinds,
            ["step_scheduled", "step_completed", "run_completed"],
            "one attempt, by the holder"
        );
    });
}

#[test]
fn a_worker_an_hour_ahead_does_not_steal_a_live_lease() {
    no_live_lease_is_stolen(None, Some(AHEAD));
}

#[test]
fn a_worker_an_hour_behind_keeps_its_lease() {
    no_live_lease_is_stolen(Some(BEHIND), None);
}

/// The recorded times of the run's timer: (scheduled at, due at, fired at).
fn timer_times(events: &[EventRecord]) -> (SystemTime, SystemTime, SystemTime) {
    let scheduled = events
        .iter()
        .find_map(|e| match &e.event {
            Event::TimerScheduled { fire_at_ms, .. } => Some((e.at, from_millis(*fire_at_ms))),
            _ => None,
        })
        .expect("a timer_scheduled event");
    let fired = events
        .iter()
        .find_map(|e| matches!(e.event, Event::TimerFired { .. }).then_some(e.at))
        .expect("a timer_fired event");
    (scheduled.0, scheduled.1, fired)
}

/// Signed `a - b` in ms, for messages and bounds.
fn ms_between(a: SystemTime, b: SystemTime) -> i64 {
    workflow_core::store::to_millis(a) as i64 - workflow_core::store::to_millis(b) as i64
}

/// A process with clock `starter_skew` starts a run that sleeps [`NAP`]; it then gives the
/// run up (`evict`: evicted to the store until the timer is due, and the process stops
/// working; otherwise it is killed with the run in memory), and a process with clock
/// `firer_skew` fires the timer. The recorded times must lie on the database's clock and the
/// timer must fire neither early nor late (beyond the safety-net poll and generous slack).
fn timer_fires_on_time(starter_skew: &str, firer_skew: &str, evict: bool) {
    let Some(c) = Cluster::new() else { return };
    bounded(async {
        let store = c.store().await;
        let db_before = db_now(&store).await;
        let evict_ms = if evict { "0" } else { "60000" };
        let nap_ms = NAP.as_millis().to_string();
        let starter = c.spawn(
            Some(starter_skew),
            &format!("nap:{nap_ms}"),
            &[("WF_EVICT_MS", evict_ms)],
        );
        let id: RunId = starter
            .line("RUN ", Duration::from_secs(60))
            .parse()
            .unwrap();
        until("the timer is recorded", Duration::from_secs(30), || async {
            store
                .events(&id)
                .await
                .unwrap()
                .iter()
                .any(|e| matches!(e.event, Event::TimerScheduled { .. }))
        })
        .await;
        let seen_scheduled = Instant::now();
        if evict {
            starter.line("IDLE", Duration::from_secs(60));
        } else {
            starter.signal("-KILL");
        }
        let _firer = c.spawn(Some(firer_skew), "work", &[]);
        until("the run completes", Duration::from_secs(90), || async {
            store.get_run(&id).await.unwrap().unwrap().status == RunStatus::Completed
        })
        .await;
        let seen_completed = Instant::now();
        let db_after = db_now(&store).await;
        let events = store.events(&id).await.unwrap();
        let (scheduled, due, fired) = timer_times(&events);
        println!(
            "starter {starter_skew} ({}), firer {firer_skew}: scheduled {} ms after the test began \
             (database clock), due {} ms after scheduling, fired {} ms after its due time; \
             seen {:?} apart here",
            if evict { "evicted" } else { "killed" },
            ms_between(scheduled, db_before),
            ms_between(due, scheduled),
            ms_between(fired, due),
            seen_completed - seen_scheduled,
        );
        for (what, t) in [("scheduled", scheduled), ("fired", fired)] {
            assert!(
                t + SLACK >= db_before && t <= db_after + SLACK,
                "the timer was {what} at {} ms, off the database's clock ({} to {} ms)",
                workflow_core::store::to_millis(t),
                workflow_core::store::to_millis(db_before),
                workflow_core::store::to_millis(db_after),
            );
        }
        // An evicted run is found again by the worker's safety-net poll: with a store that
        // pushes changes that is ten poll intervals.
        let late = POLL * 10 + SLACK;
        assert!(
            fired >= due && fired <= due + late,
            "the timer fired {} ms after its due time (allowed 0 to {} ms)",
            ms_between(fired, due),
            late.as_millis()
        );
        assert!(
            seen_completed - seen_scheduled >= NAP / 2,
            "the timer fired after {:?} of a {NAP:?} sleep",
            seen_completed - seen_scheduled
        );
    });
}

#[test]
fn a_timer_set_an_hour_ahead_fires_on_time_an_hour_behind() {
    timer_fires_on_time(AHEAD, BEHIND, false);
}

#[test]
fn a_timer_set_an_hour_behind_fires_on_time_an_hour_ahead() {
    timer_fires_on_time(BEHIND, AHEAD, true);
}

/// A process with clock `starter_skew` starts a run holding a token retained for
/// [`RETENTION`] and lets it end; a client with clock `dup_skew` then prunes runs ended more
/// than a minute ago and starts with the same token: nothing is pruned and the start
/// conflicts, naming the first run.
fn a_retained_token_stays_closed(starter_skew: Option<&str>, dup_skew: Option<&str>) {
    let Some(c) = Cluster::new() else { return };
    bounded(async {
        let token = format!("retained-{}", RunId::new());
        let starter = c.spawn(starter_skew, &format!("once:{token}"), &[]);
        let first = starter.line("RUN ", Duration::from_secs(60));
        let dup = c.spawn(dup_skew, &format!("dup:{token}"), &[]);
        let pruned = dup.line("PRUNED ", Duration::from_secs(60));
        let outcome = dup.line("DUP ", Duration::from_secs(60));
        println!(
            "starter {starter_skew:?}, duplicate {dup_skew:?}: pruned {pruned}, duplicate {outcome}"
        );
        assert_eq!(pruned, "0", "the retained run was not pruned");
        assert_eq!(
            outcome,
            format!("conflict {first}"),
            "the duplicate was refused"
        );
        let store = c.store().await;
        let runs = store.list_runs(&RunFilter::new()).await.unwrap();
        assert_eq!(runs.len(), 1, "one run");
        assert_eq!(runs[0].id.to_string(), first);
    });
}

#[test]
fn a_client_an_hour_ahead_does_not_reopen_a_retained_token() {
    a_retained_token_stays_closed(None, Some(AHEAD));
}

#[test]
fn a_token_retained_by_a_process_an_hour_behind_stays_retained() {
    a_retained_token_stays_closed(Some(BEHIND), None);
}
