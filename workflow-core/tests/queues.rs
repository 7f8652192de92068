//! Flow control as a user sees it, on every store: a queue's concurrency reached and
//! never exceeded, counted in the step bodies and by the store; per-key order, priority order,
//! each rate window admitting exactly its quota, unknown queues; and, with worker processes,
//! three workers sharing one queue and a worker killed holding a slot (SQLite, PostgreSQL).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use common::{log_execution, read_log_timed, resume_when_ready, Backend, Place, TestDb, Worker};
use workflow_core::prelude::*;
use workflow_core::store::QueueInfo;

/// How long a test waits for a queue to reach the state it expects.
const QUEUE_WAIT: Duration = Duration::from_secs(30);

/// The runs between their `enter` and `leave` steps now, and the most at once.
type Gauge = (BTreeSet<u64>, usize);

/// Per test (a tag in the workflow's arguments, since the stores' tests run side by side):
/// its [`Gauge`].
fn gauges() -> &'static Mutex<HashMap<String, Gauge>> {
    static G: OnceLock<Mutex<HashMap<String, Gauge>>> = OnceLock::new();
    G.get_or_init(Default::default)
}

fn gauge(tag: &str, run: u64, entering: bool) {
    let mut g = gauges().lock().unwrap();
    let (now, most) = g.entry(tag.to_owned()).or_default();
    if entering {
        now.insert(run);
    } else {
        now.remove(&run);
    }
    *most = (*most).max(now.len());
}

fn in_flight(tag: &str) -> BTreeSet<u64> {
    gauges()
        .lock()
        .unwrap()
        .get(tag)
        .map(|g| g.0.clone())
        .unwrap_or_default()
}

fn most_at_once(tag: &str) -> usize {
    gauges().lock().unwrap().get(tag).map_or(0, |g| g.1)
}

