//! The poller example: a chain of runs, each with a history bounded by one batch of polls,
//! that keeps its cursor and its control hook from run to run.

#[allow(dead_code)]
#[path = "../poller.rs"]
mod poller;

use workflow_core::{RunStatus, Runtime};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_continues_with_its_cursor_and_bounded_histories() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .sqlite(dir.path().join("poller.db"))
        .build()
        .await
        .unwrap();
    let ((cursor, commands), chain) =
        tokio::time::timeout(std::time::Duration::from_secs(90), poller::demo(&rt, 5))
            .await
            .expect("the poller finished in time")
            .unwrap();
    assert_eq!(cursor, 5 * u64::from(poller::ROUNDS_PER_RUN) * 3);
    assert_eq!(
        commands, 2,
        "the pause and the resume, whichever run got them"
    );
    assert_eq!(chain.len(), 5);
    let longest = chain.iter().map(|l| l.events).max().unwrap();
    let shortest = chain.iter().map(|l| l.events).min().unwrap();
    // Each run records its own polls only: no history grows with the chain.
    assert!(longest <= 8 * poller::ROUNDS_PER_RUN as usize, "{chain:?}");
    assert!(shortest > 0);
    for (i, link) in chain.iter().enumerate() {
        let want = if i + 1 == chain.len() {
            RunStatus::Completed
        } else {
            RunStatus::ContinuedAsNew
        };
        assert_eq!(link.status, want, "{chain:?}");
    }
}
