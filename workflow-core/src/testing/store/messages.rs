//! The messages contract ([`MessageStore`](crate::store::MessageStore)): a message goes into
//! the run's inbox in commit order and wakes the run; an unknown or ended run, or a repeated
//! idempotency key, gets nothing written; a delivered message leaves the inbox while its key
//! stays used.

use std::time::Duration;

use serde_json::{json, Value};

use super::support::{acquire, ap, create, lease_one, names, t};
use crate::ids::RunId;
use crate::store::*;

/// A message on `topic` sent at `at`, with idempotency key `key`.
pub(crate) fn message(topic: &str, payload: Value, key: Option<&str>, at: u64) -> NewMessage {
    NewMessage {
        topic: topic.to_owned(),
        payload,
        idempotency_key: key.map(str::to_owned),
        at: t(at),
    }
}

/// The inbox id of a send that must have been queued.
async fn queued<S: Store>(store: &S, run: RunId, m: NewMessage) -> u64 {
    match store.send_message(&run, m).await.unwrap() {
        SendOutcome::Queued(id) => id,
        other => panic!("the message to run {run} was not queued: {other:?}"),
    }
}

/// The run's inbox as (id, topic, payload); anything but a message fails the case.
async fn inbox<S: Store>(store: &S, run: RunId) -> Vec<(u64, String, Value)> {
    let entries = store.payloads(&run, 0).await.unwrap();
    entries
        .into_iter()
        .map(|e| match e.what {
            Inbound::Message { topic, payload } => (e.id, topic, payload),
            other => panic!("inbox entry {}: not a message: {other:?}", e.id),
        })
        .collect()
}

/// Messages are read back from the inbox with their topics, in commit order, with global
/// increasing ids; a message wakes a run given back with a later wake time.
pub async fn messages_are_queued_in_order_and_wake_the_run<S: Store>(store: &S) {
    let run = create(store, "orders", t(0)).await;
    let lease = lease_one(store, run, t(1)).await;
    // Given back to wake in an hour, with every payload so far seen.
    let seen = store.last_payload_id().await.unwrap();
    store.release(&lease, t(3_600_000), seen).await.unwrap();
    let wf = names(&["orders"]);
    let lease_for = Duration::from_secs(600);
    assert!(acquire(store, &wf, t(5), lease_for, 10).await.is_empty());

    let a = queued(
        store,
        run,
        message("approval", json!({"by": "ana"}), None, 10),
    )
    .await;
    let b = queued(store, run, message("progress", json!(50), None, 11)).await;
    let c = queued(
        store,
        run,
        message("approval", json!({"by": "bo"}), None, 12),
    )
    .await;
    assert!(
        a < b && b < c,
        "ids {a}, {b}, {c} do not grow in send order"
    );
    assert_eq!(
        inbox(store, run).await,
        [
            (a, "approval".to_owned(), json!({"by": "ana"})),
            (b, "progress".to_owned(), json!(50)),
            (c, "approval".to_owned(), json!({"by": "bo"})),
        ]
    );
    let since = store.payloads_since(seen, 10).await.unwrap();
    assert_eq!(since, [(a, run), (b, run), (c, run)]);
    // Due from the first message on, not in an hour.
    let got = acquire(store, &wf, t(20), lease_for, 10).await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [run]);
}

/// A send to an unknown run or one that ended writes nothing and says why.
pub async fn a_message_to_an_unknown_or_ended_run_writes_nothing<S: Store>(store: &S) {
    let before = store.last_payload_id().await.unwrap();
    let unknown = RunId::new();
    let sent = store.send_message(&unknown, message("x", json!(1), None, 1));
    assert_eq!(sent.await.unwrap(), SendOutcome::NotFound);

    let run = create(store, "orders", t(0)).await;
    let lease = lease_one(store, run, t(1)).await;
    let done = ap(Vec::new(), Some(RunOutcome::Completed(json!("ok"))));
    store.append(&lease, &done).await.unwrap();
    let sent = store.send_message(&run, message("x", json!(1), Some("k"), 2));
    assert_eq!(
        sent.await.unwrap(),
        SendOutcome::Ended(RunStatus::Completed)
    );
    let cancelled = create(store, "orders", t(0)).await;
    store.cancel(&cancelled, t(3)).await.unwrap();
    let sent = store.send_message(&cancelled, message("x", json!(1), None, 4));
    assert_eq!(
        sent.await.unwrap(),
        SendOutcome::Ended(RunStatus::Cancelled)
    );

    assert!(store.payloads(&run, 0).await.unwrap().is_empty());
    assert!(store.payloads(&cancelled, 0).await.unwrap().is_empty());
    assert_eq!(store.last_payload_id().await.unwrap(), before);
}

