//! `workflow schedules`: every schedule with its workflow, spec, state and last and next
//! nominal times, as a table and as JSON, on SQLite and PostgreSQL.

mod common;

use std::time::Duration;

use common::{cli, Backend, TestDb};
use workflow_core::prelude::*;

#[workflow(name = "cli.nightly")]
async fn nightly(tick: ScheduleTick) -> Result<()> {
    let _ = tick;
    Ok(())
}

on_both_stores!(
    schedules_are_listed_with_their_spec_state_and_times,
    a_schedule_is_shown_paused_resumed_triggered_and_backfilled,
);

async fn schedules_are_listed_with_their_spec_state_and_times(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .worker(false)
        .schedule(
            Schedule::cron("nightly", nightly, "0 2 * * *")
                .unwrap()
                .timezone("Europe/Paris")
                .unwrap(),
        )
        .schedule(Schedule::every(
            "hourly",
            nightly,
            Duration::from_secs(3600),
        ))
        .build()
        .await
        .unwrap();
    rt.pause_schedule("hourly").await.unwrap();
    rt.trigger_schedule("nightly").await.unwrap();
    let store = db.args();

    let table = cli(&store, &["schedules"]).await.ok();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    for h in ["SCHEDULE", "WORKFLOW", "SPEC", "STATE", "LAST", "NEXT"] {
        assert!(lines[0].contains(h), "{table}");
    }
    assert!(lines[1].starts_with("hourly"), "{table}");
    assert!(
        lines[1].contains("paused") && lines[1].contains("every 1h"),
        "{table}"
    );
    assert!(lines[2].starts_with("nightly"), "{table}");
    assert!(
        lines[2].contains("0 2 * * * (Europe/Paris)") && lines[2].contains("active"),
        "{table}"
    );

    let json = cli(&store, &["--json", "schedules"]).await.json();
    let list = json.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[1]["name"], "nightly");
    assert_eq!(list[1]["workflow"], "cli.nightly");
    assert_eq!(list[1]["paused"], false);
    assert!(list[1]["last"].as_str().unwrap().ends_with('Z'));
    assert!(list[1]["next"].as_str().unwrap().ends_with(":00:00.000Z"));
    assert_eq!(list[0]["paused"], true);
    assert!(list[0]["last"].is_null());
}

async fn a_schedule_is_shown_paused_resumed_triggered_and_backfilled(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .worker(false)
        .schedule(Schedule::every(
            "hourly",
            nightly,
            Duration::from_secs(3600),
        ))
        .build()
        .await
        .unwrap();
    let store = db.args();

    let shown = cli(&store, &["schedule", "hourly"]).await.ok();
    assert!(
        shown.starts_with("schedule hourly: cli.nightly active, never ticked"),
        "{shown}"
    );
    assert!(
        shown.contains("every 1h") && shown.contains("no ticks yet"),
        "{shown}"
    );
    let json = cli(&store, &["--json", "schedule", "hourly"]).await.json();
    let upcoming = json["upcoming"].as_array().unwrap();
    assert_eq!(upcoming.len(), 5);
    assert!(upcoming
        .iter()
        .all(|t| t.as_str().unwrap().ends_with(":00:00.000Z")));

    assert_eq!(
        cli(&store, &["schedule", "hourly", "pause"]).await.ok(),
        "paused hourly\n"
    );
    assert!(rt.schedules().await.unwrap()[0].paused);
    assert_eq!(
        cli(&store, &["schedule", "hourly", "resume"]).await.ok(),
        "resumed hourly\n"
    );
    assert!(!rt.schedules().await.unwrap()[0].paused);

    let triggered = cli(&store, &["--json", "schedule", "hourly", "trigger"])
        .await
        .json();
    let run: RunId = triggered["run_id"].as_str().unwrap().parse().unwrap();
    let ticks = rt.schedule_ticks("hourly", 10).await.unwrap();
    assert_eq!(ticks[0].run_id, Some(run));

    let backfill = [
        "schedule",
        "hourly",
        "backfill",
        "--from",
        "2026-01-01T00:00:00Z",
        "--to",
        "2026-01-01T02:00:00Z",
    ];
    assert_eq!(cli(&store, &backfill).await.ok(), "started 3 run(s)\n");
    assert_eq!(cli(&store, &backfill).await.ok(), "started 0 run(s)\n");
    let shown = cli(&store, &["schedule", "hourly"]).await.ok();
    assert!(
        shown.contains("2026-01-01T02:00:00.000Z  started"),
        "{shown}"
    );

    cli(&store, &["schedule", "nope", "pause"])
        .await
        .fails(1, "no schedule is named \"nope\"");
    let bad = [
        "schedule",
        "hourly",
        "backfill",
        "--from",
        "yesterday",
        "--to",
        "today",
    ];
    cli(&store, &bad).await.fails(
        2,
        "invalid value 'yesterday' for '--from <TIME>': not an RFC 3339 time such as \
         2026-01-01T00:00:00Z",
    );
}
