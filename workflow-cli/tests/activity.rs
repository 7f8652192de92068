//! `workflow web`'s Activity page: runs started and ended per minute over the last hour and
//! the latency of step attempts per step name, read from the store. On SQLite and PostgreSQL.

mod common;

use common::http::{dashboard, get};
use common::{fixture, Backend};
use workflow_core::store::RunFilter;

on_both_stores!(the_activity_page_counts_runs_per_minute_and_step_attempts);

/// The text between `open` and the next `<` after it.
fn text_after<'a>(page: &'a str, open: &str) -> &'a str {
    let start = page
        .find(open)
        .unwrap_or_else(|| panic!("{open} in {page}"))
        + open.len();
    let rest = &page[start..];
    &rest[..rest.find('<').unwrap_or(rest.len())]
}

async fn the_activity_page_counts_runs_per_minute_and_step_attempts(b: Backend) {
    let f = fixture(b).await;
    let runs = f.rt.runs(RunFilter::default().limit(100)).await.unwrap();
    let ended = runs.iter().filter(|r| r.status.is_terminal()).count();
    assert_eq!(
        ended, 3,
        "the fixture's completed, failed and cancelled runs"
    );

    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let got = get(web.addr, "/activity", &host);
    assert_eq!(got.status, 200, "{got:?}");
    let page = &got.body;
    assert!(
        page.contains(r#"href="/activity" aria-current="page""#),
        "{page}"
    );
    assert_eq!(
        text_after(page, r#"<span id="started-total">"#),
        runs.len().to_string(),
        "every run of the fixture was started within the hour"
    );
    assert_eq!(
        text_after(page, r#"<span id="ended-total">"#),
        ended.to_string()
    );
    // The bars add up to the totals.
    let sum = |attr: &str| -> usize {
        page.match_indices(attr)
            .map(|(i, _)| {
                let rest = &page[i + attr.len()..];
                rest[..rest.find('"').unwrap()].parse::<usize>().unwrap()
            })
            .sum()
    };
    assert_eq!(sum(r#"data-started=""#), runs.len(), "{page}");
    assert_eq!(sum(r#"data-ended=""#), ended, "{page}");

    // `greet` failed once then succeeded; `charge` failed both of its attempts: every
    // attempt that ended is counted under its step's name.
    for (step, attempts) in [("greet", "2"), ("charge", "2")] {
        let row = page
            .split("<tr data-step=")
            .find(|r| r.split('"').nth(1).is_some_and(|n| n.ends_with(step)))
            .unwrap_or_else(|| panic!("a row for {step}: {page}"));
        assert_eq!(
            text_after(row, r#"<td class="attempts">"#),
            attempts,
            "{step}: {row}"
        );
        assert!(row.contains(" ms<") || row.contains(" s<"), "{row}");
    }

    // The dashboard's guard stands in front of it too.
    assert_eq!(get(web.addr, "/activity", "evil.example").status, 403);
}
