//! The dashboard over raw HTTP, the way a hostile page or a rebound DNS name would reach it:
//! requests naming another `Host` are refused before anything is done, every answer carries the
//! security headers, forms send the browser back to local paths only, and an address other than
//! loopback needs the token on every request. Every test runs on SQLite and on PostgreSQL.

mod common;

use workflow_core::{RunId, RunStatus};

use common::http::{dashboard, get, send};
use common::{blocked_run, blocked_run_expecting, cli, deploy, fixture, Backend, WAIT};

// Each test on a SQLite file and on a PostgreSQL schema of its own: the listing, the queue
// positions and the streams have their own SQL on each.
on_both_stores!(
    foreign_hosts_are_refused_and_nothing_is_done,
    every_answer_carries_the_security_headers,
    forms_send_the_browser_back_to_local_paths_only,
    other_addresses_than_loopback_need_the_token,
    a_token_guards_loopback_too,
    a_blocked_run_shows_its_divergence_and_retries,
    a_divergence_is_escaped,
    parent_and_child_pages_link_to_each_other,
    the_run_page_shows_its_streams,
    the_run_page_shows_events_and_waiting_messages,
    the_run_page_shows_open_requests,
    queues_show_their_limits_occupancy_and_positions,
    the_runs_page_pages_through_older_runs,
    schedule_pages_list_schedules_and_link_ticks_to_runs,
);

async fn foreign_hosts_are_refused_and_nothing_is_done(b: Backend) {
    let f = fixture(b).await;
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let (addr, port) = (web.addr, web.addr.port());
    let cancel = format!("POST /runs/{}/cancel HTTP/1.1", f.sleeping);

    for head in [
        // Another site's name.
        format!("{cancel}\r\nHost: evil.example"),
        // DNS rebinding: the attacker's name now resolves to 127.0.0.1, and the port is right.
        format!("{cancel}\r\nHost: rebind.evil.example:{port}\r\nOrigin: http://rebind.evil.example:{port}"),
        format!("{cancel}\r\nHost: localhost.evil.example:{port}"),
        // The right name on another port.
        format!("{cancel}\r\nHost: 127.0.0.1:{}", port.wrapping_add(1)),
        format!("{cancel}\r\nHost: 127.0.0.1"),
        // A second name besides the right one.
        format!("{cancel}\r\nHost: 127.0.0.1:{port}\r\nHost: evil.example:{port}"),
        // No name at all.
        cancel.clone(),
        format!("POST /runs/{}/cancel HTTP/1.0", f.sleeping),
        // An absolute URI naming another host overrides nothing.
        format!(
            "POST http://evil.example:{port}/runs/{}/cancel HTTP/1.1\r\nHost: 127.0.0.1:{port}",
            f.sleeping
        ),
    ] {
        let a = send(addr, &head, "x=1");
        assert_eq!(a.status, 403, "{head:?}: {a:?}");
        assert!(a.body.starts_with("refused: the Host header"), "{a:?}");
        a.assert_secure();
    }
    // Reading is refused too: the pages hold every run and token.
    let a = get(addr, "/api/hooks", &format!("rebind.evil.example:{port}"));
    assert_eq!(a.status, 403, "{a:?}");
    assert!(!a.body.contains(&f.token), "{a:?}");
    let a = get(addr, "/assets/app.js", "evil.example");
    assert_eq!(a.status, 403, "{a:?}");

    assert_eq!(
        f.rt.get_run(&f.sleeping).status().await.unwrap(),
        RunStatus::Running,
        "a refused request cancelled the run"
    );

    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let a = get(addr, "/api/hooks", &host);
        assert_eq!(a.status, 200, "{host}: {a:?}");
        assert!(a.body.contains(&f.token), "{a:?}");
    }

    // The same cancel, addressed to the dashboard, goes through.
    let a = send(
        addr,
        &format!("{cancel}\r\nHost: localhost:{port}\r\nOrigin: http://localhost:{port}"),
        "x=1",
    );
    assert_eq!(a.status, 303, "{a:?}");
    common::until_status(&f.rt, f.sleeping, RunStatus::Cancelled).await;
}

