//! Conformance cases of continue-as-new ([`RunStore::continue_as_new`]): one act ends the
//! leased run and admits the next, which inherits the run's tokens, inbox, open requests,
//! queue slot and parent; a lost lease or an ended run writes nothing.

use std::time::Duration;

use serde_json::json;

use super::support::{acquire, ap, create, lease_one, names, new_run, owner, start, t};
use super::within;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::*;

/// The last events of a run continuing as `next`, at `at`.
fn continued(next: RunId, at: std::time::SystemTime) -> Append {
    ap(
        vec![NewEvent {
            at,
            event: Event::RunContinuedAsNew {
                next_run: next,
                workflow: "hooked".to_owned(),
            },
        }],
        None,
    )
}

/// The next run's own parts; the store fills in what it inherits.
fn next_run(id: RunId, at: std::time::SystemTime) -> NewRun {
    NewRun::new(id, "hooked".to_owned(), json!([7]), at)
}

/// One act ends the run as continued and admits the next run, which owns the run's tokens
/// (a resume after the seam reaches it), holds its unreceived payloads, messages and
/// requests in their order (open requests are answered from it), and names the run it
/// continues; the old run names it and keeps its history, its continuation last.
pub async fn continue_as_new_ends_the_run_and_admits_the_next_with_what_it_inherits<S: Store>(
    store: &S,
) {
    let (old, _) = start(store, "chain-tok", None, t(0)).await;
    let lease = lease_one(store, old, t(1)).await;
    let (_, p1) = store
        .resume_hook("chain-tok", json!("p1"), t(2))
        .await
        .unwrap()
        .expect("the start token is owned");
    let message = NewMessage {
        topic: "m".to_owned(),
        payload: json!("hello"),
        idempotency_key: Some("k1".to_owned()),
        at: t(3),
    };
    let sent = store.send_message(&old, message.clone()).await.unwrap();
    let SendOutcome::Queued(m1) = sent else {
        panic!("the message was not queued: {sent:?}")
    };
    let request = NewRequest {
        name: "ask".to_owned(),
        payload: json!(1),
        idempotency_key: None,
        at: t(4),
    };
    let SendOutcome::Queued(r1) = store.send_request(&old, request).await.unwrap() else {
        panic!("the request was not queued")
    };

    let next = RunId::new();
    within(store.continue_as_new(&lease, &continued(next, t(5)), next_run(next, t(5))))
        .await
        .unwrap();

    let old_rec = store.get_run(&old).await.unwrap().unwrap();
    assert_eq!(old_rec.status, RunStatus::ContinuedAsNew);
    assert_eq!(old_rec.next_run, Some(next));
    assert!(old_rec.status.is_terminal());
    let history = store.events(&old).await.unwrap();
    assert!(
        matches!(
            history.last().map(|e| &e.event),
            Some(Event::RunContinuedAsNew { next_run, .. }) if *next_run == next
        ),
        "the old run's history ends with its continuation: {history:?}"
    );

    let next_rec = store.get_run(&next).await.unwrap().unwrap();
    assert_eq!(next_rec.status, RunStatus::Pending);
    assert_eq!(next_rec.previous_run, Some(old));
    assert_eq!(next_rec.origin, Some(old), "the chain's first run");
    assert_eq!(old_rec.origin, None, "a first run continues no chain");
    assert_eq!(next_rec.next_run, None);
    assert_eq!(next_rec.input, json!([7]));
    assert_eq!(next_rec.hook_token.as_deref(), Some("chain-tok"));
    assert!(store.events(&next).await.unwrap().is_empty());

    assert_eq!(
        owner(store, "chain-tok").await,
        Some(next),
        "the token moved"
    );
    assert!(store.payloads(&old, 0).await.unwrap().is_empty());
    let inbox: Vec<u64> = store
        .payloads(&next, 0)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(inbox, vec![p1, m1, r1], "the inbox moved in its order");
    let reply = store.request_reply(&next, r1).await.unwrap().unwrap();
    assert_eq!(reply.reply, None, "the open request waits for the next run");

    // Sends to the old run find it ended as continued (the runtime follows it); a repeat
    // of the message's key to the next run is a duplicate.
    assert_eq!(
        store.send_message(&old, message.clone()).await.unwrap(),
        SendOutcome::Ended(RunStatus::ContinuedAsNew)
    );
    assert_eq!(
        store.send_message(&next, message).await.unwrap(),
        SendOutcome::Duplicate(m1)
    );
    let (to, _) = store
        .resume_hook("chain-tok", json!("p2"), t(6))
        .await
        .unwrap()
        .expect("the token is owned through the seam");
    assert_eq!(to, next);

    // The next run is due, binds the inherited token, and ends like any run, giving it up.
    let next_lease = lease_one(store, next, t(7)).await;
    let claimed = store
        .claim_hook(&next_lease, "hk_0", "chain-tok", t(8))
        .await
        .unwrap();
    assert_eq!(claimed, ClaimOutcome::Claimed, "the inherited token binds");
    let again = store
        .claim_hook(&next_lease, "hk_1", "chain-tok", t(9))
        .await
        .unwrap();
    assert_eq!(
        again,
        ClaimOutcome::Conflict(next),
        "bound once: a second claim by its owner conflicts, as any does"
    );
    store
        .append(
            &next_lease,
            &ap(Vec::new(), Some(RunOutcome::Completed(json!("done")))),
        )
        .await
        .unwrap();
    assert_eq!(owner(store, "chain-tok").await, None);
}

