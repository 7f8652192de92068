//! The requests contract ([`MessageStore`](crate::store::MessageStore)'s requests): a request
//! goes into the run's inbox in commit order and wakes the run; its record keeps its
//! idempotency key (a repeat is the first request, also after the run ended) and the first
//! reply an append records, which callers read with the run's status; an unknown or ended
//! run gets nothing written.

use std::time::Duration;

use serde_json::{json, Value};

use super::support::{acquire, ap, create, lease_one, names, t};
use crate::error::Error;
use crate::ids::RunId;
use crate::store::*;

/// A request named `name` sent at `at`, with idempotency key `key`.
pub(crate) fn request(name: &str, payload: Value, key: Option<&str>, at: u64) -> NewRequest {
    NewRequest {
        name: name.to_owned(),
        payload,
        idempotency_key: key.map(str::to_owned),
        at: t(at),
    }
}

/// The id of a request that must have been queued.
pub(crate) async fn queued<S: Store>(store: &S, run: RunId, r: NewRequest) -> u64 {
    match store.send_request(&run, r).await.unwrap() {
        SendOutcome::Queued(id) => id,
        other => panic!("the request to run {run} was not queued: {other:?}"),
    }
}

/// The reply to request `id` of `run` as recorded, with the run's status.
async fn reply<S: Store>(
    store: &S,
    run: RunId,
    id: u64,
) -> (RunStatus, Option<Result<Value, Error>>) {
    let state = store
        .request_reply(&run, id)
        .await
        .unwrap()
        .expect("the run exists");
    (state.status, state.reply)
}

pub(crate) fn received(name: &str, id: u64, payload: Value, at: u64) -> NewEvent {
    NewEvent {
        at: t(at),
        event: Event::RequestReceived {
            name: name.to_owned(),
            payload_id: id,
            payload,
        },
    }
}

pub(crate) fn replied(name: &str, id: u64, reply: Result<Value, Error>, at: u64) -> NewEvent {
    NewEvent {
        at: t(at),
        event: Event::RequestReplied {
            request_id: id,
            name: name.to_owned(),
            reply,
        },
    }
}

/// Requests are read back from the inbox with their names, in commit order among messages,
/// and wake the run; each is listed unreplied until an append records its reply, which is
/// the first one recorded (a second stays unwritten) and stays readable after the run's end,
/// with the run's status.
pub async fn requests_are_queued_and_keep_their_first_reply<S: Store>(store: &S) {
    let run = create(store, "orders", t(0)).await;
    let lease = lease_one(store, run, t(1)).await;
    let seen = store.last_payload_id().await.unwrap();
    store.release(&lease, t(3_600_000), seen).await.unwrap();
    let wf = names(&["orders"]);
    let lease_for = Duration::from_secs(600);
    assert!(acquire(store, &wf, t(5), lease_for, 10).await.is_empty());

    let a = queued(
        store,
        run,
        request("review", json!({"amount": 40}), None, 10),
    )
    .await;
    let m = store
        .send_message(
            &run,
            NewMessage {
                topic: "review".to_owned(),
                payload: json!("a message"),
                idempotency_key: None,
                at: t(11),
            },
        )
        .await
        .unwrap();
    let b = queued(
        store,
        run,
        request("review", json!({"amount": 9}), Some("k"), 12),
    )
    .await;
    let SendOutcome::Queued(m) = m else {
        panic!("the message was not queued: {m:?}")
    };
    assert!(
        a < m && m < b,
        "ids {a}, {m}, {b} do not grow in send order"
    );
    let inbox: Vec<(u64, Inbound)> = store
        .payloads(&run, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.id, e.what))
        .collect();
    assert_eq!(
        inbox,
        [
            (
                a,
                Inbound::Request {
                    name: "review".to_owned(),
                    payload: json!({"amount": 40})
                }
            ),
            (
                m,
                Inbound::Message {
                    topic: "review".to_owned(),
                    payload: json!("a message")
                }
            ),
            (
                b,
                Inbound::Request {
                    name: "review".to_owned(),
                    payload: json!({"amount": 9})
                }
            ),
        ]
    );
    let listed = store.run_requests(&run).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|r| (
                r.id,
                r.name.as_str(),
                r.idempotency_key.as_deref(),
                r.replied
            ))
            .collect::<Vec<_>>(),
        [(a, "review", None, false), (b, "review", Some("k"), false)]
    );
    assert_eq!(listed[0].at, t(10));
    assert_eq!(reply(store, run, a).await, (RunStatus::Running, None));
    // Due from the first request on, not in an hour.
    let got = acquire(store, &wf, t(20), lease_for, 10).await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [run]);
    let lease = got[0].lease.clone();

    // Delivered and replied in one append: out of the inbox, the reply readable.
    let write = vec![
        received("review", a, json!({"amount": 40}), 21),
        replied("review", a, Ok(json!(true)), 21),
    ];
    store.append(&lease, &ap(write, None)).await.unwrap();
    assert_eq!(
        reply(store, run, a).await,
        (RunStatus::Running, Some(Ok(json!(true))))
    );
    assert_eq!(reply(store, run, b).await, (RunStatus::Running, None));
    let left: Vec<u64> = store
        .payloads(&run, 0)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(left, [m, b]);
    // A second reply to `a` is not written; `b` gets an error reply with the run's end.
    let again = vec![replied("review", a, Ok(json!(false)), 22)];
    store.append(&lease, &ap(again, None)).await.unwrap();
    let last = vec![
        received("review", b, json!({"amount": 9}), 23),
        replied("review", b, Err(Error::fatal("does not fit")), 23),
    ];
    let end = ap(last, Some(RunOutcome::Completed(json!(null))));
    store.append(&lease, &end).await.unwrap();
    assert_eq!(
        reply(store, run, a).await,
        (RunStatus::Completed, Some(Ok(json!(true))))
    );
    let (status, b_reply) = reply(store, run, b).await;
    assert_eq!(status, RunStatus::Completed);
    let error = b_reply
        .expect("b's reply")
        .expect_err("b's reply is an error");
    assert_eq!(error.to_string(), "does not fit");
    assert!(store
        .run_requests(&run)
        .await
        .unwrap()
        .iter()
        .all(|r| r.replied));
    assert!(store
        .request_reply(&RunId::new(), a)
        .await
        .unwrap()
        .is_none());
}

