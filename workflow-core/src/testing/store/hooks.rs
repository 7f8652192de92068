//! The hooks contract ([`HookStore`](crate::store::HookStore)): starts claiming a token and
//! start-or-resume, claims and releases of tokens, their retention, resumes and the inbox they
//! fill, and a script of hook operations compared with the memory store.

use std::time::{Duration, SystemTime};

use serde_json::json;

use super::support::{
    acquire, ap, create, hook_payload, lease_one, names, owner, sent, start, start_hook, t,
};
use super::Inspect;
use crate::error::{Error, StoreError};
use crate::ids::RunId;
use crate::store::memory::MemoryStore;
use crate::store::*;

/// A start whose hook token is taken is refused naming the owner, and writes no run, event or
/// hook.
pub async fn a_start_whose_token_is_taken_writes_nothing<S: Store + Inspect>(store: &S) {
    let (first, admitted) = start(store, "order:1", None, t(0)).await;
    assert_eq!(admitted, Admission::Admitted);
    let run = store.get_run(&first).await.unwrap().unwrap();
    assert_eq!(run.hook_token.as_deref(), Some("order:1"));
    assert_eq!(run.status, RunStatus::Pending);
    assert_eq!(
        store.get_hook("order:1").await.unwrap(),
        Some(HookRecord {
            token: "order:1".to_owned(),
            run_id: first,
            created_at: t(0),
        })
    );
    let tables = ["runs", "events", "hooks", "hook_inbox"];
    let mut before = Vec::new();
    for table in tables {
        before.push(store.count(table).await);
    }

    let (second, conflict) = start(store, "order:1", None, t(5)).await;
    assert_eq!(conflict, Admission::Conflict(first));
    assert!(store.get_run(&second).await.unwrap().is_none());
    let mut after = Vec::new();
    for table in tables {
        after.push(store.count(table).await);
    }
    assert_eq!(after, before);
    assert_eq!(before, [1, 0, 1, 0]);
    assert_eq!(owner(store, "order:1").await, Some(first));

    // An existing id is an error before any claim.
    let again = store
        .create_run(NewRun::new(first, "hooked", json!([]), t(6)).hook(start_hook("order:2", None)))
        .await;
    assert!(
        matches!(&again, Err(StoreError::Database(m)) if m.message().contains("already exists")),
        "{again:?}"
    );
    assert_eq!(owner(store, "order:2").await, None);
    // A run without a token has none.
    let plain = create(store, "orders", t(7)).await;
    let run = store.get_run(&plain).await.unwrap().unwrap();
    assert_eq!(run.hook_token, None);
}

/// A run of `hooked` claiming `token` at `at`, for `admit_or_resume`.
pub(super) fn hooked_run(token: &str, retain_until: Option<SystemTime>, at: SystemTime) -> NewRun {
    NewRun::new(RunId::new(), "hooked".to_owned(), json!([]), at)
        .hook(start_hook(token, retain_until))
}

