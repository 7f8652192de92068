//! The queues contract ([`QueueStore`](crate::store::QueueStore), and the limits
//! [`RunStore::acquire`](crate::store::RunStore::acquire) enforces): concurrency slots, rate
//! windows, partition keys, priorities, undeclared queues, and waiting runs past their deadline.

use std::time::{Duration, SystemTime};

use serde_json::json;

use super::support::{acquire, ap, create, names, t};
use crate::error::Error;
use crate::ids::RunId;
use crate::store::*;

/// A run of `orders` at `at` in `queue` with partition key `key` and `priority`.
fn queued_run(queue: &str, key: Option<&str>, priority: i32, at: SystemTime) -> NewRun {
    NewRun::new(RunId::new(), "orders".to_owned(), json!([]), at).queue(Some(QueueEntry {
        name: queue.to_owned(),
        partition_key: key.map(str::to_owned),
        priority,
    }))
}

/// Admits a run of `orders` at `at` in `queue` with partition key `key` and `priority`,
/// waiting for its slot (no worker asked to lease it).
pub(crate) async fn create_queued<S: Store>(
    store: &S,
    queue: &str,
    key: Option<&str>,
    priority: i32,
    at: SystemTime,
) -> RunId {
    let run = queued_run(queue, key, priority, at);
    let id = run.id;
    let admission = store.create_run(run).await.unwrap();
    assert_eq!(admission, Admission::Admitted);
    id
}

