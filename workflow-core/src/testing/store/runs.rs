//! The runs contract ([`RunStore`](crate::store::RunStore)): admission, leases, their fencing
//! and heartbeats, appends, failed tries, blocks and retries, cancellation, deadlines, runs
//! created with a history, and which runs have ended.

use std::time::{Duration, SystemTime};

use serde_json::json;

use super::support::{
    acquire, ap, create, event_seqs, lease_one, names, new_run, owner, start, start_hook,
    step_done, t,
};
use super::Inspect;
use crate::error::{Error, StoreError};
use crate::ids::RunId;
use crate::store::*;

/// A run admitted with its first write ([`RunStore::create_run_leased_with`]) holds it: when
/// leased, the run is `Running` under epoch 1 with those events numbered from 1 (the next
/// append under the lease numbering on); a run not leased at admission (here: delayed) gets
/// none of them. A first write that is more than events is refused before anything is
/// written. A store that cannot do both in one act says so, gives the run back and writes
/// nothing.
pub async fn a_run_admitted_with_its_first_events_holds_them_under_its_lease<S: Store>(store: &S) {
    let run = |start_at: Option<SystemTime>| {
        NewRun::new(RunId::new(), "eager", json!([1]), t(0)).start_at(start_at)
    };
    let lease = Duration::from_secs(60);
    let first = ap(vec![step_done(t(1), 1), step_done(t(2), 2)], None);
    let eager = run(None);
    let id = eager.id;
    let leased = match store
        .create_run_leased_with(eager, lease, &first)
        .await
        .unwrap()
    {
        AdmittedWith::Done(admission, leased) => {
            assert_eq!(admission, Admission::Admitted);
            leased.expect("a plain run is leased at admission")
        }
        AdmittedWith::Unsupported(back) => {
            assert_eq!(back.id, id, "the run given is given back");
            assert!(
                store.get_run(&id).await.unwrap().is_none(),
                "nothing written"
            );
            return;
        }
    };
    assert_eq!((leased.run_id, leased.epoch), (id, 1));
    assert_eq!(
        store.get_run(&id).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    assert_eq!(event_seqs(store, id).await, [1, 2]);
    let events = store.events(&id).await.unwrap();
    assert!(
        matches!(&events[1].event, Event::StepCompleted { step_id, .. } if step_id == "s2"),
        "{events:?}"
    );
    store
        .append(&leased, &ap(vec![step_done(t(3), 3)], None))
        .await
        .unwrap();
    assert_eq!(event_seqs(store, id).await, [1, 2, 3]);

    let delayed = run(Some(t(1_000)));
    let delayed_id = delayed.id;
    match store
        .create_run_leased_with(delayed, lease, &first)
        .await
        .unwrap()
    {
        AdmittedWith::Done(admission, leased) => {
            assert_eq!(admission, Admission::Admitted);
            assert_eq!(leased, None, "a delayed run is not leased at admission");
        }
        AdmittedWith::Unsupported(_) => panic!("supported for one run, not for another"),
    }
    assert!(store.events(&delayed_id).await.unwrap().is_empty());

    let ending = run(None);
    let ending_id = ending.id;
    let refused = store
        .create_run_leased_with(
            ending,
            lease,
            &ap(vec![], Some(RunOutcome::Completed(json!(1)))),
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(
        store.get_run(&ending_id).await.unwrap().is_none(),
        "nothing written"
    );
}

/// A run leased at admission is held like an acquired one: no other worker gets it while the
/// lease lives, its writes are accepted, and after expiry a takeover fences the old lease.
pub async fn a_run_leased_at_admission_is_fenced_like_an_acquired_one<S: Store>(store: &S) {
    let id = RunId::new();
    let run = new_run(id, "leased");
    let (admission, lease) = store
        .create_run_leased(run, std::time::Duration::from_millis(1000))
        .await
        .unwrap();
    assert_eq!(admission, Admission::Admitted);
    let lease = lease.expect("this store leases at admission");
    assert_eq!(lease.epoch, 1);
    assert_eq!(
        store.get_run(&id).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    let acquire = |now: u64| AcquireRequest {
        worker_id: "other",
        workflows: &[],
        lease: std::time::Duration::from_millis(1000),
        limit: 10,
        now: t(now),
    };
    let names = names(&["leased"]);
    let req = |now| AcquireRequest {
        workflows: &names,
        ..acquire(now)
    };
    assert!(
        store.acquire(req(500)).await.unwrap().is_empty(),
        "the lease holds"
    );
    let step = NewEvent {
        at: t(600),
        event: Event::TimerFired {
            timer_id: "tmr_0".into(),
        },
    };
    store
        .append(&lease, &ap(vec![step.clone()], None))
        .await
        .unwrap();
    let taken = store.acquire(req(1500)).await.unwrap();
    assert_eq!(taken.len(), 1, "taken over after expiry");
    assert_eq!(taken[0].lease.epoch, 2);
    assert!(matches!(
        store.append(&lease, &ap(vec![step], None)).await,
        Err(StoreError::LeaseLost(_))
    ));
}

/// A run goes from admission through a lease and appended events to completion; its input,
/// events and output come back exactly as written.
pub async fn create_acquire_append_complete_round_trip<S: Store + Inspect>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    assert!(matches!(
        store
            .create_run(NewRun::new(id, "orders", json!(null), t(0)))
            .await,
        Err(StoreError::Database(m)) if m.message().contains("already exists")
    ));
    assert!(store.events(&id).await.unwrap().is_empty());
    assert!(store.get_run(&RunId::new()).await.unwrap().is_none());
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(
        (run.status, &run.input, run.created_at, run.updated_at),
        (RunStatus::Pending, &json!([1, "two"]), t(0), t(0))
    );

    let wf = names(&["orders"]);
    let got = acquire(store, &wf, t(10), Duration::from_secs(30), 10).await;
    assert_eq!(got.len(), 1);
    let leased = &got[0];
    assert_eq!(
        leased.lease,
        Lease {
            run_id: id,
            epoch: 1
        }
    );
    assert_eq!(leased.run.status, RunStatus::Running);
    assert!(leased.events.is_empty());

    // Exact JSON round trip, including what PostgreSQL's JSONB would have rewritten.
    let input = json!({"z": 1, "a": "\u{0}", "n": 1.5e300, "big": u64::MAX});
    let scheduled = NewEvent {
        at: t(11),
        event: Event::StepScheduled {
            step_id: "s1".into(),
            name: "charge".into(),
            input,
        },
    };
    store
        .append(
            &leased.lease,
            &ap(vec![scheduled.clone(), step_done(t(12), 1)], None),
        )
        .await
        .unwrap();
    let done = NewEvent {
        at: t(13),
        event: Event::RunCompleted {
            output: json!("ok"),
        },
    };
    store
        .append(
            &leased.lease,
            &ap(vec![done.clone()], Some(RunOutcome::Completed(json!("ok")))),
        )
        .await
        .unwrap();

    let events = store.events(&id).await.unwrap();
    let expect: Vec<EventRecord> = [scheduled, step_done(t(12), 1), done]
        .into_iter()
        .zip(1..)
        .map(|(e, seq)| EventRecord {
            seq,
            at: e.at,
            event: e.event,
        })
        .collect();
    assert_eq!(events, expect);

    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.output, Some(json!("ok")));
    assert_eq!(run.error, None);
    assert_eq!(run.updated_at, t(13));

    // Ended: no more writes, not acquirable, and `kind` is queryable.
    assert!(matches!(
        store.append(&leased.lease, &ap(vec![step_done(t(14), 2)], None)).await,
        Err(StoreError::LeaseLost(r)) if r == id
    ));
    assert!(acquire(store, &wf, t(100_000), Duration::from_secs(30), 10)
        .await
        .is_empty());
    if let Some(kinds) = store.event_kinds(id).await {
        assert_eq!(kinds, ["step_scheduled", "step_completed", "run_completed"]);
    }
}

/// A run ended with a failure outcome keeps the error and has no output.
pub async fn failure_outcome_records_the_error<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let got = acquire(store, &names(&["orders"]), t(0), Duration::from_secs(30), 1).await;
    let error = Error::fatal("card declined");
    store
        .append(
            &got[0].lease,
            &ap(
                vec![NewEvent {
                    at: t(5),
                    event: Event::RunFailed {
                        error: error.clone(),
                    },
                }],
                Some(RunOutcome::Failed(error.clone())),
            ),
        )
        .await
        .unwrap();
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error, Some(error));
    assert_eq!(run.output, None);
}

