//! Schedules as a user sees them, on every store: an every-second schedule fired by two
//! runtimes starts one run per nominal second; a worker stopped and started again catches
//! up per policy; the overlap policies; pause and resume; trigger; backfills that start
//! nothing twice; a schedule created at run time fired by another runtime; unknown names.
//! Every wait is bounded; nothing asserts on speed.

mod common;

use std::time::{Duration, Instant, SystemTime};

use common::{Backend, TestDb};
use workflow_core::prelude::*;
use workflow_core::{RunRecord, ScheduleError, SkipReason, TickOutcome, TickRecord};

#[workflow(name = "sched.note")]
async fn note(tick: ScheduleTick) -> Result<bool> {
    Ok(tick.backfill)
}

#[workflow(name = "sched.slow")]
async fn slow(tick: ScheduleTick) -> Result<()> {
    let _ = tick;
    sleep(Duration::from_millis(2500)).await;
    Ok(())
}

#[workflow(name = "sched.gated")]
async fn gated(tick: ScheduleTick) -> Result<()> {
    let _ = tick;
    recv::<u32>("go").await?;
    Ok(())
}

/// The wall clock when it runs, in ms.
#[step(name = "sched.stamp")]
async fn stamp() -> Result<u64> {
    Ok(ms(SystemTime::now()) as u64)
}

#[workflow(name = "sched.stepped")]
async fn stepped(tick: ScheduleTick) -> Result<u64> {
    let _ = tick;
    stamp().await
}

/// A runtime firing `name`, an every-second schedule of `stepped`, once its first tick has
/// started a run.
async fn stepping_every_second(db: &TestDb, name: &str) -> Runtime {
    let rt = db
        .builder()
        .schedule(Schedule::every(name, stepped, Duration::from_secs(1)))
        .build()
        .await
        .unwrap();
    wait_ticks(&rt, name, Duration::from_secs(30), |t| {
        !started(t).is_empty()
    })
    .await;
    rt
}

/// Sleeps until 20 ms before a whole second at least 300 ms away (the firing loop looks 50
/// ms or more ahead, so it holds that second's ticks by then); that second, in ms.
async fn just_before_a_due_time() -> u128 {
    let due = (ms(SystemTime::now()) + 300).div_ceil(1000) * 1000;
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(due as u64 - 20);
    tokio::time::sleep(at.duration_since(SystemTime::now()).unwrap_or_default()).await;
    due
}