/// Admits a run as [`create_queued`] does, asking for the lease of a worker that would drive
/// it at once; the lease when the store gave it (the run began at admission).
pub(crate) async fn create_queued_leased<S: Store>(
    store: &S,
    queue: &str,
    key: Option<&str>,
    at: SystemTime,
) -> (RunId, Option<Lease>) {
    let run = queued_run(queue, key, 0, at);
    let id = run.id;
    let (admission, lease) = store
        .create_run_leased(run, Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(admission, Admission::Admitted);
    if let Some(l) = &lease {
        assert_eq!(
            (l.run_id, l.epoch),
            (id, 1),
            "the admission's lease is epoch 1"
        );
    }
    (id, lease)
}

/// The occupancy of queue `name` at `now`: (begun and not ended, waiting).
async fn occupancy<S: Store>(store: &S, name: &str, now: SystemTime) -> (u64, u64) {
    let queues = store.list_queues(now).await.unwrap();
    let q = queues
        .iter()
        .find(|q| q.def.name == name)
        .expect("the queue is listed");
    (q.occupied, q.waiting)
}

/// Declares queue `name` with the given limits.
pub(crate) async fn declare<S: Store>(
    store: &S,
    name: &str,
    concurrency: Option<u32>,
    rate_limit: Option<(u32, Duration)>,
) {
    store
        .define_queues(&[QueueDef {
            name: name.to_owned(),
            concurrency,
            rate_limit,
        }])
        .await
        .unwrap();
}

/// The runs `acquire` leases of `orders` at `now` (limit 100), in the order handed out.
async fn acquire_orders<S: Store>(store: &S, now: SystemTime) -> Vec<LeasedRun> {
    acquire(
        store,
        &names(&["orders"]),
        now,
        Duration::from_secs(600),
        100,
    )
    .await
}

fn ids_of(runs: &[LeasedRun]) -> Vec<RunId> {
    runs.iter().map(|r| r.run.id).collect()
}

/// Ends the leased run as completed at `at`.
async fn complete<S: Store>(store: &S, lease: &Lease, at: SystemTime) {
    let end = ap(
        vec![NewEvent {
            at,
            event: Event::RunCompleted {
                output: json!(null),
            },
        }],
        Some(RunOutcome::Completed(json!(null))),
    );
    store.append(lease, &end).await.unwrap();
}

/// At most `concurrency` runs begun and not ended: a sleeping run keeps its slot, an expired
/// lease is taken back with its slot, and an end frees one for the next run in start order.
pub async fn a_queue_s_concurrency_counts_runs_begun_and_not_ended<S: Store>(store: &S) {
    declare(store, "q", Some(2), None).await;
    let mut runs = Vec::new();
    for i in 0..4 {
        runs.push(create_queued(store, "q", None, 0, t(i)).await);
    }
    let first = acquire_orders(store, t(10)).await;
    assert_eq!(ids_of(&first), runs[..2], "the two first started begin");
    for r in &first {
        let q = r
            .run
            .queue
            .as_ref()
            .expect("a leased queued run names its queue");
        assert_eq!(q.name, "q");
    }
    assert!(
        acquire_orders(store, t(20)).await.is_empty(),
        "the queue is full"
    );

    // Run 0 sleeps until t(100): it holds its slot meanwhile.
    store.release(&first[0].lease, t(100), 0).await.unwrap();
    assert!(
        acquire_orders(store, t(30)).await.is_empty(),
        "a sleeping run holds its slot"
    );
    let woken = acquire_orders(store, t(100)).await;
    assert_eq!(
        ids_of(&woken),
        [runs[0]],
        "the sleeper wakes, the waiting runs still wait"
    );

    // Run 1's worker died: after its lease expired, it is taken back, still within the limit.
    let later = t(1000) + Duration::from_secs(600);
    let taken_back = acquire_orders(store, later).await;
    assert_eq!(taken_back.len(), 2, "both expired leases are taken back");
    assert!(ids_of(&taken_back).iter().all(|id| runs[..2].contains(id)));

    let lease_of = |id: RunId| {
        taken_back
            .iter()
            .find(|r| r.run.id == id)
            .unwrap()
            .lease
            .clone()
    };
    complete(store, &lease_of(runs[1]), later).await;
    assert_eq!(
        ids_of(&acquire_orders(store, later).await),
        [runs[2]],
        "one slot freed"
    );
    assert!(acquire_orders(store, later).await.is_empty());
    // A cancelled run frees its slot too.
    store.cancel(&runs[0], later).await.unwrap();
    assert_eq!(ids_of(&acquire_orders(store, later).await), [runs[3]]);
}

/// At most `n` runs begin in any window of `period`, however soon the earlier ones ended.
pub async fn a_queue_s_rate_window_counts_begins<S: Store>(store: &S) {
    declare(store, "r", None, Some((2, Duration::from_millis(1000)))).await;
    let mut runs = Vec::new();
    for i in 0..5 {
        runs.push(create_queued(store, "r", None, 0, t(i)).await);
    }
    assert_eq!(
        store.queue_opening(t(0)).await.unwrap(),
        None,
        "none began yet"
    );
    let info = store.list_queues(t(5)).await.unwrap();
    assert_eq!(
        info[0].oldest_waiting,
        Some(t(0)),
        "the first admitted waits longest: {info:?}"
    );
    let first = acquire_orders(store, t(10)).await;
    assert_eq!(ids_of(&first), runs[..2]);
    for r in &first {
        complete(store, &r.lease, t(20)).await;
    }
    assert!(
        acquire_orders(store, t(500)).await.is_empty(),
        "two began within the last second, though both ended"
    );
    assert!(acquire_orders(store, t(1009)).await.is_empty());
    assert_eq!(
        store.queue_opening(t(500)).await.unwrap(),
        Some(t(1010)),
        "the window reopens when its oldest begin leaves it"
    );
    let second = acquire_orders(store, t(1010)).await;
    assert_eq!(
        ids_of(&second),
        runs[2..4],
        "the window moved past the first begins"
    );
    assert_eq!(store.queue_opening(t(1010)).await.unwrap(), Some(t(2010)));
    let info = store.list_queues(t(1010)).await.unwrap();
    let r = info
        .iter()
        .find(|q| q.def.name == "r")
        .expect("queue r is listed");
    assert_eq!(
        (r.occupied, r.waiting, r.begun_in_window),
        (2, 1, 2),
        "{r:?}"
    );
    assert_eq!(r.def.rate_limit, Some((2, Duration::from_millis(1000))));
    assert_eq!(
        r.oldest_waiting,
        Some(t(4)),
        "the begun runs no longer wait: {r:?}"
    );
}

/// Runs of one partition key begin one at a time, in start order; other keys and runs
/// without a key are not held up.
pub async fn a_partition_key_runs_one_at_a_time_in_start_order<S: Store>(store: &S) {
    declare(store, "k", Some(10), None).await;
    // The later run of key `a` has the higher priority: start order still wins within a key.
    let a1 = create_queued(store, "k", Some("a"), 0, t(0)).await;
    let a2 = create_queued(store, "k", Some("a"), 9, t(1)).await;
    let b1 = create_queued(store, "k", Some("b"), 0, t(2)).await;
    let free = create_queued(store, "k", None, 0, t(3)).await;
    let first = acquire_orders(store, t(10)).await;
    let mut got = ids_of(&first);
    got.sort();
    let mut want = vec![a1, b1, free];
    want.sort();
    assert_eq!(got, want, "one run per key, and the run without a key");
    assert!(
        acquire_orders(store, t(20)).await.is_empty(),
        "a2 waits for a1"
    );
    let a1_lease = first.iter().find(|r| r.run.id == a1).unwrap().lease.clone();
    // A sleeping a1 still holds its key.
    store.release(&a1_lease, t(100), 0).await.unwrap();
    assert!(
        acquire_orders(store, t(30)).await.is_empty(),
        "a2 waits for a sleeping a1"
    );
    let a1_again = acquire_orders(store, t(100)).await;
    assert_eq!(ids_of(&a1_again), [a1]);
    complete(store, &a1_again[0].lease, t(110)).await;
    assert_eq!(ids_of(&acquire_orders(store, t(120)).await), [a2]);
}

/// Among waiting runs of a queue, higher priority begins first; equal priority in start
/// order.
pub async fn a_queue_begins_higher_priority_first_then_start_order<S: Store>(store: &S) {
    declare(store, "p", Some(1), None).await;
    let low = create_queued(store, "p", None, 0, t(0)).await;
    let high = create_queued(store, "p", None, 5, t(1)).await;
    let high_later = create_queued(store, "p", None, 5, t(2)).await;
    let negative = create_queued(store, "p", None, -3, t(3)).await;
    let mut order = Vec::new();
    for i in 0..4 {
        let got = acquire_orders(store, t(10 + i * 10)).await;
        assert_eq!(got.len(), 1, "one at a time");
        order.push(got[0].run.id);
        complete(store, &got[0].lease, t(15 + i * 10)).await;
    }
    assert_eq!(order, [high, high_later, low, negative]);
}

/// A queue nobody declared begins none of its runs; other runs are not held up, and listing
/// shows only declared queues.
pub async fn an_undeclared_queue_begins_nothing<S: Store>(store: &S) {
    let queued = create_queued(store, "nobody", None, 0, t(0)).await;
    let plain = create(store, "orders", t(1)).await;
    assert_eq!(ids_of(&acquire_orders(store, t(10)).await), [plain]);
    assert!(store.list_queues(t(10)).await.unwrap().is_empty());
    declare(store, "nobody", Some(1), None).await;
    assert_eq!(ids_of(&acquire_orders(store, t(20)).await), [queued]);
    let listed = store
        .list_runs(&RunFilter::new().queue("nobody"))
        .await
        .unwrap();
    assert_eq!(listed.iter().map(|r| r.id).collect::<Vec<_>>(), [queued]);
    assert_eq!(listed[0].queue, Some(QueueEntry::new("nobody")));
}

/// A run waiting for a slot whose deadline passed is handed out anyway (its driver fails it at
/// once), without taking a slot: the queue's waiting runs still begin within its limit.
pub async fn a_waiting_run_past_its_deadline_is_handed_out_without_a_slot<S: Store>(store: &S) {
    declare(store, "d", Some(1), None).await;
    let holder = create_queued(store, "d", None, 0, t(0)).await;
    assert_eq!(ids_of(&acquire_orders(store, t(1)).await), [holder]);
    let late = RunId::new();
    store
        .create_run(
            NewRun::new(late, "orders".to_owned(), json!([]), t(2))
                .deadline(Some(t(50)))
                .queue(Some(QueueEntry::new("d"))),
        )
        .await
        .unwrap();
    let next = create_queued(store, "d", None, 0, t(3)).await;
    assert!(
        acquire_orders(store, t(10)).await.is_empty(),
        "both wait for the slot"
    );
    let got = acquire_orders(store, t(50)).await;
    assert_eq!(ids_of(&got), [late], "past its deadline, it is handed out");
    assert_eq!(got[0].run.deadline, Some(t(50)));
    let info = store.list_queues(t(50)).await.unwrap();
    assert_eq!(info[0].occupied, 1, "without taking a slot: {info:?}");
    let failed = ap(
        vec![NewEvent {
            at: t(51),
            event: Event::RunFailed {
                error: Error::fatal("timed out"),
            },
        }],
        Some(RunOutcome::Failed(Error::fatal("timed out"))),
    );
    store.append(&got[0].lease, &failed).await.unwrap();
    assert!(
        acquire_orders(store, t(60)).await.is_empty(),
        "the holder still holds"
    );
    let holder_again = acquire_orders(store, t(1) + Duration::from_secs(601)).await;
    assert_eq!(ids_of(&holder_again), [holder]);
    complete(
        store,
        &holder_again[0].lease,
        t(1) + Duration::from_secs(601),
    )
    .await;
    assert_eq!(
        ids_of(&acquire_orders(store, t(1) + Duration::from_secs(601)).await),
        [next]
    );
}

/// `updated_at` follows every change of state of a queued run: its admission, its begin (when
/// `acquire` gives it a slot and leases it), and its end; a takeover of a running run is no
/// change of state and leaves it.
pub async fn a_queued_run_s_updated_at_follows_its_changes_of_state<S: Store>(store: &S) {
    declare(store, "mail", Some(1), None).await;
    let id = create_queued(store, "mail", None, 0, t(1)).await;
    let admitted = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(
        (admitted.status, admitted.updated_at),
        (RunStatus::Pending, t(1))
    );

    let begun = acquire_orders(store, t(5)).await;
    assert_eq!(ids_of(&begun), [id]);
    assert_eq!(
        (begun[0].run.status, begun[0].run.updated_at),
        (RunStatus::Running, t(5)),
        "the leased record shows the begin"
    );
    let stored = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.updated_at),
        (RunStatus::Running, t(5))
    );

    // The lease (600 s) expires; another worker takes the run over, still running.
    let taken = acquire_orders(store, t(700_000)).await;
    assert_eq!(ids_of(&taken), [id]);
    assert_eq!(
        taken[0].run.updated_at,
        t(5),
        "a takeover is no change of state"
    );

    complete(store, &taken[0].lease, t(700_010)).await;
    let ended = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(
        (ended.status, ended.updated_at),
        (RunStatus::Completed, t(700_010))
    );
}

