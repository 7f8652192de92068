//! A runtime lives as long as its user holds a handle on it: dropping the last one
//! stops its worker, and `workflow_core::api` outside steps then finds the most recently built
//! runtime still held, or none. A binary of its own, since `api` sees every runtime of the
//! process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use workflow_core::api;
use workflow_core::prelude::*;
use workflow_core::store::memory::MemoryStore;
use workflow_core::RunError;

#[workflow]
async fn waits_for(token: String) -> Result<String> {
    create_hook::<String>(token).recv().await
}

#[workflow]
async fn plus_one(n: u32) -> Result<u32> {
    Ok(n + 1)
}

const LEASE: Duration = Duration::from_millis(300);

fn on(store: &MemoryStore) -> workflow_core::RuntimeBuilder {
    Runtime::builder()
        .store(store.clone())
        .lease(LEASE)
        .poll_interval(Duration::from_millis(20))
}

/// Polls `done` for up to 20 s.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_handle_stops_the_runtime_and_hides_it_from_api() {
    assert!(api::get_run(&RunId::new()).is_err(), "no runtime built yet");

    // An older runtime on a store of its own, still held throughout.
    let kept_store = MemoryStore::new();
    let kept = on(&kept_store).build().await.unwrap();
    let kept_run = kept.start(plus_one, (1,)).await.unwrap();
    assert_eq!(kept_run.return_value().await.unwrap(), 2);

    // The runtime to drop, driving a run that waits for a payload.
    let db = MemoryStore::new();
    let rt = on(&db).build().await.unwrap();
    let run = rt.start(waits_for, ("t".to_owned(),)).await.unwrap();
    let id = run.id();
    while rt.get_hook_by_token("t").await.is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(rt.active_runs(), 1);
    assert_eq!(
        api::get_run(&id).unwrap().status().await.unwrap(),
        RunStatus::Running,
        "api finds the most recently built runtime"
    );
    // Only the runtime's shared state holds the store it wrapped: once that is gone, every
    // loop and driver of the runtime has ended.
    let wrapped = Arc::downgrade(rt.store());
    let clone = rt.clone();
    drop(rt);
    assert_eq!(
        api::get_run(&id).unwrap().status().await.unwrap(),
        RunStatus::Running,
        "a clone still holds the runtime"
    );
    drop((clone, run));

    // `api` now finds the older runtime, which does not know the run.
    let found = api::get_run(&id).expect("the older runtime is still held");
    assert!(matches!(
        found.status().await,
        Err(RunError::NotFound(missing)) if missing == id
    ));
    eventually("the dropped runtime's loops and driver ended", || {
        wrapped.upgrade().is_none()
    })
    .await;

    // Nothing of the dropped runtime executes runs any more: a run admitted by a client-only
    // runtime on the same store stays pending.
    let client = on(&db).worker(false).build().await.unwrap();
    let pending = client.start(plus_one, (41,)).await.unwrap();
    tokio::time::sleep(LEASE * 2).await;
    assert_eq!(pending.status().await.unwrap(), RunStatus::Pending);

    // A new worker takes both over: the waiting run once the dropped runtime's lease expired
    // (it sent no heartbeat since).
    let worker = on(&db).build().await.unwrap();
    assert_eq!(pending.return_value().await.unwrap(), 42);
    client.resume_hook("t", "late").await.unwrap();
    let took_over = client.get_run(&id).typed::<String>();
    assert_eq!(took_over.return_value().await.unwrap(), "late");

    // Every handle gone: `api` finds no runtime at all.
    drop((kept, kept_run, found, client, pending, took_over, worker));
    let err = api::get_run(&id).unwrap_err();
    assert!(err.to_string().contains("no workflow runtime"), "{err}");
    assert!(matches!(
        api::start(plus_one, (1,)),
        Err(StartError::NoRuntime)
    ));
}