/// After another worker takes an expired lease over, the old lease's writes are refused with
/// `LeaseLost` and leave no event.
pub async fn a_stale_epoch_cannot_write_after_a_takeover<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let wf = names(&["orders"]);
    let lease = Duration::from_secs(10);

    let first = acquire(store, &wf, t(0), lease, 1).await.remove(0);
    store
        .append(&first.lease, &ap(vec![step_done(t(1), 1)], None))
        .await
        .unwrap();
    // Still live: nobody else gets it.
    assert!(acquire(store, &wf, t(9_999), lease, 1).await.is_empty());
    // Expired: the next worker takes over with a new epoch and the history so far.
    let second = acquire(store, &wf, t(10_000), lease, 1).await.remove(0);
    assert_eq!(second.lease.epoch, first.lease.epoch + 1);
    assert_eq!(second.events.len(), 1);

    let stale = store
        .append(
            &first.lease,
            &ap(
                vec![step_done(t(10_001), 2)],
                Some(RunOutcome::Completed(json!(1))),
            ),
        )
        .await;
    assert!(
        matches!(stale, Err(StoreError::LeaseLost(r)) if r == id),
        "{stale:?}"
    );
    assert!(matches!(
        store.release(&first.lease, t(0), 0).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(matches!(
        store.claim_hook(&first.lease, "hk_1", "tok", t(2)).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert_eq!(owner(store, "tok").await, None);
    assert_eq!(store.events(&id).await.unwrap().len(), 1);
    assert_eq!(
        store.get_run(&id).await.unwrap().unwrap().status,
        RunStatus::Running
    );

    store
        .append(&second.lease, &ap(vec![step_done(t(10_002), 2)], None))
        .await
        .unwrap();
    assert_eq!(event_seqs(store, id).await, [1, 2]);
}

/// `acquire` hands out only due runs of the named workflows that nobody holds, oldest wake time
/// first, at most `limit`.
pub async fn acquire_respects_workflows_wake_time_leases_and_order<S: Store>(store: &S) {
    let late = create(store, "orders", t(500)).await;
    let early = create(store, "orders", t(100)).await;
    let other = create(store, "emails", t(0)).await;
    let future = create(store, "orders", t(10_000)).await;
    let lease = Duration::from_secs(60);

    assert!(acquire(store, &names(&["nothing"]), t(1_000), lease, 10)
        .await
        .is_empty());
    assert!(acquire(store, &[], t(1_000), lease, 10).await.is_empty());
    assert!(acquire(store, &names(&["orders"]), t(1_000), lease, 0)
        .await
        .is_empty());

    let got = acquire(store, &names(&["orders"]), t(1_000), lease, 1).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, [early]);
    let got = acquire(store, &names(&["orders", "emails"]), t(1_000), lease, 10).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(
        ids,
        [other, late],
        "earliest wake time first; live leases and future runs skipped"
    );

    assert!(
        acquire(store, &names(&["orders", "emails"]), t(9_999), lease, 10)
            .await
            .is_empty()
    );
    let got = acquire(store, &names(&["orders"]), t(10_000), lease, 10).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, [future]);
}

/// A run whose lease expired is handed out by its wake time like any other, not by the end
/// of that lease.
pub async fn expired_leases_are_taken_back_in_wake_time_order<S: Store>(store: &S) {
    let orders = names(&["orders"]);
    let abandoned = create(store, "orders", t(0)).await;
    let got = acquire(store, &orders, t(0), Duration::from_millis(100), 1).await;
    assert_eq!(got[0].run.id, abandoned);
    let waiting = create(store, "orders", t(50)).await;
    // At 200 both are due: `abandoned` woke at 0 (its lease ended at 100), `waiting` at 50.
    let got = acquire(store, &orders, t(200), Duration::from_secs(60), 1).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, [abandoned], "earliest wake time first");
    let got = acquire(store, &orders, t(200), Duration::from_secs(60), 1).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, [waiting]);
}

