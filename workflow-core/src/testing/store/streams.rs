//! The streams contract ([`StreamStore`](crate::store::StreamStore)): chunks numbered by the
//! store per run and stream, fenced by the run's lease, closed streams, paged reads, and
//! streams pruned with their run.

use std::time::{Duration, SystemTime};

use serde_json::json;

use super::support::{acquire, ap, create, lease_one, names, t};
use super::Inspect;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::*;

/// The values of `page`'s chunks, with their index and attempt.
fn chunk_values(page: &StreamPage) -> Vec<(u64, u32, serde_json::Value)> {
    page.chunks
        .iter()
        .map(|c| (c.index, c.attempt, c.value.clone()))
        .collect()
}

/// Leases runs `ids` (of `orders`) at `now`, in that order.
async fn lease_each<S: Store>(store: &S, ids: &[RunId], now: SystemTime) -> Vec<Lease> {
    let got = acquire(
        store,
        &names(&["orders"]),
        now,
        Duration::from_secs(600),
        100,
    )
    .await;
    ids.iter()
        .map(|id| {
            got.iter()
                .find(|r| r.run.id == *id)
                .unwrap_or_else(|| panic!("run {id} was not acquirable"))
                .lease
                .clone()
        })
        .collect()
}

/// Chunks get their index from the store, from 0 per run and stream, in write order, each
/// with its attempt and time; only the lease's holder writes, and not after the run's end.
pub async fn stream_chunks_are_numbered_per_stream_and_fenced<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let other = create(store, "orders", t(0)).await;
    let [lease, other_lease] =
        <[Lease; 2]>::try_from(lease_each(store, &[id, other], t(1)).await).unwrap();
    let put = |lease: Lease, name: &'static str, attempt: u32, v: serde_json::Value| async move {
        store
            .append_chunk(&lease, name, attempt, v, t(10))
            .await
            .unwrap()
    };
    assert_eq!(put(lease.clone(), "tokens", 1, json!("a")).await, Some(0));
    assert_eq!(put(lease.clone(), "tokens", 1, json!("b")).await, Some(1));
    assert_eq!(put(lease.clone(), "progress", 1, json!(50)).await, Some(0));
    assert_eq!(
        put(lease.clone(), "tokens", 2, json!({"c": [1]})).await,
        Some(2)
    );
    assert_eq!(
        put(other_lease.clone(), "tokens", 1, json!("z")).await,
        Some(0)
    );

    let page = store.read_stream(&id, "tokens", 0, 100).await.unwrap();
    assert_eq!(
        chunk_values(&page),
        [
            (0, 1, json!("a")),
            (1, 1, json!("b")),
            (2, 2, json!({"c": [1]}))
        ]
    );
    assert!(page.chunks.iter().all(|c| c.at == t(10)));
    assert_eq!(
        (page.run, page.closed, page.len),
        (Some(RunStatus::Running), false, 3)
    );
    let page = store.read_stream(&other, "tokens", 0, 100).await.unwrap();
    assert_eq!(chunk_values(&page), [(0, 1, json!("z"))]);
    // An unknown stream reads as empty and open; an unknown run has no status.
    let page = store.read_stream(&id, "nothing", 0, 100).await.unwrap();
    assert_eq!(
        (page.run, page.closed, page.len, page.chunks.len()),
        (Some(RunStatus::Running), false, 0, 0)
    );
    let page = store
        .read_stream(&RunId::new(), "tokens", 0, 100)
        .await
        .unwrap();
    assert_eq!(page, StreamPage::default());

    // A stale epoch writes nothing.
    let stale = Lease {
        run_id: id,
        epoch: lease.epoch + 1,
    };
    let refused = store
        .append_chunk(&stale, "tokens", 1, json!("x"), t(11))
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(r)) if r == id),
        "{refused:?}"
    );
    let refused = store.close_stream(&stale, "tokens", t(11)).await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(_))),
        "{refused:?}"
    );
    // Nor does anyone after the run's end.
    let done = Some(RunOutcome::Completed(json!(1)));
    store.append(&lease, &ap(vec![], done)).await.unwrap();
    let refused = store
        .append_chunk(&lease, "tokens", 1, json!("x"), t(12))
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(_))),
        "{refused:?}"
    );
    store.cancel(&other, t(12)).await.unwrap();
    let refused = store
        .append_chunk(&other_lease, "tokens", 1, json!("x"), t(12))
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(_))),
        "{refused:?}"
    );
    let page = store.read_stream(&id, "tokens", 0, 100).await.unwrap();
    assert_eq!((page.run, page.len), (Some(RunStatus::Completed), 3));
    assert_eq!(page.chunks.len(), 3);
}

