//! The exported history format is a promise to the files users keep: a history
//! exported by version 1 of the format, committed as `tests/fixtures/history-v1.json`, must
//! stay readable and replay against the same workflow in every later build. The fixture holds
//! every kind of event a run records: steps, a failed attempt and its retry, a durable timer,
//! a hook with a payload, a patch marker, and a failed run re-opened with `retry()`.
//!
//! To write the fixture again (only when the format's version changes; keep the old file):
//! `cargo test -p workflow-core --features testing --test history_format -- --ignored write_fixture`.
#![cfg(feature = "testing")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;
use workflow_core::prelude::*;
use workflow_core::testing::{replay, ReplayError};
use workflow_core::{ExportedHistory, HISTORY_FORMAT_VERSION};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/history-v1.json"
);

// Names are pinned so that the fixture does not depend on this file's name.
#[step(name = "fixture.reserve")]
async fn reserve(item: String) -> Result<u64> {
    Ok(item.len() as u64)
}

/// Fails its first attempt: the history records the failure and the retry.
#[step(name = "fixture.charge", max_retries = 2)]
async fn charge(amount: u64) -> Result<String> {
    if step_metadata().attempt == 1 {
        return Err(Error::retryable("the card network timed out"));
    }
    Ok(format!("receipt-{amount}"))
}

/// Set while the fixture is written: the first call fails for good, so the run fails and is
/// re-opened with `retry()`.
static SHIPPING_DOWN: AtomicBool = AtomicBool::new(false);

#[step(name = "fixture.ship", max_retries = 0)]
async fn ship(item: String) -> Result<String> {
    if SHIPPING_DOWN.swap(false, Ordering::SeqCst) {
        return Err(Error::fatal("the shipping service refused the parcel"));
    }
    Ok(format!("shipped {item}"))
}

#[workflow(name = "fixture.order")]
async fn fixture_order(item: String, token: String) -> Result<String> {
    let units = reserve(item.clone()).await?;
    let receipt = charge(units * 100).await?;
    sleep(Duration::from_millis(20)).await;
    let approver = {
        let mut approval = create_hook::<String>(token);
        approval.recv().await?
    };
    let express = patched("express-shipping");
    let shipped = ship(item).await?;
    Ok(format!(
        "{receipt}, approved by {approver}, {shipped}{}",
        if express { " (express)" } else { "" }
    ))
}

fn fixture() -> Value {
    let text = std::fs::read_to_string(FIXTURE).expect("the fixture is committed");
    serde_json::from_str(&text).expect("the fixture is JSON")
}

#[test]
fn history_v1_fixture_replays_against_this_build() {
    let history = fixture();
    assert_eq!(history["version"], 1);
    let kinds: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["type"].as_str().unwrap())
        .collect();
    for kind in [
        "step_scheduled",
        "step_attempt_failed",
        "step_attempt_started",
        "step_completed",
        "timer_scheduled",
        "timer_fired",
        "hook_registered",
        "hook_received",
        "hook_released",
        "patch_marked",
        "run_failed",
        "run_retried",
        "run_completed",
    ] {
        assert!(
            kinds.contains(&kind),
            "the fixture has no {kind}: {kinds:?}"
        );
    }
    ExportedHistory::from_json(&history).expect("this build reads format version 1");
    if let Err(e) = replay(fixture_order, &history) {
        panic!("{FIXTURE}: {e}");
    }

    // And the check has teeth: a history whose first step is another one does not fit.
    let mut changed = history.clone();
    changed["events"][0]["event"]["name"] = "fixture.unreserve".into();
    match replay(fixture_order, &changed) {
        Err(ReplayError::Diverged { event: 1, .. }) => {}
        other => panic!("expected a divergence at event 1, got {other:?}"),
    }
    let err = replay(fixture_order, &changed).unwrap_err();
    let d = err.divergence().expect("the divergence, as data");
    assert_eq!(d.event, 1);
    assert!(
        d.expected.contains("fixture.unreserve") && !d.found.contains("fixture.unreserve"),
        "{d:?}"
    );
    assert!(err.to_string().ends_with(&d.to_string()), "{err}");
}

#[test]
fn newer_versions_and_other_formats_are_refused() {
    let mut newer = fixture();
    newer["version"] = (HISTORY_FORMAT_VERSION + 1).into();
    let err = ExportedHistory::from_json(&newer).unwrap_err();
    assert!(err.contains("newer than this build reads"), "{err}");
    assert!(matches!(
        replay(fixture_order, &newer),
        Err(ReplayError::Invalid(_))
    ));

    let mut other = fixture();
    other["format"] = "someone-else/history".into();
    let err = ExportedHistory::from_json(&other).unwrap_err();
    assert!(err.contains("format is"), "{err}");
    assert!(matches!(
        replay(fixture_order, &other),
        Err(ReplayError::Invalid(_))
    ));
}

/// Writes the fixture from a run on the in-memory store.
#[tokio::test]
#[ignore = "writes tests/fixtures/history-v1.json; run by hand when the format changes"]
async fn write_fixture() {
    let rt = Runtime::builder()
        .in_memory()
        .retry_backoff(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    SHIPPING_DOWN.store(true, Ordering::SeqCst);
    let token = "approval:order-7".to_string();
    let run = rt
        .start(fixture_order, ("lamp".to_string(), token.clone()))
        .await
        .unwrap();
    while rt.resume_hook(&token, "ada").await.is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let err = run.return_value().await.unwrap_err();
    assert!(err.to_string().contains("shipping"), "{err}");
    run.retry().await.unwrap();
    let out = run.return_value().await.unwrap();
    assert_eq!(out, "receipt-400, approved by ada, shipped lamp (express)");
    let history = run.export().await.unwrap();
    let text = serde_json::to_string_pretty(&history).unwrap() + "\n";
    std::fs::create_dir_all(std::path::Path::new(FIXTURE).parent().unwrap()).unwrap();
    std::fs::write(FIXTURE, text).unwrap();
}