/// A worker admitting a queued run begins it at once, holding its slot, exactly when an
/// `acquire` at that moment would have: the queue is declared, a slot and the rate window
/// are free, no run of its key holds a slot, and no run waits before it (nobody is
/// overtaken). Otherwise it waits for its slot with no lease.
pub async fn a_queued_run_begins_at_admission_only_with_room_and_nobody_waiting<S: Store>(
    store: &S,
) {
    declare(store, "a", Some(2), None).await;
    let (r1, l1) = create_queued_leased(store, "a", None, t(0)).await;
    let (r2, l2) = create_queued_leased(store, "a", None, t(1)).await;
    let l1 = l1.expect("a free slot: the first run begins at admission");
    assert!(l2.is_some(), "a second free slot: the second run too");
    let (r3, l3) = create_queued_leased(store, "a", None, t(2)).await;
    assert_eq!(l3, None, "the queue is full: the third run waits");
    assert_eq!(occupancy(store, "a", t(3)).await, (2, 1));
    assert!(
        acquire_orders(store, t(3)).await.is_empty(),
        "runs begun at admission hold their slots"
    );
    let got = store.get_run(&r1).await.unwrap().unwrap();
    assert_eq!(got.status, RunStatus::Running);
    assert_eq!(got.updated_at, t(0));

    // A slot frees while run 3 waits: a new run does not overtake it.
    complete(store, &l1, t(4)).await;
    let (_, l4) = create_queued_leased(store, "a", None, t(5)).await;
    assert_eq!(l4, None, "a run waits before it: the new run waits too");
    let begun = acquire_orders(store, t(6)).await;
    assert_eq!(ids_of(&begun), [r3], "the waiting run takes the freed slot");
    let _ = r2;

    // A partition key holding a slot keeps the key's next run waiting.
    declare(store, "k", Some(5), None).await;
    let (_, k1) = create_queued_leased(store, "k", Some("x"), t(10)).await;
    assert!(k1.is_some(), "an idle key begins at admission");
    let (_, k2) = create_queued_leased(store, "k", Some("x"), t(11)).await;
    assert_eq!(k2, None, "the key holds a slot: its next run waits");

    // A full rate window keeps the next run waiting, even with the slot free again.
    declare(store, "r", None, Some((1, Duration::from_secs(1000)))).await;
    let (_, r_first) = create_queued_leased(store, "r", None, t(20)).await;
    let r_first = r_first.expect("an empty window: the run begins at admission");
    complete(store, &r_first, t(21)).await;
    let (_, r_next) = create_queued_leased(store, "r", None, t(22)).await;
    assert_eq!(r_next, None, "the window is full: the next run waits");
    assert_eq!(occupancy(store, "r", t(23)).await, (0, 1));

    // A queue nobody declared begins nothing, at admission either.
    let (_, undeclared) = create_queued_leased(store, "nobody-declared", None, t(30)).await;
    assert_eq!(undeclared, None, "an undeclared queue begins nothing");
}