/// What the run received (its delivery recorded) and its workflow never took goes back to the
/// inbox for the next run under its own ids, in order among what moved: messages, and a hook
/// payload whose token the next run inherits; a payload of a token the run gave up stays
/// gone with it.
pub async fn a_continuation_carries_what_the_run_received_and_did_not_take<S: Store>(store: &S) {
    let (old, _) = start(store, "carry-tok", None, t(0)).await;
    let lease = lease_one(store, old, t(1)).await;
    let claimed = store
        .claim_hook(&lease, "hk_1", "gone-tok", t(2))
        .await
        .unwrap();
    assert_eq!(claimed, ClaimOutcome::Claimed);
    let resume = |token: &'static str, v: &'static str, at| async move {
        store
            .resume_hook(token, json!(v), at)
            .await
            .unwrap()
            .expect("the token is owned")
            .1
    };
    let p1 = resume("carry-tok", "p1", t(3)).await;
    let p2 = resume("gone-tok", "p2", t(4)).await;
    let message = NewMessage {
        topic: "m".to_owned(),
        payload: json!("m1"),
        idempotency_key: None,
        at: t(5),
    };
    let SendOutcome::Queued(m1) = store.send_message(&old, message).await.unwrap() else {
        panic!("the message was not queued")
    };
    // Delivered (so out of the inbox), then `gone-tok` given up.
    let delivered = |event, at| NewEvent { at, event };
    let mut got = ap(
        vec![
            delivered(
                Event::HookReceived {
                    token: "carry-tok".into(),
                    payload_id: p1,
                    payload: json!("p1"),
                },
                t(6),
            ),
            delivered(
                Event::HookReceived {
                    token: "gone-tok".into(),
                    payload_id: p2,
                    payload: json!("p2"),
                },
                t(6),
            ),
            delivered(
                Event::MessageReceived {
                    topic: "m".into(),
                    payload_id: m1,
                    payload: json!("m1"),
                },
                t(6),
            ),
            delivered(
                Event::HookReleased {
                    hook_key: "hk_1".into(),
                    token: "gone-tok".into(),
                },
                t(6),
            ),
        ],
        None,
    );
    got.release_tokens = vec!["gone-tok".to_owned()];
    store.append(&lease, &got).await.unwrap();
    assert!(store.payloads(&old, 0).await.unwrap().is_empty());
    let p3 = resume("carry-tok", "p3", t(7)).await;

    let next = RunId::new();
    let mut last = continued(next, t(8));
    last.carried = vec![
        InboxEntry {
            id: p1,
            what: Inbound::Hook {
                token: "carry-tok".into(),
                payload: json!("p1"),
            },
        },
        InboxEntry {
            id: p2,
            what: Inbound::Hook {
                token: "gone-tok".into(),
                payload: json!("p2"),
            },
        },
        InboxEntry {
            id: m1,
            what: Inbound::Message {
                topic: "m".into(),
                payload: json!("m1"),
            },
        },
    ];
    within(store.continue_as_new(&lease, &last, next_run(next, t(8))))
        .await
        .unwrap();
    let inbox = store.payloads(&next, 0).await.unwrap();
    let ids: Vec<u64> = inbox.iter().map(|e| e.id).collect();
    assert_eq!(ids, vec![p1, m1, p3], "carried under their ids, in order");
    assert_eq!(
        inbox[1].what,
        Inbound::Message {
            topic: "m".into(),
            payload: json!("m1"),
        }
    );
    assert!(store.payloads(&old, 0).await.unwrap().is_empty());
}

