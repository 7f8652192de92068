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

fn topic(name: &str) -> Mailbox {
    Mailbox::Topic(name.into())
}

fn request(id: u64, name: &str, payload: Value) -> InboxEntry {
    InboxEntry {
        id,
        what: Inbound::Request {
            name: name.into(),
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

    assert!(r.deliver_message(|m| *m == topic("a"), t(2)));
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
            mailbox: topic("a"),
            id: 3,
            payload: json!(1)
        }]
    );
    assert_eq!(r.waiting_messages(), [(4, &topic("b")), (5, &topic("a"))]);
    assert!(r.deliver_message(|m| *m == topic("a"), t(3)));
    assert_eq!(r.waiting_messages(), [(4, &topic("b"))]);
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
            mailbox: topic("a"),
            id: 3,
            payload: json!(1)
        }]
    );
    assert_eq!(r.waiting_messages(), [(6, &topic("a"))]);
    assert!(r.deliver_message(|_| true, t(9)));
    assert_eq!(
        deliveries(&mut r),
        [Delivered::Message {
            mailbox: topic("a"),
            id: 6,
            payload: json!(2)
        }]
    );
}

/// A request and a message of the same name wait in different mailboxes; a request's
/// delivery is recorded as `RequestReceived`, its reply once, also when the workflow replies
/// again on replay.
#[test]
fn requests_have_their_own_mailbox_and_one_recorded_reply() {
    let mut r = History::default().replay();
    r.add_inbox([
        message(3, "review", json!(1)),
        request(4, "review", json!(2)),
    ]);
    let wanted = Mailbox::Requests("review".into());
    assert!(r.deliver_message(|m| *m == wanted, t(2)));
    let writes = r.take_writes();
    assert_eq!(
        writes.events.iter().map(|e| &e.event).collect::<Vec<_>>(),
        [&Event::RequestReceived {
            name: "review".into(),
            payload_id: 4,
            payload: json!(2)
        }]
    );
    assert_eq!(r.waiting_messages(), [(3, &topic("review"))]);
    let reply = |v: Value| Command::Reply {
        request_id: 4,
        name: "review".into(),
        reply: Ok(v),
    };
    r.issue([reply(json!("yes"))], t(3)).unwrap();
    let writes = r.take_writes();
    assert_eq!(
        writes.events.iter().map(|e| &e.event).collect::<Vec<_>>(),
        [&Event::RequestReplied {
            request_id: 4,
            name: "review".into(),
            reply: Ok(json!("yes"))
        }]
    );

    // Replayed: the delivery comes from the history, the reply is not recorded again.
    let mut r = History::default()
        .at(
            2,
            Event::RequestReceived {
                name: "review".into(),
                payload_id: 4,
                payload: json!(2),
            },
        )
        .at(
            3,
            Event::RequestReplied {
                request_id: 4,
                name: "review".into(),
                reply: Ok(json!("yes")),
            },
        )
        .replay();
    r.add_inbox([request(4, "review", json!(2))]);
    assert_eq!(
        deliveries(&mut r),
        [Delivered::Message {
            mailbox: wanted.clone(),
            id: 4,
            payload: json!(2)
        }]
    );
    assert!(r.waiting_messages().is_empty());
    r.issue([reply(json!("yes"))], t(9)).unwrap();
    assert!(r.take_writes().events.is_empty());
}
