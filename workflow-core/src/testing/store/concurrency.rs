//! What must be atomic across handles: cases that race three handles on one database (each a
//! separate connection where the store has connections), for runs and leases, starts claiming
//! one token, resumes filling the inbox, stream chunks and queue slots.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use super::hooks::hooked_run;
use super::queues::{create_queued, create_queued_leased, declare};
use super::support::{
    acquire, ap, create, hook_payload, lease_one, names, owner, sent, start, start_hook, step_done,
    t,
};
use super::{within, Inspect};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::*;

/// `stores` are handles on one database (separate connections where the store has them).
pub async fn concurrent_acquirers_never_share_a_run<S: Store + Clone>(stores: &[S]) {
    let creates: Vec<_> = (0..200)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move { create(&store, "shared", t(i as u64)).await })
        })
        .collect();
    let mut all = HashSet::new();
    for c in creates {
        all.insert(c.await.unwrap());
    }

    let workers: Vec<_> = (0..4)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move {
                let wf = names(&["shared"]);
                let mut mine = Vec::new();
                loop {
                    let got = acquire(&store, &wf, t(1_000), Duration::from_secs(600), 3).await;
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got.into_iter().map(|r| (r.run.id, r.lease.epoch)));
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut per_worker = Vec::new();
    for w in workers {
        let mine = w.await.unwrap();
        per_worker.push(mine.len());
        for (id, epoch) in mine {
            assert_eq!(epoch, 1, "run {id} was leased twice");
            assert!(seen.insert(id), "run {id} was handed out twice");
        }
    }
    assert_eq!(seen, all, "shares per worker: {per_worker:?}");
}

/// Many runs written at once, from every handle (a store committing writes together, as
/// PostgreSQL's committers do, puts them in one transaction): each write answers for itself.
/// The writes of runs whose lease is gone (cancelled) are refused and write nothing; every
/// other run gets its step and, for half of them, its end, numbered after its own events.
pub async fn concurrent_writes_of_many_runs_each_answer_for_themselves<S: Store + Clone>(
    stores: &[S],
) {
    const RUNS: usize = 60;
    let store = &stores[0];
    for i in 0..RUNS {
        create(store, "many", t(i as u64)).await;
    }
    let leased = acquire(
        store,
        &names(&["many"]),
        t(100),
        Duration::from_secs(600),
        RUNS,
    )
    .await;
    assert_eq!(leased.len(), RUNS);
    // Every fifth run loses its lease.
    let lost: HashSet<RunId> = leased.iter().step_by(5).map(|r| r.run.id).collect();
    for id in &lost {
        store.cancel(id, t(200)).await.unwrap();
    }
    let writes: Vec<_> = leased
        .iter()
        .enumerate()
        .map(|(i, run)| {
            let store = stores[i % stores.len()].clone();
            let lease = run.lease.clone();
            tokio::spawn(async move {
                let step = store
                    .append(&lease, &ap(vec![step_done(t(300), 1)], None))
                    .await;
                if step.is_err() || i % 2 == 1 {
                    return (lease.run_id, step, None);
                }
                let end = NewEvent {
                    at: t(301),
                    event: Event::RunCompleted { output: json!(i) },
                };
                let outcome = Some(RunOutcome::Completed(json!(i)));
                let ended = store.append(&lease, &ap(vec![end], outcome)).await;
                (lease.run_id, step, Some(ended))
            })
        })
        .collect();
    for write in writes {
        let (id, step, ended) = write.await.unwrap();
        let run = store.get_run(&id).await.unwrap().unwrap();
        let kinds: Vec<&str> = store
            .events(&id)
            .await
            .unwrap()
            .iter()
            .map(|e| e.event.kind())
            .collect();
        if lost.contains(&id) {
            assert!(
                matches!(step, Err(StoreError::LeaseLost(r)) if r == id),
                "{id}: {step:?}"
            );
            assert_eq!(run.status, RunStatus::Cancelled);
            assert_eq!(kinds, ["run_cancelled"], "{id}");
            continue;
        }
        assert!(step.is_ok(), "{id}: {step:?}");
        match ended {
            Some(ended) => {
                assert!(ended.is_ok(), "{id}: {ended:?}");
                assert_eq!(run.status, RunStatus::Completed);
                assert_eq!(kinds, ["step_completed", "run_completed"], "{id}");
            }
            None => {
                assert_eq!(run.status, RunStatus::Running);
                assert_eq!(kinds, ["step_completed"], "{id}");
            }
        }
    }
}

