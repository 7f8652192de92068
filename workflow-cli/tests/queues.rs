//! `workflow queues` and `workflow runs --queue`: each queue's limits and occupancy, and the
//! queued runs with their positions, on SQLite and PostgreSQL.

mod common;

use std::time::Duration;

use common::{approval, cli, welcome, Backend, TestDb, WAIT};
use serde_json::Value;
use workflow_core::prelude::*;
use workflow_core::store::to_millis;

on_both_stores!(queues_show_limits_occupancy_and_positions);

async fn queues_show_limits_occupancy_and_positions(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .queue(
            Queue::new("payments")
                .concurrency(1)
                .rate_limit(100, Duration::from_secs(60)),
        )
        .queue(Queue::new("idle"))
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let store = db.args();

    // The first run takes the only slot and waits for its approval; three more queue up.
    let order = RunId::new().to_string();
    let token = format!("approval:{order}");
    let holder = rt
        .start(approval, (order,))
        .queue("payments")
        .await
        .unwrap();
    tokio::time::timeout(WAIT, async {
        while rt.get_hook_by_token(&token).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the first run began");
    let plain = rt
        .start(welcome, ("ada".to_string(),))
        .queue("payments")
        .partition_key("customer-7")
        .await
        .unwrap();
    let urgent = rt
        .start(welcome, ("bob".to_string(),))
        .queue("payments")
        .priority(5)
        .await
        .unwrap();
    let last = rt
        .start(welcome, ("cyd".to_string(),))
        .queue("payments")
        .await
        .unwrap();

    let table = cli(&store, &["runs", "--queue", "payments"]).await.ok();
    let first = table.lines().next().unwrap();
    assert_eq!(
        first, "queue payments: slots 1/1, rate 1/100 per 1m 00s; 3 waiting",
        "{table}"
    );
    let header = table.lines().nth(1).unwrap();
    assert!(
        header.contains("POSITION") && header.contains("KEY"),
        "{table}"
    );
    let row = |id: RunId| {
        table
            .lines()
            .find(|l| l.starts_with(&id.to_string()))
            .unwrap_or_else(|| panic!("no row for {id} in:\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row(holder.id())[2], "running", "{table}");
    assert_eq!(row(urgent.id())[2..4], ["pending", "1"], "{table}");
    assert_eq!(
        row(plain.id())[2..5],
        ["pending", "2", "customer-7"],
        "{table}"
    );
    assert_eq!(row(last.id())[2..4], ["pending", "3"], "{table}");

    let v = cli(&store, &["runs", "--queue", "payments", "--json"])
        .await
        .json();
    assert_eq!(v["queue"]["name"], "payments");
    assert_eq!(v["queue"]["concurrency"], 1);
    assert_eq!(v["queue"]["rate_limit"]["runs"], 100);
    assert_eq!(v["queue"]["rate_limit"]["period_ms"], 60_000);
    assert_eq!(
        (
            v["queue"]["occupied"].clone(),
            v["queue"]["waiting"].clone()
        ),
        (1.into(), 3.into())
    );
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    let position = |id: RunId| -> Value {
        runs.iter().find(|r| r["id"] == id.to_string()).unwrap()["position"].clone()
    };
    assert_eq!(position(urgent.id()), 1);
    assert_eq!(position(holder.id()), Value::Null);
    let urgent_run = runs
        .iter()
        .find(|r| r["id"] == urgent.id().to_string())
        .unwrap();
    assert_eq!(urgent_run["queue"]["priority"], 5);

    // A filter narrows the list, not the positions.
    let v = cli(
        &store,
        &["runs", "--queue", "payments", "--limit", "1", "--json"],
    )
    .await
    .json();
    assert_eq!(v["runs"][0]["id"], last.id().to_string());
    assert_eq!(v["runs"][0]["position"], 3);

    let queues = cli(&store, &["queues"]).await.ok();
    let payments = queues
        .lines()
        .find(|l| l.starts_with("payments"))
        .unwrap_or_else(|| panic!("{queues}"));
    let cells: Vec<&str> = payments.split_whitespace().collect();
    assert_eq!(
        cells,
        ["payments", "1", "100", "per", "1m", "00s", "1", "3"],
        "{queues}"
    );
    assert!(queues.lines().any(|l| l.starts_with("idle")), "{queues}");
    let json = cli(&store, &["queues", "--json"]).await.json();
    assert_eq!(json.as_array().unwrap().len(), 2);

    cli(&store, &["runs", "--queue", "nope"])
        .await
        .fails(1, "no queue \"nope\" is declared");

    // Approving the first run frees the slot: the others follow, the urgent one first.
    rt.resume_hook(&token, common::Approval { approved: true })
        .await
        .unwrap();
    let order = [
        ("holder", holder.id()),
        ("urgent", urgent.id()),
        ("plain", plain.id()),
        ("last", last.id()),
    ];
    for (_, run) in order {
        common::until_status(&rt, run, RunStatus::Completed).await;
    }
    // One slot: each run's history lies between the end of the one before it and the
    // beginning of the next, so the recorded times give the order they began in.
    let mut spans = Vec::new();
    for (name, run) in order {
        let events = rt.store().events(&run).await.unwrap();
        let first = to_millis(events.first().expect("a history").at);
        let last = to_millis(events.last().expect("a history").at);
        spans.push((name, first, last));
    }
    for pair in spans.windows(2) {
        let ((before, _, ended), (after, began, _)) = (pair[0], pair[1]);
        assert!(
            ended <= began,
            "{after} began before {before} ended; the order must be holder, urgent \
             (priority 5), then plain and last in start order. (run, first event, last \
             event) in ms: {spans:?}"
        );
    }
    let v = cli(&store, &["runs", "--queue", "payments", "--json"])
        .await
        .json();
    assert_eq!(
        (
            v["queue"]["occupied"].clone(),
            v["queue"]["waiting"].clone()
        ),
        (0.into(), 0.into())
    );
}
