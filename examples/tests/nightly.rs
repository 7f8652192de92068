//! The nightly example (`cargo run --example nightly`): the heartbeat starts one run per
//! second, and a backfill of the last three nights starts their reports, then none when
//! repeated.

#[allow(dead_code)]
#[path = "../nightly.rs"]
mod nightly;

use std::time::Duration;

use workflow_core::{Runtime, TickOutcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_ticks_and_a_backfill_starts_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut builder = Runtime::builder().sqlite(dir.path().join("reports.db"));
    for s in nightly::schedules().unwrap() {
        builder = builder.schedule(s);
    }
    let rt = builder.build().await.unwrap();
    let (beats, first, again) =
        tokio::time::timeout(Duration::from_secs(60), nightly::demo(&rt, 3))
            .await
            .expect("the heartbeat ticked in time")
            .unwrap();
    assert!(
        beats
            .iter()
            .filter(|t| t.outcome == TickOutcome::Started)
            .count()
            >= 3
    );
    // Three nights, or four when a DST change shortened one of the days in the span.
    assert!((3..=4).contains(&first), "{first}");
    assert_eq!(again, 0);
    let nightly = rt.schedule_ticks("nightly", 10).await.unwrap();
    assert_eq!(nightly.len(), first);
    for t in nightly {
        assert!(t.backfill);
        let report = rt.get_run(&t.run_id.unwrap()).return_value().await.unwrap();
        assert!(
            report.as_str().unwrap().ends_with("(backfilled)"),
            "{report}"
        );
    }
    rt.shutdown();
}
