//! The transactional steps' contract ([`TransactionalStore`](crate::store::TransactionalStore)):
//! a step transaction commits only under the current lease, its append fenced like
//! [`RunStore::append`](crate::store::RunStore::append), and leaves nothing when dropped. A
//! store without transactions says so (`None`) and writes nothing. What the body writes to the
//! user's tables is each store's own test (`tests/transactional.rs`).

use std::time::Duration;

use super::support::{acquire, ap, create, lease_one, names, step_done, t};
use crate::error::StoreError;
use crate::store::*;

/// Begun under the current lease, a step transaction's commit appends its events after the
/// run's history; dropped without a commit, it appends nothing.
pub async fn a_step_transaction_commits_its_append_or_nothing<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let lease = lease_one(store, id, t(1)).await;
    store
        .append(&lease, &ap(vec![step_done(t(2), 1)], None))
        .await
        .unwrap();
    let Some(open) = store.begin_step(&lease).await.unwrap() else {
        // No transactions here: nothing was begun, nothing written.
        assert_eq!(store.events(&id).await.unwrap().len(), 1);
        return;
    };
    drop(open);
    assert_eq!(store.events(&id).await.unwrap().len(), 1, "a dropped one");

    let open = store
        .begin_step(&lease)
        .await
        .unwrap()
        .expect("begins again");
    open.commit(&lease, &ap(vec![step_done(t(3), 2)], None))
        .await
        .unwrap();
    let events = store.events(&id).await.unwrap();
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(events[1].event, step_done(t(3), 2).event);
    // The run's next plain append numbers after it.
    store
        .append(&lease, &ap(vec![step_done(t(4), 3)], None))
        .await
        .unwrap();
    assert_eq!(store.events(&id).await.unwrap().len(), 3);
}

/// After a takeover, the old lease commits nothing: its step transaction is refused at the
/// begin (where the store checks there) or at the commit, and the new lease begins and
/// commits. (A takeover while a transaction is open is each store's own test: on SQLite it
/// cannot happen, as the transaction holds the file's write lock and the takeover waits for
/// it.)
pub async fn a_step_transaction_under_a_lost_lease_commits_nothing<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let wf = names(&["orders"]);
    let lease = Duration::from_secs(10);
    let first = acquire(store, &wf, t(0), lease, 1).await.remove(0).lease;
    if store.begin_step(&first).await.unwrap().is_none() {
        return; // no transactions: see the case above
    }
    let second = acquire(store, &wf, t(10_000), lease, 1)
        .await
        .remove(0)
        .lease;
    let refused = match store.begin_step(&first).await {
        Ok(open) => {
            let open = open.expect("a store with transactions");
            open.commit(&first, &ap(vec![step_done(t(10_001), 1)], None))
                .await
        }
        Err(e) => Err(e),
    };
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(r)) if r == id),
        "{refused:?}"
    );
    assert!(store.events(&id).await.unwrap().is_empty());
    // The current lease still begins and commits.
    let open = store.begin_step(&second).await.unwrap().expect("begins");
    open.commit(&second, &ap(vec![step_done(t(10_001), 1)], None))
        .await
        .unwrap();
    assert_eq!(store.events(&id).await.unwrap().len(), 1);
}