fn ms(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The schedule's ticks, oldest first.
async fn ticks(rt: &Runtime, name: &str) -> Vec<TickRecord> {
    let mut t = rt.schedule_ticks(name, 1000).await.unwrap();
    t.reverse();
    t
}

/// Waits (at most `limit`) until `done` holds for the schedule's ticks; they are returned.
async fn wait_ticks(
    rt: &Runtime,
    name: &str,
    limit: Duration,
    done: impl Fn(&[TickRecord]) -> bool,
) -> Vec<TickRecord> {
    let start = Instant::now();
    loop {
        let t = ticks(rt, name).await;
        if done(&t) {
            return t;
        }
        assert!(
            start.elapsed() < limit,
            "schedule {name}: still waiting after {limit:?}; ticks: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn started(t: &[TickRecord]) -> Vec<&TickRecord> {
    t.iter()
        .filter(|r| r.outcome == TickOutcome::Started)
        .collect()
}

/// The tick a run was started for, read from its input.
async fn tick_of(rt: &Runtime, id: RunId) -> ScheduleTick {
    let run = rt.get_run(&id).info().await.unwrap();
    serde_json::from_value(run.input[0].clone()).unwrap()
}

async fn an_every_second_schedule_fires_once_per_nominal_second_on_two_runtimes(b: Backend) {
    let db = TestDb::new(b);
    let beat = || Schedule::every("beat", note, Duration::from_secs(1));
    let one = db.builder().schedule(beat()).build().await.unwrap();
    let two = db.builder().schedule(beat()).build().await.unwrap();
    let t = wait_ticks(&one, "beat", Duration::from_secs(30), |t| {
        started(t).len() >= 4
    })
    .await;
    one.shutdown();
    two.shutdown();
    // Every nominal second from the first on has one record, and each started tick one run
    // of its own, whose argument names the tick.
    for w in t.windows(2) {
        assert_eq!(ms(w[1].nominal) - ms(w[0].nominal), 1000, "{t:?}");
    }
    let mut runs = Vec::new();
    for r in started(&t) {
        assert_eq!(ms(r.nominal) % 1000, 0);
        let id = r.run_id.expect("a started tick names its run");
        let tick = tick_of(&one, id).await;
        assert_eq!(
            (tick.schedule.as_str(), tick.nominal, tick.backfill),
            ("beat", r.nominal, false)
        );
        runs.push(id);
    }
    let listed = one
        .runs(RunFilter::new().workflow("sched.note").limit(10_000))
        .await
        .unwrap();
    let mut listed: Vec<RunId> = listed.into_iter().map(|r| r.id).collect();
    let recorded_now = started(&ticks(&one, "beat").await).len();
    listed.sort();
    runs.sort();
    runs.dedup();
    assert_eq!(runs.len(), started(&t).len(), "a run shared by two ticks");
    assert_eq!(
        listed.len(),
        recorded_now,
        "runs without a tick, or ticks with two runs"
    );
}

/// The period of the downtime cases' schedule, in ms.
const DOWN_PERIOD: u128 = 2000;

/// Stops the only worker just after a tick (`t0`) of an every-2-seconds schedule under
/// `policy`, and starts a new one `after` ms after the `missed`-th tick since: those ticks
/// fell due while no worker was up, however close to the restart the latest one fell due. Of
/// them, the policy's count (`expected`) of the latest start, the older ones are recorded as
/// missed, and no other run is started for them; the ticks due once the new worker is up start.
async fn restart_after_downtime(
    b: Backend,
    policy: CatchUp,
    (missed, after): (u128, u128),
    expected: usize,
) {
    let db = TestDb::new(b);
    let sched = || {
        Schedule::every("down", note, Duration::from_millis(DOWN_PERIOD as u64))
            .catch_up(policy)
            .overlap(Overlap::AllowAll)
    };
    let rt = db.builder().schedule(sched()).build().await.unwrap();
    // A tick at least 300 ms away, fired by this worker, which stops as soon as it is recorded.
    let t0 = (ms(SystemTime::now()) + 300).div_ceil(DOWN_PERIOD) * DOWN_PERIOD;
    wait_ticks(&rt, "down", Duration::from_secs(20), |t| {
        t.iter().any(|r| ms(r.nominal) == t0)
    })
    .await;
    rt.shutdown();
    drop(rt);
    let client = db.builder().worker(false).build().await.unwrap();
    let last_missed = t0 + missed * DOWN_PERIOD;
    let restart = SystemTime::UNIX_EPOCH + Duration::from_millis((last_missed + after) as u64);
    tokio::time::sleep(
        restart
            .duration_since(SystemTime::now())
            .unwrap_or_default(),
    )
    .await;
    // Nothing fired while no worker was up: the runtime's shutdown stopped its schedules.
    let before = ticks(&client, "down").await;
    assert!(
        before.iter().all(|r| ms(r.nominal) <= t0),
        "a tick after {t0} ms was fired before the restart: {before:?}"
    );
    let restarted = ms(SystemTime::now());
    let rt = db.builder().schedule(sched()).build().await.unwrap();
    // Ticks due from 500 ms after the build returned fell due while the new worker was up
    // (its firing loop looked by then).
    let live_from = ms(SystemTime::now()) + 500;
    let t = wait_ticks(&rt, "down", Duration::from_secs(20), |t| {
        t.iter().any(|r| ms(r.nominal) >= live_from)
    })
    .await;
    rt.shutdown();
    let at = |t: &[TickRecord]| -> Vec<(u128, TickOutcome)> {
        t.iter().map(|r| (ms(r.nominal), r.outcome)).collect()
    };
    let context = format!(
        "{policy:?}: tick {t0} ms fired, restarted at {restarted} ms, live from {live_from} ms: {:?}",
        at(&t)
    );
    let gap: Vec<(u128, TickOutcome)> = at(&t)
        .into_iter()
        .filter(|(n, _)| *n > t0 && *n <= last_missed)
        .collect();
    let want: Vec<(u128, TickOutcome)> = (1..=missed)
        .map(|i| {
            let outcome = if i + expected as u128 > missed {
                TickOutcome::Started
            } else {
                TickOutcome::Skipped(SkipReason::Missed)
            };
            (t0 + i * DOWN_PERIOD, outcome)
        })
        .collect();
    assert_eq!(gap, want, "{context}");
    assert!(
        t.iter()
            .filter(|r| ms(r.nominal) >= live_from)
            .all(|r| r.outcome == TickOutcome::Started),
        "{context}"
    );
    // The runs started for the missed ticks, read from the runs themselves.
    let runs = client
        .runs(RunFilter::new().workflow("sched.note").limit(10_000))
        .await
        .unwrap();
    let mut caught = Vec::new();
    for run in runs {
        let n = ms(tick_of(&client, run.id).await.nominal);
        if n > t0 && n <= last_missed {
            caught.push(n);
        }
    }
    caught.sort_unstable();
    let want: Vec<u128> = want
        .iter()
        .filter(|(_, o)| *o == TickOutcome::Started)
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(caught, want, "runs of the missed ticks; {context}");
    eprintln!("{b:?}, {context}");
}

async fn catch_up_none_starts_no_tick_missed_while_no_worker_was_up(b: Backend) {
    restart_after_downtime(b, CatchUp::None, (2, 1300), 0).await;
}

/// The latest missed tick fell due 300 ms before the restart: a worker up then would record
/// it within a second, so the new one waits for that before recording it as missed.
async fn catch_up_none_starts_no_missed_tick_however_recent(b: Backend) {
    restart_after_downtime(b, CatchUp::None, (2, 300), 0).await;
}

async fn catch_up_latest_starts_only_the_latest_missed_tick(b: Backend) {
    restart_after_downtime(b, CatchUp::Latest, (2, 1300), 1).await;
}

async fn catch_up_all_starts_up_to_max_of_the_latest_missed_ticks(b: Backend) {
    restart_after_downtime(b, CatchUp::All { max: 2 }, (3, 1300), 2).await;
}

/// A `slow` schedule every second (each run lasts 2.5 s) under `overlap`, until 7 ticks are
/// recorded: the ticks, and each started tick's run (created, updated and status).
async fn overlapping(b: Backend, overlap: Overlap) -> (Vec<TickRecord>, Vec<RunRecord>) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .schedule(Schedule::every("ov", slow, Duration::from_secs(1)).overlap(overlap))
        .build()
        .await
        .unwrap();
    let t = wait_ticks(&rt, "ov", Duration::from_secs(40), |t| t.len() >= 7).await;
    rt.shutdown();
    let mut runs = Vec::new();
    for r in started(&t) {
        runs.push(rt.get_run(&r.run_id.unwrap()).info().await.unwrap());
    }
    (t, runs)
}

/// Whether a run began before the one started before it ended.
fn overlapped(runs: &[RunRecord]) -> bool {
    runs.windows(2)
        .any(|w| !w[0].status.is_terminal() || w[1].created_at < w[0].updated_at)
}

async fn overlap_skip_skips_ticks_while_the_run_goes_on(b: Backend) {
    let (t, runs) = overlapping(b, Overlap::Skip).await;
    assert!(
        t.iter()
            .any(|r| r.outcome == TickOutcome::Skipped(SkipReason::Overlap)),
        "{t:?}"
    );
    let ended: Vec<RunRecord> = runs
        .into_iter()
        .filter(|r| r.status.is_terminal())
        .collect();
    assert!(!overlapped(&ended), "{ended:?}");
}

async fn overlap_allow_all_starts_every_tick(b: Backend) {
    let (t, runs) = overlapping(b, Overlap::AllowAll).await;
    assert!(t.iter().all(|r| r.outcome == TickOutcome::Started), "{t:?}");
    assert!(overlapped(&runs), "{runs:?}");
}

async fn overlap_buffer_one_starts_a_waiting_tick_when_the_run_ends(b: Backend) {
    let (t, runs) = overlapping(b, Overlap::BufferOne).await;
    // A buffered tick started later, once the run before it ended: late by over a second.
    let late = started(&t)
        .iter()
        .zip(&runs)
        .any(|(tick, run)| run.created_at >= tick.nominal + Duration::from_millis(1000));
    assert!(late, "no buffered tick was started: {t:?}");
    assert!(
        t.iter()
            .any(|r| r.outcome == TickOutcome::Skipped(SkipReason::Overlap)),
        "at most one tick waits: {t:?}"
    );
    let ended: Vec<RunRecord> = runs
        .into_iter()
        .filter(|r| r.status.is_terminal())
        .collect();
    assert!(!overlapped(&ended), "{ended:?}");
}

async fn overlap_cancel_other_cancels_the_running_one(b: Backend) {
    let (t, runs) = overlapping(b, Overlap::CancelOther).await;
    assert!(t.iter().all(|r| r.outcome == TickOutcome::Started), "{t:?}");
    // Every run but the last was cancelled by the next tick (none lives 2.5 s to complete).
    for run in &runs[..runs.len() - 1] {
        assert_eq!(run.status, RunStatus::Cancelled, "{runs:?}");
    }
}

async fn a_paused_schedule_records_its_ticks_as_paused_and_resumes_without_catching_up(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .schedule(Schedule::every("pr", note, Duration::from_secs(1)))
        .build()
        .await
        .unwrap();
    wait_ticks(&rt, "pr", Duration::from_secs(20), |t| {
        !started(t).is_empty()
    })
    .await;
    rt.pause_schedule("pr").await.unwrap();
    let paused_at = SystemTime::now();
    assert!(rt.schedules().await.unwrap()[0].paused);
    let t = wait_ticks(&rt, "pr", Duration::from_secs(20), |t| {
        t.iter()
            .filter(|r| r.outcome == TickOutcome::Skipped(SkipReason::Paused))
            .count()
            >= 2
    })
    .await;
    rt.resume_schedule("pr").await.unwrap();
    let resumed_at = SystemTime::now();
    let last_paused = t.last().unwrap().nominal;
    let t = wait_ticks(&rt, "pr", Duration::from_secs(20), |t| {
        started(t).iter().any(|r| r.nominal > resumed_at)
    })
    .await;
    rt.shutdown();
    // Between the pause and the resume, only paused ticks; nothing started later for them.
    for r in &t {
        if r.nominal > paused_at + Duration::from_millis(10) && r.nominal <= last_paused {
            assert_eq!(r.outcome, TickOutcome::Skipped(SkipReason::Paused), "{t:?}");
        }
    }
    assert!(!rt.schedules().await.unwrap()[0].paused);
}

async fn trigger_starts_one_run_now(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .schedule(Schedule::cron("yearly", note, "0 0 1 1 *").unwrap())
        .build()
        .await
        .unwrap();
    let before = SystemTime::now();
    let id = rt.trigger_schedule("yearly").await.unwrap();
    let t = ticks(&rt, "yearly").await;
    assert_eq!(t.len(), 1);
    assert_eq!(
        (t[0].outcome, t[0].run_id),
        (TickOutcome::Started, Some(id))
    );
    assert!(t[0].nominal + Duration::from_secs(1) >= before);
    let run = rt.get_run(&id);
    assert_eq!(run.return_value().await.unwrap(), serde_json::json!(false));
    assert_eq!(tick_of(&rt, id).await.nominal, t[0].nominal);
    let info = &rt.schedules().await.unwrap()[0];
    assert_eq!(info.last, Some(t[0].nominal));
    assert!(info.next.is_some_and(|n| n > before));
}

async fn a_backfill_starts_every_nominal_time_once(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .schedule(Schedule::every("bf", note, Duration::from_secs(3600)))
        .build()
        .await
        .unwrap();
    let from = SystemTime::UNIX_EPOCH + Duration::from_secs(1_577_836_800); // 2020-01-01
    let to = from + Duration::from_secs(3 * 3600);
    assert_eq!(rt.backfill_schedule("bf", from, to).await.unwrap(), 4);
    assert_eq!(rt.backfill_schedule("bf", from, to).await.unwrap(), 0);
    let wider = to + Duration::from_secs(3600);
    assert_eq!(rt.backfill_schedule("bf", from, wider).await.unwrap(), 1);
    // The hourly schedule also ticks on its own when the test runs across the top of an
    // hour: that tick (and its run) is not the backfill's.
    let all = ticks(&rt, "bf").await;
    let t: Vec<&TickRecord> = all.iter().filter(|r| r.nominal <= wider).collect();
    assert_eq!(t.len(), 5, "{all:?}");
    for (i, r) in t.iter().enumerate() {
        assert_eq!(r.nominal, from + Duration::from_secs(3600 * i as u64));
        assert_eq!((r.outcome, r.backfill), (TickOutcome::Started, true));
        let run = rt.get_run(&r.run_id.unwrap());
        assert_eq!(run.return_value().await.unwrap(), serde_json::json!(true));
    }
    let listed = rt
        .runs(RunFilter::new().workflow("sched.note"))
        .await
        .unwrap();
    // Every run is a tick's (ticks read after the runs), and every backfilled tick's run is
    // listed.
    let tick_runs: Vec<RunId> = ticks(&rt, "bf")
        .await
        .iter()
        .filter_map(|r| r.run_id)
        .collect();
    assert!(
        listed.iter().all(|r| tick_runs.contains(&r.id)),
        "{listed:?} {tick_runs:?}"
    );
    for r in &t {
        assert!(listed.iter().any(|l| Some(l.id) == r.run_id), "{r:?}");
    }
}

async fn a_schedule_created_at_run_time_is_fired_by_another_runtime(b: Backend) {
    let db = TestDb::new(b);
    let worker = db.builder().build().await.unwrap();
    let client = db.builder().worker(false).build().await.unwrap();
    client
        .create_schedule(Schedule::every("late", note, Duration::from_secs(1)))
        .await
        .unwrap();
    let t = wait_ticks(&worker, "late", Duration::from_secs(20), |t| {
        !started(t).is_empty()
    })
    .await;
    let id = started(&t)[0].run_id.unwrap();
    let run = client.get_run(&id);
    assert_eq!(run.return_value().await.unwrap(), serde_json::json!(false));
    let names: Vec<String> = worker
        .schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["late"]);
    client.delete_schedule("late").await.unwrap();
    assert!(worker.schedules().await.unwrap().is_empty());
    worker.shutdown();
}

async fn unknown_schedules_are_errors(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let nope = |r: std::result::Result<(), ScheduleError>| {
        assert!(
            matches!(r, Err(ScheduleError::NotFound { ref name }) if name == "nope"),
            "{r:?}"
        );
    };
    nope(rt.pause_schedule("nope").await);
    nope(rt.resume_schedule("nope").await);
    nope(rt.delete_schedule("nope").await);
    nope(rt.trigger_schedule("nope").await.map(|_| ()));
    let now = SystemTime::now();
    nope(rt.backfill_schedule("nope", now, now).await.map(|_| ()));
    nope(rt.schedule_ticks("nope", 1).await.map(|_| ()));
    let bad = rt
        .create_schedule(Schedule::every("", note, Duration::from_secs(1)))
        .await;
    assert!(
        matches!(bad, Err(ScheduleError::InvalidName { .. })),
        "{bad:?}"
    );
}

async fn the_last_declaration_of_a_name_wins_and_keeps_the_ticks(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .worker(false)
        .schedule(Schedule::every("dup", note, Duration::from_secs(3600)))
        .schedule(Schedule::cron("dup", note, "0 3 * * *").unwrap())
        .build()
        .await
        .unwrap();
    let listed = rt.schedules().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].spec,
        workflow_core::ScheduleSpec::Cron {
            expr: "0 3 * * *".into(),
            zone: "UTC".into()
        }
    );
    rt.trigger_schedule("dup").await.unwrap();
    // Declared again by another runtime: the new definition, the same ticks.
    let again = db
        .builder()
        .worker(false)
        .schedule(Schedule::every("dup", note, Duration::from_secs(60)).overlap(Overlap::AllowAll))
        .build()
        .await
        .unwrap();
    let listed = again.schedules().await.unwrap();
    assert_eq!(
        (listed[0].spec.clone(), listed[0].overlap),
        (
            workflow_core::ScheduleSpec::Every { period_ms: 60_000 },
            Overlap::AllowAll
        )
    );
    assert_eq!(again.schedule_ticks("dup", 10).await.unwrap().len(), 1);
}

