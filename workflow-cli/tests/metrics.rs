//! `workflow web`'s `/metrics`: the store's runs by workflow and status, blocked runs, queue
//! depths and schedules in the Prometheus text format, behind the dashboard's guard. On SQLite
//! and PostgreSQL.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::http::{dashboard, get};
use common::{blocked_run, fixture, Backend};
use workflow_core::store::{NewRun, QueueDef, QueueEntry, RunFilter};
use workflow_core::RunId;

on_both_stores!(metrics_show_the_store_s_runs_queues_and_schedules);

#[workflow_core::workflow]
async fn metrics_tick(tick: workflow_core::ScheduleTick) -> workflow_core::Result<String> {
    Ok(format!("{:?}", tick.nominal))
}

/// The samples of `text`: `name{labels}` to value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample has a value");
            (series.to_owned(), value.parse().expect("a numeric value"))
        })
        .collect()
}

async fn metrics_show_the_store_s_runs_queues_and_schedules(b: Backend) {
    let f = fixture(b).await;
    blocked_run(&f, "metrics").await;
    f.rt.store()
        .define_queues(&[QueueDef {
            name: "mail \"out\"".to_owned(),
            concurrency: Some(2),
            rate_limit: None,
        }])
        .await
        .unwrap();
    // A run waiting in a queue no worker here serves (its workflow is not registered): the
    // queue's oldest waiting age counts from its admission, 30 s ago.
    f.rt.store()
        .define_queues(&[QueueDef {
            name: "held".to_owned(),
            concurrency: Some(1),
            rate_limit: None,
        }])
        .await
        .unwrap();
    let admitted = SystemTime::now() - Duration::from_secs(30);
    f.rt.store()
        .create_run(
            NewRun::new(
                RunId::new(),
                "elsewhere::not_here".to_owned(),
                serde_json::json!([]),
                admitted,
            )
            .queue(Some(QueueEntry::new("held"))),
        )
        .await
        .unwrap();
    let hourly = workflow_core::Schedule::every("hourly", metrics_tick, Duration::from_secs(3600));
    f.rt.create_schedule(hourly).await.unwrap();

    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let got = get(web.addr, "/metrics", &host);
    assert_eq!(got.status, 200, "{got:?}");
    let text = &got.body;
    assert!(text.contains("# TYPE workflow_runs gauge"), "{text}");
    let s = samples(text);

    // Every run of the store, counted by workflow and status, as the listing sees them.
    let runs = f.rt.runs(RunFilter::default().limit(1000)).await.unwrap();
    let mut expected: BTreeMap<String, f64> = BTreeMap::new();
    for r in &runs {
        let series = format!(
            "workflow_runs{{workflow=\"{}\",status=\"{}\"}}",
            r.workflow, r.status
        );
        *expected.entry(series).or_default() += 1.0;
    }
    let served: BTreeMap<String, f64> = s
        .iter()
        .filter(|(k, _)| k.starts_with("workflow_runs{"))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    assert_eq!(served, expected, "{text}");
    assert!(
        expected.keys().any(|k| k.contains("status=\"completed\"")),
        "{text}"
    );
    assert_eq!(s["workflow_blocked_runs"], 1.0, "{text}");

    // The queue's name is escaped in its label.
    assert_eq!(
        s[r#"workflow_queue_waiting{queue="mail \"out\""}"#], 0.0,
        "{text}"
    );
    assert_eq!(
        s[r#"workflow_queue_running{queue="mail \"out\""}"#], 0.0,
        "{text}"
    );

    assert_eq!(s[r#"workflow_queue_waiting{queue="held"}"#], 1.0, "{text}");
    let age = s[r#"workflow_queue_oldest_waiting_age_seconds{queue="held"}"#];
    assert!((29.0..3600.0).contains(&age), "{age}: {text}");
    assert!(
        !text.contains(r#"workflow_queue_oldest_waiting_age_seconds{queue="mail"#),
        "a queue where none waits has no age: {text}"
    );

    let next = s[r#"workflow_schedule_next_tick_timestamp_seconds{schedule="hourly"}"#];
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        next > now && next <= now + 3601.0,
        "{next} vs {now}: {text}"
    );
    assert_eq!(s[r#"workflow_schedule_paused{schedule="hourly"}"#], 0.0);

    // The dashboard's guard stands in front of it too.
    let foreign = get(web.addr, "/metrics", "evil.example");
    assert_eq!(foreign.status, 403);
}
