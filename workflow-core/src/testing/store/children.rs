//! The children part of the runs contract ([`RunStore::start_child`] and what a run's end and
//! cancellation do to its family): a child admitted with its record in the parent's history,
//! its end reaching the parent's inbox, and a cancellation reaching down the tree.
//!
//! [`RunStore::start_child`]: crate::store::RunStore::start_child

use std::time::{Duration, SystemTime};

use serde_json::json;

use super::support::{acquire, ap, create, names, step_done, t};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::*;

/// The child's end an inbox entry holds; anything else fails the case.
fn notice_of(entry: &InboxEntry) -> ChildNotice {
    match &entry.what {
        Inbound::ChildEnded(notice) => notice.clone(),
        other => panic!("inbox entry {}: not a child's end: {other:?}", entry.id),
    }
}

/// A child of `parent` (leased) at `at`, under key `key`.
pub(super) fn child_of(parent: &Lease, key: &str, at: SystemTime, detached: bool) -> NewRun {
    let _ = key;
    NewRun::new(RunId::new(), "child", json!([key]), at).parent(Some(ParentLink {
        run: parent.run_id,
        detached,
    }))
}

/// `start_child` admits the child and records `ChildStarted` in one act, fenced by the
/// parent's lease; a token taken elsewhere is recorded as the conflict and admits nothing;
/// the child's end, by its own append or a cancellation, puts an [`Inbound::ChildEnded`] into
/// the parent's inbox and makes the parent due; the delivery takes the notice out again.
pub async fn a_child_is_started_with_its_record_and_its_end_reaches_the_parent<S: Store>(
    store: &S,
) {
    let parent_id = create(store, "parent", t(0)).await;
    let parent = acquire(store, &names(&["parent"]), t(1), Duration::from_secs(60), 1)
        .await
        .remove(0)
        .lease;
    let child = child_of(&parent, "ch_0", t(2), false);
    let child_id = child.id;
    assert_eq!(
        store.start_child(&parent, "ch_0", child).await.unwrap(),
        Admission::Admitted
    );
    let record = store.get_run(&child_id).await.unwrap().unwrap();
    assert_eq!(record.parent, Some(parent_id));
    assert_eq!(record.status, RunStatus::Pending);
    assert_eq!(
        store.events(&parent_id).await.unwrap(),
        vec![EventRecord {
            seq: 1,
            at: t(2),
            event: Event::ChildStarted {
                refused: None,
                child_key: "ch_0".into(),
                child_id,
                workflow: "child".into(),
                conflict: None,
            },
        }]
    );
    let listed = store
        .list_runs(&RunFilter::new().parent(parent_id))
        .await
        .unwrap();
    assert_eq!(listed.iter().map(|r| r.id).collect::<Vec<_>>(), [child_id]);

    // A token owned by another run: the decision is recorded, no child is admitted.
    let owner = RunId::new();
    store
        .create_run(
            NewRun::new(owner, "other", json!([]), t(3)).hook(Some(StartHook {
                token: "taken".into(),
                retain_until: None,
            })),
        )
        .await
        .unwrap();
    let mut contested = child_of(&parent, "ch_1", t(4), false);
    contested.hook = Some(StartHook {
        token: "taken".into(),
        retain_until: None,
    });
    let contested_id = contested.id;
    assert_eq!(
        store.start_child(&parent, "ch_1", contested).await.unwrap(),
        Admission::Conflict(owner)
    );
    assert!(store.get_run(&contested_id).await.unwrap().is_none());
    let last = store.events(&parent_id).await.unwrap().pop().unwrap();
    assert!(
        matches!(&last.event, Event::ChildStarted { conflict: Some(o), .. } if *o == owner),
        "{last:?}"
    );

    // The parent is given back to sleep; the child completes.
    store.release(&parent, never(), 0).await.unwrap();
    let leased = acquire(store, &names(&["child"]), t(5), Duration::from_secs(60), 1)
        .await
        .remove(0);
    assert_eq!(leased.run.id, child_id);
    assert_eq!(leased.run.parent, Some(parent_id));
    store
        .append(
            &leased.lease,
            &ap(
                vec![NewEvent {
                    at: t(6),
                    event: Event::RunCompleted { output: json!(42) },
                }],
                Some(RunOutcome::Completed(json!(42))),
            ),
        )
        .await
        .unwrap();
    let inbox = store.payloads(&parent_id, 0).await.unwrap();
    assert_eq!(inbox.len(), 1, "{inbox:?}");
    let notice = notice_of(&inbox[0]);
    assert_eq!(
        notice,
        ChildNotice {
            child: child_id,
            status: RunStatus::Completed,
            output: Some(json!(42)),
            error: None,
        }
    );
    assert_eq!(notice.result(), Ok(json!(42)));
    // The sleeping parent is due at the child's end.
    let woken = acquire(store, &names(&["parent"]), t(6), Duration::from_secs(60), 1).await;
    assert_eq!(woken.len(), 1, "the parent is due when its child ends");
    let parent = woken[0].lease.clone();
    store
        .append(
            &parent,
            &ap(
                vec![NewEvent {
                    at: t(7),
                    event: Event::ChildEnded {
                        child_id,
                        payload_id: inbox[0].id,
                        result: Ok(json!(42)),
                    },
                }],
                None,
            ),
        )
        .await
        .unwrap();
    assert!(store.payloads(&parent_id, 0).await.unwrap().is_empty());

    // A second child, cancelled: its parent hears of that too.
    let second = child_of(&parent, "ch_2", t(8), false);
    let second_id = second.id;
    store.start_child(&parent, "ch_2", second).await.unwrap();
    assert_eq!(
        store.cancel(&second_id, t(9)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let inbox = store.payloads(&parent_id, 0).await.unwrap();
    let notice = notice_of(&inbox[0]);
    assert_eq!(notice.child, second_id);
    assert_eq!(notice.status, RunStatus::Cancelled);
    assert!(notice.result().unwrap_err().is_cancelled());

    // A stale lease starts nothing.
    let stale = Lease {
        run_id: parent_id,
        epoch: parent.epoch + 7,
    };
    let refused = child_of(&stale, "ch_3", t(10), false);
    let refused_id = refused.id;
    assert!(matches!(
        store.start_child(&stale, "ch_3", refused).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(store.get_run(&refused_id).await.unwrap().is_none());
}

/// Cancelling a run cancels its unfinished children that are not detached, and theirs, in
/// one act; ended and detached children are left as they are.
pub async fn cancelling_a_parent_cancels_its_attached_children_down_the_tree<S: Store>(store: &S) {
    let wf = names(&["parent", "child"]);
    let root = create(store, "parent", t(0)).await;
    let root_lease = acquire(store, &wf, t(1), Duration::from_secs(60), 1)
        .await
        .remove(0)
        .lease;
    let attached = child_of(&root_lease, "ch_0", t(2), false);
    let detached = child_of(&root_lease, "ch_1", t(2), true);
    let done = child_of(&root_lease, "ch_2", t(2), false);
    let (attached_id, detached_id, done_id) = (attached.id, detached.id, done.id);
    for (key, child) in [("ch_0", attached), ("ch_1", detached), ("ch_2", done)] {
        store.start_child(&root_lease, key, child).await.unwrap();
    }
    // `done` ends before the cancel; `attached` has a child of its own.
    let leased = acquire(store, &wf, t(3), Duration::from_secs(60), 10).await;
    let lease_of = |id: RunId| {
        leased
            .iter()
            .find(|r| r.run.id == id)
            .map(|r| r.lease.clone())
            .unwrap()
    };
    store
        .append(
            &lease_of(done_id),
            &ap(
                vec![NewEvent {
                    at: t(4),
                    event: Event::RunCompleted { output: json!(1) },
                }],
                Some(RunOutcome::Completed(json!(1))),
            ),
        )
        .await
        .unwrap();
    let grandchild = child_of(&lease_of(attached_id), "ch_0", t(5), false);
    let grandchild_id = grandchild.id;
    store
        .start_child(&lease_of(attached_id), "ch_0", grandchild)
        .await
        .unwrap();

    assert_eq!(
        store.cancel(&root, t(6)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    for id in [attached_id, grandchild_id] {
        let run = store.get_run(&id).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Cancelled, "{id}");
        assert!(run.error.unwrap().is_cancelled());
        assert_eq!(
            store.events(&id).await.unwrap().last().unwrap().event,
            Event::RunCancelled
        );
    }
    let status = |id| async move { store.get_run(&id).await.unwrap().unwrap().status };
    assert_eq!(status(done_id).await, RunStatus::Completed);
    assert_eq!(status(detached_id).await, RunStatus::Running);
    // The cancelled child's worker is fenced off.
    assert!(matches!(
        store
            .append(&lease_of(attached_id), &ap(vec![step_done(t(7), 1)], None))
            .await,
        Err(StoreError::LeaseLost(_))
    ));
}

/// A run's end writes the same whatever its writer's [`EndHint`] says, a wrong hint
/// included: a child's end reaches its parent's inbox and gives up the hooks the child holds;
/// a run's start token is given up.
pub async fn an_end_writes_the_same_whatever_its_hint<S: Store>(store: &S) {
    let lease_for = Duration::from_secs(60);
    let hints = [
        EndHint::Unknown,
        EndHint::Alone,
        EndHint::NoParent,
        EndHint::Child,
    ];
    for (i, hint) in hints.into_iter().enumerate() {
        let at = |ms: u64| t(100 * i as u64 + ms);
        let (p, c, s) = (format!("p{i}"), format!("c{i}"), format!("s{i}"));
        let parent_id = create(store, &p, at(0)).await;
        let parent = acquire(store, &names(&[&p]), at(1), lease_for, 1)
            .await
            .remove(0)
            .lease;
        let mut child = child_of(&parent, "ch_0", at(2), false);
        child.workflow = c.clone();
        let child_id = child.id;
        store.start_child(&parent, "ch_0", child).await.unwrap();
        store.release(&parent, never(), 0).await.unwrap();
        let leased = acquire(store, &names(&[&c]), at(3), lease_for, 1)
            .await
            .remove(0);
        let token = format!("held-{i}");
        assert_eq!(
            store
                .claim_hook(&leased.lease, "hk_0", &token, at(4))
                .await
                .unwrap(),
            ClaimOutcome::Claimed
        );
        let end = |output: u64, at: SystemTime| Append {
            events: vec![NewEvent {
                at,
                event: Event::RunCompleted {
                    output: json!(output),
                },
            }],
            outcome: Some(RunOutcome::Completed(json!(output))),
            end_hint: hint,
            ..Append::default()
        };
        store.append(&leased.lease, &end(1, at(5))).await.unwrap();
        let inbox = store.payloads(&parent_id, 0).await.unwrap();
        assert_eq!(inbox.len(), 1, "{hint:?}: {inbox:?}");
        let notice = notice_of(&inbox[0]);
        assert_eq!(notice.child, child_id, "{hint:?}");
        assert_eq!(notice.result(), Ok(json!(1)), "{hint:?}");
        assert_eq!(store.get_hook(&token).await.unwrap(), None, "{hint:?}");

        // A run with a start token and no parent.
        let started = RunId::new();
        store
            .create_run(
                NewRun::new(started, s.clone(), json!([]), at(6)).hook(Some(StartHook {
                    token: format!("start-{i}"),
                    retain_until: None,
                })),
            )
            .await
            .unwrap();
        let leased = acquire(store, &names(&[&s]), at(7), lease_for, 1)
            .await
            .remove(0);
        store.append(&leased.lease, &end(2, at(8))).await.unwrap();
        let record = store.get_run(&started).await.unwrap().unwrap();
        assert_eq!(record.status, RunStatus::Completed, "{hint:?}");
        assert_eq!(
            store.get_hook(&format!("start-{i}")).await.unwrap(),
            None,
            "{hint:?}"
        );
        // A stale lease writes nothing, whatever the hint.
        assert!(matches!(
            store.append(&leased.lease, &end(3, at(9))).await,
            Err(StoreError::LeaseLost(_))
        ));
    }
}