async fn every_answer_carries_the_security_headers(b: Backend) {
    let f = fixture(b).await;
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    for (path, status) in [
        ("/".to_owned(), 200),
        (format!("/runs/{}", f.waiting), 200),
        ("/assets/style.css".to_owned(), 200),
        ("/api/runs".to_owned(), 200),
        ("/no/such/page".to_owned(), 404),
        (format!("/runs/{}", workflow_core::RunId::new()), 404),
        ("/runs/not-an-id".to_owned(), 400),
    ] {
        let a = get(web.addr, &path, &host);
        assert_eq!(a.status, status, "{path}: {a:?}");
        a.assert_secure();
    }
    let a = get(web.addr, "/", "evil.example");
    assert_eq!(a.status, 403);
    a.assert_secure();

    // The pages need nothing the policy forbids: no inline script or <style>.
    let page = get(web.addr, &format!("/runs/{}", f.waiting), &host).body;
    assert!(page.contains(r#"<script src="/assets/app.js" defer></script>"#));
    assert_eq!(page.matches("<script").count(), 1, "{page}");
    assert!(!page.contains("<style"), "{page}");
}

async fn forms_send_the_browser_back_to_local_paths_only(b: Backend) {
    let f = fixture(b).await;
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let port = web.addr.port();
    let resume = |back: &str| {
        // An empty payload is refused, so nothing reaches the run whatever `back` is.
        let a = send(
            web.addr,
            &format!("POST /hooks/resume HTTP/1.1\r\nHost: 127.0.0.1:{port}"),
            &format!("token=x&payload=&back={back}"),
        );
        assert_eq!(a.status, 303, "{back}: {a:?}");
        a.assert_secure();
        a.header("location").unwrap_or_default().to_owned()
    };
    let run_page = format!("/runs/{}", f.waiting);
    assert!(resume(&run_page).starts_with(&format!("{run_page}?error=")));
    assert!(resume("%2Fhooks%3Ftoken%3Dx").starts_with("/hooks?token=x&error="));
    for back in [
        "%2F%2Fevil.example",
        "%2F%5Cevil.example",
        "%2F%09%2Fevil.example",
        "%2F%0D%0ASet-Cookie%3A+x%3D1",
        "https%3A%2F%2Fevil.example",
        "evil.example",
        "",
    ] {
        let to = resume(back);
        assert!(
            to.starts_with("/?error="),
            "{back} sent the browser to {to}"
        );
    }
    assert_eq!(f.rt.store().payloads(&f.waiting, 0).await.unwrap(), []);
}

async fn other_addresses_than_loopback_need_the_token(b: Backend) {
    let f = fixture(b).await;

    let out = common::cli(&f.store, &["web", "--listen", "0.0.0.0:0"]).await;
    out.fails(2, "--listen 0.0.0.0:0 is reachable from other machines");
    let out = common::cli(&f.store, &["web", "--listen", "0.0.0.0"]).await;
    out.fails(2, "set a secret with --token or WORKFLOW_WEB_TOKEN");
    let out = common::cli(&f.store, &["web", "--listen", "0.0.0.0:0", "--token", ""]).await;
    out.fails(2, "--token (or WORKFLOW_WEB_TOKEN) is empty");

    for web in [
        dashboard(
            &f.store,
            &["--listen", "0.0.0.0:0", "--token", "s3cret t0ken"],
            &[],
        ),
        dashboard(
            &f.store,
            &["--listen", "0.0.0.0:0"],
            &[("WORKFLOW_WEB_TOKEN", "s3cret t0ken")],
        ),
    ] {
        let (addr, port) = (web.addr, web.addr.port());
        let host = format!("Host: 127.0.0.1:{port}");
        let cancel = format!("POST /runs/{}/cancel HTTP/1.1\r\n{host}", f.sleeping);
        for auth in [
            "",
            "\r\nAuthorization: Bearer s3cret t0keN",
            "\r\nAuthorization: Bearer s3cret",
            "\r\nAuthorization: Basic s3cret t0ken",
            "\r\nCookie: workflow_token_1=s3cret+t0ken",
            &format!("\r\nCookie: workflow_token_{port}=s3cret"),
        ] {
            for head in [
                format!("GET /api/hooks HTTP/1.1\r\n{host}{auth}"),
                format!("{cancel}{auth}"),
            ] {
                let a = send(addr, &head, "x=1");
                assert_eq!(a.status, 401, "{head:?}: {a:?}");
                assert!(
                    a.body.contains(r#"<form method="post" action="/login">"#),
                    "{a:?}"
                );
                assert!(!a.body.contains(&f.token), "{a:?}");
                a.assert_secure();
            }
        }
        // Still the Host check first.
        let a = send(
            addr,
            "GET /api/hooks HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer s3cret t0ken",
            "",
        );
        assert_eq!(a.status, 403, "{a:?}");
        assert_eq!(
            f.rt.get_run(&f.sleeping).status().await.unwrap(),
            RunStatus::Running
        );

        let a = send(
            addr,
            &format!("GET /api/hooks HTTP/1.1\r\n{host}\r\nAuthorization: Bearer s3cret t0ken"),
            "",
        );
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.body.contains(&f.token), "{a:?}");

        // A browser logs in once and carries the cookie.
        let login = format!("POST /login HTTP/1.1\r\n{host}");
        let a = send(addr, &login, "token=s3cret");
        assert_eq!(a.status, 401, "{a:?}");
        assert!(a.header("set-cookie").is_none(), "{a:?}");
        let a = send(addr, &login, "token=s3cret+t0ken");
        assert_eq!(a.status, 303, "{a:?}");
        let cookie = a.header("set-cookie").expect("no cookie").to_owned();
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
            "{cookie}"
        );
        let pair = cookie.split(';').next().unwrap();
        let a = send(
            addr,
            &format!("GET / HTTP/1.1\r\n{host}\r\nCookie: {pair}"),
            "",
        );
        assert_eq!(a.status, 200, "{a:?}");
        a.assert_secure();
    }
    assert_eq!(
        f.rt.get_run(&f.sleeping).status().await.unwrap(),
        RunStatus::Running,
        "a request without the token cancelled the run"
    );
}

async fn a_token_guards_loopback_too(b: Backend) {
    let f = fixture(b).await;
    let web = dashboard(&f.store, &["--port", "0", "--token", "t"], &[]);
    let host = format!("Host: localhost:{}", web.addr.port());
    let a = send(web.addr, &format!("GET / HTTP/1.1\r\n{host}"), "");
    assert_eq!(a.status, 401, "{a:?}");
    let a = send(
        web.addr,
        &format!("GET / HTTP/1.1\r\n{host}\r\nAuthorization: Bearer t"),
        "",
    );
    assert_eq!(a.status, 200, "{a:?}");
}

async fn a_blocked_run_shows_its_divergence_and_retries(b: Backend) {
    let f = fixture(b).await;
    let key = format!("key-{}", workflow_core::RunId::new());
    let id = blocked_run(&f, &key).await;
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let port = web.addr.port();
    let host = format!("127.0.0.1:{port}");
    let retry = format!("POST /runs/{id}/retry HTTP/1.1\r\nHost: {host}");

    let page = get(web.addr, &format!("/runs/{id}"), &host);
    assert_eq!(page.status, 200, "{page:?}");
    let body = &page.body;
    assert!(body.contains(r#"<span class="badge blocked" data-status="blocked">blocked</span>"#));
    assert!(body.contains(r#"id="divergence" role="alert""#), "{body}");
    assert!(
        body.contains(&format!(
            "replay of run {id} (workflow `web::common::upgrade`) diverged from its recorded history: at event 1"
        )),
        "{body}"
    );
    assert!(
        body.contains(r#"<dd class="mono" id="div-expected">step `web::common::greet` (stp_"#),
        "{body}"
    );
    assert!(
        body.contains(r#"<dd class="mono" id="div-found">step `web::common::note` (stp_"#),
        "{body}"
    );
    assert!(body.contains(&format!(
        r#"<form method="post" action="/runs/{id}/retry">"#
    )));
    // Retry is offered for failed and blocked runs only.
    let failed = get(web.addr, &format!("/runs/{}", f.failed), &host).body;
    assert!(failed.contains(&format!(r#"action="/runs/{}/retry""#, f.failed)));
    for other in [f.completed, f.cancelled, f.sleeping] {
        let page = get(web.addr, &format!("/runs/{other}"), &host).body;
        assert!(!page.contains("/retry"), "{other}: {page}");
        assert!(!page.contains(r#"id="divergence""#), "{other}: {page}");
    }

    // The list filters blocked runs and styles them apart.
    let list = get(web.addr, "/?status=blocked", &host).body;
    assert!(list.contains(r#"<option value="blocked" selected>blocked</option>"#));
    assert!(list.contains(&format!(r#"data-run-id="{id}""#)), "{list}");
    assert!(
        !list.contains(&format!(r#"data-run-id="{}""#, f.failed)),
        "{list}"
    );
    let css = get(web.addr, "/assets/style.css", &host).body;
    assert!(css.contains(".badge.blocked"), "{css}");

    // Another site's form, or another Host, is refused and nothing changes.
    let a = send(
        web.addr,
        &format!("{retry}\r\nOrigin: https://evil.example"),
        "x=1",
    );
    assert_eq!(a.status, 400, "{a:?}");
    let a = send(
        web.addr,
        &format!("{retry}\r\nSec-Fetch-Site: cross-site"),
        "x=1",
    );
    assert_eq!(a.status, 400, "{a:?}");
    let a = send(
        web.addr,
        &format!("POST /runs/{id}/retry HTTP/1.1\r\nHost: evil.example:{port}"),
        "x=1",
    );
    assert_eq!(a.status, 403, "{a:?}");
    a.assert_secure();

    // The fitting code is deployed; the retry hands the run to the worker now.
    deploy(&key);
    let a = send(
        web.addr,
        &format!("{retry}\r\nOrigin: http://{host}\r\nSec-Fetch-Site: same-origin"),
        "x=1",
    );
    assert_eq!(a.status, 303, "{a:?}");
    a.assert_secure();
    assert_eq!(
        a.header("location"),
        Some(
            format!("/runs/{id}?notice=Retry+requested%3A+a+worker+picks+the+run+up+now.").as_str()
        )
    );
    common::until_status(&f.rt, id, RunStatus::Completed).await;
    let page = get(web.addr, &format!("/runs/{id}"), &host).body;
    assert!(!page.contains(r#"id="divergence""#), "{page}");
    assert!(!page.contains("/retry"), "{page}");

    // A completed run is not retried: the page says why.
    let a = send(
        web.addr,
        &format!("POST /runs/{}/retry HTTP/1.1\r\nHost: {host}", f.completed),
        "x=1",
    );
    assert_eq!(a.status, 303, "{a:?}");
    let to = a.header("location").unwrap_or_default();
    assert!(
        to.starts_with(&format!("/runs/{}?error=", f.completed))
            && to.contains("only+a+failed+or+blocked+run+can+be+retried"),
        "{to}"
    );

    // A failed run is re-opened.
    let a = send(
        web.addr,
        &format!("POST /runs/{}/retry HTTP/1.1\r\nHost: {host}", f.failed),
        "x=1",
    );
    assert!(
        a.header("location")
            .unwrap_or_default()
            .contains("notice=Run+re-opened"),
        "{a:?}"
    );
    let events = f.rt.store().events(&f.failed).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.event == workflow_core::store::Event::RunRetried),
        "{events:?}"
    );
    // The timeline marks the retry; the events say it in words.
    let page = get(web.addr, &format!("/runs/{}", f.failed), &host).body;
    assert!(page.contains(r#"<div class="mark retried""#), "{page}");
    assert!(page.contains("failed run re-opened by retry"), "{page}");
}

async fn a_divergence_is_escaped(b: Backend) {
    let f = fixture(b).await;
    let key = format!("key-{}", workflow_core::RunId::new());
    let id = blocked_run_expecting(&f, &key, Some("<script>alert('x')</script>")).await;
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let body = get(web.addr, &format!("/runs/{id}"), &host).body;
    // maud escapes `&`, `<`, `>` and `"`; a `'` stays, harmless in text and in attributes,
    // which maud always quotes with `"`.
    assert!(
        body.contains("step `&lt;script&gt;alert('x')&lt;/script&gt;`"),
        "{body}"
    );
    assert!(!body.contains("<script>alert"), "{body}");
    assert_eq!(body.matches("<script").count(), 1, "{body}");
}

/// Returns its argument.
#[workflow_core::workflow]
async fn web_child(n: u32) -> workflow_core::Result<u32> {
    Ok(n)
}

/// Starts a child and returns its result.
#[workflow_core::workflow]
async fn web_parent(n: u32) -> workflow_core::Result<u32> {
    let child = workflow_core::start_child(web_child, (n,)).await?;
    child.result().await
}

async fn parent_and_child_pages_link_to_each_other(b: Backend) {
    let f = fixture(b).await;
    let run = f.rt.start(web_parent, (7,)).await.unwrap();
    assert_eq!(
        tokio::time::timeout(WAIT, run.return_value())
            .await
            .unwrap()
            .unwrap(),
        7
    );
    let children =
        f.rt.store()
            .list_runs(&workflow_core::store::RunFilter::new().parent(run.id()))
            .await
            .unwrap();
    let child = children[0].id;
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());

    let page = get(web.addr, &format!("/runs/{}", run.id()), &host);
    assert_eq!(page.status, 200, "{page:?}");
    let body = &page.body;
    assert!(body.contains(r#"<section id="children">"#), "{body}");
    assert!(
        body.contains(&format!(
            r#"<a class="mono" href="/runs/{child}">{child}</a>"#
        )),
        "{body}"
    );
    assert!(body.contains(r#"data-status="completed""#), "{body}");
    let page = get(web.addr, &format!("/runs/{child}"), &host).body;
    assert!(
        page.contains(&format!(
            r#"<a class="mono" id="parent" href="/runs/{id}">{id}</a>"#,
            id = run.id()
        )),
        "{page}"
    );
}

#[workflow_core::step]
async fn shout(words: Vec<String>) -> workflow_core::Result<()> {
    let out = workflow_core::stream::<String>("log");
    for w in words {
        out.write(w).await?;
    }
    out.close().await
}

#[workflow_core::workflow]
async fn shouting(words: Vec<String>) -> workflow_core::Result<()> {
    shout(words).await
}

/// The run page lists the run's streams with their last chunks, escaped; the API serves a
/// stream's chunks as JSON from an index on.
async fn the_run_page_shows_its_streams(b: Backend) {
    let f = fixture(b).await;
    let words: Vec<String> = (0..25)
        .map(|i| format!("word {i}"))
        .chain(["<script>alert('x')</script>".to_owned()])
        .collect();
    let run = f.rt.start(shouting, (words,)).await.unwrap();
    run.return_value().await.unwrap();
    let id = run.id();
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let page = get(web.addr, &format!("/runs/{id}"), &host);
    assert_eq!(page.status, 200);
    page.assert_secure();
    let body = page.body;
    assert!(body.contains("<h2>Streams</h2>"), "{body}");
    assert!(body.contains(r#"data-stream="log""#), "{body}");
    assert!(body.contains("26 chunks, the last 20 shown"), "{body}");
    assert!(body.contains(r#"<tr data-index="25">"#), "{body}");
    assert!(
        !body.contains(r#"<tr data-index="5">"#),
        "only the last 20: {body}"
    );
    assert!(body.contains("&lt;script&gt;alert"), "{body}");
    assert_eq!(body.matches("<script").count(), 1, "{body}");

    let api = get(
        web.addr,
        &format!("/api/runs/{id}/streams/log?from=24"),
        &host,
    );
    assert_eq!(api.status, 200, "{api:?}");
    api.assert_secure();
    let chunks: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(
        chunks,
        serde_json::json!([
            {"index": 24, "attempt": 1, "value": "word 24"},
            {"index": 25, "attempt": 1, "value": "<script>alert('x')</script>"},
        ])
    );
    let list = get(web.addr, &format!("/api/runs/{id}/streams"), &host);
    let list: serde_json::Value = serde_json::from_str(&list.body).unwrap();
    assert_eq!(list[0]["name"], "log");
    assert_eq!(list[0]["chunks"], 26);
    let unknown = workflow_core::RunId::new();
    let missing = get(web.addr, &format!("/api/runs/{unknown}/streams/log"), &host);
    assert_eq!(missing.status, 404, "{missing:?}");
    // Another host is refused here as everywhere.
    let foreign = get(
        web.addr,
        &format!("/api/runs/{id}/streams/log"),
        "evil.example",
    );
    assert_eq!(foreign.status, 403);
}

/// The queues page lists each queue's limits and occupancy; the runs list filtered by a queue
/// shows the queue and each waiting run's position; a run's page names its queue.
async fn queues_show_their_limits_occupancy_and_positions(b: Backend) {
    use std::time::Duration;
    use workflow_core::prelude::*;

    let db = common::TestDb::new(b);
    let rt = db
        .builder()
        .queue(
            Queue::new("payments")
                .concurrency(1)
                .rate_limit(100, Duration::from_secs(60)),
        )
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let order = RunId::new().to_string();
    let token = format!("approval:{order}");
    let holder = rt
        .start(common::approval, (order,))
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
    let waiting = rt
        .start(common::welcome, ("<ada>".to_string(),))
        .queue("payments")
        .partition_key("<customer>")
        .priority(3)
        .await
        .unwrap();

    let web = dashboard(&db.args(), &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());

    let page = get(web.addr, "/queues", &host);
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains(r#"<tr data-queue="payments">"#),
        "{}",
        page.body
    );
    assert!(
        page.body.contains(
            r#"<td><a href="/?queue=payments">payments</a></td><td>1</td><td>100 per 1m 00s</td><td>1</td><td>1</td><td>1</td>"#
        ),
        "{}",
        page.body
    );

    let page = get(web.addr, "/?queue=payments", &host);
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains(
            "Queue <strong>payments</strong>: slots 1/1, rate 1/100 per 1m 00s; 1 waiting."
        ),
        "{}",
        page.body
    );
    assert!(page.body.contains("<th>Position</th>"), "{}", page.body);
    assert!(
        page.body.contains(
            r#"<td class="position">1</td><td class="mono">&lt;customer&gt;</td><td>3</td>"#
        ),
        "{}",
        page.body
    );
    assert!(page.body.contains(&holder.id().to_string()));

    let api = get(web.addr, "/api/runs?queue=payments", &host);
    let v: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(v["queue"]["occupied"], 1);
    let runs = v["runs"].as_array().unwrap();
    let of = |id: workflow_core::RunId| {
        runs.iter().find(|r| r["id"] == id.to_string()).unwrap()["position"].clone()
    };
    assert_eq!(of(waiting.id()), 1);
    assert_eq!(of(holder.id()), serde_json::Value::Null);
    let api = get(web.addr, "/api/queues", &host);
    let v: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(v[0]["name"], "payments");
    assert_eq!(v[0]["waiting"], 1);

    let page = get(web.addr, &format!("/runs/{}", waiting.id()), &host);
    assert!(
        page.body.contains(
            r#"<dt>queue</dt><dd><a href="/?queue=payments">payments</a>, priority 3, key <span class="mono">&lt;customer&gt;</span></dd>"#
        ),
        "{}",
        page.body
    );
    drop(web);
    rt.resume_hook(&token, common::Approval { approved: true })
        .await
        .unwrap();
    common::until_status(&rt, waiting.id(), RunStatus::Completed).await;
}

/// `workflow web --tz` shows the pages' times in that zone; the API keeps UTC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_show_times_in_the_zone_tz_names() {
    let f = fixture(Backend::Sqlite).await;
    let web = dashboard(&f.store, &["--port", "0", "--tz", "Europe/Paris"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let id = f.completed;
    let api = get(web.addr, &format!("/api/runs/{id}"), &host);
    let v: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    let utc = v["created_at"].as_str().unwrap();
    assert!(utc.ends_with('Z'), "{utc}");
    let paris = utc
        .parse::<jiff::Timestamp>()
        .unwrap()
        .to_zoned_datetime(jiff::tz::TimeZone::get("Europe/Paris").unwrap())
        .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
        .to_string();
    let page = get(web.addr, &format!("/runs/{id}"), &host).body;
    assert!(
        page.contains(&format!("<dt>created</dt><dd>{paris}</dd>")),
        "{paris}: {page}"
    );
    assert!(!page.contains(utc), "{utc}: {page}");
}

/// The run ids a runs page lists, in its order.
fn listed_ids(body: &str) -> Vec<String> {
    body.split(r#"data-run-id=""#)
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// The "Older runs" link of a runs page, as a path to request.
fn older_link(body: &str) -> Option<String> {
    let rest = body.split(r#"<a class="older" href=""#).nth(1)?;
    Some(rest.split('"').next()?.replace("&amp;", "&"))
}

async fn the_runs_page_pages_through_older_runs(b: Backend) {
    let f = fixture(b).await;
    let all: Vec<String> =
        f.rt.runs(workflow_core::RunFilter::new())
            .await
            .unwrap()
            .iter()
            .map(|r| r.id.to_string())
            .collect();
    assert!(all.len() >= 5, "{all:?}");
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());

    // Pages of 2, each from the link of the one before: every run once, newest first; the
    // last page links nowhere.
    let mut seen = Vec::new();
    let mut path = "/?limit=2".to_owned();
    for _ in 0..all.len() {
        let page = get(web.addr, &path, &host);
        assert_eq!(page.status, 200, "{path}: {page:?}");
        seen.extend(listed_ids(&page.body));
        match older_link(&page.body) {
            Some(next) => {
                assert!(next.contains("limit=2"), "the limit is kept: {next}");
                path = next;
            }
            None => break,
        }
    }
    assert_eq!(seen, all, "pages of 2 list each run once, newest first");

    // The filters stay on the next page.
    let running = get(web.addr, "/?limit=1&status=running", &host);
    let next = older_link(&running.body).expect("a full page links to older runs");
    assert!(next.contains("status=running"), "{next}");
    let second = get(web.addr, &next, &host).body;
    assert_eq!(listed_ids(&second).len(), 1, "{second}");
    assert!(second.contains(r#"data-status="running""#), "{second}");
    // An unknown or malformed cursor is an error page, not an empty list.
    let unknown = get(web.addr, &format!("/?after={}", RunId::new()), &host);
    assert_ne!(unknown.status, 200, "{unknown:?}");
    let malformed = get(web.addr, "/?after=nope", &host);
    assert_eq!(malformed.status, 400, "{malformed:?}");
}

/// A scheduled workflow: returns the tick's schedule name.
#[workflow_core::workflow]
async fn web_tick(tick: workflow_core::ScheduleTick) -> workflow_core::Result<String> {
    Ok(tick.schedule)
}

async fn schedule_pages_list_schedules_and_link_ticks_to_runs(b: Backend) {
    let f = fixture(b).await;
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let empty = get(web.addr, "/schedules", &host);
    assert_eq!(empty.status, 200, "{empty:?}");
    assert!(
        empty.body.contains("No schedules are stored."),
        "{}",
        empty.body
    );

    let hourly =
        workflow_core::Schedule::every("<hourly>", web_tick, std::time::Duration::from_secs(3600));
    f.rt.create_schedule(hourly).await.unwrap();
    let run = f.rt.trigger_schedule("<hourly>").await.unwrap();

    let list = get(web.addr, "/schedules", &host);
    assert_eq!(list.status, 200, "{list:?}");
    let body = &list.body;
    // The name is escaped, in the text and in the link.
    assert!(
        body.contains(r#"<a href="/schedules/%3Chourly%3E">&lt;hourly&gt;</a>"#),
        "{body}"
    );
    assert!(body.contains("every 1h"), "{body}");
    assert!(body.contains(r#"aria-current="page">Schedules"#), "{body}");

    let page = get(web.addr, "/schedules/%3Chourly%3E", &host);
    assert_eq!(page.status, 200, "{page:?}");
    let body = &page.body;
    assert!(
        body.contains(&format!(r#"<a href="/runs/{run}">{run}</a>"#)),
        "the triggered tick links to its run {run}: {body}"
    );
    assert!(body.contains(r#"data-outcome="started""#), "{body}");
    let missing = get(web.addr, "/schedules/nope", &host);
    assert_eq!(missing.status, 404, "{missing:?}");
}

/// Publishes a stage, then waits for "go".
#[workflow_core::workflow]
async fn publishing() -> workflow_core::Result<()> {
    workflow_core::set_event("stage", "<b>one</b>")?;
    workflow_core::recv::<()>("go").await
}

/// The run page shows the values the run published and the messages no `recv` took yet,
/// escaped; a message taken leaves the list.
async fn the_run_page_shows_events_and_waiting_messages(b: Backend) {
    let f = fixture(b).await;
    let run = f.rt.start(publishing, ()).await.unwrap();
    assert_eq!(run.event::<String>("stage").await.unwrap(), "<b>one</b>");
    run.send("later", "<i>not now</i>").await.unwrap();
    let id = run.id();
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let page = get(web.addr, &format!("/runs/{id}"), &host);
    assert_eq!(page.status, 200);
    let body = page.body;
    assert!(body.contains("<h2>Events</h2>"), "{body}");
    assert!(body.contains(r#"<tr data-key="stage">"#), "{body}");
    assert!(body.contains("&lt;b&gt;one&lt;/b&gt;"), "{body}");
    assert!(body.contains("<h2>Waiting messages</h2>"), "{body}");
    assert!(body.contains("&lt;i&gt;not now&lt;/i&gt;"), "{body}");
    assert!(!body.contains("<i>not now"), "{body}");
    // `workflow run <id>` shows both.
    let shown = cli(&f.store, &["run", &id.to_string()]).await;
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let events = shown
        .stdout
        .split("\nevents\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no events section: {}", shown.stdout));
    assert!(events.contains("stage"), "{events}");
    assert!(events.contains("<b>one</b>"), "{events}");
    let waiting = shown
        .stdout
        .split("\nwaiting messages\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no waiting messages section: {}", shown.stdout));
    assert!(waiting.contains("later"), "{waiting}");
    assert!(waiting.contains("<i>not now</i>"), "{waiting}");

    run.send("go", ()).await.unwrap();
    run.return_value().await.unwrap();
    let page = get(web.addr, &format!("/runs/{id}"), &host);
    assert!(page.body.contains("<h2>Events</h2>"), "{}", page.body);
    assert!(
        page.body.contains("<h2>Waiting messages</h2>"),
        "a message no recv took stays listed: {}",
        page.body
    );
    let taken = f.rt.store().payloads(&id, 0).await.unwrap();
    assert_eq!(taken.len(), 1, "only the message on `later` waits");
}

/// Takes one request "<review>", waits for "go", and replies.
#[workflow_core::workflow]
async fn reviewing() -> workflow_core::Result<u32> {
    let mut asks = workflow_core::requests::<u32, u32>("<review>");
    let Some(req) = asks.next().await else {
        return Err(workflow_core::Error::fatal("no request"));
    };
    workflow_core::recv::<()>("go").await?;
    req.reply(req.body() + 1)?;
    Ok(*req.body())
}

/// The run page lists the requests the run has not replied to, escaped, received or still
/// waiting for the workflow; a request replied to leaves the list.
async fn the_run_page_shows_open_requests(b: Backend) {
    let f = fixture(b).await;
    let run = f.rt.start(reviewing, ()).await.unwrap();
    let id = run.id();
    let caller = {
        let run = run.clone();
        tokio::spawn(async move {
            run.request::<u32, u32>("<review>", 41)
                .idempotency_key("k<1>")
                .await
        })
    };
    let unheard = run
        .request::<u32, u32>("later", 1)
        .timeout(std::time::Duration::from_millis(50))
        .await;
    assert!(
        matches!(unheard, Err(workflow_core::RunError::TimedOut { .. })),
        "{unheard:?}"
    );
    loop {
        let events = f.rt.store().events(&id).await.unwrap();
        if events
            .iter()
            .any(|e| matches!(e.event, workflow_core::store::Event::RequestReceived { .. }))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let web = dashboard(&f.store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", web.addr.port());
    let page = get(web.addr, &format!("/runs/{id}"), &host);
    assert_eq!(page.status, 200);
    let body = page.body;
    assert!(!body.contains("<review>"), "{body}");
    let open = open_requests(&body);
    assert!(open.contains("<h2>Open requests</h2>"), "{body}");
    assert!(open.contains("&lt;review&gt;"), "{open}");
    assert!(open.contains("k&lt;1&gt;"), "{open}");
    assert!(open.contains("received, no reply yet"), "{open}");
    assert!(open.contains("waiting for the workflow"), "{open}");
    // `workflow run <id>` lists them too.
    let shown = cli(&f.store, &["run", &id.to_string()]).await;
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let section = shown
        .stdout
        .split("\nopen requests\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no open requests section: {}", shown.stdout));
    assert!(section.contains("<review>"), "{section}");
    assert!(section.contains("k<1>"), "{section}");
    assert!(section.contains("received, no reply yet"), "{section}");
    assert!(section.contains("waiting for the workflow"), "{section}");

    run.send("go", ()).await.unwrap();
    assert_eq!(caller.await.unwrap().unwrap(), 42);
    run.return_value().await.unwrap();
    let page = get(web.addr, &format!("/runs/{id}"), &host);
    let body = page.body;
    let open = open_requests(&body);
    assert!(
        !open.contains("&lt;review&gt;"),
        "the replied request is listed: {open}"
    );
    assert!(
        open.contains("waiting for the workflow"),
        "the request nobody took stays listed: {open}"
    );
}

/// The page's section of open requests (empty when it has none).
fn open_requests(body: &str) -> &str {
    let Some(from) = body.find(r#"<section id="open-requests">"#) else {
        return "";
    };
    let len = body[from..].find("</section>").unwrap_or(body.len() - from);
    &body[from..from + len]
}
