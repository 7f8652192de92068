//! The fan-out example: three child runs priced and added up, and a delayed start that is
//! pending until its time.

#[allow(dead_code)]
#[path = "../fan_out.rs"]
mod fan_out;

use std::time::Duration;

use workflow_core::{RunStatus, Runtime};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_are_priced_and_the_reminder_waits_for_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .sqlite(dir.path().join("fan_out.db"))
        .build()
        .await
        .unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        fan_out::demo(&rt, Duration::from_millis(300)),
    )
    .await
    .expect("the demo finished in time")
    .unwrap();
    // apple, fig, banana: 5 + 3 + 6 letters at 100 each.
    assert_eq!(out.total, 1_400);
    assert_eq!(out.children, 3, "one child run per item");
    assert_eq!(out.reminder_before, RunStatus::Pending);
    assert_eq!(out.reminder, "reminded ana");
}
