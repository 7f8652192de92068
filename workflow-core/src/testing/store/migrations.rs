//! A fixture for the SQL stores' migration tests: what a store migrated from the previous
//! release's layout must still hold.

use serde_json::json;

use super::support::{ap, event_seqs, hook_payload, lease_one, owner, step_done, t};
use super::within;
use crate::ids::RunId;
use crate::store::*;

/// What a SQL store migrated from the previous release's layout must still hold: the fixture
/// both dialects' migration tests write (run `done` completed with output 7 and token
/// `tok-completed`; run `live` running, owning `tok-running` with the payload "early"; two
/// events each), and `live`'s history continuing after its last event. Returns the lease
/// taken on `live`.
pub(crate) async fn previous_release_is_kept<S: Store>(
    store: &S,
    done: RunId,
    live: RunId,
) -> Lease {
    let run = within(store.get_run(&done)).await.unwrap().unwrap();
    assert_eq!(
        (run.status, run.output, run.hook_token.as_deref()),
        (RunStatus::Completed, Some(json!(7)), Some("tok-completed"))
    );
    for id in [done, live] {
        assert_eq!(event_seqs(store, id).await, [1, 2]);
    }
    assert_eq!(within(owner(store, "tok-running")).await, Some(live));
    let inbox = within(store.payloads(&live, 0)).await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(hook_payload(&inbox[0]).1, &json!("early"));
    let lease = within(lease_one(store, live, t(3))).await;
    within(store.append(&lease, &ap(vec![step_done(t(4), 3)], None)))
        .await
        .unwrap();
    let last = within(store.events(&live)).await.unwrap().pop().unwrap();
    assert_eq!((last.seq, last.at), (3, t(4)));
    lease
}