/// One message per run and idempotency key: a repeat, with any payload, is a duplicate naming
/// the first and writes nothing, also after the first was delivered (and left the inbox);
/// another run's key of the same name is its own.
pub async fn an_idempotency_key_stores_one_message_per_run<S: Store>(store: &S) {
    let run = create(store, "orders", t(0)).await;
    let other = create(store, "orders", t(0)).await;
    let first = queued(store, run, message("pay", json!(1), Some("req-42"), 1)).await;
    let again = store.send_message(&run, message("pay", json!(2), Some("req-42"), 2));
    assert_eq!(again.await.unwrap(), SendOutcome::Duplicate(first));
    let elsewhere = queued(store, other, message("pay", json!(3), Some("req-42"), 3)).await;
    assert_ne!(elsewhere, first);
    assert_eq!(
        inbox(store, run).await,
        [(first, "pay".to_owned(), json!(1))]
    );

    // Delivered: out of the inbox, and the key still used.
    let lease = lease_one(store, run, t(4)).await;
    let received = NewEvent {
        at: t(5),
        event: Event::MessageReceived {
            topic: "pay".to_owned(),
            payload_id: first,
            payload: json!(1),
        },
    };
    store
        .append(&lease, &ap(vec![received], None))
        .await
        .unwrap();
    assert!(inbox(store, run).await.is_empty());
    let later = store.send_message(&run, message("pay", json!(4), Some("req-42"), 6));
    assert_eq!(later.await.unwrap(), SendOutcome::Duplicate(first));
    assert!(inbox(store, run).await.is_empty());
    let fresh = queued(store, run, message("pay", json!(5), Some("req-43"), 7)).await;
    assert_eq!(
        inbox(store, run).await,
        [(fresh, "pay".to_owned(), json!(5))]
    );
}

/// Sends racing with one idempotency key from three handles store exactly one message.
pub async fn concurrent_sends_with_one_key_store_one<S: Store + Clone>(stores: &[S]) {
    let run = create(&stores[0], "orders", t(0)).await;
    let mut tasks = Vec::new();
    for (h, store) in stores.iter().enumerate() {
        for n in 0..10u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let m = message("once", json!([h, n]), Some("the-key"), 1 + n);
                store.send_message(&run, m).await.unwrap()
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
}

/// A value published by an append (`EventSet` among its events) is the key's latest value,
/// also when the append ends the run; the latest per key wins; an unknown run reads `None`.
pub async fn published_values_keep_the_latest_per_key<S: Store>(store: &S) {
    let run = create(store, "orders", t(0)).await;
    assert!(store.run_events(&RunId::new()).await.unwrap().is_none());
    let read = store
        .run_events(&run)
        .await
        .unwrap()
        .expect("the run exists");
    assert_eq!(read.status, RunStatus::Pending);
    assert!(read.values.is_empty());

    let lease = lease_one(store, run, t(1)).await;
    let set = |n: u32, key: &str, value: Value| NewEvent {
        at: t(2),
        event: Event::EventSet {
            set_id: format!("set_{n}"),
            key: key.to_owned(),
            value,
        },
    };
    let first = vec![
        set(0, "progress", json!(10)),
        set(1, "url", json!("https://pay.example/1")),
        set(2, "progress", json!(60)),
    ];
    store.append(&lease, &ap(first, None)).await.unwrap();
    let read = store.run_events(&run).await.unwrap().unwrap();
    assert_eq!(read.status, RunStatus::Running);
    assert_eq!(
        read.values.into_iter().collect::<Vec<_>>(),
        [
            ("progress".to_owned(), json!(60)),
            ("url".to_owned(), json!("https://pay.example/1")),
        ]
    );
    // The run's last write publishes too.
    let last = ap(
        vec![set(3, "progress", json!(100))],
        Some(RunOutcome::Completed(json!(null))),
    );
    store.append(&lease, &last).await.unwrap();
    let read = store.run_events(&run).await.unwrap().unwrap();
    assert_eq!(read.status, RunStatus::Completed);
    assert_eq!(read.values["progress"], json!(100));
    assert_eq!(read.values.len(), 2);
}