/// A run that ends shortly before its schedule's next tick does not make that tick skip under
/// `Overlap::Skip`: the firing loop lists the schedules a little ahead of the due time (20 ms
/// here) and reads a run it listed as not ended again when the tick fires. Each round ends
/// the current run 12 ms before the next whole second; a round whose run did not end at least
/// 1 ms before that second (a slow commit) proves nothing and is not counted.
async fn a_run_ended_just_before_the_next_tick_does_not_skip_it(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .schedule(Schedule::every("gate", gated, Duration::from_secs(1)).overlap(Overlap::Skip))
        .build()
        .await
        .unwrap();
    let began = Instant::now();
    let (mut proved, mut rounds) = (0, 0);
    while proved < 2 && began.elapsed() < Duration::from_secs(40) {
        rounds += 1;
        // The run of the latest started tick, still waiting for its message.
        let t = wait_ticks(&rt, "gate", Duration::from_secs(10), |t| {
            !started(t).is_empty()
        })
        .await;
        let run = started(&t).last().unwrap().run_id.unwrap();
        if rt.get_run(&run).info().await.unwrap().status.is_terminal() {
            continue;
        }
        // The next whole second at least 100 ms away.
        let next = (ms(SystemTime::now()) + 100).div_ceil(1000) * 1000;
        let at = |m: u128| SystemTime::UNIX_EPOCH + Duration::from_millis(m as u64);
        let wait = at(next - 12)
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::time::sleep(wait).await;
        let handle = rt.get_run(&run);
        handle.send("go", 1u32).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), handle.return_value())
            .await
            .expect("the gated run ends once told")
            .unwrap();
        if ms(SystemTime::now()) >= next - 1 {
            continue;
        }
        let t = wait_ticks(&rt, "gate", Duration::from_secs(10), |t| {
            t.iter().any(|r| ms(r.nominal) == next)
        })
        .await;
        let tick = t.iter().find(|r| ms(r.nominal) == next).unwrap();
        assert_eq!(
            tick.outcome,
            TickOutcome::Started,
            "the run ended before the tick of {next} ms: {t:?}"
        );
        proved += 1;
    }
    eprintln!("{b:?}: {proved} of {rounds} rounds ended their run in time");
    rt.shutdown();
}

