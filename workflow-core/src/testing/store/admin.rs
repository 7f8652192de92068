//! The administration contract ([`AdminStore`](crate::store::AdminStore)): listing runs and
//! hooks for inspection tools, with filters, order and cursors, and pruning ended runs with
//! everything they recorded.

use std::time::Duration;

use serde_json::json;

use super::support::{acquire, ap, create, lease_one, names, start, step_done, t};
use super::Inspect;
use crate::error::{Error, StoreError};
use crate::ids::RunId;
use crate::store::memory::MemoryStore;
use crate::store::*;

/// Admits runs of two workflows, ends some of them, registers and releases hooks, and lists.
pub(crate) async fn listing_script<S: Store>(store: &S, ids: &[RunId]) -> Vec<String> {
    let mut log = Vec::new();
    macro_rules! note {
        ($e:expr) => {
            log.push(format!("{:?}", $e))
        };
    }
    for (i, id) in ids.iter().enumerate() {
        let workflow = if i % 2 == 0 { "orders" } else { "hooked" };
        let hook = (i % 2 == 1).then(|| StartHook {
            token: format!("tok-{i}"),
            retain_until: None,
        });
        // Two runs share an admission time: the id breaks the tie.
        let at = t(10 * (i as u64 / 2 * 2));
        note!(
            store
                .create_run(NewRun::new(*id, workflow, json!([i]), at).hook(hook))
                .await
        );
    }
    note!(store.cancel(&ids[1], t(100)).await);
    let leased = store
        .acquire(AcquireRequest {
            worker_id: "w",
            workflows: &names(&["orders"]),
            lease: Duration::from_secs(60),
            limit: 10,
            now: t(200),
        })
        .await
        .unwrap();
    let lease = leased
        .iter()
        .find(|r| r.run.id == ids[0])
        .unwrap()
        .lease
        .clone();
    note!(store.claim_hook(&lease, "hk_1", "extra", t(210)).await);
    note!(
        store
            .append(
                &lease,
                &ap(
                    vec![NewEvent {
                        at: t(220),
                        event: Event::RunFailed {
                            error: Error::fatal("no"),
                        },
                    }],
                    Some(RunOutcome::Failed(Error::fatal("no")))
                )
            )
            .await
    );
    let filters = [
        RunFilter::new(),
        RunFilter::new().limit(2),
        RunFilter::new().limit(0),
        RunFilter::new().workflow("orders"),
        RunFilter::new()
            .workflow("hooked")
            .status(RunStatus::Pending),
        RunFilter::new().status(RunStatus::Running),
        RunFilter::new().status(RunStatus::Failed),
        RunFilter::new().status(RunStatus::Cancelled),
        RunFilter::new().workflow("nope"),
    ];
    for f in &filters {
        note!(store.list_runs(f).await);
    }
    let hook_filters = [
        HookFilter::new(),
        HookFilter::new().limit(1),
        HookFilter::new().token("tok-3"),
        HookFilter::new().token("tok-1"),
        HookFilter::new().token("extra"),
        HookFilter::new().run_id(ids[5]),
        HookFilter::new().run_id(ids[5]).token("tok-3"),
    ];
    for f in &hook_filters {
        note!(store.list_hooks(f).await);
    }
    log
}

/// A script of admissions, ends, hooks and listings has the same transcript on `store` as on
/// the memory store, and what they agree on is right.
pub async fn listing_behaves_like_the_memory_store<S: Store>(store: &S) {
    let ids: Vec<RunId> = (0..6).map(|_| RunId::new()).collect();
    let memory = MemoryStore::new();
    let expected = listing_script(&memory, &ids).await;
    let got = listing_script(store, &ids).await;
    for (n, (want, have)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(have, want, "step {n} differs from the memory store");
    }
    assert_eq!(got.len(), expected.len());

    let listed = |f: RunFilter| async move { run_ids(&store.list_runs(&f).await.unwrap()) };
    // Newest first; equal admission times (0 and 1, 2 and 3, 4 and 5) by id, descending.
    let mut newest_first = ids.clone();
    newest_first.sort_by_key(|id| {
        let i = ids.iter().position(|x| x == id).unwrap();
        std::cmp::Reverse((i / 2, *id))
    });
    assert_eq!(listed(RunFilter::new()).await, newest_first);
    assert_eq!(listed(RunFilter::new().limit(2)).await, newest_first[..2]);
    assert_eq!(
        listed(RunFilter::new().status(RunStatus::Failed)).await,
        [ids[0]]
    );
    assert_eq!(
        listed(RunFilter::new().status(RunStatus::Cancelled)).await,
        [ids[1]]
    );
    // Runs 2 and 4 were leased; 3 and 5 are `hooked` runs never acquired.
    let mut running = listed(RunFilter::new().status(RunStatus::Running)).await;
    running.sort();
    let mut want = vec![ids[2], ids[4]];
    want.sort();
    assert_eq!(running, want);

    let hooks = store.list_hooks(&HookFilter::new()).await.unwrap();
    let tokens: Vec<&str> = hooks.iter().map(|h| h.token.as_str()).collect();
    // tok-1 went with the cancellation, `extra` with run 0's end.
    assert_eq!(tokens, ["tok-5", "tok-3"]);
    assert_eq!(hooks[0].run_id, ids[5]);
    assert_eq!(hooks[0].created_at, t(40));
}