/// A released run is not handed out before its wake time, and is handed out again after it.
pub async fn release_with_a_future_wake_time<S: Store>(store: &S) {
    let id = create(store, "timers", t(0)).await;
    let wf = names(&["timers"]);
    let lease = Duration::from_secs(60);
    let first = acquire(store, &wf, t(0), lease, 1).await.remove(0);
    store.release(&first.lease, t(5_000), 0).await.unwrap();

    assert!(acquire(store, &wf, t(4_999), lease, 1).await.is_empty());
    // Released means no lease holds it: heartbeat and writes under the old lease fail.
    assert_eq!(
        store
            .heartbeat(std::slice::from_ref(&first.lease), lease, t(1))
            .await
            .unwrap(),
        [id]
    );
    assert!(matches!(
        store.append(&first.lease, &ap(vec![], None)).await,
        Err(StoreError::LeaseLost(_))
    ));
    let again = acquire(store, &wf, t(5_000), lease, 1).await.remove(0);
    assert_eq!(
        again.lease,
        Lease {
            run_id: id,
            epoch: 2
        }
    );
    assert_eq!(again.run.status, RunStatus::Running);
}

/// A heartbeat extends the leases still held and reports the runs that were cancelled, ended or
/// taken over.
pub async fn heartbeat_extends_live_leases_and_reports_lost_ones<S: Store>(store: &S) {
    let wf = names(&["orders"]);
    let lease = Duration::from_secs(10);
    let kept = create(store, "orders", t(0)).await;
    let taken = create(store, "orders", t(1)).await;
    let cancelled = create(store, "orders", t(2)).await;
    let ended = create(store, "orders", t(3)).await;
    let mine = acquire(store, &wf, t(0), lease, 10).await;
    assert_eq!(mine.len(), 1);
    let mine: Vec<Lease> = [mine, acquire(store, &wf, t(3), lease, 10).await]
        .concat()
        .into_iter()
        .map(|r| r.lease)
        .collect();
    assert_eq!(
        mine.iter().map(|l| l.run_id).collect::<Vec<_>>(),
        [kept, taken, cancelled, ended]
    );

    // Extended until t(19_000): a takeover at t(15_000) must fail for `kept`.
    assert!(store
        .heartbeat(&mine, lease, t(9_000))
        .await
        .unwrap()
        .is_empty());
    store.cancel(&cancelled, t(9_500)).await.unwrap();
    store
        .append(
            &mine[3],
            &ap(vec![], Some(RunOutcome::Completed(json!(null)))),
        )
        .await
        .unwrap();
    // `taken` was extended too: release it so that the next acquire takes it over.
    store.release(&mine[1], t(0), 0).await.unwrap();
    let over = acquire(store, &wf, t(15_000), lease, 10).await;
    assert_eq!(over.iter().map(|r| r.run.id).collect::<Vec<_>>(), [taken]);

    let lost = store.heartbeat(&mine, lease, t(16_000)).await.unwrap();
    assert_eq!(lost, [taken, cancelled, ended]);
    // The new holder's lease is live; a lease with a made-up epoch is not.
    let fake = Lease {
        run_id: kept,
        epoch: 99,
    };
    assert_eq!(
        store
            .heartbeat(&[over[0].lease.clone(), fake], lease, t(16_000))
            .await
            .unwrap(),
        [kept]
    );
    assert!(store
        .heartbeat(&[], lease, t(16_000))
        .await
        .unwrap()
        .is_empty());
}