/// A closed stream refuses later chunks (writing nothing); closing is idempotent and works
/// on a stream never written; the run's streams are listed by name.
pub async fn a_closed_stream_takes_no_more_chunks<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let lease = lease_one(store, id, t(1)).await;
    for v in 0..3 {
        store
            .append_chunk(&lease, "out", 1, json!(v), t(2))
            .await
            .unwrap();
    }
    store
        .append_chunk(&lease, "log", 1, json!("x"), t(2))
        .await
        .unwrap();
    store.close_stream(&lease, "out", t(3)).await.unwrap();
    store.close_stream(&lease, "out", t(3)).await.unwrap();
    assert_eq!(
        store
            .append_chunk(&lease, "out", 1, json!(9), t(4))
            .await
            .unwrap(),
        None
    );
    store.close_stream(&lease, "empty", t(5)).await.unwrap();
    let page = store.read_stream(&id, "out", 0, 100).await.unwrap();
    assert_eq!((page.closed, page.len, page.chunks.len()), (true, 3, 3));
    let page = store.read_stream(&id, "empty", 0, 100).await.unwrap();
    assert_eq!((page.closed, page.len, page.chunks.len()), (true, 0, 0));
    // Other streams stay open.
    assert_eq!(
        store
            .append_chunk(&lease, "log", 1, json!("y"), t(6))
            .await
            .unwrap(),
        Some(1)
    );
    let info = |name: &str, len: u64, closed: bool| StreamInfo {
        name: name.to_owned(),
        len,
        closed,
    };
    assert_eq!(
        store.list_streams(&id).await.unwrap(),
        [
            info("empty", 0, true),
            info("log", 2, false),
            info("out", 3, true)
        ]
    );
    assert!(store.list_streams(&RunId::new()).await.unwrap().is_empty());
}

/// Reads start at any index and return at most the limit, in index order.
pub async fn a_stream_reads_in_pages_from_any_index<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let lease = lease_one(store, id, t(1)).await;
    for v in 0..10u64 {
        let index = store
            .append_chunk(&lease, "n", 1, json!(v * 10), t(2 + v))
            .await
            .unwrap();
        assert_eq!(index, Some(v));
    }
    let page = store.read_stream(&id, "n", 4, 3).await.unwrap();
    assert_eq!(
        chunk_values(&page),
        [(4, 1, json!(40)), (5, 1, json!(50)), (6, 1, json!(60))]
    );
    assert_eq!(page.chunks[0].at, t(6));
    assert_eq!(page.len, 10);
    let page = store.read_stream(&id, "n", 9, 3).await.unwrap();
    assert_eq!(chunk_values(&page), [(9, 1, json!(90))]);
    let page = store.read_stream(&id, "n", 10, 3).await.unwrap();
    assert!(page.chunks.is_empty());
    let page = store.read_stream(&id, "n", u64::MAX, 3).await.unwrap();
    assert!(page.chunks.is_empty());
    let page = store.read_stream(&id, "n", 0, 0).await.unwrap();
    assert_eq!((page.len, page.chunks.len()), (10, 0));
}

/// Pruning a run deletes its streams and their chunks.
pub async fn prune_takes_a_run_s_streams_with_it<S: Store + Inspect>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let kept = create(store, "orders", t(0)).await;
    for lease in lease_each(store, &[id, kept], t(1)).await {
        store
            .append_chunk(&lease, "a", 1, json!(1), t(2))
            .await
            .unwrap();
        store
            .append_chunk(&lease, "a", 1, json!(2), t(2))
            .await
            .unwrap();
        store.close_stream(&lease, "b", t(2)).await.unwrap();
    }
    store.cancel(&id, t(10)).await.unwrap();
    assert_eq!(store.count("streams").await, 4);
    assert_eq!(store.count("stream_chunks").await, 4);
    assert_eq!(store.prune(t(50), t(100)).await.unwrap().runs, 1);
    assert_eq!(store.count("streams").await, 2);
    assert_eq!(store.count("stream_chunks").await, 2);
    assert!(store.list_streams(&id).await.unwrap().is_empty());
    let page = store.read_stream(&kept, "a", 0, 10).await.unwrap();
    assert_eq!(page.chunks.len(), 2);
}
