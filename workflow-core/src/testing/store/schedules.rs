//! The schedules contract ([`ScheduleStore`](crate::store::ScheduleStore)): exactly one run
//! per schedule and nominal time under concurrent firings, the tick records kept (the latest
//! 1,000, latest first), the next nominal time moving only forward, a redefinition keeping
//! the schedule's state, pause and resume, backfills replacing run-less records once, and
//! deletion.

use std::time::{Duration, SystemTime};

use serde_json::json;

use super::support::{ap, event_seqs, step_done, t};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::*;

/// A schedule named `name` of workflow `tick`, every second.
pub(crate) fn def(name: &str) -> ScheduleDef {
    ScheduleDef {
        name: name.to_owned(),
        workflow: "tick".to_owned(),
        queue: None,
        spec: ScheduleSpec::Every { period_ms: 1000 },
        overlap: Overlap::Skip,
        catch_up: CatchUp::Latest,
        catch_up_window: Duration::from_secs(3600),
        jitter: Duration::ZERO,
    }
}

/// The run of a tick at `at`.
fn run(at: SystemTime) -> NewRun {
    NewRun::new(RunId::new(), "tick".to_owned(), json!([{"n": 1}]), at)
}

/// A tick of `schedule` at `nominal` with outcome `outcome` (and a run when started).
pub(crate) fn tick(schedule: &str, nominal: SystemTime, outcome: TickOutcome) -> NewTick {
    NewTick {
        schedule: schedule.to_owned(),
        nominal,
        outcome,
        run: (outcome == TickOutcome::Started).then(|| run(nominal)),
        backfill: false,
        at: nominal,
        next: None,
        replace_runless: false,
        lease: None,
        first: Vec::new(),
    }
}

async fn state<S: Store>(store: &S, name: &str) -> Option<ScheduleState> {
    store
        .list_schedules()
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.def.name == name)
}

