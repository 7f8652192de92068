//! Decoding, for stores keeping encoded rows ([`Damage`](super::Damage)): a row the store cannot
//! decode is reported as corrupt by every read that meets it, not skipped.

use std::time::Duration;

use super::children::child_of;
use super::support::{acquire, create, lease_one, names, t};
use super::Damage;
use crate::error::StoreError;
use crate::store::*;

/// A row the store cannot decode is an error naming the run, and does not stall the others;
/// `acquire` does not hand such a run out, and fails it after [`MAX_FAILED_TRIES`] tries.
pub async fn undecodable_rows_are_reported_as_corrupt<S: Store + Damage>(store: &S) {
    let bad_input = create(store, "orders", t(0)).await;
    let bad_history = create(store, "orders", t(1)).await;
    let good = create(store, "orders", t(2)).await;
    store.corrupt_input(bad_input).await;
    store.add_undecodable_event(bad_history).await;

    let err = store.get_run(&bad_input).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt(m) if m.contains(&bad_input.to_string()) && m.contains("input")),
        "{err:?}"
    );
    let err = store.events(&bad_history).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt(m) if m.contains(&bad_history.to_string()) && m.contains("event 1")),
        "{err:?}"
    );
    // One bad run does not stall the others, and neither comes back forever: each acquire
    // counts a failed try, and the store fails the run on the last. (100 s apart: every
    // backoff and the good run's lease are over by the next.)
    let lease = Duration::from_secs(60);
    let mut handed_out = Vec::new();
    for i in 0..2 * u64::from(MAX_FAILED_TRIES) {
        let got = acquire(
            store,
            &names(&["orders"]),
            t(10_000 + i * 100_000),
            lease,
            10,
        )
        .await;
        handed_out.extend(got.iter().map(|r| r.run.id));
    }
    assert!(handed_out.iter().all(|id| *id == good), "{handed_out:?}");
    let run = store.get_run(&bad_history).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert!(
        error.message().contains("gave up") && error.message().contains("event 1"),
        "{error:?}"
    );
}

/// A row that cannot be decoded is reported by a listing, not skipped.
pub async fn listing_reports_an_undecodable_row<S: Store + Damage>(store: &S) {
    create(store, "orders", t(0)).await;
    let bad = create(store, "orders", t(1)).await;
    store.corrupt_input(bad).await;
    let err = store.list_runs(&RunFilter::new()).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt(m) if m.contains(&bad.to_string())),
        "{err:?}"
    );
}

/// A child's end is read back as [`Inbound::ChildEnded`] or reported as corrupt: a row under
/// the child's-end token that does not hold one is an error naming the run and the entry,
/// never skipped (the parent would wait for that child forever) nor handed out as a hook's
/// payload.
pub async fn an_undecodable_child_end_is_reported_as_corrupt<S: Store + Damage>(store: &S) {
    let parent_id = create(store, "orders", t(0)).await;
    let parent = lease_one(store, parent_id, t(1)).await;
    let child = child_of(&parent, "ch_0", t(2), false);
    let child_id = child.id;
    assert_eq!(
        store.start_child(&parent, "ch_0", child).await.unwrap(),
        Admission::Admitted
    );
    assert_eq!(
        store.cancel(&child_id, t(3)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let inbox = store.payloads(&parent_id, 0).await.unwrap();
    let [InboxEntry {
        id,
        what: Inbound::ChildEnded(notice),
    }] = &inbox[..]
    else {
        panic!("one child's end: {inbox:?}");
    };
    assert_eq!(notice.child, child_id);

    // Valid JSON, and a valid hook payload, but no child's end.
    store.rewrite_inbox(parent_id, r#"{"child": 1}"#).await;
    let err = store.payloads(&parent_id, 0).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt(m)
            if m.contains(&parent_id.to_string()) && m.contains(&format!("payload {id}"))),
        "{err:?}"
    );
}