/// Two storms of starts on one token: from tasks on one handle, then spread over all of
/// `stores` (handles on one database).
pub async fn concurrent_starts_with_one_token_admit_exactly_one<S: Store + Clone + Inspect>(
    stores: &[S],
) {
    storm(&stores[..1], "solo", 200).await;
    storm(stores, "shared", 200).await;
    let store = &stores[0];
    assert_eq!(store.count("runs").await, 2);
    assert_eq!(store.count("hooks").await, 2);
    assert_eq!(store.count("events").await, 0);
}

/// Starts `n` runs claiming `token` at once, spread over `stores` (handles on one database);
/// checks that exactly one was admitted and every other start names it and wrote no run;
/// returns the winner.
pub(crate) async fn storm<S: Store + Clone>(stores: &[S], token: &str, n: usize) -> RunId {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let token = token.to_owned();
            tokio::spawn(async move {
                let id = RunId::new();
                let admission = store
                    .create_run(
                        NewRun::new(id, "hooked".to_owned(), json!([i]), t(0))
                            .hook(start_hook(&token, None)),
                    )
                    .await
                    .unwrap();
                (id, admission)
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let winners: Vec<RunId> = results
        .iter()
        .filter(|(_, a)| *a == Admission::Admitted)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = winners[0];
    for (id, admission) in &results {
        if *id != winner {
            assert_eq!(*admission, Admission::Conflict(winner));
            assert!(stores[0].get_run(id).await.unwrap().is_none());
        }
    }
    assert_eq!(owner(&stores[0], token).await, Some(winner));
    winner
}

/// 200 `admit_or_resume` calls with one token at once, spread over `stores`, and 50 plain
/// starts of the token among them (which may take it between a call's resume and its
/// claim): one run is admitted, each plain start that lost names it, and every call that did
/// not admit queued its own payload to it, once.
pub async fn concurrent_admit_or_resume_calls_admit_one_and_queue_the_rest<
    S: Store + Clone + Inspect,
>(
    stores: &[S],
) {
    let tasks: Vec<_> = (0..250)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move {
                let run = hooked_run("storm", None, t(0));
                let id = run.id;
                let outcome = if i % 5 == 4 {
                    match store.create_run(run).await.unwrap() {
                        Admission::Admitted => AdmitOrResume::Admitted(None),
                        Admission::Conflict(owner) => AdmitOrResume::Conflict(owner),
                    }
                } else {
                    store.admit_or_resume(run, None, json!(i)).await.unwrap()
                };
                (i, id, outcome)
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut resumed = Vec::new();
    let mut refused = Vec::new();
    for task in tasks {
        let (i, id, outcome) = within(task).await.unwrap();
        match outcome {
            AdmitOrResume::Admitted(_) => admitted.push(id),
            AdmitOrResume::Resumed { run, payload_id } => resumed.push((i, run, payload_id)),
            AdmitOrResume::Conflict(owner) if i % 5 == 4 => refused.push(owner),
            AdmitOrResume::Conflict(owner) => panic!("call {i} conflicted with {owner}"),
        }
    }
    assert_eq!(admitted.len(), 1, "exactly one call admits");
    let winner = admitted[0];
    assert_eq!(resumed.len() + refused.len(), 249);
    assert!(refused.iter().all(|owner| *owner == winner));
    assert!(resumed.iter().all(|(_, run, _)| *run == winner));
    let inbox = store_payloads(&stores[0], winner).await;
    let mut sent: Vec<_> = resumed.iter().map(|(i, _, id)| (*id, json!(i))).collect();
    sent.sort_by_key(|(id, _)| *id);
    assert_eq!(
        inbox, sent,
        "each resumed call's payload, once, under its id"
    );
    assert_eq!(stores[0].count("runs").await, 1);
}

async fn store_payloads<S: Store>(store: &S, run: RunId) -> Vec<(u64, serde_json::Value)> {
    let inbox = within(store.payloads(&run, 0)).await.unwrap();
    inbox
        .iter()
        .map(|p| (p.id, hook_payload(p).1.clone()))
        .collect()
}

/// Payloads sent one after the other and at once, through two handles on one database
/// (`stores[0]` and `stores[1]`): each id is above the last, all are delivered to their
/// owner, and the listings agree.
pub async fn payloads_reach_the_owner_in_commit_order<S: Store + Clone>(stores: &[S]) {
    let (a, b) = (&stores[0], &stores[1]);
    // Admitted to wake far ahead; a payload makes it acquirable at the payload's time.
    let (run, _) = start(a, "inbox", None, t(50_000)).await;
    let (other, _) = start(a, "other", None, t(50_000)).await;
    let hooked = names(&["hooked"]);
    assert!(acquire(a, &hooked, t(100), Duration::from_secs(60), 10)
        .await
        .is_empty());
    let first = a
        .resume_hook("inbox", json!({"n": 0}), t(100))
        .await
        .unwrap();
    assert_eq!(first, Some((run, 1)));
    let got = acquire(a, &hooked, t(100), Duration::from_secs(60), 10).await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [run]);

    // One after the other, from either handle: each id above the last.
    let mut last = 1;
    let mut expect = vec![(1, run)];
    for i in 1..20u64 {
        let store = if i % 2 == 0 { a } else { b };
        let token = if i % 3 == 0 { "other" } else { "inbox" };
        let (owner, id) = store
            .resume_hook(token, json!({"n": i}), t(200 + i))
            .await
            .unwrap()
            .unwrap();
        assert!(id > last, "payload id {id} after {last}");
        last = id;
        expect.push((id, owner));
    }
    // At once: distinct ids, all delivered.
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                store
                    .resume_hook("inbox", json!({"burst": i}), t(300))
                    .await
                    .unwrap()
                    .unwrap()
            })
        })
        .collect();
    for task in tasks {
        let (owner, id) = task.await.unwrap();
        expect.push((id, owner));
    }
    expect.sort();
    let since = a.payloads_since(0, 1_000).await.unwrap();
    assert_eq!(since, expect);
    assert_eq!(
        since.iter().map(|p| p.0).collect::<HashSet<_>>().len(),
        60,
        "ids are unique"
    );
    assert_eq!(a.last_payload_id().await.unwrap(), since[59].0);
    assert_eq!(a.payloads_since(5, 3).await.unwrap(), since[5..8]);
    assert!(a.payloads_since(since[59].0, 10).await.unwrap().is_empty());

    let mine = a.payloads(&run, 0).await.unwrap();
    let theirs = b.payloads(&other, 0).await.unwrap();
    assert_eq!(mine.len() + theirs.len(), 60);
    assert_eq!(
        mine.iter().map(|p| (p.id, run)).collect::<Vec<_>>(),
        expect
            .iter()
            .copied()
            .filter(|(_, r)| *r == run)
            .collect::<Vec<_>>()
    );
    assert!(theirs.iter().all(|p| hook_payload(p).0 == "other"));
    assert_eq!(mine[0], sent(1, "inbox", json!({"n": 0})));
    assert_eq!(
        a.payloads(&run, 1).await.unwrap(),
        mine[1..],
        "`after` is exclusive"
    );
    assert!(a.payloads(&RunId::new(), 0).await.unwrap().is_empty());
}

