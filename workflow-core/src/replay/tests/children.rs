//! Child runs: starts decided by the store and replayed, and child ends recorded when
//! awaited.

use super::*;

fn start_child(child_key: &str, workflow: &'static str) -> Command<()> {
    Command::StartChild(ChildCall {
        queue: None,
        child_key: child_key.into(),
        workflow,
        child_id: RunId::new(),
        input: json!([]),
        hook: None,
        timeout: None,
        detached: false,
    })
}

fn child_notice(id: u64, child: RunId, output: Value) -> InboxEntry {
    InboxEntry {
        id,
        what: Inbound::ChildEnded(ChildNotice {
            child,
            status: RunStatus::Completed,
            output: Some(output),
            error: None,
        }),
    }
}

#[test]
fn a_new_child_start_asks_the_store_and_records_nothing_itself() {
    let mut r = History::default().replay();
    r.issue([start_child("ch_0", "ship")], t(1)).unwrap();
    assert!(r.take_writes().is_empty());
    assert_eq!(
        effects(&mut r),
        [Effect::StartChild {
            child_key: "ch_0".into()
        }]
    );
    assert_eq!(r.child("ch_0".into()).map(|c| c.workflow), Some("ship"));
    let child = RunId::new();
    r.child_started("ch_0".into(), child, None, t(2));
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildStarted {
            refused: None,
            child_key: "ch_0".into(),
            child_id: child,
            conflict: None
        }]
    );
    assert!(r.child("ch_0".into()).is_none());
}

#[test]
fn a_recorded_child_is_replayed_and_never_started_again() {
    let child = RunId::new();
    let mut r = History::default()
        .at(
            1,
            Event::ChildStarted {
                refused: None,
                child_key: "ch_0".into(),
                child_id: child,
                workflow: "ship".into(),
                conflict: None,
            },
        )
        .at(
            5,
            Event::ChildEnded {
                child_id: child,
                payload_id: 9,
                result: Ok(json!("parcel")),
            },
        )
        .replay();
    r.issue([start_child("ch_0", "ship")], t(10)).unwrap();
    assert!(effects(&mut r).is_empty());
    assert_eq!(
        r.next_delivery().unwrap().unwrap().what,
        Delivered::ChildStarted {
            refused: None,
            child_key: "ch_0".into(),
            child_id: child,
            conflict: None
        }
    );
    r.issue([Command::AwaitChild { child_id: child }], t(10))
        .unwrap();
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildEnded {
            child_id: child,
            result: Ok(json!("parcel"))
        }]
    );
    // Its notice, still read from the inbox, is not delivered a second time.
    r.add_inbox([child_notice(9, child, json!("parcel"))]);
    assert!(!r.deliver_child_end(t(11)));
    assert!(r.take_writes().is_empty());
}

#[test]
fn another_child_workflow_diverges() {
    let mut r = History::default()
        .at(
            1,
            Event::ChildStarted {
                refused: None,
                child_key: "ch_0".into(),
                child_id: RunId::new(),
                workflow: "ship".into(),
                conflict: None,
            },
        )
        .replay();
    let d = divergence(&mut r, vec![start_child("ch_0", "refund")]);
    assert_eq!(d.kind, DivergenceKind::Command);
    assert!(
        d.expected.contains("ship") && d.found.contains("refund"),
        "{d}"
    );
}

#[test]
fn a_child_end_is_recorded_when_awaited_not_when_read() {
    let child = RunId::new();
    let mut r = History::default()
        .at(
            1,
            Event::ChildStarted {
                refused: None,
                child_key: "ch_0".into(),
                child_id: child,
                workflow: "ship".into(),
                conflict: None,
            },
        )
        .replay();
    r.issue([start_child("ch_0", "ship")], t(2)).unwrap();
    deliveries(&mut r);
    // Read before the workflow awaits it: kept, not recorded.
    r.add_inbox([child_notice(4, child, json!(7))]);
    assert!(!r.deliver_child_end(t(3)));
    assert!(r.take_writes().is_empty());
    // Awaited: recorded with its inbox id, then delivered.
    r.issue([Command::AwaitChild { child_id: child }], t(5))
        .unwrap();
    assert!(r.is_idle(), "a parent waiting for its child may be evicted");
    assert!(r.deliver_child_end(t(6)));
    let w = r.take_writes();
    assert_eq!(
        w.events[0].event,
        Event::ChildEnded {
            child_id: child,
            payload_id: 4,
            result: Ok(json!(7))
        }
    );
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildEnded {
            child_id: child,
            result: Ok(json!(7))
        }]
    );
    assert!(!r.deliver_child_end(t(7)));
}

#[test]
fn a_child_notice_is_not_a_hook_payload() {
    let child = RunId::new();
    let mut r = History::default().registered(1, "hk_0", "x", None).replay();
    r.issue([hook("hk_0", "x")], t(2)).unwrap();
    deliveries(&mut r);
    r.add_inbox([child_notice(3, child, json!(1))]);
    assert!(!r.deliver_payload(|_| true, t(4)));
}

#[test]
fn a_shared_child_end_read_from_its_record_is_recorded_when_awaited() {
    let (child, recorded) = (RunId::new(), RunId::new());
    let started = |child_key: &str, child_id| Event::ChildStarted {
        refused: None,
        child_key: child_key.into(),
        child_id,
        workflow: "ship".into(),
        conflict: None,
    };
    // A fork's history: two children of its original, the second one's end recorded.
    let mut r = History::default()
        .at(1, started("ch_0", child))
        .at(2, started("ch_1", recorded))
        .at(
            3,
            Event::ChildEnded {
                child_id: recorded,
                payload_id: 9,
                result: Ok(json!(2)),
            },
        )
        .replay();
    r.issue(
        [start_child("ch_0", "ship"), start_child("ch_1", "ship")],
        t(4),
    )
    .unwrap();
    // The two starts, one at a time (the workflow awaits the ends after both).
    for _ in 0..2 {
        assert!(matches!(
            r.next_delivery().unwrap().unwrap().what,
            Delivered::ChildStarted { .. }
        ));
    }
    assert!(r.unread_child_ends().is_empty(), "nothing awaited yet");
    r.issue(
        [
            Command::AwaitChild { child_id: child },
            Command::AwaitChild { child_id: recorded },
        ],
        t(5),
    )
    .unwrap();
    // The recorded end comes from the history; the other one is for the driver to read.
    assert_eq!(r.unread_child_ends(), [child]);
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildEnded {
            child_id: recorded,
            result: Ok(json!(2))
        }]
    );
    r.child_end_read(child, Ok(json!(1)));
    assert!(r.unread_child_ends().is_empty());
    assert!(r.deliver_child_end(t(6)));
    assert_eq!(
        r.take_writes().events[0].event,
        Event::ChildEnded {
            child_id: child,
            payload_id: 0,
            result: Ok(json!(1))
        }
    );
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildEnded {
            child_id: child,
            result: Ok(json!(1))
        }]
    );
}