/// The ids of `runs`, in order.
fn run_ids(runs: &[RunRecord]) -> Vec<RunId> {
    runs.iter().map(|r| r.id).collect()
}

/// Admits a run of `workflow` at `at`, claiming `token` if given.
async fn admit<S: Store>(store: &S, workflow: &str, at: u64, token: Option<&str>) -> RunId {
    let id = RunId::new();
    let admission = store
        .create_run(
            NewRun::new(id, workflow, json!([]), t(at)).hook(token.map(|token| StartHook {
                token: token.into(),
                retain_until: None,
            })),
        )
        .await
        .unwrap();
    assert_eq!(admission, Admission::Admitted);
    id
}

/// `list_runs` returns the newest runs first and applies each filter.
pub async fn lists_runs_newest_first_with_filters<S: Store>(store: &S) {
    let a = admit(store, "orders", 1, None).await;
    let b = admit(store, "billing", 2, None).await;
    let c = admit(store, "orders", 3, None).await;
    store.cancel(&a, t(4)).await.unwrap();

    let listed = |f: RunFilter| async move { run_ids(&store.list_runs(&f).await.unwrap()) };
    assert_eq!(listed(RunFilter::new()).await, [c, b, a]);
    assert_eq!(listed(RunFilter::new().workflow("orders")).await, [c, a]);
    assert_eq!(
        listed(RunFilter::new().status(RunStatus::Cancelled)).await,
        [a]
    );
    assert_eq!(
        listed(
            RunFilter::new()
                .workflow("orders")
                .status(RunStatus::Pending)
        )
        .await,
        [c]
    );
    assert_eq!(listed(RunFilter::new().limit(2)).await, [c, b]);
    assert!(listed(RunFilter::new().workflow("nope")).await.is_empty());
}

/// `list_runs` pages through a time range: `created_after` is inclusive, `created_before`
/// exclusive, and `after(run)` continues the newest-first order after that run, also among
/// runs admitted at the same time; a cursor the store does not hold is `RunNotFound`.
pub async fn lists_runs_by_time_range_and_cursor<S: Store>(store: &S) {
    let a = admit(store, "orders", 1, None).await;
    let b = admit(store, "orders", 2, None).await;
    let c = admit(store, "orders", 2, None).await;
    let d = admit(store, "billing", 3, None).await;
    // b and c share an admission time: the id breaks the tie, the higher first.
    let (hi, lo) = if b > c { (b, c) } else { (c, b) };

    let listed = |f: RunFilter| async move { run_ids(&store.list_runs(&f).await.unwrap()) };
    assert_eq!(
        listed(RunFilter::new().created_after(t(2))).await,
        [d, hi, lo]
    );
    assert_eq!(listed(RunFilter::new().created_before(t(2))).await, [a]);
    assert_eq!(
        listed(RunFilter::new().created_after(t(2)).created_before(t(3))).await,
        [hi, lo]
    );
    // Pages of two, each after the last run of the one before.
    let first = listed(RunFilter::new().limit(2)).await;
    assert_eq!(first, [d, hi]);
    let second = listed(RunFilter::new().limit(2).after(&hi)).await;
    assert_eq!(second, [lo, a]);
    assert!(listed(RunFilter::new().limit(2).after(&a)).await.is_empty());
    // The cursor combines with the other filters.
    assert_eq!(
        listed(RunFilter::new().workflow("orders").after(&d)).await,
        [hi, lo, a]
    );
    let unknown = RunId::new();
    let err = store
        .list_runs(&RunFilter::new().after(&unknown))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::RunNotFound(id) if id == unknown),
        "{err:?}"
    );
}