/// Ends the leased run as failed at `at`.
async fn fail<S: Store>(store: &S, lease: &Lease, at: SystemTime) {
    let end = ap(
        vec![NewEvent {
            at,
            event: Event::RunFailed {
                error: Error::fatal("no"),
            },
        }],
        Some(RunOutcome::Failed(Error::fatal("no"))),
    );
    store.append(lease, &end).await.unwrap();
}

/// A slot is taken by every way a queued run begins (at admission, at `acquire`, a failed
/// run re-opened by `retry` when it begins again) and given back by every way it ends
/// (completed, failed, cancelled while blocked), whichever path wrote it: a store that keeps the count of held
/// slots rather than counting the holding runs must agree with the count at each step.
pub async fn a_queue_s_slots_follow_every_begin_and_end<S: Store>(store: &S) {
    declare(store, "one", Some(1), None).await;
    let one = |at| async move {
        let queues = store.list_queues(at).await.unwrap();
        let q = queues.iter().find(|q| q.def.name == "one").unwrap();
        (q.occupied, q.waiting)
    };
    let (a, la) = create_queued_leased(store, "one", None, t(0)).await;
    let la = la.expect("an empty queue: A begins at admission");
    let b = create_queued(store, "one", None, 0, t(1)).await;
    assert!(
        acquire_orders(store, t(2)).await.is_empty(),
        "A holds the slot"
    );
    assert_eq!(one(t(2)).await, (1, 1));

    // A fails: B begins.
    fail(store, &la, t(3)).await;
    let got = acquire_orders(store, t(4)).await;
    assert_eq!(ids_of(&got), [b], "A's failure gave its slot back");
    let lb = got[0].lease.clone();

    // A re-opened waits for a slot again, ahead of C (started later).
    assert_eq!(store.retry(&a, t(5)).await.unwrap(), RetryOutcome::Reopened);
    assert_eq!(one(t(5)).await, (1, 1));
    let c = create_queued(store, "one", None, 0, t(6)).await;
    assert!(
        acquire_orders(store, t(6)).await.is_empty(),
        "B holds the slot"
    );
    complete(store, &lb, t(7)).await;
    let got = acquire_orders(store, t(8)).await;
    assert_eq!(ids_of(&got), [a], "A begins again; C waits");
    complete(store, &got[0].lease, t(9)).await;
    assert_eq!(one(t(9)).await, (0, 1));

    // C begins, is blocked (it keeps its slot), then cancelled (it gives it back).
    let got = acquire_orders(store, t(10)).await;
    assert_eq!(ids_of(&got), [c]);
    let divergence = Error::diverged("at event 1 its history expects A next, but B");
    store
        .block(&got[0].lease, &divergence, t(11))
        .await
        .unwrap();
    let d = create_queued(store, "one", None, 0, t(12)).await;
    let later = t(12) + Duration::from_secs(3600);
    let got = acquire_orders(store, later).await;
    assert_eq!(ids_of(&got), [c], "the blocked run holds its slot; D waits");
    store.cancel(&c, later).await.unwrap();
    let got = acquire_orders(store, later).await;
    assert_eq!(ids_of(&got), [d], "the cancelled run gave its slot back");
    complete(store, &got[0].lease, later).await;
    assert_eq!(one(later).await, (0, 0));
    let (_, le) = create_queued_leased(store, "one", None, later).await;
    assert!(le.is_some(), "every slot is free: E begins at admission");
}

