//! Continue-as-new under SIGKILL-like crashes, with real processes (SQLite and PostgreSQL):
//! this test binary re-executes itself as a worker (`child_main`) armed with the failpoint
//! `continue_as_new.before_commit`, which aborts the process after the run decided to
//! continue and before the store call that commits it. A second worker takes the run over:
//! nothing is lost and exactly one next run is admitted per continuation.

mod common;

use std::time::Duration;

use common::{bounded, Place, Worker};
use workflow_core::prelude::*;
use workflow_core::store::{Event, RunFilter};
use workflow_core::testing::FAILPOINT_ENV;
use workflow_core::HookError;

const LEASE: Duration = Duration::from_millis(500);

/// Each run receives one message on "m"; `left` more runs follow.
#[workflow]
async fn crash_chain(left: u32, mut got: Vec<String>) -> Result<Vec<String>> {
    got.push(recv::<String>("m").await?);
    if left == 0 {
        return Ok(got);
    }
    continue_as_new(crash_chain, (left - 1, got)).await
}

/// Hands a batch on (takes a few milliseconds, as a write elsewhere would).
#[step]
async fn hand_on(batch: u32) -> Result<u32> {
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(batch)
}

/// Run `k` of a chain receives payloads on `token` until it has `per_run * (k + 1)` of them
/// (or `total`), hands the batch on (payloads keep arriving meanwhile), then continues as run
/// `k + 1`; the run that has `total` returns them all.
#[workflow]
async fn streamed_chain(
    token: String,
    k: u32,
    per_run: u32,
    total: u32,
    mut got: Vec<u32>,
) -> Result<Vec<u32>> {
    let mut hook = create_hook::<u32>(token.clone());
    let until = (per_run * (k + 1)).min(total) as usize;
    while got.len() < until {
        got.push(hook.recv().await?);
    }
    if got.len() == total as usize {
        return Ok(got);
    }
    hand_on(k).await?;
    continue_as_new(streamed_chain, (token, k + 1, per_run, total, got)).await
}

/// The worker process: a worker runtime on the store named in its environment.
#[test]
#[ignore = "entry point of the worker processes the chain crash tests spawn"]
fn child_main() {
    common::serve_worker(|b| {
        b.worker(true)
            .lease(LEASE)
            .poll_interval(Duration::from_millis(20))
            .retry_backoff(Duration::from_millis(10))
    });
}

async fn killed_at_the_seam(place: Place) {
    let client = place
        .builder()
        .worker(false)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let run = client.start(crash_chain, (2, Vec::new())).await.unwrap();
    for i in 0..3 {
        run.send("m", format!("m{i}")).await.unwrap();
    }
    let env = place.env();
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push((FAILPOINT_ENV, "continue_as_new.before_commit"));
    // Dies at the first seam: after the decision, before its commit.
    let mut doomed = Worker::spawn(&env);
    let status = doomed.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "the armed worker aborted at the seam");
    let first = run.info().await.unwrap();
    assert_eq!(first.next_run, None, "nothing of the seam committed");
    assert_ne!(first.status, RunStatus::ContinuedAsNew);
    let all = client.runs(RunFilter::new().limit(100)).await.unwrap();
    assert_eq!(all.len(), 1, "no next run was admitted: {all:?}");

    // Another worker takes the run over once the dead one's lease expires.
    env.pop();
    let _survivor = Worker::spawn(&env);
    let got = run.return_value().await.unwrap();
    assert_eq!(got, vec!["m0", "m1", "m2"], "every message once, in order");
    let all = client.runs(RunFilter::new().limit(100)).await.unwrap();
    assert_eq!(
        all.len(),
        3,
        "exactly one next run per continuation: {all:?}"
    );
    let mut id = Some(run.id());
    let mut received = Vec::new();
    let mut links = 0;
    while let Some(i) = id {
        let r = client.get_run(&i).info().await.unwrap();
        for e in client.store().events(&i).await.unwrap() {
            if let Event::MessageReceived { payload, .. } = e.event {
                received.push(payload.as_str().unwrap_or_default().to_owned());
            }
        }
        if let Some(next) = r.next_run {
            let n = client.get_run(&next).info().await.unwrap();
            assert_eq!(n.previous_run, Some(i));
            links += 1;
        }
        id = r.next_run;
    }
    assert_eq!(links, 2);
    assert_eq!(received, vec!["m0", "m1", "m2"]);
}