/// A worker that lost its lease, or a run that ended, continues nothing: no next run, the
/// run as it was.
pub async fn continue_as_new_under_a_lost_lease_or_on_an_ended_run_writes_nothing<S: Store>(
    store: &S,
) {
    let run = create(store, "orders", t(0)).await;
    let short = Duration::from_millis(10);
    let first = acquire(store, &names(&["orders"]), t(1), short, 10).await;
    let stale = first[0].lease.clone();
    // Taken over after the lease expired.
    let current = lease_one(store, run, t(1_000)).await;
    let next = RunId::new();
    let refused = store
        .continue_as_new(&stale, &continued(next, t(1_001)), next_run(next, t(1_001)))
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(id)) if id == run),
        "a stale lease continues nothing: {refused:?}"
    );
    assert!(store.get_run(&next).await.unwrap().is_none());
    let rec = store.get_run(&run).await.unwrap().unwrap();
    assert_eq!(rec.status, RunStatus::Running);
    assert_eq!(rec.next_run, None);
    assert!(store.events(&run).await.unwrap().is_empty());

    store
        .append(
            &current,
            &ap(Vec::new(), Some(RunOutcome::Completed(json!(1)))),
        )
        .await
        .unwrap();
    let refused = store
        .continue_as_new(
            &current,
            &continued(next, t(1_002)),
            next_run(next, t(1_002)),
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(_))),
        "an ended run continues nothing: {refused:?}"
    );
    assert!(store.get_run(&next).await.unwrap().is_none());
    assert_eq!(
        store.get_run(&run).await.unwrap().unwrap().status,
        RunStatus::Completed
    );
}

/// The next run holds the queue slot and partition key of the run it continues: no other
/// run of the queue begins between the two, and the slot frees only at the chain's end.
pub async fn a_continued_run_keeps_its_queue_slot<S: Store>(store: &S) {
    store
        .define_queues(&[QueueDef {
            name: "chainq".to_owned(),
            concurrency: Some(1),
            rate_limit: None,
        }])
        .await
        .unwrap();
    let queued = |at| {
        let id = RunId::new();
        let mut entry = QueueEntry::new("chainq");
        entry.partition_key = Some("key".to_owned());
        (
            id,
            NewRun {
                queue: Some(entry),
                ..next_run(id, at)
            },
        )
    };
    let (first, run) = queued(t(0));
    store.create_run(run).await.unwrap();
    let (other, run) = queued(t(1));
    store.create_run(run).await.unwrap();
    let wfs = names(&["hooked"]);
    let got = acquire(store, &wfs, t(2), Duration::from_secs(600), 10).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, vec![first], "one slot");
    let next = RunId::new();
    store
        .continue_as_new(&got[0].lease, &continued(next, t(3)), next_run(next, t(3)))
        .await
        .unwrap();
    let rec = store.get_run(&next).await.unwrap().unwrap();
    assert_eq!(rec.queue.as_ref().map(|q| q.name.as_str()), Some("chainq"));
    assert_eq!(
        rec.queue.as_ref().and_then(|q| q.partition_key.as_deref()),
        Some("key")
    );
    let got = acquire(store, &wfs, t(4), Duration::from_secs(600), 10).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, vec![next], "the chain keeps its slot; {other} waits");
    store
        .append(
            &got[0].lease,
            &ap(Vec::new(), Some(RunOutcome::Completed(json!(1)))),
        )
        .await
        .unwrap();
    let got = acquire(store, &wfs, t(5), Duration::from_secs(600), 10).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, vec![other], "the chain's end frees the slot");
}

