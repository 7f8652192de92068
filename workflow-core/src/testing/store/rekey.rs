//! The rekey contract ([`RekeyStore`](crate::store::RekeyStore)): every row holding the
//! envelope marker is read once, page by page, in every table, and nothing else is; a
//! replacement writes only while the row holds what was read, and a stale one writes nothing.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::messages::message;
use super::requests::{queued, received, replied, request};
use super::support::{ap, create, lease_one, t};
use crate::ids::RunId;
use crate::store::*;

/// A stand-in for a sealed payload: the store sees only JSON holding the marker.
fn sealed(n: u32) -> Value {
    json!({"$wf_sealed": 1, "key": "old", "nonce": "n", "data": format!("d{n}")})
}

/// Every row of `table`, read in pages of `page` (runs: `page` runs per page).
async fn read_all<S: Store>(store: &S, table: PayloadTable, page: usize) -> Vec<SealedRow> {
    let mut all: Vec<SealedRow> = Vec::new();
    loop {
        let after = all.last().map(|r| r.at.clone());
        let rows = store
            .sealed_rows(table, after.as_ref(), page)
            .await
            .unwrap();
        let n = match table {
            PayloadTable::Runs => rows
                .iter()
                .map(|r| r.at.run())
                .collect::<BTreeSet<_>>()
                .len(),
            _ => rows.len(),
        };
        assert!(
            n <= page,
            "{table:?}: a page of {n} over the limit of {page}"
        );
        all.extend(rows);
        if n < page {
            return all;
        }
    }
}