/// Senders on `stores[0]` and `stores[1]` while a cursor reader like the runtime's polls
/// `stores[2]` (handles on one database): an id committed below the reader's cursor would be
/// lost to it, so ids must follow commit order.
pub async fn payload_ids_follow_commit_order_under_concurrent_resumes<S: Store + Clone>(
    stores: &[S],
) {
    let (a, b, reader) = (&stores[0], &stores[1], stores[2].clone());
    const TOKENS: usize = 8;
    const EACH: usize = 25;
    let mut runs = Vec::new();
    for i in 0..TOKENS {
        runs.push(start(a, &format!("tk{i}"), None, t(0)).await.0);
    }

    let (done_tx, done) = tokio::sync::watch::channel(false);
    let cursor = tokio::spawn(async move {
        let mut cursor = 0u64;
        let mut seen = Vec::new();
        loop {
            let finished = *done.borrow();
            let news = reader.payloads_since(cursor, 1_000).await.unwrap();
            for (id, run) in news {
                assert!(id > cursor, "id {id} at cursor {cursor}");
                cursor = id;
                seen.push((id, run));
            }
            if finished {
                return seen;
            }
            tokio::task::yield_now().await;
        }
    });
    let writers: Vec<_> = (0..TOKENS)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for n in 0..EACH {
                    let (_, id) = store
                        .resume_hook(&format!("tk{i}"), json!({"n": n}), t(1))
                        .await
                        .unwrap()
                        .unwrap();
                    ids.push(id);
                }
                ids
            })
        })
        .collect();
    let mut all = Vec::new();
    for (i, w) in writers.into_iter().enumerate() {
        let ids = w.await.unwrap();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "one sender's ids grow: {ids:?}"
        );
        // Each run's inbox holds its payloads in the order they were sent.
        let inbox = a.payloads(&runs[i], 0).await.unwrap();
        assert_eq!(inbox.iter().map(|p| p.id).collect::<Vec<_>>(), ids);
        assert_eq!(
            inbox
                .iter()
                .map(|p| hook_payload(p).1.clone())
                .collect::<Vec<_>>(),
            (0..EACH).map(|n| json!({"n": n})).collect::<Vec<_>>()
        );
        all.extend(ids.into_iter().map(|id| (id, runs[i])));
    }
    done_tx.send(true).unwrap();
    let seen = cursor.await.unwrap();
    all.sort();
    assert_eq!(seen.len(), TOKENS * EACH, "the cursor skipped payloads");
    assert_eq!(seen, all);
    assert_eq!(a.last_payload_id().await.unwrap(), all.last().unwrap().0);
    assert_eq!(a.payloads_since(all[4].0, 3).await.unwrap(), all[5..8]);
}