/// `has_waiting_runs` says whether any queued run waits for a slot: none at first, one
/// admitted while the queue is full, none again once it began (or when it ends).
pub async fn whether_a_run_waits_for_a_slot_is_known<S: Store>(store: &S) {
    declare(store, "w", Some(1), None).await;
    assert!(!store.has_waiting_runs().await.unwrap(), "an empty store");
    let (_, la) = create_queued_leased(store, "w", None, t(0)).await;
    let la = la.expect("an empty queue: the first run begins at admission");
    assert!(
        !store.has_waiting_runs().await.unwrap(),
        "a run holding its slot does not wait"
    );
    let b = create_queued(store, "w", None, 0, t(1)).await;
    assert!(
        store.has_waiting_runs().await.unwrap(),
        "the second run waits"
    );
    complete(store, &la, t(2)).await;
    let got = acquire_orders(store, t(3)).await;
    assert_eq!(ids_of(&got), [b]);
    assert!(
        !store.has_waiting_runs().await.unwrap(),
        "it began: nobody waits"
    );
    let c = create_queued(store, "w", None, 0, t(4)).await;
    assert!(store.has_waiting_runs().await.unwrap());
    store.cancel(&c, t(5)).await.unwrap();
    assert!(
        !store.has_waiting_runs().await.unwrap(),
        "a cancelled run waits no more"
    );
}