/// A child that continues as new keeps its parent: the chain's last run's end reaches the
/// parent's inbox, naming the child the parent started (the chain's first run).
pub async fn a_continued_child_s_end_reaches_the_parent_under_its_first_id<S: Store>(store: &S) {
    let parent = create(store, "orders", t(0)).await;
    let parent_lease = lease_one(store, parent, t(1)).await;
    let child = RunId::new();
    let admitted = store
        .start_child(
            &parent_lease,
            "ch_0",
            NewRun {
                parent: Some(ParentLink {
                    run: parent,
                    detached: false,
                }),
                ..next_run(child, t(2))
            },
        )
        .await
        .unwrap();
    assert_eq!(admitted, Admission::Admitted);
    let child_lease = lease_one(store, child, t(3)).await;
    let next = RunId::new();
    store
        .continue_as_new(&child_lease, &continued(next, t(4)), next_run(next, t(4)))
        .await
        .unwrap();
    assert_eq!(
        store.get_run(&next).await.unwrap().unwrap().parent,
        Some(parent)
    );
    let notices = |entries: Vec<InboxEntry>| -> Vec<ChildNotice> {
        entries
            .into_iter()
            .filter_map(|e| match e.what {
                Inbound::ChildEnded(n) => Some(n),
                _ => None,
            })
            .collect()
    };
    assert!(
        notices(store.payloads(&parent, 0).await.unwrap()).is_empty(),
        "a continuation is no end the parent hears of"
    );
    let next_lease = lease_one(store, next, t(5)).await;
    store
        .append(
            &next_lease,
            &ap(Vec::new(), Some(RunOutcome::Completed(json!("last")))),
        )
        .await
        .unwrap();
    let ends = notices(store.payloads(&parent, 0).await.unwrap());
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert_eq!(ends[0].child, child, "named as the parent started it");
    assert_eq!(ends[0].status, RunStatus::Completed);
    assert_eq!(ends[0].output, Some(json!("last")));
}

/// The tick that started a run names the run that continues it: the chain is the tick's run
/// (its overlap policy sees the chain running until its last run ends).
pub async fn a_continued_run_stays_its_schedule_tick_s_run<S: Store>(store: &S) {
    let def = ScheduleDef {
        name: "chained".to_owned(),
        workflow: "hooked".to_owned(),
        queue: None,
        spec: ScheduleSpec::Every { period_ms: 1000 },
        overlap: Overlap::Skip,
        catch_up: CatchUp::Latest,
        catch_up_window: Duration::from_secs(3600),
        jitter: Duration::ZERO,
    };
    store
        .define_schedule(&def, Some(t(1000)), t(0))
        .await
        .unwrap();
    let first = RunId::new();
    let fired = store
        .fire_tick(NewTick {
            schedule: "chained".to_owned(),
            nominal: t(1000),
            outcome: TickOutcome::Started,
            run: Some(next_run(first, t(1000))),
            backfill: false,
            at: t(1000),
            next: Some(t(2000)),
            replace_runless: false,
            lease: None,
            first: Vec::new(),
        })
        .await
        .unwrap();
    assert_eq!(fired, TickWrite::Recorded);
    let lease = lease_one(store, first, t(1001)).await;
    let next = RunId::new();
    store
        .continue_as_new(&lease, &continued(next, t(1002)), next_run(next, t(1002)))
        .await
        .unwrap();
    let ticks = store.schedule_ticks("chained", 1).await.unwrap();
    assert_eq!(ticks.len(), 1);
    assert_eq!(ticks[0].run_id, Some(next), "{ticks:?}");
    let state = store
        .list_schedules()
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.def.name == "chained")
        .unwrap();
    assert_eq!(state.last_started, Some((t(1000), next)));
}

