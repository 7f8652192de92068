//! Chains of runs (continue-as-new) as the CLI and the dashboard show them: `workflow run`
//! names the previous and the next run, `workflow runs --status continued_as_new` lists the
//! runs that continued, and the run page links both ways. On SQLite and on PostgreSQL.

mod common;

use serde_json::Value;
use workflow_core::prelude::{continue_as_new, workflow};
use workflow_core::{RunId, RunStatus};

use common::http::{dashboard, get};
use common::{cli, fixture, Backend};

on_both_stores!(the_cli_and_the_dashboard_show_a_chain);

/// Continues as itself `n` times, then returns `n`'s start.
#[workflow]
async fn cli_count_down(n: u32) -> workflow_core::Result<u32> {
    if n == 0 {
        return Ok(0);
    }
    continue_as_new(cli_count_down, (n - 1,)).await
}

fn ids(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn the_cli_and_the_dashboard_show_a_chain(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let run = f.rt.start(cli_count_down, (2,)).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), 0);
    let first = run.info().await.unwrap();
    let second: RunId = first.next_run.expect("the first run continued");
    let third =
        f.rt.get_run(&second)
            .info()
            .await
            .unwrap()
            .next_run
            .unwrap();
    let (first, second_s, third_s) = (first.id.to_string(), second.to_string(), third.to_string());

    let out = cli(db, &["run", &second_s]).await.ok();
    let line = |name: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name:?} row in:\n{out}"))
            .to_owned()
    };
    assert!(line("status").contains("continued_as_new"), "{out}");
    assert!(line("previous run").contains(&first), "{out}");
    assert!(line("next run").contains(&third_s), "{out}");
    let v = cli(db, &["run", &second_s, "--json"]).await.json();
    assert_eq!(v["previous_run"], first.as_str(), "{v}");
    assert_eq!(v["next_run"], third_s.as_str(), "{v}");
    assert_eq!(v["status"], "continued_as_new", "{v}");

    let v = cli(db, &["runs", "--status", "continued_as_new", "--json"])
        .await
        .json();
    let mut listed = ids(&v);
    listed.sort();
    let mut want = vec![first.clone(), second_s.clone()];
    want.sort();
    assert_eq!(listed, want, "{v}");
    let table = cli(db, &["runs"]).await.ok();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&first) && l.contains("continued_as_new")),
        "{table}"
    );
    assert_eq!(
        f.rt.get_run(&third).info().await.unwrap().status,
        RunStatus::Completed
    );

    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let page = get(web.addr, &format!("/runs/{second_s}"), &host);
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.body.contains(&format!(
            r#"<a class="mono" id="previous-run" href="/runs/{first}">{first}</a>"#
        )),
        "{}",
        page.body
    );
    assert!(
        page.body.contains(&format!(
            r#"<a class="mono" id="next-run" href="/runs/{third_s}">{third_s}</a>"#
        )),
        "{}",
        page.body
    );
}