/// Polls `check` every 10 ms until it gives a value; panics with `what` (and the last value
/// seen, from `state`) after [`QUEUE_WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + QUEUE_WAIT;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(state) if tokio::time::Instant::now() > deadline => {
                panic!("{what} did not happen within {QUEUE_WAIT:?}; last seen: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// The store's account of queue `name` at this moment.
async fn queue_info(rt: &Runtime, name: &str) -> QueueInfo {
    rt.store()
        .list_queues(SystemTime::now())
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.def.name == name)
        .unwrap_or_else(|| panic!("the store lists no queue {name:?}"))
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
async fn enter(tag: String, run: u64) -> Result<()> {
    gauge(&tag, run, true);
    Ok(())
}

#[step]
async fn leave(tag: String, run: u64) -> Result<()> {
    gauge(&tag, run, false);
    Ok(())
}

#[step]
async fn mark(tag: String, what: String) -> Result<()> {
    let mut m = marks().lock().unwrap();
    m.entry(tag).or_default().push((what, SystemTime::now()));
    Ok(())
}

/// Counted from its first step to its last, between which it sleeps (a sleeping run still
/// holds its slot) and then waits for a payload on `<tag>-<run>`: it holds its slot until the
/// test lets it go.
#[workflow]
async fn held(tag: String, run: u64) -> Result<()> {
    enter(tag.clone(), run).await?;
    sleep(Duration::from_millis(10)).await;
    create_hook::<String>(format!("{tag}-{run}")).recv().await?;
    leave(tag, run).await
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

/// Twelve runs through a queue of three slots, in rounds: each round, exactly three runs hold
/// a slot (counted in their steps and by the store), no fourth begins while they do, and the
/// test then lets them end.
async fn the_concurrency_is_reached_and_never_exceeded(backend: Backend) {
    const RUNS: u64 = 12;
    const LIMIT: usize = 3;
    let db = TestDb::new(backend);
    let rt = runtime_with(&db, Queue::new("payments").concurrency(LIMIT as u32)).await;
    let tag = tag(backend, "concurrency");
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let run = rt
            .start(held, (tag.clone(), i))
            .queue("payments")
            .await
            .unwrap();
        runs.push(run);
    }
    let mut ended = 0;
    while ended < RUNS {
        let holding = eventually(&format!("{LIMIT} runs in flight at once"), || async {
            let now = in_flight(&tag);
            if now.len() >= LIMIT {
                Ok(now)
            } else {
                Err(format!("runs {now:?} in flight, {ended} ended"))
            }
        })
        .await;
        // Slots are held until the test sends: a queue that admits too many has time to show it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let q = queue_info(&rt, "payments").await;
        let now = in_flight(&tag);
        eprintln!(
            "{backend:?}: runs {now:?} in flight, {} holding a slot, {} waiting",
            q.occupied, q.waiting
        );
        assert_eq!(
            holding.len(),
            LIMIT,
            "over the limit of {LIMIT}: {holding:?}"
        );
        assert_eq!(now, holding, "a run began while {LIMIT} held the slots");
        assert_eq!(
            (q.occupied, q.waiting),
            (LIMIT as u64, RUNS - ended - LIMIT as u64),
            "the store's count of runs holding a slot and waiting"
        );
        for i in &holding {
            resume_when_ready(&rt, &format!("{tag}-{i}"), "go").await;
        }
        for i in &holding {
            runs[*i as usize].return_value().await.unwrap();
        }
        ended += LIMIT as u64;
    }
    assert_eq!(most_at_once(&tag), LIMIT, "the most runs in flight at once");
    let q = queue_info(&rt, "payments").await;
    assert_eq!((q.occupied, q.waiting), (0, 0));
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

/// Seven runs through a queue that lets three begin in any window of a second. All seven wait
/// before a worker exists, so the first window takes three at once, the next three together a
/// period later, and the last one a period after them: the store's count of runs begun in the
/// window ending now, sampled throughout, shows each window at exactly its quota and never
/// over it.
async fn each_rate_window_admits_exactly_its_quota(backend: Backend) {
    const PERIOD: Duration = Duration::from_secs(1);
    const QUOTA: u64 = 3;
    const RUNS: u64 = 7;
    let db = TestDb::new(backend);
    let api = || Queue::new("api").rate_limit(QUOTA as u32, PERIOD);
    let client = db
        .builder()
        .queue(api())
        .worker(false)
        .build()
        .await
        .unwrap();
    let tag = tag(backend, "rate");
    // No run can begin before it is started: the first window opens after this.
    let started = SystemTime::now();
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let run = client
            .start(marks_once, (tag.clone(), format!("r{i}")))
            .queue("api")
            .await
            .unwrap();
        runs.push(run);
    }
    assert_eq!(queue_info(&client, "api").await.waiting, RUNS);
    let _worker = runtime_with(&db, api()).await;
    // (runs begun so far, runs begun in the window ending now), as the store counts them.
    let mut samples: Vec<(u64, u64)> = Vec::new();
    let deadline = tokio::time::Instant::now() + QUEUE_WAIT;
    loop {
        let q = queue_info(&client, "api").await;
        let sample = (RUNS - q.waiting, q.begun_in_window);
        if samples.last() != Some(&sample) {
            samples.push(sample);
        }
        if q.waiting == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every run began within {QUEUE_WAIT:?}: {samples:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for run in runs {
        run.return_value().await.unwrap();
    }
    eprintln!("{backend:?}: (begun, begun in the window) as sampled: {samples:?}");
    assert!(
        samples.iter().all(|&(_, in_window)| in_window <= QUOTA),
        "a window admitted more than {QUOTA}: {samples:?}"
    );
    for (begun, window) in [(QUOTA, "first"), (2 * QUOTA, "second")] {
        assert!(
            samples.contains(&(begun, QUOTA)),
            "the {window} window did not admit exactly {QUOTA} ({begun} begun in all, \
             {QUOTA} of them in the window): {samples:?}"
        );
    }

    let mut at: Vec<SystemTime> = marked(&tag).into_iter().map(|(_, t)| t).collect();
    at.sort();
    assert_eq!(at.len() as u64, RUNS, "each run's step ran once");
    let after = |i: usize| at[i].duration_since(started).unwrap_or_default();
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

/// The end of a run that held a slot begins the run waiting for it at once, not at the next
/// poll: the worker here checks whether a run waits and leases it (the poll interval is a
/// minute, the wait bounded at ten seconds).
async fn a_freed_slot_begins_the_waiting_run_without_a_poll(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db
        .builder()
        .queue(Queue::new("handoff").concurrency(1))
        .poll_interval(Duration::from_secs(60))
        .build()
        .await
        .expect("runtime builds");
    let tag = tag(backend, "handoff");
    let token = format!("{tag}-holder");
    let holder = rt
        .start(waits_for, (token.clone(),))
        .queue("handoff")
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while rt.get_hook_by_token(&token).await.is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the holder begins");
    let next = rt
        .start(marks_once, (tag.clone(), "next".to_owned()))
        .queue("handoff")
        .await
        .unwrap();
    assert_eq!(next.status().await.unwrap(), RunStatus::Pending, "it waits");
    rt.resume_hook(&token, ()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), holder.return_value())
        .await
        .expect("the holder ends")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), next.return_value())
        .await
        .expect("the waiting run begins once the slot is freed, well before a poll")
        .unwrap();
    let marks: Vec<String> = marked(&tag).into_iter().map(|(m, _)| m).collect();
    assert_eq!(marks, ["next"]);
    rt.shutdown();
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
    a_freed_slot_begins_the_waiting_run_without_a_poll,
    a_waiting_run_times_out_without_taking_a_slot,
    the_concurrency_is_reached_and_never_exceeded,
    per_key_order_equals_start_order,
    priority_order_holds,
    each_rate_window_admits_exactly_its_quota,
    an_unknown_queue_is_an_error_at_start,
);

// ---------------------------------------------------------------------------------------------
// Three worker processes, one queue

/// One run of the shared queue: logs `in` and `out` from steps of its own to the step log of
/// the test (`WF_LOG`), and between them holds its slot until the test sends to
/// `shared-<run>`.
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
    create_hook::<String>(format!("shared-{run}"))
        .recv()
        .await?;
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
/// lease of `WF_LEASE_MS` (default 5 s) and, given `WF_MAX_ACTIVE`, at most that many runs at
/// once (kept in memory while they wait).
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
        let mut builder = Place::from_env()
            .builder()
            .queue(shared_queue())
            .queue(Queue::new(SOLO).concurrency(1))
            .poll_interval(Duration::from_millis(20))
            .lease(lease);
        if let Some(n) = std::env::var("WF_MAX_ACTIVE")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            builder = builder
                .max_active_runs(n)
                .evict_after(Duration::from_secs(3600));
        }
        let _worker = builder.build().await.unwrap();
        println!("READY");
        std::io::stdout().flush().unwrap();
        std::future::pending::<()>().await;
    });
}

