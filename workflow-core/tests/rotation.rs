//! Key rotation across processes, on SQLite and PostgreSQL (the memory store lives
//! in one process; `encryption.rs` rotates in one process on every store): worker process A,
//! with the old key only, starts runs that wait on hooks; process C, with the new key only,
//! takes them once A is gone and leaves them blocked with their histories unchanged, naming
//! the old key; process B, with the new key current and the old one kept, finishes them,
//! sealing what it adds under the new key; `rekey` then leaves nothing under the old key and
//! a client with the new key alone reads every result.
#![cfg(any(feature = "sqlite", feature = "postgres"))]

mod common;

use std::io::Write;
use std::time::Duration;

use common::{until_status, Place, Worker};
use workflow_core::prelude::*;
use workflow_core::store::Event;
use workflow_core::RekeyOptions;

const KEY_A: [u8; 32] = [0xa1; 32];
const KEY_B: [u8; 32] = [0xb2; 32];
const RUNS: usize = 3;
const LEASE: Duration = Duration::from_millis(800);
const LIMIT: Duration = Duration::from_secs(120);
/// How long a child process may take to say it is ready.
const READY: Duration = Duration::from_secs(30);

fn keys(which: &str) -> Keys {
    match which {
        "a" => Keys::new().current("key-A", KEY_A),
        "b" => Keys::new().current("key-B", KEY_B),
        _ => Keys::new().current("key-B", KEY_B).old("key-A", KEY_A),
    }
}

#[step]
async fn rot_step(s: String) -> Result<String> {
    Ok(format!("{s}-step"))
}

#[workflow]
async fn rot_wait(s: String, token: String) -> Result<String> {
    let r = rot_step(s).await?;
    let mut hook = create_hook::<String>(token);
    let p = hook.recv().await?;
    Ok(format!("{r}|{p}"))
}

/// A worker process with the keys `WF_KEYS` names; with `WF_START=n` it starts `n` runs of
/// `rot_wait` and prints their ids (`RUN <id> <token>`) before `READY`.
#[test]
#[ignore]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let which = std::env::var("WF_KEYS").unwrap();
        let worker = Place::from_env()
            .builder()
            .encryption(keys(&which))
            .worker(true)
            .lease(LEASE)
            .poll_interval(Duration::from_millis(50))
            .retry_backoff(Duration::from_millis(10))
            .build()
            .await
            .expect("worker runtime");
        let start: usize = std::env::var("WF_START")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        for i in 0..start {
            let token = format!("rot-{i}-{}", RunId::new());
            let run = worker
                .start(rot_wait, (format!("secret{i}"), token.clone()))
                .await
                .expect("start");
            println!("RUN {} {token}", run.id());
        }
        println!("READY");
        std::io::stdout().flush().unwrap();
        std::future::pending::<()>().await;
    });
}

fn spawn(place: &Place, which: &str, start: usize) -> Worker {
    let mut env: Vec<(&str, String)> = place.env();
    env.push(("WF_KEYS", which.to_owned()));
    env.push(("WF_START", start.to_string()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Worker::spawn(&env)
}

async fn rotation(place: Place) {
    let a = spawn(&place, "a", RUNS);
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let line = a.line("RUN ", READY);
        let (id, token) = line.split_once(' ').expect("RUN <id> <token>");
        runs.push((id.parse::<RunId>().unwrap(), token.to_owned()));
    }
    a.line("READY", READY);
    // A client without keys: it reads statuses and histories, not payloads.
    let watcher = place.builder().worker(false).build().await.unwrap();
    for (id, _) in &runs {
        loop {
            let events = watcher.store().events(id).await.unwrap();
            if events
                .iter()
                .any(|e| matches!(e.event, Event::HookRegistered { .. }))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    a.kill();
    let mut before = Vec::new();
    for (id, _) in &runs {
        before.push(watcher.store().events(id).await.unwrap());
    }

    // The new key only: the runs wait blocked, unchanged, naming the old key.
    let c = spawn(&place, "b", 0);
    c.line("READY", READY);
    for ((id, _), before) in runs.iter().zip(&before) {
        let blocked = until_status(&watcher, *id, RunStatus::Blocked).await;
        let why = blocked.error.expect("a blocked run says why").to_string();
        assert!(why.contains("key \"key-A\""), "{why}");
        assert_eq!(&watcher.store().events(id).await.unwrap(), before);
    }
    c.kill();

    // The new key current and the old one kept: the runs finish, new payloads under B.
    let b = spawn(&place, "ba", 0);
    b.line("READY", READY);
    let client = place
        .builder()
        .encryption(keys("ba"))
        .worker(false)
        .build()
        .await
        .unwrap();
    for (i, (id, token)) in runs.iter().enumerate() {
        client.resume_hook(token, format!("hook{i}")).await.unwrap();
        // Handed to a worker now rather than after its block's backoff.
        let _ = client.get_run(id).retry().await;
    }
    for (i, ((id, _), before)) in runs.iter().zip(&before).enumerate() {
        let out = client
            .get_run(id)
            .typed::<String>()
            .return_value()
            .await
            .unwrap();
        assert_eq!(out, format!("secret{i}-step|hook{i}"));
        let events = client.store().events(id).await.unwrap();
        let Some(Event::RunCompleted { output }) = events.last().map(|e| &e.event) else {
            panic!("run {id} ends completed: {events:?}");
        };
        assert_eq!(
            common::stored::sealed_key(output),
            Some("key-B"),
            "new payloads are sealed with the new key: {output}"
        );
        let old = before.iter().find_map(|e| match &e.event {
            Event::StepCompleted { result: Ok(v), .. } => common::stored::sealed_key(v),
            _ => None,
        });
        assert_eq!(old, Some("key-A"));
    }
    b.kill();

    let report = client.rekey(RekeyOptions::new()).await.unwrap();
    println!(
        "rotation on {}: rekey rewrote {} payloads in {} rows, {} already current",
        place.name(),
        report.rewritten(),
        report.rows_rewritten,
        report.current()
    );
    assert!(report.complete() && report.rewritten() > 0, "{report:?}");
    let b_only = place
        .builder()
        .encryption(keys("b"))
        .worker(false)
        .build()
        .await
        .unwrap();
    for (i, (id, _)) in runs.iter().enumerate() {
        let out = b_only.get_run(id).typed::<String>().return_value().await;
        assert_eq!(out.unwrap(), format!("secret{i}-step|hook{i}"));
        let events = b_only.store().events(id).await.unwrap();
        assert!(!format!("{events:?}").contains("key-A"), "{events:?}");
    }
}

fn bounded<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(LIMIT, f)
            .await
            .unwrap_or_else(|_| panic!("rotation test timed out after {LIMIT:?}"))
    })
}

#[cfg(feature = "sqlite")]
#[test]
fn rotation_across_processes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    bounded(rotation(Place::Sqlite {
        path: dir.path().join("wf.db"),
    }));
}

#[cfg(feature = "postgres")]
#[test]
fn rotation_across_processes_on_postgres() {
    use workflow_core::store::postgres::PostgresStore;

    let Some(url) = common::postgres_url() else {
        return;
    };
    let schema = common::fresh_schema();
    bounded(async {
        if !common::postgres_reachable(&url, &schema).await {
            return;
        }
        rotation(Place::Postgres {
            url: url.clone(),
            schema: schema.clone(),
        })
        .await;
        if let Ok(s) = PostgresStore::connect(&url, &schema).await {
            let _ = s.drop_schema().await;
        }
    });
}