/// Fires one tick 60 times at once over the handles, each with a run of its own: exactly
/// one firing records it and admits its run, the record names that run, and no other run
/// exists. The next nominal time ends at the furthest any firing asked for.
pub async fn concurrent_firings_of_one_tick_admit_exactly_one_run<S: Store + Clone>(stores: &[S]) {
    let store = &stores[0];
    store
        .define_schedule(&def("race"), Some(t(1000)), t(0))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move {
                let mut tk = tick("race", t(1000), TickOutcome::Started);
                tk.next = Some(t(2000));
                let id = tk.run.as_ref().unwrap().id;
                (id, store.fire_tick(tk).await.unwrap())
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let winners: Vec<RunId> = results
        .iter()
        .filter(|(_, w)| *w == TickWrite::Recorded)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert!(results
        .iter()
        .all(|(_, w)| matches!(w, TickWrite::Recorded | TickWrite::Exists)));
    for (id, _) in &results {
        let exists = store.get_run(id).await.unwrap().is_some();
        assert_eq!(exists, *id == winners[0], "run {id}");
    }
    let ticks = store.schedule_ticks("race", 10).await.unwrap();
    assert_eq!(ticks.len(), 1);
    assert_eq!(
        (ticks[0].nominal, ticks[0].outcome, ticks[0].run_id),
        (t(1000), TickOutcome::Started, Some(winners[0]))
    );
    let st = state(store, "race").await.unwrap();
    assert_eq!(st.next, Some(t(2000)));
    assert_eq!(st.last, Some(t(1000)));
    assert_eq!(st.last_started, Some((t(1000), winners[0])));
}

/// A schedule keeps its latest 1,000 ticks by nominal time; they are listed latest first.
pub async fn a_schedule_keeps_its_latest_1000_ticks<S: Store>(store: &S) {
    store
        .define_schedule(&def("many"), Some(t(0)), t(0))
        .await
        .unwrap();
    for i in 0..1005u64 {
        let tk = tick(
            "many",
            t(i * 1000),
            TickOutcome::Skipped(SkipReason::Missed),
        );
        assert_eq!(store.fire_tick(tk).await.unwrap(), TickWrite::Recorded);
    }
    let ticks = store.schedule_ticks("many", 5000).await.unwrap();
    assert_eq!(ticks.len(), TICKS_KEPT);
    assert_eq!(ticks[0].nominal, t(1004 * 1000));
    assert_eq!(ticks[TICKS_KEPT - 1].nominal, t(5 * 1000));
    assert!(ticks.windows(2).all(|w| w[0].nominal > w[1].nominal));
    assert_eq!(store.schedule_ticks("many", 3).await.unwrap().len(), 3);
    assert!(store.schedule_ticks("other", 3).await.unwrap().is_empty());
}

/// The next nominal time moves only forward when ticks fire or the schedule advances; a
/// redefinition keeps the schedule's ticks and pause, takes the new definition, and lowers
/// the next nominal time only to an earlier one.
pub async fn the_next_nominal_time_is_kept_and_a_redefinition_keeps_the_state<S: Store>(store: &S) {
    store
        .define_schedule(&def("kept"), Some(t(5000)), t(0))
        .await
        .unwrap();
    assert!(store.advance_schedule("kept", t(8000)).await.unwrap());
    assert!(store.advance_schedule("kept", t(6000)).await.unwrap());
    assert_eq!(state(store, "kept").await.unwrap().next, Some(t(8000)));
    assert!(!store.advance_schedule("nope", t(1)).await.unwrap());
    let mut tk = tick("kept", t(8000), TickOutcome::Buffered);
    tk.next = Some(t(7000));
    assert_eq!(store.fire_tick(tk).await.unwrap(), TickWrite::Recorded);
    let st = state(store, "kept").await.unwrap();
    assert_eq!(
        (st.next, st.buffered, st.last),
        (Some(t(8000)), Some(t(8000)), Some(t(8000)))
    );
    assert!(store.set_schedule_paused("kept", true, None).await.unwrap());

    let mut changed = def("kept");
    changed.overlap = Overlap::AllowAll;
    store
        .define_schedule(&changed, Some(t(9000)), t(1))
        .await
        .unwrap();
    let st = state(store, "kept").await.unwrap();
    assert_eq!(st.def, changed);
    assert!(st.paused);
    assert_eq!(st.next, Some(t(8000)));
    assert_eq!(store.schedule_ticks("kept", 10).await.unwrap().len(), 1);
    store
        .define_schedule(&changed, Some(t(3000)), t(2))
        .await
        .unwrap();
    assert_eq!(state(store, "kept").await.unwrap().next, Some(t(3000)));
}

/// Pausing and resuming are kept; a resume may move the next nominal time forward past the
/// paused span; an unknown schedule is reported.
pub async fn pause_and_resume<S: Store>(store: &S) {
    store
        .define_schedule(&def("p"), Some(t(1000)), t(0))
        .await
        .unwrap();
    assert!(!state(store, "p").await.unwrap().paused);
    assert!(store.set_schedule_paused("p", true, None).await.unwrap());
    let st = state(store, "p").await.unwrap();
    assert!(st.paused);
    assert_eq!(st.next, Some(t(1000)));
    assert!(store
        .set_schedule_paused("p", false, Some(t(60_000)))
        .await
        .unwrap());
    let st = state(store, "p").await.unwrap();
    assert!(!st.paused);
    assert_eq!(st.next, Some(t(60_000)));
    assert!(!store.set_schedule_paused("nope", true, None).await.unwrap());
}

/// A backfill's firing replaces a record without a run, once: repeating it writes nothing
/// and admits no second run; a record with a run is never replaced.
pub async fn a_backfill_replaces_a_run_less_record_once<S: Store>(store: &S) {
    store
        .define_schedule(&def("b"), Some(t(0)), t(0))
        .await
        .unwrap();
    let skipped = tick("b", t(1000), TickOutcome::Skipped(SkipReason::Paused));
    assert_eq!(store.fire_tick(skipped).await.unwrap(), TickWrite::Recorded);
    let backfill = |nominal| {
        let mut tk = tick("b", nominal, TickOutcome::Started);
        tk.backfill = true;
        tk.replace_runless = true;
        tk
    };
    let first = backfill(t(1000));
    let first_run = first.run.as_ref().unwrap().id;
    assert_eq!(store.fire_tick(first).await.unwrap(), TickWrite::Recorded);
    let again = backfill(t(1000));
    let again_run = again.run.as_ref().unwrap().id;
    assert_eq!(store.fire_tick(again).await.unwrap(), TickWrite::Exists);
    assert!(store.get_run(&again_run).await.unwrap().is_none());
    assert!(store.get_run(&first_run).await.unwrap().is_some());
    // Without leave to replace, even a run-less record stays.
    let plain = tick("b", t(2000), TickOutcome::Skipped(SkipReason::Overlap));
    assert_eq!(store.fire_tick(plain).await.unwrap(), TickWrite::Recorded);
    let over = tick("b", t(2000), TickOutcome::Started);
    let over_run = over.run.as_ref().unwrap().id;
    assert_eq!(store.fire_tick(over).await.unwrap(), TickWrite::Exists);
    assert!(store.get_run(&over_run).await.unwrap().is_none());

    let ticks = store.schedule_ticks("b", 10).await.unwrap();
    assert_eq!(ticks.len(), 2);
    assert_eq!(
        (ticks[1].outcome, ticks[1].run_id, ticks[1].backfill),
        (TickOutcome::Started, Some(first_run), true)
    );
    assert_eq!(ticks[0].outcome, TickOutcome::Skipped(SkipReason::Overlap));
    // A backfilled run is not the schedule's previous run for its overlap policy.
    assert_eq!(state(store, "b").await.unwrap().last_started, None);
}

/// Deleting a schedule removes it and its records, not its runs; firing it then writes
/// nothing; a second delete finds nothing.
pub async fn delete_removes_the_schedule_and_its_ticks<S: Store>(store: &S) {
    store
        .define_schedule(&def("d"), Some(t(0)), t(0))
        .await
        .unwrap();
    store.define_schedule(&def("e"), None, t(0)).await.unwrap();
    let started = tick("d", t(1000), TickOutcome::Started);
    let run_id = started.run.as_ref().unwrap().id;
    assert_eq!(store.fire_tick(started).await.unwrap(), TickWrite::Recorded);
    assert!(store.delete_schedule("d").await.unwrap());
    let names: Vec<String> = store
        .list_schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.def.name)
        .collect();
    assert_eq!(names, ["e"]);
    assert!(store.schedule_ticks("d", 10).await.unwrap().is_empty());
    assert!(store.get_run(&run_id).await.unwrap().is_some());
    let late = tick("d", t(2000), TickOutcome::Started);
    let late_run = late.run.as_ref().unwrap().id;
    assert_eq!(store.fire_tick(late).await.unwrap(), TickWrite::NoSchedule);
    assert!(store.get_run(&late_run).await.unwrap().is_none());
    assert!(!store.delete_schedule("d").await.unwrap());
    assert_eq!(state(store, "e").await.unwrap().next, None);
}

