//! Scripts of store operations whose transcripts must be identical on every store: the
//! stores' unit tests run them on themselves and on [`super::memory::MemoryStore`] and compare.

use std::time::SystemTime;

use serde_json::json;

use super::*;
use crate::ids::RunId;

/// A fixed point in time (November 2023), plus `ms`.
pub(crate) fn t(ms: u64) -> SystemTime {
    from_millis(1_700_000_000_000 + ms)
}

/// An append of `events`, ending the run with `outcome` if given.
pub(crate) fn ap(events: Vec<NewEvent>, outcome: Option<RunOutcome>) -> Append {
    Append {
        events,
        release_tokens: Vec::new(),
        outcome,
    }
}

/// Owned workflow names.
pub(crate) fn names(ws: &[&str]) -> Vec<String> {
    ws.iter().map(|w| (*w).to_owned()).collect()
}

/// One script of hook operations; its transcript must be the same on every store.
pub(crate) async fn hook_script<S: Store>(store: &S, ids: &[RunId]) -> Vec<String> {
    let mut log = Vec::new();
    macro_rules! note {
        ($e:expr) => {
            log.push(format!("{:?}", $e))
        };
    }
    let new_run = |i: usize, token: Option<&str>, retain: Option<u64>, at: u64| NewRun {
        id: ids[i],
        workflow: "hooked".into(),
        input: json!([i]),
        created_at: t(at),
        hook: token.map(|token| StartHook {
            token: token.into(),
            retain_until: retain.map(t),
        }),
    };
    note!(store.create_run(new_run(0, Some("x"), Some(300), 0)).await);
    note!(store.create_run(new_run(1, Some("x"), None, 1)).await);
    note!(store.create_run(new_run(2, None, None, 2)).await);
    note!(store.create_run(new_run(3, Some("y"), None, 3)).await);
    note!(store.create_run(new_run(3, Some("q"), None, 3)).await);
    let leased = store
        .acquire(AcquireRequest {
            worker_id: "w",
            workflows: &names(&["hooked"]),
            lease: Duration::from_secs(60),
            limit: 10,
            now: t(10),
        })
        .await
        .unwrap();
    note!(leased
        .iter()
        .map(|r| (&r.run, &r.lease, &r.events))
        .collect::<Vec<_>>());
    let lease = |i: usize| {
        leased
            .iter()
            .find(|r| r.run.id == ids[i])
            .unwrap()
            .lease
            .clone()
    };
    note!(store.claim_hook(&lease(2), "hk_1", "x", t(11)).await);
    note!(store.claim_hook(&lease(2), "hk_2", "z", t(12)).await);
    note!(store.claim_hook(&lease(2), "hk_3", "z", t(13)).await);
    note!(store.resume_hook("z", json!("p1"), t(20)).await);
    note!(store.resume_hook("y", json!("p2"), t(21)).await);
    note!(store.resume_hook("nope", json!("p3"), t(22)).await);
    note!(store.resume_hook("x", json!("p4"), t(23)).await);
    note!(store.payloads(&ids[2], 0).await);
    note!(store.payloads_since(0, 10).await);
    note!(store.last_payload_id().await);
    note!(store.get_hook("z").await);
    note!(
        store
            .append(
                &lease(2),
                Append {
                    events: vec![NewEvent {
                        at: t(30),
                        event: Event::HookReleased {
                            hook_key: "hk_2".into(),
                            token: "z".into(),
                        },
                    }],
                    release_tokens: vec!["z".into(), "x".into()],
                    outcome: None,
                }
            )
            .await
    );
    note!(store.get_hook("z").await);
    note!(store.get_hook("x").await);
    note!(store.resume_hook("z", json!("p5"), t(31)).await);
    note!(
        store
            .append(
                &lease(0),
                ap(
                    vec![NewEvent {
                        at: t(40),
                        event: Event::RunCompleted { output: json!(0) },
                    }],
                    Some(RunOutcome::Completed(json!(0)))
                )
            )
            .await
    );
    note!(store.get_hook("x").await);
    note!(store.create_run(new_run(4, Some("x"), None, 100)).await);
    note!(store.claim_hook(&lease(2), "hk_4", "x", t(299)).await);
    note!(store.claim_hook(&lease(2), "hk_5", "x", t(300)).await);
    note!(store.cancel(&ids[3], t(50)).await);
    note!(store.get_hook("y").await);
    note!(store.create_run(new_run(5, Some("y"), None, 51)).await);
    note!(store.release(&lease(2), t(400), 0).await.is_ok());
    note!(store.claim_hook(&lease(2), "hk_6", "w", t(401)).await);
    for id in ids {
        note!(store.get_run(id).await);
        note!(store.events(id).await);
        note!(store.payloads(id, 0).await);
    }
    log
}