/// The runs in flight by the step log: (run, pid) of each `in` without its `out`.
fn logged_in_flight(log: &std::path::Path) -> BTreeSet<(u64, u32)> {
    let mut now = BTreeSet::new();
    for (_, _, label, pid, _) in read_log_timed(log) {
        if let Some(run) = label.strip_prefix("in") {
            now.insert((run.parse().unwrap(), pid));
        } else if let Some(run) = label.strip_prefix("out") {
            let run: u64 = run.parse().unwrap();
            now.retain(|(r, _)| *r != run);
        }
    }
    now
}

/// Three worker processes that each drive one run at a time share a queue of two slots: in
/// each round exactly two runs hold the slots, on two different workers, and the third worker
/// begins none, until the test lets them end.
async fn three_workers_share_one_queue(place: Place, files: &std::path::Path) {
    const RUNS: u64 = 12;
    const LIMIT: usize = 2;
    let log = files.join("steps.log");
    let mut env: Vec<(&str, String)> = place.env();
    env.push(("WF_LOG", log.to_str().unwrap().to_owned()));
    env.push(("WF_MAX_ACTIVE", "1".to_owned()));
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
    let mut ended = 0;
    while ended < RUNS {
        let holding = eventually(&format!("{LIMIT} runs in flight at once"), || async {
            let now = logged_in_flight(&log);
            if now.len() >= LIMIT {
                Ok(now)
            } else {
                Err(format!("(run, pid) {now:?} in flight, {ended} ended"))
            }
        })
        .await;
        // The slots are held until the test sends: a third worker that begins a run despite
        // the limit has time to show it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = logged_in_flight(&log);
        eprintln!("{}: (run, pid) {now:?} in flight", place.name());
        assert_eq!(
            holding.len(),
            LIMIT,
            "over the limit of {LIMIT}: {holding:?}"
        );
        assert_eq!(now, holding, "a run began while {LIMIT} held the slots");
        let pids: BTreeSet<u32> = holding.iter().map(|(_, pid)| *pid).collect();
        assert_eq!(
            pids.len(),
            LIMIT,
            "each worker drives one run at a time, yet {holding:?}"
        );
        for (run, _) in &holding {
            resume_when_ready(&client, &format!("shared-{run}"), "go").await;
        }
        for (run, _) in &holding {
            runs[*run as usize].return_value().await.unwrap();
        }
        ended += LIMIT as u64;
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
    assert_eq!(most, LIMIT as i64, "the most runs in flight at once");
    assert!(pids.len() >= LIMIT, "on workers {pids:?}");
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
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let place = Place::Postgres {
        url,
        schema: common::fresh_schema(),
    };
    common::bounded(three_workers_share_one_queue(place, dir.path())).await;
}