/// `admit_or_resume`: a free token admits the run (leased when asked) and queues nothing; a
/// token an active hook owns queues the payload to its run, which becomes due, and admits
/// nothing; a token only retained by an ended run writes nothing at all.
pub async fn admit_or_resume_admits_resumes_or_conflicts<S: Store + Inspect>(store: &S) {
    let minute = Some(Duration::from_secs(60));
    let first = hooked_run("a", None, t(0));
    let owner_a = first.id;
    let admitted = store
        .admit_or_resume(first, minute, json!("not sent"))
        .await
        .unwrap();
    let lease = match admitted {
        AdmitOrResume::Admitted(lease) => lease,
        other => panic!("a free token admits: {other:?}"),
    };
    if let Some(lease) = lease {
        assert_eq!(
            lease,
            Lease {
                run_id: owner_a,
                epoch: 1
            }
        );
        let run = store.get_run(&owner_a).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Running);
    }
    assert_eq!(owner(store, "a").await, Some(owner_a));
    assert_eq!(store.count("hook_inbox").await, 0);

    let second = hooked_run("a", None, t(10));
    let duplicate = second.id;
    assert_eq!(
        store
            .admit_or_resume(second, minute, json!({"n": 1}))
            .await
            .unwrap(),
        AdmitOrResume::Resumed {
            run: owner_a,
            payload_id: 1
        }
    );
    assert!(store.get_run(&duplicate).await.unwrap().is_none());
    assert_eq!(
        store.payloads(&owner_a, 0).await.unwrap(),
        [sent(1, "a", json!({"n": 1}))]
    );

    // A pending owner due far ahead becomes due at the payload's time.
    let (owner_b, _) = start(store, "b", None, t(50_000)).await;
    let hooked = names(&["hooked"]);
    assert!(acquire(store, &hooked, t(100), Duration::from_secs(60), 10)
        .await
        .is_empty());
    assert_eq!(
        store
            .admit_or_resume(hooked_run("b", None, t(100)), None, json!(2))
            .await
            .unwrap(),
        AdmitOrResume::Resumed {
            run: owner_b,
            payload_id: 2
        }
    );
    let got = acquire(store, &hooked, t(100), Duration::from_secs(60), 10).await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [owner_b]);

    // Retained by an ended run: a conflict naming it, and nothing written.
    let (owner_c, _) = start(store, "c", Some(t(10_000)), t(200)).await;
    store.cancel(&owner_c, t(300)).await.unwrap();
    let tables = ["runs", "events", "hooks", "hook_inbox"];
    let mut before = Vec::new();
    for table in tables {
        before.push(store.count(table).await);
    }
    let late = hooked_run("c", None, t(400));
    let late_id = late.id;
    assert_eq!(
        store.admit_or_resume(late, minute, json!(3)).await.unwrap(),
        AdmitOrResume::Conflict(owner_c)
    );
    let mut after = Vec::new();
    for table in tables {
        after.push(store.count(table).await);
    }
    assert_eq!(after, before);
    assert!(store.get_run(&late_id).await.unwrap().is_none());
    assert_eq!(store.last_payload_id().await.unwrap(), 2);

    // Once the retention is over, the token is free again.
    let fresh = hooked_run("c", None, t(10_000));
    let fresh_id = fresh.id;
    assert!(matches!(
        store.admit_or_resume(fresh, None, json!(4)).await.unwrap(),
        AdmitOrResume::Admitted(None)
    ));
    assert_eq!(owner(store, "c").await, Some(fresh_id));
    assert_eq!(store.last_payload_id().await.unwrap(), 2);

    // A run without a token is refused.
    let mut tokenless = hooked_run("d", None, t(0));
    tokenless.hook = None;
    assert!(store
        .admit_or_resume(tokenless, None, json!(5))
        .await
        .is_err());
}