/// Admits runs of two workflows, ends some of them, registers and releases hooks, and lists.
pub(crate) async fn listing_script<S: Store>(store: &S, ids: &[RunId]) -> Vec<String> {
    let mut log = Vec::new();
    macro_rules! note {
        ($e:expr) => {
            log.push(format!("{:?}", $e))
        };
    }
    for (i, id) in ids.iter().enumerate() {
        let workflow = if i % 2 == 0 { "orders" } else { "hooked" };
        let hook = (i % 2 == 1).then(|| StartHook {
            token: format!("tok-{i}"),
            retain_until: None,
        });
        // Two runs share an admission time: the id breaks the tie.
        let at = t(10 * (i as u64 / 2 * 2));
        note!(
            store
                .create_run(NewRun {
                    id: *id,
                    workflow: workflow.into(),
                    input: json!([i]),
                    created_at: at,
                    hook,
                })
                .await
        );
    }
    note!(store.cancel(&ids[1], t(100)).await);
    let leased = store
        .acquire(AcquireRequest {
            worker_id: "w",
            workflows: &names(&["orders"]),
            lease: Duration::from_secs(60),
            limit: 10,
            now: t(200),
        })
        .await
        .unwrap();
    let lease = leased
        .iter()
        .find(|r| r.run.id == ids[0])
        .unwrap()
        .lease
        .clone();
    note!(store.claim_hook(&lease, "hk_1", "extra", t(210)).await);
    note!(
        store
            .append(
                &lease,
                ap(
                    vec![NewEvent {
                        at: t(220),
                        event: Event::RunFailed {
                            error: Error::fatal("no"),
                        },
                    }],
                    Some(RunOutcome::Failed(Error::fatal("no")))
                )
            )
            .await
    );
    let filters = [
        RunFilter::new(),
        RunFilter::new().limit(2),
        RunFilter::new().limit(0),
        RunFilter::new().workflow("orders"),
        RunFilter::new()
            .workflow("hooked")
            .status(RunStatus::Pending),
        RunFilter::new().status(RunStatus::Running),
        RunFilter::new().status(RunStatus::Failed),
        RunFilter::new().status(RunStatus::Cancelled),
        RunFilter::new().workflow("nope"),
    ];
    for f in &filters {
        note!(store.list_runs(f).await);
    }
    let hook_filters = [
        HookFilter::new(),
        HookFilter::new().limit(1),
        HookFilter::new().token("tok-3"),
        HookFilter::new().token("tok-1"),
        HookFilter::new().token("extra"),
        HookFilter::new().run_id(ids[5]),
        HookFilter::new().run_id(ids[5]).token("tok-3"),
    ];
    for f in &hook_filters {
        note!(store.list_hooks(f).await);
    }
    log
}

/// A run leased at admission is held like an acquired one: no other worker gets it while the
/// lease lives, its writes are accepted, and after expiry a takeover fences the old lease.
pub(crate) async fn leased_admission<S: Store>(store: &S) {
    let id = RunId::new();
    let run = NewRun {
        id,
        workflow: "leased".into(),
        input: json!([]),
        created_at: t(0),
        hook: None,
    };
    let (admission, lease) = store
        .create_run_leased(run, std::time::Duration::from_millis(1000))
        .await
        .unwrap();
    assert_eq!(admission, Admission::Admitted);
    let lease = lease.expect("this store leases at admission");
    assert_eq!(lease.epoch, 1);
    assert_eq!(
        store.get_run(&id).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    let acquire = |now: u64| AcquireRequest {
        worker_id: "other",
        workflows: &[],
        lease: std::time::Duration::from_millis(1000),
        limit: 10,
        now: t(now),
    };
    let names = names(&["leased"]);
    let req = |now| AcquireRequest {
        workflows: &names,
        ..acquire(now)
    };
    assert!(
        store.acquire(req(500)).await.unwrap().is_empty(),
        "the lease holds"
    );
    let step = NewEvent {
        at: t(600),
        event: Event::TimerFired {
            timer_id: "tmr_0".into(),
        },
    };
    store
        .append(&lease, ap(vec![step.clone()], None))
        .await
        .unwrap();
    let taken = store.acquire(req(1500)).await.unwrap();
    assert_eq!(taken.len(), 1, "taken over after expiry");
    assert_eq!(taken[0].lease.epoch, 2);
    assert!(matches!(
        store.append(&lease, ap(vec![step], None)).await,
        Err(StoreError::LeaseLost(_))
    ));
}