/// `list_hooks` returns the active hooks, newest first, and applies each filter; a cancelled
/// run's hooks are not listed.
pub async fn lists_only_active_hooks<S: Store>(store: &S) {
    let a = admit(store, "hooked", 1, Some("order:1")).await;
    let b = admit(store, "hooked", 2, Some("order:2")).await;
    let c = admit(store, "hooked", 3, Some("order:3")).await;
    store.cancel(&b, t(4)).await.unwrap();

    let listed = |f: HookFilter| async move {
        store
            .list_hooks(&f)
            .await
            .unwrap()
            .into_iter()
            .map(|h| (h.token, h.run_id))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(HookFilter::new()).await,
        [("order:3".to_owned(), c), ("order:1".to_owned(), a)]
    );
    let one = store
        .list_hooks(&HookFilter::new().token("order:1"))
        .await
        .unwrap();
    assert_eq!(one[0].created_at, t(1));
    assert_eq!(
        listed(HookFilter::new().token("order:1")).await,
        [("order:1".to_owned(), a)]
    );
    assert!(listed(HookFilter::new().token("order:2")).await.is_empty());
    assert_eq!(
        listed(HookFilter::new().run_id(c)).await,
        [("order:3".to_owned(), c)]
    );
    assert_eq!(
        listed(HookFilter::new().limit(1)).await,
        [("order:3".to_owned(), c)]
    );
}

/// `prune` deletes the runs that ended before the cutoff, with their events, payloads and
/// hooks, and counts exactly what it deleted; it keeps runs that have not ended, runs that
/// ended after the cutoff, and an ended run whose token retention is in force (the token
/// still refuses duplicates and names it) until that retention is over. Pruning again
/// deletes nothing more.
pub async fn prune_deletes_old_ended_runs_with_what_they_recorded<S: Store>(store: &S) {
    // Old and ended: a completed run that received a payload, a failed run, and a cancelled
    // run whose token is retained only until before the prune.
    let (completed, _) = start(store, "pa", None, t(0)).await;
    store
        .resume_hook("pa", json!("hi"), t(10))
        .await
        .unwrap()
        .unwrap();
    let failed = create(store, "orders", t(0)).await;
    let running = create(store, "orders", t(0)).await;
    let leased = acquire(
        store,
        &names(&["hooked", "orders"]),
        t(20),
        Duration::from_secs(600),
        10,
    )
    .await;
    let lease = |id: RunId| {
        leased
            .iter()
            .find(|r| r.run.id == id)
            .unwrap()
            .lease
            .clone()
    };
    let done = Some(RunOutcome::Completed(json!(1)));
    let write = ap(vec![step_done(t(100), 1)], done);
    store.append(&lease(completed), &write).await.unwrap();
    let boom = Some(RunOutcome::Failed(Error::fatal("boom")));
    let write = ap(vec![step_done(t(150), 1), step_done(t(200), 2)], boom);
    store.append(&lease(failed), &write).await.unwrap();
    let write = ap(vec![step_done(t(200), 1)], None);
    store.append(&lease(running), &write).await.unwrap();
    let (expired, _) = start(store, "c", Some(t(400)), t(0)).await;
    store.cancel(&expired, t(300)).await.unwrap();
    // Kept: ended before the cutoff but retaining its token past `now`; pending; ended
    // after the cutoff.
    let (retained, _) = start(store, "d", Some(t(5_000)), t(0)).await;
    store.cancel(&retained, t(300)).await.unwrap();
    let pending = create(store, "orders", t(0)).await;
    let recent = create(store, "orders", t(0)).await;
    store.cancel(&recent, t(900)).await.unwrap();

    let events = |id: RunId| async move { store.events(&id).await.unwrap() };
    let pruned = [completed, failed, expired];
    let kept = [retained, running, pending, recent];
    let mut doomed_events = 0;
    for id in pruned {
        doomed_events += events(id).await.len() as u64;
    }
    assert_eq!(doomed_events, 4, "one step, two steps, a cancellation");
    let mut before = Vec::new();
    for id in kept {
        let run = store.get_run(&id).await.unwrap().unwrap();
        before.push((run, events(id).await));
    }
    let inbox = store.payloads_since(0, 100).await.unwrap();
    assert_eq!(inbox.iter().filter(|(_, r)| *r == completed).count(), 1);

    let (cutoff, now) = (t(500), t(1_000));
    assert_eq!(
        store.prune(cutoff, now).await.unwrap(),
        PruneStats {
            runs: 3,
            events: doomed_events
        }
    );
    for id in pruned {
        assert_eq!(store.get_run(&id).await.unwrap(), None, "run {id}");
        assert!(events(id).await.is_empty(), "events of run {id}");
        assert!(store.payloads(&id, 0).await.unwrap().is_empty());
    }
    let inbox = store.payloads_since(0, 100).await.unwrap();
    assert!(inbox.iter().all(|(_, r)| *r != completed), "{inbox:?}");
    for (id, (run, history)) in kept.iter().zip(&before) {
        assert_eq!(store.get_run(id).await.unwrap().as_ref(), Some(run));
        assert_eq!(&events(*id).await, history, "events of run {id}");
    }
    // The retained token still refuses a duplicate and names its run; the expired one is free.
    assert_eq!(
        start(store, "d", None, t(1_001)).await.1,
        Admission::Conflict(retained)
    );
    assert_eq!(
        start(store, "c", None, t(1_001)).await.1,
        Admission::Admitted
    );

    assert_eq!(
        store.prune(cutoff, now).await.unwrap(),
        PruneStats::default()
    );
    // Once the retention is over, the run goes too.
    let retained_events = before[0].1.len() as u64;
    assert_eq!(
        store.prune(cutoff, t(5_000)).await.unwrap(),
        PruneStats {
            runs: 1,
            events: retained_events
        }
    );
    assert_eq!(store.get_run(&retained).await.unwrap(), None);
    assert_eq!(
        start(store, "d", None, t(5_001)).await.1,
        Admission::Admitted
    );
    for id in [running, pending, recent] {
        assert!(store.get_run(&id).await.unwrap().is_some(), "run {id}");
    }
}

