//! Delayed starts and run versions as an operator sees them: `workflow runs`
//! and `workflow run` show a delayed run as "pending, starts at <time>" and each run's
//! version, `--version` filters the listing, and the dashboard's runs page and run page show
//! the same. Every test runs on SQLite and on PostgreSQL.

mod common;

use std::time::Duration;

use common::http::{dashboard, get};
use common::{cli, welcome, Backend, TestDb};

on_both_stores!(delayed_runs_and_versions_show_in_the_cli_and_the_dashboard);

/// The run ids a runs page lists, in its order.
fn listed_ids(body: &str) -> Vec<String> {
    body.split("data-run-id=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

async fn delayed_runs_and_versions_show_in_the_cli_and_the_dashboard(b: Backend) {
    let db = TestDb::new(b);
    let old = db
        .builder()
        .version("3.2.0")
        .retry_backoff(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let done = old.start(welcome, ("ada".to_owned(),)).await.unwrap();
    // `welcome` fails its first attempt: its retry waits for the backoff.
    tokio::time::timeout(common::WAIT, done.return_value())
        .await
        .expect("the run ended in time")
        .unwrap();
    old.shutdown();
    drop(old);
    let rt = db.builder().version("3.2.1").build().await.unwrap();
    let delayed = rt
        .start(welcome, ("bob".to_owned(),))
        .delay(Duration::from_secs(3600))
        .await
        .unwrap();
    let (done, delayed) = (done.id().to_string(), delayed.id().to_string());
    let store = db.args();

    // The start as JSON (UTC, RFC 3339): what the tables show in UTC too.
    let detail = cli(&store, &["--json", "run", &delayed]).await.json();
    let start = detail["start_at"]
        .as_str()
        .expect("the delayed run's start, in JSON")
        .to_owned();
    assert_eq!(detail["status"], "pending");
    assert_eq!(detail["version"], "3.2.1");
    let pending = format!("pending, starts at {start}");

    let table = cli(&store, &["runs"]).await.ok();
    let row = |id: &str| {
        table
            .lines()
            .find(|l| l.contains(id))
            .unwrap_or_else(|| panic!("run {id} is not listed: {table}"))
            .to_owned()
    };
    assert!(table.lines().next().unwrap().contains("VERSION"), "{table}");
    assert!(row(&delayed).contains(&pending), "{table}");
    assert!(row(&delayed).contains("3.2.1"), "{table}");
    assert!(row(&done).contains("completed"), "{table}");
    assert!(!row(&done).contains("starts at"), "{table}");
    assert!(row(&done).contains("3.2.0"), "{table}");

    let by_version = |v: &'static str| {
        let store = store.clone();
        async move {
            let out = cli(&store, &["--json", "runs", "--version", v])
                .await
                .json();
            out.as_array()
                .expect("a list of runs")
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(by_version("3.2.0").await, [done.as_str()]);
    assert_eq!(by_version("3.2.1").await, [delayed.as_str()]);
    assert!(by_version("9.9.9").await.is_empty());
    let only_new = cli(&store, &["runs", "--version", "3.2.1"]).await.ok();
    assert!(
        only_new.contains(&delayed) && !only_new.contains(&done),
        "{only_new}"
    );

    let shown = cli(&store, &["run", &delayed]).await.ok();
    for field in [
        format!("status     {pending}"),
        format!("starts     {start}"),
        "version    3.2.1".to_owned(),
        format!("its start at {start}"),
    ] {
        assert!(shown.contains(&field), "{field:?} in: {shown}");
    }

    let web = dashboard(&store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let page = get(web.addr, "/", &host);
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("<th>Version</th>"), "{}", page.body);
    let delayed_row = page
        .body
        .split("<tr ")
        .find(|r| r.contains(&format!("data-run-id=\"{delayed}\"")))
        .expect("the delayed run is listed");
    assert!(
        delayed_row.contains(&format!("starts at {start}")),
        "{delayed_row}"
    );
    assert!(delayed_row.contains("3.2.1"), "{delayed_row}");
    let filtered = get(web.addr, "/?version=3.2.0", &host).body;
    assert_eq!(listed_ids(&filtered), [done.as_str()]);
    assert!(
        filtered.contains("value=\"3.2.0\""),
        "the filter is kept: {filtered}"
    );

    let run_page = get(web.addr, &format!("/runs/{delayed}"), &host).body;
    assert!(
        run_page.contains(&format!("<dd id=\"start-at\">{start} (pending until then")),
        "{run_page}"
    );
    assert!(
        run_page.contains("<span class=\"mono\" id=\"version\">3.2.1</span>"),
        "{run_page}"
    );
    assert!(
        run_page.contains(&format!("its start at {start}")),
        "{run_page}"
    );
}