/// Writers racing on one stream through three handles get every index exactly once, and
/// the stream holds each value at the index its write returned.
pub async fn concurrent_chunk_writers_get_every_index_once<S: Store + Clone>(stores: &[S]) {
    let id = create(&stores[0], "orders", t(0)).await;
    let lease = lease_one(&stores[0], id, t(1)).await;
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(w, store)| {
            let (store, lease) = (store.clone(), lease.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..20 {
                    let v = json!(format!("{w}-{i}"));
                    let index = store
                        .append_chunk(&lease, "race", 1, v.clone(), t(2))
                        .await
                        .unwrap()
                        .unwrap();
                    got.push((index, v));
                }
                got
            })
        })
        .collect();
    let mut written = Vec::new();
    for task in tasks {
        written.extend(task.await.unwrap());
    }
    written.sort_by_key(|(i, _)| *i);
    let indexes: Vec<u64> = written.iter().map(|(i, _)| *i).collect();
    assert_eq!(indexes, (0..60).collect::<Vec<u64>>());
    let page = stores[1].read_stream(&id, "race", 0, 100).await.unwrap();
    let stored: Vec<(u64, serde_json::Value)> = page
        .chunks
        .into_iter()
        .map(|c| (c.index, c.value))
        .collect();
    assert_eq!(stored, written);
}

/// Three handles acquiring at once never begin more runs of a queue than its concurrency.
pub async fn concurrent_acquirers_never_exceed_a_queue_s_concurrency<S: Store + Clone>(
    stores: &[S],
) {
    declare(&stores[0], "c", Some(3), None).await;
    for i in 0..30 {
        create_queued(&stores[0], "c", None, 0, t(i)).await;
    }
    let mut tasks = Vec::new();
    for store in stores {
        for _ in 0..3 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let got = acquire(
                    &store,
                    &names(&["orders"]),
                    t(100),
                    Duration::from_secs(600),
                    2,
                )
                .await;
                got.len()
            }));
        }
    }
    let mut leased = 0;
    for task in tasks {
        leased += task.await.unwrap();
    }
    assert_eq!(leased, 3, "exactly the queue's concurrency began");
    let info = stores[0].list_queues(t(100)).await.unwrap();
    assert_eq!((info[0].occupied, info[0].waiting), (3, 27));
}

/// Admissions asking for a lease race acquirers on three handles: the runs begun at admission
/// and by `acquire` together never exceed the queue's concurrency, and every run is counted
/// once, begun or waiting.
pub async fn concurrent_leased_admissions_never_exceed_a_queue_s_concurrency<S: Store + Clone>(
    stores: &[S],
) {
    declare(&stores[0], "m", Some(3), None).await;
    let mut admissions = Vec::new();
    let mut acquirers = Vec::new();
    for (n, store) in stores.iter().enumerate() {
        for i in 0..10u64 {
            let store = store.clone();
            let at = t(n as u64 * 10 + i);
            admissions.push(tokio::spawn(async move {
                create_queued_leased(&store, "m", None, at)
                    .await
                    .1
                    .is_some()
            }));
        }
        let store = store.clone();
        acquirers.push(tokio::spawn(async move {
            acquire(
                &store,
                &names(&["orders"]),
                t(100),
                Duration::from_secs(600),
                2,
            )
            .await
            .len()
        }));
    }
    let mut begun = 0;
    for a in admissions {
        begun += usize::from(a.await.unwrap());
    }
    for a in acquirers {
        begun += a.await.unwrap();
    }
    let info = stores[0].list_queues(t(100)).await.unwrap();
    let m = info.iter().find(|q| q.def.name == "m").unwrap();
    assert!(begun <= 3, "{begun} runs began in a queue of concurrency 3");
    assert_eq!(m.occupied as usize, begun, "every begin holds a slot");
    assert_eq!(m.occupied + m.waiting, 30, "every run is counted once");
}