/// Cancelling a pending or running run records it as cancelled and fences its lease; an ended
/// or unknown run is reported as such and left alone.
pub async fn cancel_running_ended_and_unknown_runs<S: Store>(store: &S) {
    let wf = names(&["orders"]);
    let running = create(store, "orders", t(0)).await;
    let pending = create(store, "orders", t(50_000)).await;
    let leased = acquire(store, &wf, t(0), Duration::from_secs(60), 1)
        .await
        .remove(0);
    store
        .append(&leased.lease, &ap(vec![step_done(t(1), 1)], None))
        .await
        .unwrap();

    assert_eq!(
        store.cancel(&running, t(2)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let run = store.get_run(&running).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Cancelled);
    assert_eq!(run.updated_at, t(2));
    let error = run.error.unwrap();
    assert!(error.is_cancelled(), "{error:?}");
    assert_eq!(error, Error::cancelled(&running));
    let events = store.events(&running).await.unwrap();
    assert_eq!(
        events.last().unwrap(),
        &EventRecord {
            seq: 2,
            at: t(2),
            event: Event::RunCancelled
        }
    );
    // The worker's lease is gone, and the run is never handed out again.
    assert!(matches!(
        store
            .append(&leased.lease, &ap(vec![step_done(t(3), 2)], None))
            .await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(acquire(store, &wf, t(100_000), Duration::from_secs(60), 10)
        .await
        .iter()
        .all(|r| r.run.id != running));

    assert_eq!(
        store.cancel(&running, t(3)).await.unwrap(),
        CancelOutcome::AlreadyEnded(RunStatus::Cancelled)
    );
    assert_eq!(store.events(&running).await.unwrap().len(), 2);

    assert_eq!(
        store.cancel(&pending, t(4)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let unknown = RunId::new();
    assert!(matches!(
        store.cancel(&unknown, t(5)).await,
        Err(StoreError::RunNotFound(r)) if r == unknown
    ));
}

/// Cancelling a completed run reports it as already ended and changes nothing.
pub async fn cancel_of_a_completed_run_reports_its_status<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let lease = lease_one(store, id, t(0)).await;
    store
        .append(&lease, &ap(vec![], Some(RunOutcome::Completed(json!(7)))))
        .await
        .unwrap();
    assert_eq!(
        store.cancel(&id, t(9)).await.unwrap(),
        CancelOutcome::AlreadyEnded(RunStatus::Completed)
    );
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!((run.status, run.error), (RunStatus::Completed, None));
}

/// A failed try gives the run back, due after [`failure_backoff`]; try
/// [`MAX_FAILED_TRIES`] fails it with the cause, records `RunFailed`, releases its tokens, and
/// the run is never handed out again. A stale lease cannot record a failure.
pub async fn failed_tries_give_the_run_back_and_the_last_fails_it<S: Store>(store: &S) {
    let (id, _) = start(store, "poison", None, t(0)).await;
    let cause = Error::fatal("the database refused a value");
    let mut now = t(10);
    for tries in 1..MAX_FAILED_TRIES {
        let lease = lease_one(store, id, now).await;
        let outcome = store.record_failure(&lease, &cause, now).await.unwrap();
        let due = now + failure_backoff(tries);
        assert_eq!(outcome, FailureOutcome::Retrying { tries, at: due });
        assert!(
            store
                .record_failure(&lease, &cause, now)
                .await
                .is_err_and(|e| matches!(e, StoreError::LeaseLost(r) if r == id)),
            "a lease given back cannot record another failure"
        );
        let early = acquire(
            store,
            &names(&["hooked"]),
            due - Duration::from_millis(1),
            Duration::from_secs(60),
            10,
        )
        .await;
        assert!(early.is_empty(), "handed out before its backoff ended");
        now = due;
    }
    let lease = lease_one(store, id, now).await;
    let before = event_seqs(store, id).await.len();
    assert_eq!(
        store.record_failure(&lease, &cause, now).await.unwrap(),
        FailureOutcome::Failed
    );
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert!(
        error.message().contains("gave up") && error.message().contains("refused a value"),
        "{error:?}"
    );
    let events = store.events(&id).await.unwrap();
    assert_eq!(events.len(), before + 1);
    assert!(matches!(&events[before].event, Event::RunFailed { error: e } if *e == error));
    assert_eq!(
        owner(store, "poison").await,
        None,
        "the token was not released"
    );
    let later = acquire(
        store,
        &names(&["hooked"]),
        t(10_000_000),
        Duration::from_secs(60),
        10,
    )
    .await;
    assert!(later.is_empty());
    assert!(matches!(
        store.record_failure(&lease, &cause, now).await,
        Err(StoreError::LeaseLost(_))
    ));
}

/// Failed tries count in a row: a try that ends well (the run given back with `release`)
/// starts the count again.
pub async fn a_release_starts_the_count_of_failed_tries_again<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let cause = Error::fatal("refused");
    let mut now = t(10);
    for tries in 1..=2 {
        let lease = lease_one(store, id, now).await;
        let outcome = store.record_failure(&lease, &cause, now).await.unwrap();
        assert!(matches!(outcome, FailureOutcome::Retrying { tries: n, .. } if n == tries));
        now += Duration::from_secs(100);
    }
    let lease = lease_one(store, id, now).await;
    store.release(&lease, now, 0).await.unwrap();
    now += Duration::from_secs(100);
    let lease = lease_one(store, id, now).await;
    let outcome = store.record_failure(&lease, &cause, now).await.unwrap();
    assert!(
        matches!(outcome, FailureOutcome::Retrying { tries: 1, .. }),
        "{outcome:?}"
    );
}

/// `block` (fenced) makes the run blocked with the divergence as its error and nothing added
/// to its history, due after [`block_backoff`] (doubling per block in a row); payloads do not
/// wake it; `wake_blocked` and `retry` make it due at once; acquiring it clears the error.
pub async fn a_blocked_run_waits_with_its_divergence_until_woken_or_retried<S: Store>(store: &S) {
    let (id, _) = start(store, "blocked", None, t(0)).await;
    let divergence = Error::diverged("at event 1 its history expects A next, but B");
    let lease = lease_one(store, id, t(10)).await;
    let before = event_seqs(store, id).await;
    let due = store.block(&lease, &divergence, t(10)).await.unwrap();
    assert_eq!(due, t(10) + block_backoff(1));
    assert!(matches!(
        store.block(&lease, &divergence, t(10)).await,
        Err(StoreError::LeaseLost(r)) if r == id
    ));
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(
        (run.status, run.error),
        (RunStatus::Blocked, Some(divergence.clone()))
    );
    assert_eq!(event_seqs(store, id).await, before, "nothing written");
    assert!(!run.status.is_terminal());

    // A payload does not wake it.
    store.resume_hook("blocked", json!(1), t(11)).await.unwrap();
    let hooked = names(&["hooked"]);
    let lease_for = Duration::from_secs(60);
    assert!(acquire(
        store,
        &hooked,
        due - Duration::from_millis(1),
        lease_for,
        10
    )
    .await
    .is_empty());
    // Due after its backoff; acquiring clears the divergence.
    let got = acquire(store, &hooked, due, lease_for, 10).await;
    assert_eq!(got.len(), 1);
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!((run.status, run.error), (RunStatus::Running, None));

    // Blocked again: the backoff doubles; wake_blocked makes it due at once.
    let due = store.block(&got[0].lease, &divergence, due).await.unwrap();
    let now = t(10) + block_backoff(1);
    assert_eq!(due, now + block_backoff(2));
    assert_eq!(store.wake_blocked(now).await.unwrap(), 1);
    let got = acquire(store, &hooked, now, lease_for, 10).await;
    assert_eq!(got.len(), 1);

    // And retry, too, without waiting for the backoff.
    store.block(&got[0].lease, &divergence, now).await.unwrap();
    assert_eq!(
        store.retry(&id, now).await.unwrap(),
        RetryOutcome::Unblocked
    );
    assert_eq!(acquire(store, &hooked, now, lease_for, 10).await.len(), 1);
    assert_eq!(store.wake_blocked(now).await.unwrap(), 0);
}

/// `retry` re-opens a failed run (a `RunRetried` event, pending, error cleared, due now) and
/// refuses, changing nothing, a completed, cancelled or live run; an unknown run is an error.
pub async fn retry_reopens_a_failed_run_and_refuses_other_statuses<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let lease = lease_one(store, id, t(1)).await;
    let error = Error::fatal("out of stock");
    store
        .append(
            &lease,
            &ap(vec![step_done(t(2), 1)], Some(RunOutcome::Failed(error))),
        )
        .await
        .unwrap();
    assert_eq!(
        store.retry(&id, t(5)).await.unwrap(),
        RetryOutcome::Reopened
    );
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!((run.status, run.error), (RunStatus::Pending, None));
    let events = store.events(&id).await.unwrap();
    assert!(
        matches!(events.last().map(|e| &e.event), Some(Event::RunRetried)),
        "{events:?}"
    );
    let got = acquire(
        store,
        &names(&["orders"]),
        t(5),
        Duration::from_secs(60),
        10,
    )
    .await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [id]);
    assert_eq!(got[0].events.len(), events.len());
    assert_eq!(
        store.retry(&id, t(6)).await.unwrap(),
        RetryOutcome::NotRetryable(RunStatus::Running)
    );
    store
        .append(
            &got[0].lease,
            &ap(vec![], Some(RunOutcome::Completed(json!(1)))),
        )
        .await
        .unwrap();
    let before = store.events(&id).await.unwrap();
    assert_eq!(
        store.retry(&id, t(7)).await.unwrap(),
        RetryOutcome::NotRetryable(RunStatus::Completed)
    );
    assert_eq!(store.events(&id).await.unwrap(), before);
    let cancelled = create(store, "orders", t(8)).await;
    store.cancel(&cancelled, t(9)).await.unwrap();
    assert_eq!(
        store.retry(&cancelled, t(9)).await.unwrap(),
        RetryOutcome::NotRetryable(RunStatus::Cancelled)
    );
    let unknown = RunId::new();
    assert!(matches!(
        store.retry(&unknown, t(9)).await,
        Err(StoreError::RunNotFound(r)) if r == unknown
    ));
}

/// A run created with a history (`fork`) is pending, holds that history numbered from 1, and
/// is handed out with it; an existing id or a token is refused.
pub async fn a_run_created_with_a_history_replays_it<S: Store>(store: &S) {
    let id = RunId::new();
    let new = |id, hook| NewRun::new(id, "orders".to_owned(), json!([1]), t(0)).hook(hook);
    let history = [step_done(t(1), 1), step_done(t(2), 2)];
    store
        .create_run_with_history(new(id, None), &history)
        .await
        .unwrap();
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Pending);
    assert_eq!(event_seqs(store, id).await, [1, 2]);
    let got = acquire(
        store,
        &names(&["orders"]),
        t(3),
        Duration::from_secs(60),
        10,
    )
    .await;
    assert_eq!(got.len(), 1);
    let events: Vec<NewEvent> = got[0]
        .events
        .iter()
        .map(|e| NewEvent {
            at: e.at,
            event: e.event.clone(),
        })
        .collect();
    assert_eq!(events, history);
    assert!(store
        .create_run_with_history(new(id, None), &history)
        .await
        .is_err());
    let other = RunId::new();
    assert!(store
        .create_run_with_history(new(other, start_hook("fork", None)), &history)
        .await
        .is_err());
    assert!(store.get_run(&other).await.unwrap().is_none());
    assert_eq!(owner(store, "fork").await, None);
}

