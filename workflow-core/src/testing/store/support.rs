//! Helpers the conformance cases share: a fixed clock ([`t`]), admissions, leases, appends
//! and the events the cases write. They panic on failure, as the cases do.

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::within;
use crate::ids::RunId;
use crate::store::*;

/// A run of `workflow` admitted at `t(0)` as `id`, without a token, parent or queue.
pub(crate) fn new_run(id: RunId, workflow: &str) -> NewRun {
    NewRun::new(id, workflow.to_owned(), json!([]), t(0))
}

/// A fixed point in time (November 2023), plus `ms`.
pub(crate) fn t(ms: u64) -> SystemTime {
    from_millis(1_700_000_000_000 + ms)
}

/// An append of `events`, ending the run with `outcome` if given.
pub(crate) fn ap(events: Vec<NewEvent>, outcome: Option<RunOutcome>) -> Append {
    Append {
        events,
        outcome,
        ..Append::default()
    }
}

/// Inbox entry `id`: `payload` sent to `token`.
pub(crate) fn sent(id: u64, token: &str, payload: Value) -> InboxEntry {
    InboxEntry {
        id,
        what: Inbound::Hook {
            token: token.to_owned(),
            payload,
        },
    }
}

/// The token and payload of a hook's inbox entry; anything else fails the case.
pub(crate) fn hook_payload(entry: &InboxEntry) -> (&str, &Value) {
    match &entry.what {
        Inbound::Hook { token, payload } => (token, payload),
        other => panic!("inbox entry {}: not a hook payload: {other:?}", entry.id),
    }
}

/// Owned workflow names.
pub(crate) fn names(ws: &[&str]) -> Vec<String> {
    ws.iter().map(|w| (*w).to_owned()).collect()
}

/// Admits a run of `workflow` at `at` (input `[1, "two"]`, no hook).
pub(crate) async fn create<S: Store>(store: &S, workflow: &str, at: SystemTime) -> RunId {
    let id = RunId::new();
    store
        .create_run(NewRun::new(id, workflow.to_owned(), json!([1, "two"]), at))
        .await
        .unwrap();
    id
}

/// Leases up to `limit` runs of `workflows` for worker `w`.
pub(crate) async fn acquire<S: Store>(
    store: &S,
    workflows: &[String],
    now: SystemTime,
    lease: Duration,
    limit: usize,
) -> Vec<LeasedRun> {
    store
        .acquire(AcquireRequest {
            worker_id: "w",
            workflows,
            lease,
            limit,
            now,
        })
        .await
        .unwrap()
}

/// The completion of step `s<n>` with result `n`.
pub(crate) fn step_done(at: SystemTime, n: u32) -> NewEvent {
    NewEvent {
        at,
        event: Event::StepCompleted {
            step_id: format!("s{n}"),
            result: Ok(json!(n)),
        },
    }
}

pub(crate) fn start_hook(token: &str, retain_until: Option<SystemTime>) -> Option<StartHook> {
    Some(StartHook {
        token: token.to_owned(),
        retain_until,
    })
}

/// Starts a run of `hooked` claiming `token`.
pub(crate) async fn start<S: Store>(
    store: &S,
    token: &str,
    retain_until: Option<SystemTime>,
    at: SystemTime,
) -> (RunId, Admission) {
    let id = RunId::new();
    let admission = store
        .create_run(
            NewRun::new(id, "hooked".to_owned(), json!([]), at)
                .hook(start_hook(token, retain_until)),
        )
        .await
        .unwrap();
    (id, admission)
}

/// Leases run `id` (of `hooked` or `orders`) at `now`; panics if it is not acquirable.
pub(crate) async fn lease_one<S: Store>(store: &S, id: RunId, now: SystemTime) -> Lease {
    let got = acquire(
        store,
        &names(&["hooked", "orders"]),
        now,
        Duration::from_secs(600),
        100,
    )
    .await;
    got.into_iter()
        .find(|r| r.run.id == id)
        .unwrap_or_else(|| panic!("run {id} was not acquirable at {now:?}"))
        .lease
}

/// The run owning `token`, if an active hook does.
pub(crate) async fn owner<S: Store>(store: &S, token: &str) -> Option<RunId> {
    store.get_hook(token).await.unwrap().map(|h| h.run_id)
}

/// The sequence numbers of run `id`'s events, in order.
pub(crate) async fn event_seqs<S: Store>(store: &S, id: RunId) -> Vec<u64> {
    let events = within(store.events(&id)).await.unwrap();
    events.iter().map(|e| e.seq).collect()
}