/// 1,000 payloads streamed to a chain's token while its workers are SIGKILLed one after
/// another, at random points and once exactly at a seam (before its commit): every payload is
/// received exactly once, in send order, by some run of the chain.
async fn payloads_streamed_through_killed_seams(place: Place) {
    const TOTAL: u32 = 1_000;
    let client = place
        .builder()
        .worker(false)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let token = format!("stream-{}", RunId::new());
    let run = client
        .start(streamed_chain, (token.clone(), 0, 25, TOTAL, Vec::new()))
        .hook(&token)
        .await
        .unwrap();
    let sender = {
        let (client, token) = (client.clone(), token.clone());
        tokio::spawn(async move {
            for i in 0..TOTAL {
                let mut tries = 0;
                loop {
                    match client.resume_hook(&token, i).await {
                        Ok(_) => break,
                        Err(HookError::NotFound(e)) => {
                            panic!("payload {i}: the chain lost its token: {e}")
                        }
                        Err(e) => {
                            tries += 1;
                            assert!(tries < 50, "payload {i}: {e}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                if i % 10 == 9 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        })
    };
    let env = place.env();
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut kills = 0;
    // Workers killed after 150 to 450 ms of work, each a little longer than the last.
    for i in 0..6u64 {
        let w = Worker::spawn(&env);
        w.line("READY", Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(150 + 50 * i)).await;
        w.kill();
        kills += 1;
    }
    // One dies exactly at a seam, after the decision and before its commit.
    env.push((FAILPOINT_ENV, "continue_as_new.before_commit"));
    let mut doomed = Worker::spawn(&env);
    let status = tokio::task::block_in_place(|| doomed.wait_exit(Duration::from_secs(60)));
    assert!(!status.success(), "the armed worker aborted at a seam");
    kills += 1;
    env.pop();
    let _survivor = Worker::spawn(&env);
    let got = run.return_value().await.unwrap();
    sender.await.unwrap();
    assert_eq!(got.len(), TOTAL as usize, "every payload received");
    assert_eq!(
        got,
        (0..TOTAL).collect::<Vec<_>>(),
        "each payload exactly once, in send order"
    );
    let mut id = Some(run.id());
    let (mut runs, mut deliveries) = (0, 0);
    while let Some(i) = id {
        runs += 1;
        deliveries += client
            .store()
            .events(&i)
            .await
            .unwrap()
            .iter()
            .filter(|e| matches!(e.event, Event::HookReceived { .. }))
            .count();
        id = client.get_run(&i).info().await.unwrap().next_run;
    }
    assert_eq!(runs, TOTAL.div_ceil(25), "one run per 25 payloads");
    assert_eq!(
        deliveries, TOTAL as usize,
        "each payload recorded by one run"
    );
    // Stays in the test's output (`--nocapture`) as the run's figures.
    eprintln!(
        "{}: {TOTAL} payloads received once each in order by {runs} runs, {deliveries} \
         deliveries recorded, {kills} workers killed",
        place.name()
    );
}

/// Runs `case` on a fresh SQLite file.
#[cfg(feature = "sqlite")]
fn on_sqlite<F: std::future::Future<Output = ()>>(case: impl FnOnce(Place) -> F) {
    let dir = tempfile::tempdir().unwrap();
    let place = Place::Sqlite {
        path: dir.path().join("wf.db"),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(bounded(case(place)));
}

/// Runs `case` in a fresh PostgreSQL schema, dropped after it (skipped, or failed under
/// `CI=true`, without a database).
#[cfg(feature = "postgres")]
fn on_postgres<F: std::future::Future<Output = ()>>(case: impl FnOnce(Place) -> F) {
    use workflow_core::store::postgres::PostgresStore;

    let Some(url) = common::postgres_url() else {
        return;
    };
    let schema = common::fresh_schema();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(bounded(async {
        if !common::postgres_reachable(&url, &schema).await {
            return;
        }
        let place = Place::Postgres {
            url: url.clone(),
            schema: schema.clone(),
        };
        case(place).await;
        if let Ok(s) = PostgresStore::connect(&url, &schema).await {
            let _ = s.drop_schema().await;
        }
    }));
}

#[cfg(feature = "sqlite")]
#[test]
fn payloads_streamed_through_killed_seams_on_sqlite() {
    on_sqlite(payloads_streamed_through_killed_seams);
}

#[cfg(feature = "postgres")]
#[test]
fn payloads_streamed_through_killed_seams_on_postgres() {
    on_postgres(payloads_streamed_through_killed_seams);
}

#[cfg(feature = "sqlite")]
#[test]
fn sigkill_at_the_seam_on_sqlite() {
    on_sqlite(killed_at_the_seam);
}

#[cfg(feature = "postgres")]
#[test]
fn sigkill_at_the_seam_on_postgres() {
    on_postgres(killed_at_the_seam);
}