/// The next run keeps the trace context its chain was started in: every attempt of every run
/// of the chain is a span of the start's trace.
pub async fn a_continued_run_keeps_its_trace_context<S: Store>(store: &S) {
    let trace = TraceContext {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        tracestate: Some("vendor=1".to_owned()),
    };
    let old = RunId::new();
    store
        .create_run(NewRun {
            trace_context: Some(trace.clone()),
            ..new_run(old, "hooked")
        })
        .await
        .unwrap();
    let lease = lease_one(store, old, t(1)).await;
    let next = RunId::new();
    within(store.continue_as_new(&lease, &continued(next, t(2)), next_run(next, t(2))))
        .await
        .unwrap();
    let next_rec = store.get_run(&next).await.unwrap().unwrap();
    assert_eq!(next_rec.trace_context, Some(trace));
}

/// `continue_as_new_leased` admits the next run leased to the caller under the same lease
/// (epoch 1): no acquire hands it out while that lease lasts, its writes go through with
/// the lease returned, and a further continuation names the chain's first run as its
/// origin. A stale lease continues and leases nothing. A store that cannot lease at the seam
/// returns no lease, and its next run is acquired as usual.
pub async fn a_run_continued_under_a_lease_is_leased_to_the_same_worker<S: Store>(store: &S) {
    let old = create(store, "orders", t(0)).await;
    let lease = lease_one(store, old, t(1)).await;
    let next = RunId::new();
    let leased = within(store.continue_as_new_leased(
        &lease,
        &continued(next, t(2)),
        NewRun {
            workflow: "orders".to_owned(),
            ..next_run(next, t(2))
        },
    ))
    .await
    .unwrap();
    let old_rec = store.get_run(&old).await.unwrap().unwrap();
    assert_eq!(old_rec.status, RunStatus::ContinuedAsNew);
    assert_eq!(old_rec.next_run, Some(next));
    let Some(leased) = leased else {
        // This store leaves the next run to `acquire`.
        let rec = store.get_run(&next).await.unwrap().unwrap();
        assert_eq!(rec.status, RunStatus::Pending);
        lease_one(store, next, t(3)).await;
        return;
    };
    assert_eq!(
        leased.lease,
        Lease {
            run_id: next,
            epoch: 1
        }
    );
    assert_eq!(leased.run.id, next);
    assert_eq!(leased.run.status, RunStatus::Running);
    assert_eq!(leased.run.previous_run, Some(old));
    assert_eq!(leased.run.origin, Some(old));
    assert!(leased.events.is_empty() && !leased.took_over);
    assert_eq!(leased.run, store.get_run(&next).await.unwrap().unwrap());
    let others = acquire(store, &names(&["orders"]), t(3), Duration::from_secs(1), 10).await;
    assert!(
        others.iter().all(|r| r.run.id != next),
        "no other worker acquires a run leased at the seam"
    );

    // Its driver writes with the lease it was given; its own continuation keeps the origin.
    let third = RunId::new();
    let again = store
        .continue_as_new_leased(
            &leased.lease,
            &continued(third, t(4)),
            NewRun {
                workflow: "orders".to_owned(),
                ..next_run(third, t(4))
            },
        )
        .await
        .unwrap()
        .expect("a store that leases at the seam leases every time");
    assert_eq!(again.run.origin, Some(old));
    assert_eq!(again.run.previous_run, Some(next));

    // A stale lease (the run taken over after its lease expired) leases nothing.
    let run = create(store, "orders", t(10)).await;
    let short = Duration::from_millis(10);
    let stale = acquire(store, &names(&["orders"]), t(11), short, 10).await;
    let stale = stale
        .into_iter()
        .find(|r| r.run.id == run)
        .expect("acquirable")
        .lease;
    let _current = lease_one(store, run, t(1_000)).await;
    let refused_id = RunId::new();
    let refused = store
        .continue_as_new_leased(
            &stale,
            &continued(refused_id, t(1_001)),
            next_run(refused_id, t(1_001)),
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(id)) if id == run),
        "a stale lease continues nothing: {refused:?}"
    );
    assert!(store.get_run(&refused_id).await.unwrap().is_none());
}
