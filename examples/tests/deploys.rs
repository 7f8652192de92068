//! The deploys example: a run failed on a bug, retried after the fix without repeating its
//! recorded step, and forked from its first step.

#[allow(dead_code)]
#[path = "../deploys.rs"]
mod deploys;

use std::time::Duration;

use workflow_core::Runtime;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_is_retried_after_the_fix_and_forked() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .sqlite(dir.path().join("deploys.db"))
        .retry_backoff(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), deploys::demo(&rt))
        .await
        .expect("the demo finished in time")
        .unwrap();
    assert!(out.failed_with.contains("euros"), "{out:?}");
    assert_eq!(out.retried, "R-o-7: charged 4200 cents");
    assert_eq!(out.forked, out.retried);
    // The retry went on from the failed charge and the fork copied the reservation: it was
    // made once. Both the retried run and the fork reached the receipt live.
    assert_eq!(out.reservations, 1, "{out:?}");
    assert_eq!(out.receipts, 2, "{out:?}");
}