/// A run with a sealed input, events, a published value, a chunk, an undelivered message, a
/// request delivered and replied to under the marker (and one in plain text) and a sealed
/// end; another with nothing sealed. Every table is paged through in pages of one
/// and of many with the same rows, each once; a replacement is read back by the ordinary
/// calls, and the same replacement again (its `stored` now stale) writes nothing.
pub async fn sealed_rows_are_paged_and_replaced_only_while_unchanged<S: Store>(store: &S) {
    let plain = create(store, "orders", t(0)).await;
    let lease = lease_one(store, plain, t(1)).await;
    store
        .append(&lease, &ap(vec![super::support::step_done(t(2), 1)], None))
        .await
        .unwrap();

    let id = RunId::new();
    store
        .create_run(NewRun::new(id, "orders".to_owned(), sealed(1), t(3)))
        .await
        .unwrap();
    let lease = lease_one(store, id, t(4)).await;
    let events = vec![
        NewEvent {
            at: t(5),
            event: Event::StepCompleted {
                step_id: "s1".into(),
                result: Ok(sealed(2)),
            },
        },
        NewEvent {
            at: t(5),
            event: Event::TimerFired {
                timer_id: "t1".into(),
            },
        },
        NewEvent {
            at: t(5),
            event: Event::EventSet {
                set_id: "set_1".into(),
                key: "status".into(),
                value: sealed(3),
            },
        },
    ];
    store.append(&lease, &ap(events, None)).await.unwrap();
    store
        .append_chunk(&lease, "out", 1, sealed(4), t(6))
        .await
        .unwrap();
    store
        .append_chunk(&lease, "out", 1, json!("plain"), t(6))
        .await
        .unwrap();
    store
        .send_message(&id, message("note", sealed(5), None, 7))
        .await
        .unwrap();
    let ask = queued(store, id, request("ask", sealed(8), Some("k1"), 7)).await;
    let plain_ask = queued(store, id, request("ask", json!("plain"), Some("k2"), 7)).await;
    let answers = vec![
        received("ask", ask, sealed(8), 7),
        received("ask", plain_ask, json!("plain"), 7),
        replied("ask", ask, Ok(sealed(9)), 7),
        replied("ask", plain_ask, Err(crate::Error::fatal("plain")), 7),
    ];
    store.append(&lease, &ap(answers, None)).await.unwrap();

    for table in PayloadTable::ALL {
        let one = read_all(store, table, 1).await;
        let many = read_all(store, table, 100).await;
        assert_eq!(one, many, "{table:?}: pages of 1 and of 100 differ");
        let places: BTreeSet<_> = one.iter().map(|r| r.at.clone()).collect();
        assert_eq!(
            places.len(),
            one.len(),
            "{table:?}: a row read twice: {one:?}"
        );
        for row in &one {
            assert_eq!(row.at.table(), table);
            assert_eq!(
                row.at.run(),
                id,
                "{table:?}: only the sealed run's rows: {row:?}"
            );
            assert!(row.stored.contains("$wf_sealed"), "{row:?}");
        }
        let expected = match table {
            PayloadTable::Runs => vec![SealedAt::RunInput(id)],
            PayloadTable::Events => vec![
                SealedAt::Event { run: id, seq: 1 },
                SealedAt::Event { run: id, seq: 3 },
                SealedAt::Event { run: id, seq: 4 },
                SealedAt::Event { run: id, seq: 6 },
            ],
            PayloadTable::Chunks => vec![SealedAt::Chunk {
                run: id,
                stream: "out".into(),
                index: 0,
            }],
            PayloadTable::Published => vec![SealedAt::Published {
                run: id,
                key: "status".into(),
            }],
            PayloadTable::Inbox => one.iter().map(|r| r.at.clone()).take(1).collect(),
            PayloadTable::Replies => vec![SealedAt::Reply { run: id, id: ask }],
        };
        assert_eq!(
            one.iter().map(|r| r.at.clone()).collect::<Vec<_>>(),
            expected,
            "{table:?}"
        );
    }
    let inbox = read_all(store, PayloadTable::Inbox, 10).await;
    assert!(
        matches!(&inbox[..], [SealedRow { value: SealedValue::Inbound(Inbound::Message { topic, .. }), .. }] if topic == "note"),
        "{inbox:?}"
    );

    // Each table: replace, read back, and the stale replacement writes nothing.
    let rows: Vec<SealedRow> = {
        let mut rows = Vec::new();
        for table in PayloadTable::ALL {
            rows.extend(read_all(store, table, 10).await);
        }
        rows
    };
    for row in &rows {
        let new = match &row.value {
            SealedValue::Value(_) => SealedValue::Value(sealed(100)),
            SealedValue::Event(Event::StepCompleted { step_id, .. }) => {
                SealedValue::Event(Event::StepCompleted {
                    step_id: step_id.clone(),
                    result: Ok(sealed(100)),
                })
            }
            SealedValue::Event(Event::EventSet { set_id, key, .. }) => {
                SealedValue::Event(Event::EventSet {
                    set_id: set_id.clone(),
                    key: key.clone(),
                    value: sealed(100),
                })
            }
            SealedValue::Event(Event::RequestReceived {
                name, payload_id, ..
            }) => SealedValue::Event(Event::RequestReceived {
                name: name.clone(),
                payload_id: *payload_id,
                payload: sealed(100),
            }),
            SealedValue::Event(Event::RequestReplied {
                request_id, name, ..
            }) => SealedValue::Event(Event::RequestReplied {
                request_id: *request_id,
                name: name.clone(),
                reply: Ok(sealed(100)),
            }),
            SealedValue::Reply(_) => SealedValue::Reply(Ok(sealed(100))),
            SealedValue::Inbound(Inbound::Message { topic, .. }) => {
                SealedValue::Inbound(Inbound::Message {
                    topic: topic.clone(),
                    payload: sealed(100),
                })
            }
            other => panic!("unexpected row {other:?}"),
        };
        assert!(store.replace_sealed(row, &new).await.unwrap(), "{row:?}");
        let mut stale = new.clone();
        if let SealedValue::Value(v) = &mut stale {
            *v = sealed(200);
        }
        assert!(
            !store.replace_sealed(row, &stale).await.unwrap(),
            "a replacement of a row that changed since it was read wrote: {row:?}"
        );
        // A value of another kind is refused.
        let other = match new {
            SealedValue::Value(_) => SealedValue::Error(crate::Error::fatal("x")),
            _ => SealedValue::Value(json!(1)),
        };
        assert!(store.replace_sealed(row, &other).await.is_err(), "{row:?}");
    }

    // What the ordinary calls read now.
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.input, sealed(100));
    let events = store.events(&id).await.unwrap();
    assert!(
        matches!(&events[0].event, Event::StepCompleted { result: Ok(v), .. } if *v == sealed(100))
    );
    assert!(matches!(&events[1].event, Event::TimerFired { .. }));
    assert!(matches!(&events[2].event, Event::EventSet { value, .. } if *value == sealed(100)));
    assert!(
        matches!(&events[3].event, Event::RequestReceived { payload, .. } if *payload == sealed(100))
    );
    assert!(
        matches!(&events[5].event, Event::RequestReplied { reply: Ok(v), .. } if *v == sealed(100))
    );
    let reply = store.request_reply(&id, ask).await.unwrap().unwrap().reply;
    assert_eq!(reply, Some(Ok(sealed(100))));
    let reply = store
        .request_reply(&id, plain_ask)
        .await
        .unwrap()
        .unwrap()
        .reply;
    assert_eq!(reply, Some(Err(crate::Error::fatal("plain"))));
    let published = store.run_events(&id).await.unwrap().unwrap();
    assert_eq!(published.values["status"], sealed(100));
    let page = store.read_stream(&id, "out", 0, 10).await.unwrap();
    assert_eq!(page.chunks[0].value, sealed(100));
    assert_eq!(page.chunks[1].value, json!("plain"));
    let inbox = store.payloads(&id, 0).await.unwrap();
    assert!(matches!(&inbox[0].what, Inbound::Message { payload, .. } if *payload == sealed(100)));

    // An ended run's output and error are rows too; an entry gone from the inbox is not
    // replaced.
    let msg = inbox[0].clone();
    let gone = rows
        .iter()
        .find(|r| matches!(r.at, SealedAt::Inbox { .. }))
        .unwrap();
    let mut gone = gone.clone();
    gone.stored = serde_json::to_string(&sealed(100)).unwrap();
    let end = ap(
        vec![NewEvent {
            at: t(8),
            event: Event::MessageReceived {
                topic: "note".into(),
                payload_id: msg.id,
                payload: sealed(100),
            },
        }],
        Some(RunOutcome::Completed(sealed(6))),
    );
    store.append(&lease, &end).await.unwrap();
    assert!(store.payloads(&id, 0).await.unwrap().is_empty());
    assert!(
        !store
            .replace_sealed(&gone, &gone.value.clone())
            .await
            .unwrap(),
        "a delivered inbox entry was written"
    );
    let runs = read_all(store, PayloadTable::Runs, 1).await;
    let at: Vec<_> = runs.iter().map(|r| r.at.clone()).collect();
    assert_eq!(at, [SealedAt::RunInput(id), SealedAt::RunOutput(id)]);
    assert!(store
        .replace_sealed(&runs[1], &SealedValue::Value(sealed(7)))
        .await
        .unwrap());
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.output, Some(sealed(7)));
    assert_eq!(run.status, RunStatus::Completed);
}