/// Handles fire the same batch of ticks (three schedules, two nominal times each) at once,
/// each firing with runs of its own, half of them asking for leases: every tick is recorded
/// once, by one firing, with one run, and no other firing's run exists; a run admitted with a
/// lease asked for is leased to its firing (epoch 1, running, not handed out by `acquire`),
/// one without is left pending for any worker.
pub async fn concurrent_batches_of_the_same_ticks_admit_exactly_one_run_each<S: Store + Clone>(
    stores: &[S],
) {
    let names = ["batch-a", "batch-b", "batch-c"];
    for name in names {
        stores[0]
            .define_schedule(&def(name), Some(t(1000)), t(0))
            .await
            .unwrap();
    }
    let nominals = [t(1000), t(2000)];
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let leased = i % 2 == 0;
            tokio::spawn(async move {
                let mut batch = Vec::new();
                // Half the firings take the ticks in the other order.
                let mut order: Vec<(usize, usize)> = (0..names.len())
                    .flat_map(|s| (0..nominals.len()).map(move |n| (s, n)))
                    .collect();
                if i % 4 < 2 {
                    order.reverse();
                }
                for (s, n) in order {
                    let mut tk = tick(names[s], nominals[n], TickOutcome::Started);
                    tk.next = Some(t(3000));
                    tk.lease = leased.then_some(Duration::from_secs(60));
                    batch.push(tk);
                }
                let runs: Vec<(String, SystemTime, RunId)> = batch
                    .iter()
                    .map(|tk| (tk.schedule.clone(), tk.nominal, tk.run.as_ref().unwrap().id))
                    .collect();
                let fired = store.fire_ticks(batch).await.unwrap();
                (leased, runs, fired)
            })
        })
        .collect();
    let mut winners: Vec<(String, SystemTime, RunId)> = Vec::new();
    let mut pending: Vec<RunId> = Vec::new();
    let store = &stores[0];
    for task in tasks {
        let (leased, runs, fired) = task.await.unwrap();
        assert_eq!(fired.len(), runs.len());
        for ((schedule, nominal, id), f) in runs.into_iter().zip(fired) {
            let run = store.get_run(&id).await.unwrap();
            match f.write {
                TickWrite::Recorded => {
                    let run = run.expect("a recorded tick's run is admitted");
                    if leased {
                        let lease = f.lease.expect("a run admitted with a lease asked for");
                        assert_eq!((lease.run_id, lease.epoch), (id, 1));
                        assert_eq!(run.status, RunStatus::Running);
                    } else {
                        assert_eq!(f.lease, None);
                        assert_eq!(run.status, RunStatus::Pending);
                        pending.push(id);
                    }
                    winners.push((schedule, nominal, id));
                }
                TickWrite::Exists => {
                    assert!(run.is_none(), "a tick recorded elsewhere admits no run");
                    assert_eq!(f.lease, None);
                }
                TickWrite::NoSchedule => panic!("every schedule exists"),
            }
        }
    }
    winners.sort();
    assert_eq!(winners.len(), names.len() * nominals.len(), "{winners:?}");
    winners.dedup_by(|a, b| (&a.0, a.1) == (&b.0, b.1));
    assert_eq!(
        winners.len(),
        names.len() * nominals.len(),
        "a tick recorded twice"
    );
    for (schedule, nominal, id) in &winners {
        let ticks = store.schedule_ticks(schedule, 10).await.unwrap();
        let record = ticks.iter().find(|r| r.nominal == *nominal).unwrap();
        assert_eq!(
            (record.outcome, record.run_id),
            (TickOutcome::Started, Some(*id))
        );
    }
    let kinds = vec!["tick".to_owned()];
    let acquired = store
        .acquire(AcquireRequest {
            worker_id: "other",
            workflows: &kinds,
            lease: Duration::from_secs(60),
            limit: 100,
            now: t(5000),
        })
        .await
        .unwrap();
    // Only the runs admitted without a lease are handed out: the others are held.
    let mut acquired: Vec<RunId> = acquired.iter().map(|l| l.run.id).collect();
    acquired.sort();
    pending.sort();
    assert_eq!(acquired, pending);
    for name in names {
        let st = state(store, name).await.unwrap();
        assert_eq!(st.next, Some(t(3000)));
        assert_eq!(st.last, Some(t(2000)));
        assert!(st.last_started_live);
    }
}