/// The firing loop decides a look's ticks ahead of their due time (their runs' first rounds
/// polled then) and fires them at it: nothing of a tick's run is dated before its nominal
/// time (its creation, its events) and no step of it starts before then.
async fn a_tick_decided_ahead_of_time_starts_nothing_before_it(b: Backend) {
    let db = TestDb::new(b);
    let rt = stepping_every_second(&db, "stamped").await;
    let t = wait_ticks(&rt, "stamped", Duration::from_secs(30), |t| {
        started(t).len() >= 4
    })
    .await;
    for r in started(&t) {
        let id = r.run_id.unwrap();
        let run = rt.get_run(&id).typed::<u64>();
        let ran = tokio::time::timeout(Duration::from_secs(10), run.return_value())
            .await
            .expect("a tick's run ends")
            .unwrap();
        assert!(
            u128::from(ran) >= ms(r.nominal),
            "its step ran at {ran} ms, before its tick: {r:?}"
        );
        let info = run.info().await.unwrap();
        assert!(
            ms(info.created_at) >= ms(r.nominal),
            "run created before its tick: {info:?} {r:?}"
        );
        assert!(ms(r.recorded_at) >= ms(r.nominal), "{r:?}");
        let history = run.export().await.unwrap();
        for e in history["events"].as_array().unwrap() {
            assert!(
                u128::from(e["at_ms"].as_u64().unwrap()) >= ms(r.nominal),
                "an event dated before its run's tick: {e} {r:?}"
            );
        }
    }
    rt.shutdown();
}

