//! Messages from the inbox: delivered (and recorded) only while a `recv` of their topic
//! wants one, in inbox order per topic; recorded deliveries replayed in history order and
//! never delivered again.

use super::*;

fn message(id: u64, topic: &str, payload: Value) -> InboxEntry {
    InboxEntry {
        id,
        what: Inbound::Message {
            topic: topic.into(),
            payload,
        },
    }
}

#[test]
fn a_message_is_delivered_only_when_its_topic_is_wanted() {
    let mut r = History::default().replay();
    r.add_inbox([
        message(3, "a", json!(1)),
        message(4, "b", json!(2)),
        message(5, "a", json!(3)),
    ]);
    assert_eq!(r.inbox_seen(), 5);
    assert!(!r.deliver_message(|_| false, t(1)));
    assert!(
        r.take_writes().is_empty(),
        "nothing wanted, nothing recorded"
    );

    assert!(r.deliver_message(|topic| topic == "a", t(2)));
    let writes = r.take_writes();
    assert_eq!(
        writes.events.iter().map(|e| &e.event).collect::<Vec<_>>(),
        [&Event::MessageReceived {
            topic: "a".into(),
            payload_id: 3,
            payload: json!(1)
        }]
    );
    assert_eq!(
        deliveries(&mut r),
        [Delivered::Message {
            topic: "a".into(),
            payload: json!(1)
        }]
    );
    assert_eq!(r.waiting_messages(), [(4, "b"), (5, "a")]);
    assert!(r.deliver_message(|topic| topic == "a", t(3)));
    assert_eq!(r.waiting_messages(), [(4, "b")]);
}

#[test]
fn a_recorded_message_is_replayed_and_not_delivered_again() {
    let mut r = History::default()
        .at(
            4,
            Event::MessageReceived {
                topic: "a".into(),
                payload_id: 3,
                payload: json!(1),
            },
        )
        .replay();
    r.add_inbox([message(3, "a", json!(1)), message(6, "a", json!(2))]);
    assert_eq!(
        deliveries(&mut r),
        [Delivered::Message {
            topic: "a".into(),
            payload: json!(1)
        }]
    );
    assert_eq!(r.waiting_messages(), [(6, "a")]);
    assert!(r.deliver_message(|_| true, t(9)));
    assert_eq!(
        deliveries(&mut r),
        [Delivered::Message {
            topic: "a".into(),
            payload: json!(2)
        }]
    );
}