/// A batch is answered tick by tick, in order, as firing each alone would answer: a tick of
/// an unknown schedule writes nothing, a tick given twice is recorded once, a run-less tick
/// records no run; the schedule moves on to the furthest next time asked for; and the
/// listing tells whether the latest started tick's run has ended.
pub async fn a_batch_of_ticks_is_answered_in_order<S: Store>(store: &S) {
    store
        .define_schedule(&def("order"), Some(t(1000)), t(0))
        .await
        .unwrap();
    let mut first = tick("order", t(1000), TickOutcome::Started);
    first.next = Some(t(2000));
    first.lease = Some(Duration::from_secs(60));
    let first_run = first.run.as_ref().unwrap().id;
    let unknown = tick("unknown", t(1000), TickOutcome::Started);
    let unknown_run = unknown.run.as_ref().unwrap().id;
    let again = tick("order", t(1000), TickOutcome::Started);
    let again_run = again.run.as_ref().unwrap().id;
    let mut skipped = tick("order", t(2000), TickOutcome::Skipped(SkipReason::Overlap));
    skipped.next = Some(t(4000));
    let mut last = tick("order", t(3000), TickOutcome::Started);
    last.next = Some(t(3500));
    let last_run = last.run.as_ref().unwrap().id;
    let fired = store
        .fire_ticks(vec![first, unknown, again, skipped, last])
        .await
        .unwrap();
    let writes: Vec<TickWrite> = fired.iter().map(|f| f.write).collect();
    assert_eq!(
        writes,
        [
            TickWrite::Recorded,
            TickWrite::NoSchedule,
            TickWrite::Exists,
            TickWrite::Recorded,
            TickWrite::Recorded
        ]
    );
    assert_eq!(
        fired[0].lease,
        Some(Lease {
            run_id: first_run,
            epoch: 1
        })
    );
    assert!(fired[1..].iter().all(|f| f.lease.is_none()));
    for gone in [unknown_run, again_run] {
        assert!(store.get_run(&gone).await.unwrap().is_none());
    }
    let ticks = store.schedule_ticks("order", 10).await.unwrap();
    let listed: Vec<(SystemTime, TickOutcome, Option<RunId>)> = ticks
        .iter()
        .map(|r| (r.nominal, r.outcome, r.run_id))
        .collect();
    assert_eq!(
        listed,
        [
            (t(3000), TickOutcome::Started, Some(last_run)),
            (t(2000), TickOutcome::Skipped(SkipReason::Overlap), None),
            (t(1000), TickOutcome::Started, Some(first_run)),
        ]
    );
    let st = state(store, "order").await.unwrap();
    assert_eq!(st.next, Some(t(4000)));
    assert_eq!(st.last_started, Some((t(3000), last_run)));
    assert!(st.last_started_live, "a pending run has not ended");
    // `fire_tick` leases nothing, whatever the tick asks.
    let mut alone = tick("order", t(5000), TickOutcome::Started);
    alone.lease = Some(Duration::from_secs(60));
    let alone_run = alone.run.as_ref().unwrap().id;
    assert_eq!(store.fire_tick(alone).await.unwrap(), TickWrite::Recorded);
    let run = store.get_run(&alone_run).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Pending);
    // Once the latest started run has ended, the listing says so.
    store.cancel(&alone_run, t(5001)).await.unwrap();
    let st = state(store, "order").await.unwrap();
    assert_eq!(st.last_started, Some((t(5000), alone_run)));
    assert!(!st.last_started_live, "a cancelled run has ended");
}