/// Hook claims: one active owner per token, release on request, and retained tokens refused
/// until their retention ends.
pub async fn claims_releases_and_retention<S: Store + Inspect>(store: &S) {
    let (keeper, _) = start(store, "keep", Some(t(1_000)), t(0)).await;
    let claimer = create(store, "orders", t(1)).await;
    let keeper_lease = lease_one(store, keeper, t(0)).await;
    let lease = lease_one(store, claimer, t(1)).await;

    // Taken by an active start hook.
    assert_eq!(
        store
            .claim_hook(&lease, "hk_1", "keep", t(10))
            .await
            .unwrap(),
        ClaimOutcome::Conflict(keeper)
    );
    // The owner claiming its own token again is a conflict naming itself.
    assert_eq!(
        store
            .claim_hook(&keeper_lease, "hk_1", "keep", t(11))
            .await
            .unwrap(),
        ClaimOutcome::Conflict(keeper)
    );
    assert_eq!(
        store.events(&claimer).await.unwrap(),
        [EventRecord {
            seq: 1,
            at: t(10),
            event: Event::HookRegistered {
                hook_key: "hk_1".into(),
                token: "keep".into(),
                conflict: Some(keeper),
            },
        }]
    );

    // Ended with retention: released (no owner, unresumable) but not free until t(1_000).
    store
        .append(
            &keeper_lease,
            &ap(
                vec![NewEvent {
                    at: t(20),
                    event: Event::RunCompleted { output: json!(1) },
                }],
                Some(RunOutcome::Completed(json!(1))),
            ),
        )
        .await
        .unwrap();
    assert_eq!(owner(store, "keep").await, None);
    assert_eq!(
        store
            .resume_hook("keep", json!("late"), t(21))
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.count("hook_inbox").await, 0);
    assert_eq!(
        start(store, "keep", None, t(500)).await.1,
        Admission::Conflict(keeper)
    );
    assert_eq!(
        store
            .claim_hook(&lease, "hk_2", "keep", t(999))
            .await
            .unwrap(),
        ClaimOutcome::Conflict(keeper)
    );
    // Retention over: the next claim replaces the row.
    assert_eq!(
        store
            .claim_hook(&lease, "hk_3", "keep", t(1_000))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store.get_hook("keep").await.unwrap(),
        Some(HookRecord {
            token: "keep".into(),
            run_id: claimer,
            created_at: t(1_000),
        })
    );
    let seqs: Vec<(u64, Option<RunId>)> = store
        .events(&claimer)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e.event {
            Event::HookRegistered { conflict, .. } => (e.seq, conflict),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        seqs,
        [(1, Some(keeper)), (2, Some(keeper)), (3, None)],
        "one HookRegistered per claim, at the next seq"
    );

    // A stale lease claims nothing and records nothing.
    let stale = Lease {
        run_id: claimer,
        epoch: lease.epoch + 1,
    };
    assert!(matches!(
        store.claim_hook(&stale, "hk_4", "fresh", t(1_000)).await,
        Err(StoreError::LeaseLost(r)) if r == claimer
    ));
    assert_eq!(owner(store, "fresh").await, None);
    assert_eq!(store.events(&claimer).await.unwrap().len(), 3);

    // Released without retention: free at once, its row gone.
    let released = NewEvent {
        at: t(1_001),
        event: Event::HookReleased {
            hook_key: "hk_3".into(),
            token: "keep".into(),
        },
    };
    let release_keep = |events: Vec<NewEvent>| Append {
        events,
        release_tokens: vec!["keep".into()],
        ..Append::default()
    };
    store
        .append(&lease, &release_keep(vec![released.clone()]))
        .await
        .unwrap();
    assert_eq!(owner(store, "keep").await, None);
    assert_eq!(store.count("hooks").await, 0);
    let (next, admitted) = start(store, "keep", None, t(1_002)).await;
    assert_eq!(admitted, Admission::Admitted);
    // Releasing a token one does not own changes nothing.
    store.append(&lease, &release_keep(vec![])).await.unwrap();
    assert_eq!(owner(store, "keep").await, Some(next));
    // A fenced-off release releases nothing either.
    assert!(matches!(
        store.append(&stale, &release_keep(vec![])).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert_eq!(owner(store, "keep").await, Some(next));
    let last = store.events(&claimer).await.unwrap();
    assert_eq!(last.last().unwrap().event, released.event);
}

/// A run's end and its cancellation release its tokens in the same operation, except retained
/// ones.
pub async fn run_end_and_cancel_release_tokens<S: Store + Inspect>(store: &S) {
    let (failing, _) = start(store, "a", None, t(0)).await;
    let lease = lease_one(store, failing, t(0)).await;
    assert_eq!(
        store.claim_hook(&lease, "hk_1", "b", t(1)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(owner(store, "b").await, Some(failing));
    let error = Error::fatal("boom");
    store
        .append(
            &lease,
            &ap(
                vec![NewEvent {
                    at: t(2),
                    event: Event::RunFailed {
                        error: error.clone(),
                    },
                }],
                Some(RunOutcome::Failed(error)),
            ),
        )
        .await
        .unwrap();
    assert_eq!(owner(store, "a").await, None);
    assert_eq!(owner(store, "b").await, None);
    assert_eq!(store.count("hooks").await, 0);
    assert_eq!(start(store, "a", None, t(3)).await.1, Admission::Admitted);

    // Cancelled while pending.
    let (cancelled, _) = start(store, "c", None, t(0)).await;
    assert_eq!(
        store.cancel(&cancelled, t(4)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(owner(store, "c").await, None);
    assert_eq!(start(store, "c", None, t(5)).await.1, Admission::Admitted);

    // Cancelled with retention: unavailable until it ends.
    let (retained, _) = start(store, "d", Some(t(5_000)), t(0)).await;
    store.cancel(&retained, t(10)).await.unwrap();
    assert_eq!(owner(store, "d").await, None);
    assert_eq!(
        start(store, "d", None, t(4_999)).await.1,
        Admission::Conflict(retained)
    );
    let (late, admitted) = start(store, "d", None, t(5_000)).await;
    assert_eq!(admitted, Admission::Admitted);
    assert_eq!(owner(store, "d").await, Some(late));
    // Cancelling an ended run releases nothing more.
    assert_eq!(
        store.cancel(&retained, t(6_000)).await.unwrap(),
        CancelOutcome::AlreadyEnded(RunStatus::Cancelled)
    );
    assert_eq!(owner(store, "d").await, Some(late));
}

/// A payload for a token no active hook owns is refused and stored nowhere; once a run claims
/// the token, a payload makes that run due at once.
pub async fn a_resume_before_the_hook_exists_delivers_nothing<S: Store + Inspect>(store: &S) {
    assert_eq!(
        store.resume_hook("later", json!(1), t(0)).await.unwrap(),
        None
    );
    assert_eq!(store.last_payload_id().await.unwrap(), 0);
    assert!(store.payloads_since(0, 10).await.unwrap().is_empty());
    assert_eq!(store.count("hook_inbox").await, 0);
    // Admitted to wake far ahead; a payload makes it acquirable at the payload's time.
    let (run, _) = start(store, "later", None, t(50_000)).await;
    let hooked = names(&["hooked"]);
    assert!(acquire(store, &hooked, t(100), Duration::from_secs(60), 10)
        .await
        .is_empty());
    assert_eq!(
        store
            .resume_hook("later", json!({"n": 1}), t(100))
            .await
            .unwrap(),
        Some((run, 1))
    );
    let got = acquire(store, &hooked, t(100), Duration::from_secs(60), 10).await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [run]);
    assert_eq!(
        store.payloads(&run, 0).await.unwrap(),
        [sent(1, "later", json!({"n": 1}))]
    );
    assert!(store.payloads(&run, 1).await.unwrap().is_empty());
    assert_eq!(store.count("hook_inbox").await, 1);
}

/// An append recording a payload's delivery takes it out of the run's inbox, so a run picked
/// up again reads only what it has not received; the others stay, in order.
pub async fn delivered_payloads_leave_the_inbox<S: Store>(store: &S) {
    let (id, _) = start(store, "inbox", None, t(0)).await;
    let lease = lease_one(store, id, t(1)).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let (run, payload) = store
            .resume_hook("inbox", json!(n), t(2 + n))
            .await
            .unwrap()
            .expect("the token has an owner");
        assert_eq!(run, id);
        ids.push(payload);
    }
    let received = |n: usize| NewEvent {
        at: t(10),
        event: Event::HookReceived {
            token: "inbox".to_owned(),
            payload_id: ids[n],
            payload: json!(n),
        },
    };
    store
        .append(&lease, &ap(vec![received(0), received(2)], None))
        .await
        .unwrap();
    let left = store.payloads(&id, 0).await.unwrap();
    assert_eq!(
        left.iter()
            .map(|p| (p.id, hook_payload(p).1.clone()))
            .collect::<Vec<_>>(),
        [(ids[1], json!(1))]
    );
    // Ids are never reused, even once the newest payload left the inbox.
    let (_, next) = store
        .resume_hook("inbox", json!(3), t(11))
        .await
        .unwrap()
        .unwrap();
    assert!(next > ids[2], "{next} reuses an id at or below {}", ids[2]);
}

/// Releasing a run with payloads it has not seen makes it due at once, not at its wake time.
pub async fn release_wakes_a_run_with_unseen_payloads<S: Store + Inspect>(store: &S) {
    let (run, _) = start(store, "w", None, t(0)).await;
    let wf = names(&["hooked"]);
    let lease = Duration::from_secs(600);

    let held = lease_one(store, run, t(0)).await;
    let (_, p1) = store
        .resume_hook("w", json!(1), t(1))
        .await
        .unwrap()
        .unwrap();
    // Everything seen: it sleeps until woken.
    store.release(&held, never(), p1).await.unwrap();
    assert_eq!(store.wake_at(run).await, never());
    let far = SystemTime::now() + Duration::from_secs(86_400);
    assert!(acquire(store, &wf, far, lease, 10).await.is_empty());

    // A payload wakes it (at the payload's time).
    let (_, p2) = store
        .resume_hook("w", json!(2), t(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.wake_at(run).await, t(10));
    let held = lease_one(store, run, t(10)).await;

    // Released having seen only p1: p2 is waiting, so it is due now, not never. (Compared in
    // milliseconds, what the SQL stores keep.)
    let before = to_millis(SystemTime::now());
    store.release(&held, never(), p1).await.unwrap();
    let woken = to_millis(store.wake_at(run).await);
    assert!(
        woken >= before && woken <= to_millis(SystemTime::now()),
        "{woken}"
    );
    let held = lease_one(store, run, SystemTime::now() + Duration::from_secs(1)).await;
    assert!(matches!(
        store
            .release(
                &Lease {
                    epoch: 0,
                    ..held.clone()
                },
                never(),
                0
            )
            .await,
        Err(StoreError::LeaseLost(_))
    ));
    store.release(&held, t(99), p2).await.unwrap();
    assert_eq!(store.wake_at(run).await, t(99));
}

/// One script of hook operations; its transcript must be the same on every store.
pub(crate) async fn hook_script<S: Store>(store: &S, ids: &[RunId]) -> Vec<String> {
    let mut log = Vec::new();
    macro_rules! note {
        ($e:expr) => {
            log.push(format!("{:?}", $e))
        };
    }
    let new_run = |i: usize, token: Option<&str>, retain: Option<u64>, at: u64| {
        NewRun::new(ids[i], "hooked", json!([i]), t(at)).hook(token.map(|token| StartHook {
            token: token.into(),
            retain_until: retain.map(t),
        }))
    };
    note!(store.create_run(new_run(0, Some("x"), Some(300), 0)).await);
    note!(store.create_run(new_run(1, Some("x"), None, 1)).await);
    note!(store.create_run(new_run(2, None, None, 2)).await);
    note!(store.create_run(new_run(3, Some("y"), None, 3)).await);
    note!(store.create_run(new_run(3, Some("q"), None, 3)).await);
    let leased = store
        .acquire(AcquireRequest {
            worker_id: "w",
            workflows: &names(&["hooked"]),
            lease: Duration::from_secs(60),
            limit: 10,
            now: t(10),
        })
        .await
        .unwrap();
    note!(leased
        .iter()
        .map(|r| (&r.run, &r.lease, &r.events))
        .collect::<Vec<_>>());
    let lease = |i: usize| {
        leased
            .iter()
            .find(|r| r.run.id == ids[i])
            .unwrap()
            .lease
            .clone()
    };
    note!(store.claim_hook(&lease(2), "hk_1", "x", t(11)).await);
    note!(store.claim_hook(&lease(2), "hk_2", "z", t(12)).await);
    note!(store.claim_hook(&lease(2), "hk_3", "z", t(13)).await);
    note!(store.resume_hook("z", json!("p1"), t(20)).await);
    note!(store.resume_hook("y", json!("p2"), t(21)).await);
    note!(store.resume_hook("nope", json!("p3"), t(22)).await);
    note!(store.resume_hook("x", json!("p4"), t(23)).await);
    note!(store.payloads(&ids[2], 0).await);
    note!(store.payloads_since(0, 10).await);
    note!(store.last_payload_id().await);
    note!(store.get_hook("z").await);
    note!(
        store
            .append(
                &lease(2),
                &Append {
                    events: vec![NewEvent {
                        at: t(30),
                        event: Event::HookReleased {
                            hook_key: "hk_2".into(),
                            token: "z".into(),
                        },
                    }],
                    release_tokens: vec!["z".into(), "x".into()],
                    ..Append::default()
                }
            )
            .await
    );
    note!(store.get_hook("z").await);
    note!(store.get_hook("x").await);
    note!(store.resume_hook("z", json!("p5"), t(31)).await);
    note!(
        store
            .append(
                &lease(0),
                &ap(
                    vec![NewEvent {
                        at: t(40),
                        event: Event::RunCompleted { output: json!(0) },
                    }],
                    Some(RunOutcome::Completed(json!(0)))
                )
            )
            .await
    );
    note!(store.get_hook("x").await);
    note!(store.create_run(new_run(4, Some("x"), None, 100)).await);
    note!(store.claim_hook(&lease(2), "hk_4", "x", t(299)).await);
    note!(store.claim_hook(&lease(2), "hk_5", "x", t(300)).await);
    note!(store.cancel(&ids[3], t(50)).await);
    note!(store.get_hook("y").await);
    note!(store.create_run(new_run(5, Some("y"), None, 51)).await);
    note!(store.release(&lease(2), t(400), 0).await.is_ok());
    note!(store.claim_hook(&lease(2), "hk_6", "w", t(401)).await);
    for id in ids {
        note!(store.get_run(id).await);
        note!(store.events(id).await);
        note!(store.payloads(id, 0).await);
    }
    log
}

/// A script of hook operations has the same transcript on `store` as on the memory store.
pub async fn hooks_behave_like_the_memory_store<S: Store>(store: &S) {
    let ids: Vec<RunId> = (0..6).map(|_| RunId::new()).collect();
    let memory = MemoryStore::new();
    let expected = hook_script(&memory, &ids).await;
    let got = hook_script(store, &ids).await;
    for (n, (want, have)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(have, want, "step {n} differs from the memory store");
    }
    assert_eq!(got.len(), expected.len());
}