/// A run's deadline is kept with it: read back by `get_run`, handed out by `acquire` and by
/// an admission that leases.
pub async fn a_deadline_is_kept_with_the_run<S: Store>(store: &S) {
    let run = |deadline| {
        NewRun::new(RunId::new(), "orders".to_owned(), json!([]), t(0)).deadline(deadline)
    };
    let (with, without) = (run(Some(t(5_000))), run(None));
    let (with_id, without_id) = (with.id, without.id);
    store.create_run(with).await.unwrap();
    store.create_run(without).await.unwrap();
    let read = |id| async move { store.get_run(&id).await.unwrap().unwrap().deadline };
    assert_eq!(read(with_id).await, Some(t(5_000)));
    assert_eq!(read(without_id).await, None);
    let got = acquire(
        store,
        &names(&["orders"]),
        t(1),
        Duration::from_secs(60),
        10,
    )
    .await;
    let deadline = |id| got.iter().find(|r| r.run.id == id).map(|r| r.run.deadline);
    assert_eq!(deadline(with_id), Some(Some(t(5_000))));
    assert_eq!(deadline(without_id), Some(None));
    let leased = run(Some(t(9_000)));
    let leased_id = leased.id;
    store
        .create_run_leased(leased, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(read(leased_id).await, Some(t(9_000)));
}

/// `ended_among` answers, of the given runs, those that ended or do not exist, in order.
pub async fn ended_among_names_the_runs_that_are_not_live<S: Store>(store: &S) {
    let pending = create(store, "orders", t(0)).await;
    let running = create(store, "orders", t(0)).await;
    let lease = lease_one(store, running, t(1)).await;
    let done = create(store, "orders", t(0)).await;
    let done_lease = lease_one(store, done, t(1)).await;
    store
        .append(
            &done_lease,
            &ap(vec![], Some(RunOutcome::Completed(json!(1)))),
        )
        .await
        .unwrap();
    let cancelled = create(store, "orders", t(0)).await;
    store.cancel(&cancelled, t(2)).await.unwrap();
    let gone = RunId::new();
    let asked = [pending, running, done, cancelled, gone];
    assert_eq!(
        store.ended_among(&asked).await.unwrap(),
        [done, cancelled, gone]
    );
    assert_eq!(store.ended_among(&[]).await.unwrap(), []);
    store
        .block(&lease, &Error::diverged("x"), t(3))
        .await
        .unwrap();
    assert_eq!(store.ended_among(&[running]).await.unwrap(), []);
}