/// Ticks handed over before they may be written (`fire_ticks_when`) are written once their
/// `ready` resolves, and not at all when it resolves with an error, which is returned.
pub async fn ticks_handed_over_early_are_written_only_when_ready<S: Store>(store: &S) {
    store
        .define_schedule(&def("early"), Some(t(1000)), t(0))
        .await
        .unwrap();
    let mut refused = tick("early", t(1000), TickOutcome::Started);
    refused.next = Some(t(2000));
    let refused_run = refused.run.as_ref().unwrap().id;
    let why = store
        .fire_ticks_when(
            vec![refused],
            Box::pin(async { Err(StoreError::database("the schedules changed")) }),
        )
        .await
        .unwrap_err();
    assert!(why.to_string().contains("the schedules changed"), "{why}");
    assert!(store.get_run(&refused_run).await.unwrap().is_none());
    assert!(store.schedule_ticks("early", 10).await.unwrap().is_empty());
    assert_eq!(state(store, "early").await.unwrap().next, Some(t(1000)));

    // Written once ready, not before: the store is read while the call waits.
    let mut due = tick("early", t(1000), TickOutcome::Started);
    due.next = Some(t(2000));
    let due_run = due.run.as_ref().unwrap().id;
    let (go, ready) = tokio::sync::oneshot::channel::<()>();
    let call = store.fire_ticks_when(
        vec![due],
        Box::pin(async move {
            ready
                .await
                .map_err(|_| StoreError::database("the caller went away"))
        }),
    );
    let check = async {
        // Both the call and the reads below make progress on this task; the call is polled
        // first, so it has made its rows and waits on `ready` when this runs.
        tokio::task::yield_now().await;
        assert!(store.get_run(&due_run).await.unwrap().is_none());
        assert!(store.schedule_ticks("early", 10).await.unwrap().is_empty());
        let _ = go.send(());
    };
    let (fired, ()) = tokio::join!(call, check);
    let fired = fired.unwrap();
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].write, TickWrite::Recorded);
    assert!(store.get_run(&due_run).await.unwrap().is_some());
    assert_eq!(state(store, "early").await.unwrap().next, Some(t(2000)));
}

