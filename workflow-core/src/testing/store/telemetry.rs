//! What observability needs of a store: `acquire` says whether it took a run over
//! from a lease that expired while set (`workflow_lease_takeovers_total`), and a run keeps
//! the trace context it was started in through every way a run is admitted and read.

use std::time::Duration;

use serde_json::json;

use super::children::child_of;
use super::queues::declare;
use super::support::{acquire, ap, create, lease_one, names, start_hook, step_done, t};
use crate::error::Error;
use crate::ids::RunId;
use crate::store::*;

/// A run of `workflow` admitted at `at` with trace context `trace`.
fn traced(workflow: &str, at: u64, trace: Option<&TraceContext>) -> NewRun {
    NewRun::new(RunId::new(), workflow.to_owned(), json!([]), t(at)).trace_context(trace.cloned())
}

/// A trace context whose trace id ends in `n`.
fn context(n: u8) -> TraceContext {
    TraceContext::parse(&format!(
        "00-4bf92f3577b34da6a3ce929d0e0e47{n:02x}-00f067aa0ba902b7-01,congo=t61rcWkgMzE"
    ))
    .expect("a well-formed traceparent")
}

/// `acquire` reports a takeover only for a run whose lease was still set when it expired: not
/// for a run never leased, nor one given back by a release, a failed try or a block, nor for
/// a run leased at admission until that lease expires. Every acquisition is fenced alike.
pub async fn an_acquire_says_whether_it_took_over_an_expired_lease<S: Store>(store: &S) {
    let wf = names(&["taken"]);
    let lease = Duration::from_secs(10);
    let id = create(store, "taken", t(0)).await;
    let first = acquire(store, &wf, t(0), lease, 1).await;
    assert_eq!(first.len(), 1);
    assert!(!first[0].took_over, "a fresh run is begun, not taken over");
    // The holder stops renewing: at expiry the next acquire takes it over.
    let second = acquire(store, &wf, t(10_000), lease, 1).await;
    assert_eq!(second.len(), 1);
    assert!(second[0].took_over, "the lease expired while set");
    assert_eq!(second[0].lease.epoch, first[0].lease.epoch + 1);
    // Given back (a run waiting on a timer): acquired again, it is no takeover.
    store.release(&second[0].lease, t(10_001), 0).await.unwrap();
    let third = acquire(store, &wf, t(10_001), lease, 1).await;
    assert_eq!(third.len(), 1);
    assert!(
        !third[0].took_over,
        "a released run is resumed, not taken over"
    );
    // A failed try gives it back too.
    let cause = Error::fatal("the database refused a value");
    match store
        .record_failure(&third[0].lease, &cause, t(10_002))
        .await
        .unwrap()
    {
        FailureOutcome::Retrying { at, .. } => {
            let fourth = acquire(store, &wf, at, lease, 1).await;
            assert_eq!(fourth.len(), 1);
            assert!(!fourth[0].took_over, "after a failed try");
            // So does a block.
            let due = store
                .block(&fourth[0].lease, &Error::fatal("diverged"), at)
                .await
                .unwrap();
            let fifth = acquire(store, &wf, due, lease, 1).await;
            assert_eq!(fifth.len(), 1);
            assert!(!fifth[0].took_over, "after a block");
            store
                .append(
                    &fifth[0].lease,
                    &ap(Vec::new(), Some(RunOutcome::Completed(json!(1)))),
                )
                .await
                .unwrap();
        }
        FailureOutcome::Failed => panic!("one failed try does not fail the run"),
    }
    assert_eq!(
        store.get_run(&id).await.unwrap().unwrap().status,
        RunStatus::Completed
    );

    // Leased at admission, then abandoned: its lease expires while set.
    let (admission, leased) = store
        .create_run_leased(traced("taken", 20_000, None), Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(admission, Admission::Admitted);
    if leased.is_some() {
        assert!(acquire(store, &wf, t(20_050), lease, 1).await.is_empty());
        let got = acquire(store, &wf, t(20_100), lease, 1).await;
        assert_eq!(got.len(), 1);
        assert!(
            got[0].took_over,
            "a lease given at admission expired while set"
        );
    }

    // A queued run begins (its first lease): no takeover; abandoned, it is taken over.
    declare(store, "tq", Some(1), None).await;
    let mut queued = traced("taken", 30_000, None);
    queued.queue = Some(QueueEntry::new("tq"));
    store.create_run(queued).await.unwrap();
    let begun = acquire(store, &wf, t(30_000), Duration::from_millis(100), 1).await;
    assert_eq!(begun.len(), 1);
    assert!(!begun[0].took_over, "a queued run's begin");
    let again = acquire(store, &wf, t(30_100), lease, 1).await;
    assert_eq!(again.len(), 1);
    assert!(again[0].took_over, "a begun queued run whose lease expired");
}

/// A run keeps its trace context, as given, through every admission (plain, leased at
/// admission, with a token, queued and begun at admission, a child, with a history, several
/// at once) and every read (`get_run`, `acquire`, `list_runs`); a run started in no trace has
/// none.
pub async fn a_run_keeps_its_trace_context<S: Store>(store: &S) {
    let lease = Duration::from_secs(60);
    let mut admitted: Vec<(RunId, Option<TraceContext>)> = Vec::new();

    let plain = traced("traced", 0, Some(&context(1)));
    admitted.push((plain.id, plain.trace_context.clone()));
    store.create_run(plain).await.unwrap();
    let none = traced("traced", 1, None);
    admitted.push((none.id, None));
    store.create_run(none).await.unwrap();

    let leased = traced("traced", 2, Some(&context(2)));
    admitted.push((leased.id, leased.trace_context.clone()));
    store.create_run_leased(leased, lease).await.unwrap();

    let mut hooked = traced("traced", 3, Some(&context(3)));
    hooked.hook = start_hook("traced-token", None);
    admitted.push((hooked.id, hooked.trace_context.clone()));
    assert_eq!(store.create_run(hooked).await.unwrap(), Admission::Admitted);
    let mut hooked_leased = traced("traced", 4, Some(&context(4)));
    hooked_leased.hook = start_hook("traced-token-2", None);
    admitted.push((hooked_leased.id, hooked_leased.trace_context.clone()));
    store.create_run_leased(hooked_leased, lease).await.unwrap();

    declare(store, "traced-q", Some(5), None).await;
    let mut queued = traced("traced", 5, Some(&context(5)));
    queued.queue = Some(QueueEntry::new("traced-q"));
    admitted.push((queued.id, queued.trace_context.clone()));
    store.create_run_leased(queued, lease).await.unwrap();
    let mut waiting = traced("traced", 6, Some(&context(6)));
    waiting.queue = Some(QueueEntry::new("traced-q"));
    admitted.push((waiting.id, waiting.trace_context.clone()));
    store.create_run(waiting).await.unwrap();

    let forked = traced("traced", 7, Some(&context(7)));
    admitted.push((forked.id, forked.trace_context.clone()));
    store
        .create_run_with_history(forked, &[step_done(t(8), 1)])
        .await
        .unwrap();

    // Several admissions at once (a store may write them in one statement).
    let many: Vec<NewRun> = (0..8)
        .map(|i| traced("traced", 8 + i, Some(&context(8 + i as u8))))
        .collect();
    admitted.extend(many.iter().map(|r| (r.id, r.trace_context.clone())));
    let results = futures::future::join_all(many.into_iter().map(|r| store.create_run(r))).await;
    assert!(results
        .into_iter()
        .all(|r| r.unwrap() == Admission::Admitted));

    // A child, admitted by its parent's lease.
    let parent_id = create(store, "orders", t(20)).await;
    let parent = lease_one(store, parent_id, t(20)).await;
    let mut child = child_of(&parent, "c1", t(21), false);
    child.trace_context = Some(context(40));
    admitted.push((child.id, child.trace_context.clone()));
    assert_eq!(
        store.start_child(&parent, "c1", child).await.unwrap(),
        Admission::Admitted
    );

    for (id, trace) in &admitted {
        let run = store.get_run(id).await.unwrap().unwrap();
        assert_eq!(&run.trace_context, trace, "get_run of {id}");
    }
    let listed = store.list_runs(&RunFilter::new().limit(100)).await.unwrap();
    for (id, trace) in &admitted {
        let run = listed
            .iter()
            .find(|r| r.id == *id)
            .unwrap_or_else(|| panic!("run {id} is listed"));
        assert_eq!(&run.trace_context, trace, "list_runs of {id}");
    }
    let handed: Vec<LeasedRun> = acquire(
        store,
        &names(&["traced", "child"]),
        t(60_000 * 10),
        lease,
        100,
    )
    .await;
    assert!(!handed.is_empty());
    for got in &handed {
        let want = admitted
            .iter()
            .find(|(id, _)| *id == got.run.id)
            .map(|(_, trace)| trace.clone())
            .unwrap_or_else(|| panic!("acquire handed out an unknown run {}", got.run.id));
        assert_eq!(got.run.trace_context, want, "acquire of {}", got.run.id);
    }
}