/// A pruned run leaves no row behind: not its events, its payloads, nor the row of its
/// retained token, once that retention is over (until then, nothing of it goes).
pub async fn prune_leaves_no_rows_of_a_pruned_run<S: Store + Inspect>(store: &S) {
    let (run, _) = start(store, "x", Some(t(100)), t(0)).await;
    store
        .resume_hook("x", json!(1), t(5))
        .await
        .unwrap()
        .unwrap();
    store.cancel(&run, t(10)).await.unwrap();
    let tables = ["runs", "events", "hooks", "hook_inbox"];
    for table in tables {
        assert_eq!(store.count(table).await, 1, "{table}");
    }
    assert_eq!(
        store.prune(t(50), t(99)).await.unwrap(),
        PruneStats::default()
    );
    for table in tables {
        assert_eq!(store.count(table).await, 1, "{table} while retained");
    }
    assert_eq!(
        store.prune(t(50), t(100)).await.unwrap(),
        PruneStats { runs: 1, events: 1 }
    );
    for table in tables {
        assert_eq!(store.count(table).await, 0, "{table}");
    }
}

/// `run_counts` groups every stored run by workflow and status, ordered by workflow then
/// status, and follows the runs' changes of state.
pub async fn run_counts_group_runs_by_workflow_and_status<S: Store>(store: &S) {
    assert_eq!(
        store.run_counts().await.unwrap(),
        Vec::new(),
        "an empty store"
    );
    let a = create(store, "orders", t(0)).await;
    create(store, "orders", t(1)).await;
    create(store, "hooked", t(2)).await;
    let count = |w: &str, status, runs| RunCount {
        workflow: w.to_owned(),
        status,
        runs,
    };
    let sorted = |mut counts: Vec<RunCount>| {
        counts.sort_by(|x, y| {
            (&x.workflow, x.status.as_str()).cmp(&(&y.workflow, y.status.as_str()))
        });
        counts
    };
    assert_eq!(
        sorted(store.run_counts().await.unwrap()),
        [
            count("hooked", RunStatus::Pending, 1),
            count("orders", RunStatus::Pending, 2),
        ]
    );
    // Leases the three runs; `a` then completes.
    let lease = lease_one(store, a, t(3)).await;
    let end = ap(
        vec![NewEvent {
            at: t(4),
            event: Event::RunCompleted { output: json!(1) },
        }],
        Some(RunOutcome::Completed(json!(1))),
    );
    store.append(&lease, &end).await.unwrap();
    assert_eq!(
        sorted(store.run_counts().await.unwrap()),
        [
            count("hooked", RunStatus::Running, 1),
            count("orders", RunStatus::Completed, 1),
            count("orders", RunStatus::Running, 1),
        ]
    );
}