/// A tick's run admitted leased to the firing worker holds the tick's first events under its
/// lease, numbered from 1 (the next append numbering on), and the answer says they were
/// written; a run admitted without a lease gets none of them, and a tick recorded already
/// admits no run and writes none.
pub async fn a_ticks_run_leased_at_its_admission_holds_its_first_events<S: Store>(store: &S) {
    store
        .define_schedule(&def("first"), Some(t(1000)), t(0))
        .await
        .unwrap();
    let first = || vec![step_done(t(1), 1), step_done(t(2), 2)];
    let mut leased = tick("first", t(1000), TickOutcome::Started);
    leased.lease = Some(Duration::from_secs(60));
    leased.first = first();
    let leased_run = leased.run.as_ref().unwrap().id;
    let mut unleased = tick("first", t(2000), TickOutcome::Started);
    unleased.first = first();
    let unleased_run = unleased.run.as_ref().unwrap().id;
    let fired = store.fire_ticks(vec![leased, unleased]).await.unwrap();
    assert_eq!(
        fired.iter().map(|f| f.write).collect::<Vec<_>>(),
        [TickWrite::Recorded, TickWrite::Recorded]
    );
    assert!(!fired[1].first, "a run admitted without a lease gets none");
    assert!(store.events(&unleased_run).await.unwrap().is_empty());
    let lease = fired[0].lease.clone().expect("leased at admission");
    assert!(fired[0].first, "written with the run");
    assert_eq!(event_seqs(store, leased_run).await, [1, 2]);
    store
        .append(&lease, &ap(vec![step_done(t(3), 3)], None))
        .await
        .unwrap();
    assert_eq!(event_seqs(store, leased_run).await, [1, 2, 3]);

    let mut again = tick("first", t(1000), TickOutcome::Started);
    again.lease = Some(Duration::from_secs(60));
    again.first = first();
    let again_run = again.run.as_ref().unwrap().id;
    let fired = store.fire_ticks(vec![again]).await.unwrap();
    assert_eq!(
        (fired[0].write, &fired[0].lease, fired[0].first),
        (TickWrite::Exists, &None, false)
    );
    assert!(store.get_run(&again_run).await.unwrap().is_none());
    assert!(store.events(&again_run).await.unwrap().is_empty());
}