/// A request to an unknown run or one that ended writes nothing and says why; a request with
/// the idempotency key of an earlier one to the run is that one, also after the run ended,
/// and writes nothing; another run's key of the same name is its own.
pub async fn a_request_is_refused_or_deduplicated_without_writing<S: Store>(store: &S) {
    let before = store.last_payload_id().await.unwrap();
    let unknown = RunId::new();
    let sent = store.send_request(&unknown, request("x", json!(1), None, 1));
    assert_eq!(sent.await.unwrap(), SendOutcome::NotFound);
    assert_eq!(store.last_payload_id().await.unwrap(), before);

    let run = create(store, "orders", t(0)).await;
    let other = create(store, "orders", t(0)).await;
    let first = queued(store, run, request("ask", json!(1), Some("req-42"), 1)).await;
    let again = store.send_request(&run, request("ask", json!(2), Some("req-42"), 2));
    assert_eq!(again.await.unwrap(), SendOutcome::Duplicate(first));
    let elsewhere = queued(store, other, request("ask", json!(3), Some("req-42"), 3)).await;
    assert_ne!(elsewhere, first);
    assert_eq!(store.payloads(&run, 0).await.unwrap().len(), 1);
    assert_eq!(store.run_requests(&run).await.unwrap().len(), 1);

    let lease = lease_one(store, run, t(4)).await;
    let done = ap(Vec::new(), Some(RunOutcome::Completed(json!("ok"))));
    store.append(&lease, &done).await.unwrap();
    let after_end = store.last_payload_id().await.unwrap();
    let keyed = store.send_request(&run, request("ask", json!(4), Some("req-42"), 5));
    assert_eq!(keyed.await.unwrap(), SendOutcome::Duplicate(first));
    let fresh = store.send_request(&run, request("ask", json!(5), Some("req-43"), 6));
    assert_eq!(
        fresh.await.unwrap(),
        SendOutcome::Ended(RunStatus::Completed)
    );
    let keyless = store.send_request(&run, request("ask", json!(6), None, 7));
    assert_eq!(
        keyless.await.unwrap(),
        SendOutcome::Ended(RunStatus::Completed)
    );
    assert_eq!(store.last_payload_id().await.unwrap(), after_end);
    assert_eq!(store.run_requests(&run).await.unwrap().len(), 1);
    assert_eq!(reply(store, run, first).await, (RunStatus::Completed, None));

    let cancelled = create(store, "orders", t(0)).await;
    store.cancel(&cancelled, t(8)).await.unwrap();
    let sent = store.send_request(&cancelled, request("ask", json!(1), None, 9));
    assert_eq!(
        sent.await.unwrap(),
        SendOutcome::Ended(RunStatus::Cancelled)
    );
    assert!(store.run_requests(&cancelled).await.unwrap().is_empty());
    assert_eq!(store.last_payload_id().await.unwrap(), after_end);
}

/// Requests racing with one idempotency key from three handles store exactly one, and every
/// sender is told its id.
pub async fn concurrent_requests_with_one_key_store_one<S: Store + Clone>(stores: &[S]) {
    let run = create(&stores[0], "orders", t(0)).await;
    let mut tasks = Vec::new();
    for (h, store) in stores.iter().enumerate() {
        for n in 0..10u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let r = request("once", json!([h, n]), Some("the-key"), 1 + n);
                store.send_request(&run, r).await.unwrap()
            }));
        }
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let ids: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| match o {
            SendOutcome::Queued(id) => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 1, "{outcomes:?}");
    assert!(
        outcomes.iter().all(
            |o| matches!(o, SendOutcome::Queued(id) | SendOutcome::Duplicate(id) if *id == ids[0])
        ),
        "{outcomes:?}"
    );
    assert_eq!(stores[1].payloads(&run, 0).await.unwrap().len(), 1);
    assert_eq!(stores[2].run_requests(&run).await.unwrap().len(), 1);
}