/// A runtime shut down while its firing loop holds the next second's ticks (decided ahead
/// of their due time) fires none of them.
async fn a_runtime_shut_down_before_the_due_time_fires_nothing_held(b: Backend) {
    let db = TestDb::new(b);
    let rt = stepping_every_second(&db, "held").await;
    let due = just_before_a_due_time().await;
    rt.shutdown();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Read through the stopped runtime: another would fire the schedule itself.
    let t = ticks(&rt, "held").await;
    assert!(
        t.iter().all(|r| ms(r.nominal) < due),
        "a tick due at {due} ms, after the shutdown, was fired: {t:?}"
    );
}

/// A schedule paused while the firing loop holds its next tick (decided ahead of its due
/// time) records that tick as paused: a tick due while paused never starts.
async fn a_schedule_paused_just_before_its_due_time_starts_nothing_then(b: Backend) {
    let db = TestDb::new(b);
    let rt = stepping_every_second(&db, "paused-late").await;
    let due = just_before_a_due_time().await;
    rt.pause_schedule("paused-late").await.unwrap();
    let paused_at = ms(SystemTime::now());
    let t = wait_ticks(&rt, "paused-late", Duration::from_secs(10), |t| {
        t.iter().any(|r| ms(r.nominal) > due)
    })
    .await;
    rt.shutdown();
    if paused_at >= due {
        eprintln!("{b:?}: the pause took until after the due time; nothing to check");
        return;
    }
    for r in t.iter().filter(|r| ms(r.nominal) >= due) {
        assert_eq!(
            r.outcome,
            TickOutcome::Skipped(SkipReason::Paused),
            "a tick due after the pause at {paused_at} ms: {t:?}"
        );
    }
}

