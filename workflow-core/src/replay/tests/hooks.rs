//! Hooks and payloads: registrations decided by the store, releases, and payloads from the
//! inbox delivered once, in order, to the hook that owns their token.

use super::*;

#[test]
fn a_new_hook_registration_asks_for_a_claim_and_records_nothing_itself() {
    let mut r = History::default().replay();
    r.issue([hook("hk_0", "order:1")], t(0)).unwrap();
    assert!(r.take_writes().is_empty(), "the store records the claim");
    assert_eq!(
        effects(&mut r),
        [Effect::Claim {
            hook_key: "hk_0".into(),
            token: "order:1".into()
        }]
    );
}

#[test]
fn a_claim_decision_is_delivered() {
    let owner = RunId::new();
    let mut r = History::default().replay();
    r.issue([hook("hk_0", "order:1")], t(0)).unwrap();
    effects(&mut r);
    assert!(!r.is_idle() || r.next_effect().is_none());
    r.claimed("hk_0".into(), "order:1".into(), Some(owner), t(3));
    let d = r.next_delivery().unwrap().unwrap();
    assert_eq!(d.at, t(3));
    assert_eq!(
        d.what,
        Delivered::Registration {
            hook_key: "hk_0".into(),
            token: "order:1".into(),
            conflict: Some(owner)
        }
    );
}

#[test]
fn a_recorded_registration_is_replayed_without_claiming_again() {
    let owner = RunId::new();
    let mut r = History::default()
        .registered(1, "hk_0", "order:1", Some(owner))
        .replay();
    r.issue([hook("hk_0", "order:1")], t(9)).unwrap();
    assert!(effects(&mut r).is_empty());
    assert_eq!(
        deliveries(&mut r),
        [Delivered::Registration {
            hook_key: "hk_0".into(),
            token: "order:1".into(),
            conflict: Some(owner)
        }]
    );
}

#[test]
fn a_release_is_recorded_once() {
    let mut r = History::default().replay();
    r.issue(
        [release("hk_0", "order:1"), release("hk_0", "order:1")],
        t(0),
    )
    .unwrap();
    let w = r.take_writes();
    assert_eq!(kinds(&w), ["hook_released"]);
    assert_eq!(w.releases, ["order:1"]);
}

#[test]
fn a_recorded_release_is_not_written_again() {
    let mut r = History::default()
        .registered(1, "hk_0", "order:1", None)
        .at(
            2,
            Event::HookReleased {
                hook_key: "hk_0".into(),
                token: "order:1".into(),
            },
        )
        .replay();
    r.issue([hook("hk_0", "order:1"), release("hk_0", "order:1")], t(5))
        .unwrap();
    assert!(r.take_writes().is_empty());
}

#[test]
fn recorded_payloads_are_replayed_in_order_and_not_delivered_twice() {
    let mut r = History::default()
        .registered(1, "hk_0", "tok", None)
        .received(2, "tok", 7, json!("first"))
        .received(3, "tok", 9, json!("second"))
        .replay();
    r.add_inbox([
        payload(7, "tok", json!("first")),
        payload(9, "tok", json!("second")),
        payload(12, "tok", json!("third")),
    ]);
    assert_eq!(r.inbox_seen(), 12);
    r.issue([hook("hk_0", "tok")], t(50)).unwrap();
    let payloads = |id: u64, v: &str| Delivered::Payload {
        token: "tok".into(),
        id,
        payload: json!(v),
    };
    assert_eq!(
        deliveries(&mut r)[1..],
        [payloads(7, "first"), payloads(9, "second")]
    );
    assert!(r.deliver_payload(|_| true, t(60)));
    assert_eq!(kinds(&r.take_writes()), ["hook_received"]);
    assert_eq!(
        r.next_delivery().unwrap().unwrap().what,
        payloads(12, "third")
    );
    assert!(!r.deliver_payload(|_| true, t(61)), "each payload once");
}

#[test]
fn a_payload_waits_until_a_hook_owns_its_token() {
    let mut r = History::default().replay();
    r.add_inbox([payload(1, "a", json!(1)), payload(2, "b", json!(2))]);
    assert!(r.deliver_payload(|t| t == "b", t(1)));
    assert_eq!(
        r.next_delivery().unwrap().unwrap().what,
        Delivered::Payload {
            token: "b".into(),
            id: 2,
            payload: json!(2)
        }
    );
    assert!(!r.deliver_payload(|t| t == "b", t(2)), "`a` waits");
    assert!(r.deliver_payload(|_| true, t(3)));
    match &r.take_writes().events[1].event {
        Event::HookReceived { payload_id, .. } => assert_eq!(*payload_id, 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn payloads_for_one_token_go_out_in_inbox_order() {
    let mut r = History::default().replay();
    r.add_inbox((1..=3).map(|id| payload(id, "t", json!(id))));
    let mut got = Vec::new();
    while r.deliver_payload(|_| true, t(0)) {
        if let Delivered::Payload { payload, .. } = r.next_delivery().unwrap().unwrap().what {
            got.push(payload);
        }
    }
    assert_eq!(got, [json!(1), json!(2), json!(3)]);
}

#[test]
fn the_hooks_a_run_holds_are_those_it_claimed_and_did_not_release() {
    let owner = RunId::new();
    // A lost claim holds nothing; a recorded claim holds until its release.
    let mut r = History::default()
        .registered(1, "hk_0", "lost", Some(owner))
        .replay();
    assert!(!r.holds_hooks());
    r.claimed("hk_1".into(), "won".into(), None, t(2));
    assert!(r.holds_hooks(), "a live claim that won");
    r.issue([release("hk_1", "won")], t(3)).unwrap();
    assert!(!r.holds_hooks(), "released");

    let mut r = History::default()
        .registered(1, "hk_0", "order:1", None)
        .replay();
    assert!(r.holds_hooks(), "a recorded claim that won");
    let r2 = History::default()
        .registered(1, "hk_0", "order:1", None)
        .at(
            2,
            Event::HookReleased {
                hook_key: "hk_0".into(),
                token: "order:1".into(),
            },
        )
        .replay();
    assert!(!r2.holds_hooks(), "a recorded release");
    r.issue([release("hk_0", "order:1")], t(5)).unwrap();
    assert!(!r.holds_hooks());
}