on_every_store!(
    a_schedule_paused_just_before_its_due_time_starts_nothing_then,
    a_runtime_shut_down_before_the_due_time_fires_nothing_held,
    a_tick_decided_ahead_of_time_starts_nothing_before_it,
    a_run_ended_just_before_the_next_tick_does_not_skip_it,
    the_last_declaration_of_a_name_wins_and_keeps_the_ticks,
    an_every_second_schedule_fires_once_per_nominal_second_on_two_runtimes,
    catch_up_none_starts_no_tick_missed_while_no_worker_was_up,
    catch_up_none_starts_no_missed_tick_however_recent,
    catch_up_latest_starts_only_the_latest_missed_tick,
    catch_up_all_starts_up_to_max_of_the_latest_missed_ticks,
    overlap_skip_skips_ticks_while_the_run_goes_on,
    overlap_allow_all_starts_every_tick,
    overlap_buffer_one_starts_a_waiting_tick_when_the_run_ends,
    overlap_cancel_other_cancels_the_running_one,
    a_paused_schedule_records_its_ticks_as_paused_and_resumes_without_catching_up,
    trigger_starts_one_run_now,
    a_backfill_starts_every_nominal_time_once,
    a_schedule_created_at_run_time_is_fired_by_another_runtime,
    unknown_schedules_are_errors,
);
