//! The dashboard in a real browser: `workflow web` on a loopback port, headless Chromium driven
//! through chromedriver. It lists the runs, shows a run's timeline with one bar per step attempt,
//! a click on "resume" moves a waiting run on, and a blocked run shows why and moves on after a
//! click on "retry" once the code fits. It runs on SQLite and on PostgreSQL, one store after
//! the other. Screenshots land in `target/screenshots/`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them). Without them the
//! test says so and passes, except under `CI=true`, where it fails.

mod common;

use std::io::{BufRead, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fantoccini::{Client, ClientBuilder, Locator};
use serde::{Deserialize, Serialize};
use serde_json::json;
use workflow_core::prelude::*;
use workflow_core::store::{Event, NewEvent, NewRun};

use common::{Backend, TestDb};

/// The whole test ends by then.
const TEST_LIMIT: Duration = Duration::from_secs(240);
/// One wait (a page, a process, a run's progress) ends by then.
const WAIT: Duration = Duration::from_secs(45);

#[step]
async fn reserve(order: String) -> Result<u32> {
    tokio::time::sleep(Duration::from_millis(150)).await;
    Ok(order.len() as u32)
}

#[step(max_retries = 4)]
async fn charge(order: String, cents: u64) -> Result<String> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    if cents == 0 {
        return Err(Error::fatal("card declined"));
    }
    // The payment provider times out twice before it answers.
    if step_metadata().attempt < 3 {
        return Err(
            Error::retryable("payment provider timed out").retry_after(Duration::from_millis(250))
        );
    }
    Ok(format!("ch_{order}"))
}

#[step]
async fn ship(order: String) -> Result<String> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(format!("TRACK-{order}"))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Approval {
    approved: bool,
}

#[workflow]
async fn checkout(order: String, cents: u64) -> Result<String> {
    reserve(order.clone()).await?;
    let charge_id = charge(order.clone(), cents).await?;
    sleep(Duration::from_millis(600)).await;
    let mut approval = create_hook::<Approval>(format!("approve:{order}"));
    let Approval { approved } = approval.recv().await?;
    approval.dispose();
    if !approved {
        return Err(Error::fatal("not approved"));
    }
    let tracking = ship(order).await?;
    Ok(format!("{charge_id} {tracking}"))
}

/// Whether the build that reserves before shipping is deployed (the worker runs in this
/// process; the binary's tests, one per store, take turns: [`ONE_AT_A_TIME`]).
static DEPLOYED: AtomicBool = AtomicBool::new(false);

/// Held by the browser test running now: `DEPLOYED` is one switch for the process, and one
/// Chromium at a time is enough for a small machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The old code ships at once; the new code reserves first.
#[workflow]
async fn upgrade(order: String) -> Result<String> {
    let new_code = DEPLOYED.load(Ordering::SeqCst);
    if new_code {
        reserve(order.clone()).await?;
    }
    ship(order).await
}

/// Kills and reaps a child process when the test ends, however it ends.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An executable on `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Chromium and chromedriver, or `None` after saying why the test is skipped.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| which("chromium"))
        .or_else(|| which("chromium-browser"));
    let driver = std::env::var_os("CHROMEDRIVER")
        .map(PathBuf::from)
        .or_else(|| which("chromedriver"));
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        (c, d) => {
            let missing = [(c.is_none(), "chromium"), (d.is_none(), "chromedriver")]
                .iter()
                .filter(|(m, _)| *m)
                .map(|(_, n)| *n)
                .collect::<Vec<_>>()
                .join(" and ");
            let msg = format!(
                "{missing} not found: install Debian's `chromium` and `chromium-driver` \
                 (as .ci/run does) to run the browser test"
            );
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{msg}");
            }
            // Straight to stderr: the test harness would hide an `eprintln!` of a passing test.
            let _ = writeln!(std::io::stderr(), "skipping the browser test: {msg}");
            None
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Until something listens on `addr`.
fn until_listening(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + WAIT;
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start listening on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `workflow <store..> web --port 0`; returns it and the URL it printed.
fn start_dashboard(store: &[String]) -> (Reap, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_workflow"))
        .args(store)
        .args(["web", "--port", "0"])
        .env_remove("WORKFLOW_DB")
        .env_remove("WORKFLOW_DATABASE_URL")
        .env_remove("WORKFLOW_SCHEMA")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("cannot start `workflow web`");
    let stdout = child.stdout.take().unwrap();
    let child = Reap(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(WAIT)
        .expect("`workflow web` printed no address in time");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .trim_end_matches('/')
        .to_owned();
    (child, url)
}

/// Starts chromedriver and opens a headless Chromium session with a fresh profile.
async fn start_browser(chromium: &Path, driver: &Path, profile: &Path) -> (Reap, Client) {
    let port = free_port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start chromedriver");
    let child = Reap(child);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    tokio::task::spawn_blocking(move || until_listening(addr, "chromedriver"))
        .await
        .unwrap();
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".to_owned(),
        json!({
            "binary": chromium,
            "args": [
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
                "--window-size=1280,1100",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    let client = tokio::time::timeout(
        WAIT,
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://{addr}")),
    )
    .await
    .expect("no browser session in time")
    .expect("chromedriver refused the session");
    (child, client)
}

/// Polls `check` until it yields `Some`, for at most [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Attempts recorded in a run's history: the first starts with `StepScheduled`, the others
/// with `StepAttemptStarted`. Also the failed ones.
async fn attempts(rt: &Runtime, id: RunId) -> (usize, usize) {
    let events = rt.store().events(&id).await.unwrap();
    let started = events
        .iter()
        .filter(|e| {
            matches!(
                e.event,
                Event::StepScheduled { .. } | Event::StepAttemptStarted { .. }
            )
        })
        .count();
    let failed = events
        .iter()
        .filter(|e| {
            matches!(
                &e.event,
                Event::StepAttemptFailed { .. } | Event::StepCompleted { result: Err(_), .. }
            )
        })
        .count();
    (started, failed)
}

async fn count(client: &Client, css: &str) -> usize {
    client.find_all(Locator::Css(css)).await.unwrap().len()
}

/// Types `payload` into the resume form `form` and submits it.
async fn submit_payload(client: &Client, form: &str, payload: &str) {
    let area = client
        .find(Locator::Css(&format!("{form} textarea")))
        .await
        .unwrap();
    area.send_keys(payload).await.unwrap();
    client
        .find(Locator::Css(&format!("{form} button")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

fn screenshots() -> PathBuf {
    // CARGO_TARGET_TMPDIR is `<target>/tmp`.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

mod sqlite {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_dashboard_shows_runs_and_resumes_a_hook() {
        super::the_dashboard_shows_runs_and_resumes_a_hook(super::Backend::Sqlite).await;
    }
}

mod postgres {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_dashboard_shows_runs_and_resumes_a_hook() {
        super::the_dashboard_shows_runs_and_resumes_a_hook(super::Backend::Postgres).await;
    }
}

async fn the_dashboard_shows_runs_and_resumes_a_hook(b: Backend) {
    let Some((chromium, driver)) = browser() else {
        return;
    };
    if !common::available(b) {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    DEPLOYED.store(false, Ordering::SeqCst);
    tokio::time::timeout(TEST_LIMIT, dashboard(b, &chromium, &driver))
        .await
        .expect("the browser test did not finish in time");
}

async fn dashboard(b: Backend, chromium: &Path, driver: &Path) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();

    // A failed run, then one that waits on its approval hook.
    let declined = rt
        .start(checkout, ("o-17".to_string(), 0u64))
        .await
        .unwrap();
    let err = declined.return_value().await.unwrap_err();
    assert!(err.to_string().contains("card declined"), "{err}");
    let order = "o-42".to_string();
    let token = format!("approve:{order}");
    let waiting = rt.start(checkout, (order, 4200u64)).await.unwrap();
    eventually("the hook to open", || async {
        rt.get_hook_by_token(&token).await.ok()
    })
    .await;

    let (_web, base) = tokio::task::spawn_blocking({
        let store = db.args();
        move || start_dashboard(&store)
    })
    .await
    .unwrap();
    let profile = tempfile::tempdir().unwrap();
    let (_driver, client) = start_browser(chromium, driver, profile.path()).await;
    let shots = screenshots();

    // The runs list, newest first.
    client.goto(&format!("{base}/")).await.unwrap();
    let rows = client
        .find_all(Locator::Css("table.runs tr[data-run-id]"))
        .await
        .unwrap();
    let mut listed = Vec::new();
    for r in &rows {
        listed.push(r.attr("data-run-id").await.unwrap().unwrap());
    }
    assert_eq!(
        listed,
        [waiting.id().to_string(), declined.id().to_string()]
    );
    let status = client
        .find(Locator::Css(&format!(
            r#"tr[data-run-id="{}"] .badge"#,
            declined.id()
        )))
        .await
        .unwrap();
    assert_eq!(status.text().await.unwrap(), "failed");
    std::fs::write(shots.join("runs.png"), client.screenshot().await.unwrap()).unwrap();

    // The filter narrows the list.
    client
        .goto(&format!("{base}/?status=failed"))
        .await
        .unwrap();
    assert_eq!(count(&client, "table.runs tr[data-run-id]").await, 1);

    // A run page: one bar per step attempt, failed attempts marked.
    client.goto(&format!("{base}/")).await.unwrap();
    client
        .find(Locator::Css(&format!(
            r#"a[href="/runs/{}"]"#,
            waiting.id()
        )))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(".timeline"))
        .await
        .unwrap();
    assert!(client
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with(&waiting.id().to_string()));
    let (started, failed) = attempts(&rt, waiting.id()).await;
    assert_eq!(
        (started, failed),
        (4, 2),
        "reserve once, charge three times"
    );
    assert_eq!(count(&client, ".timeline .bar.attempt").await, started);
    assert_eq!(
        count(&client, ".timeline .bar.attempt.failed").await,
        failed
    );
    assert_eq!(count(&client, ".timeline .bar.retry-wait").await, 2);
    assert_eq!(count(&client, ".timeline .bar.sleep").await, 1);
    assert_eq!(count(&client, ".timeline .bar.hook.open").await, 1);
    let charge_bars = client
        .find_all(Locator::Css(".timeline .bar.attempt[data-attempt]"))
        .await
        .unwrap();
    let mut numbers = Vec::new();
    for b in &charge_bars {
        numbers.push(b.attr("data-attempt").await.unwrap().unwrap());
    }
    assert_eq!(numbers, ["1", "1", "2", "3"]);
    // The Content-Security-Policy still lets the timeline's style attributes place the bars (a
    // blocked attribute leaves `style.width` empty) and runs the page's script.
    let width = client
        .execute(
            "return document.querySelector('.timeline .bar.attempt').style.width",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        width.as_str().is_some_and(|w| w.ends_with('%')),
        "bar width {width}"
    );
    let badge = client.find(Locator::Css(".run-head .badge")).await.unwrap();
    assert_eq!(badge.text().await.unwrap(), "running");
    std::fs::write(
        shots.join("run-page-waiting.png"),
        client.screenshot().await.unwrap(),
    )
    .unwrap();

    // A malformed payload is refused with a message, and nothing is sent.
    let form = format!(r#"tr[data-token="{token}"] form.resume"#);
    submit_payload(&client, &form, "{approved: yes}").await;
    let error = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(".banner.error"))
        .await
        .unwrap();
    assert!(error
        .text()
        .await
        .unwrap()
        .contains("malformed JSON payload"));
    assert_eq!(rt.store().payloads(&waiting.id(), 0).await.unwrap(), []);

    // Resume the waiting hook from its form; the run moves on and the page follows by itself.
    submit_payload(&client, &form, r#"{"approved": true}"#).await;
    let notice = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(".banner.notice"))
        .await
        .unwrap();
    assert!(notice
        .text()
        .await
        .unwrap()
        .contains("Payload delivered to hook"));
    eventually("the page to show the run completed", || async {
        let badge = client.find(Locator::Css(".run-head .badge")).await.ok()?;
        (badge.text().await.ok()? == "completed").then_some(())
    })
    .await;
    assert_eq!(waiting.return_value().await.unwrap(), "ch_o-42 TRACK-o-42");
    let (started, _) = attempts(&rt, waiting.id()).await;
    assert_eq!(started, 5, "ship ran");
    eventually("the ship step's bar", || async {
        (count(&client, ".timeline .bar.attempt").await == started).then_some(())
    })
    .await;
    assert_eq!(count(&client, ".timeline .mark.payload").await, 1);
    assert_eq!(
        count(&client, "#cancel").await,
        0,
        "an ended run has no cancel button"
    );
    let output = client.find(Locator::Css("#output")).await.unwrap();
    assert!(output.text().await.unwrap().contains("TRACK-o-42"));
    std::fs::write(
        shots.join("run-page.png"),
        client.screenshot().await.unwrap(),
    )
    .unwrap();

    // The hook was released with the run's progress: nothing is open any more.
    client.goto(&format!("{base}/hooks")).await.unwrap();
    assert!(client
        .find(Locator::Css(".empty"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .contains("No open hooks"));

    blocked_run_and_retry(&rt, &client, &base, declined.id()).await;

    client.close().await.unwrap();
}

/// A run of `upgrade` whose history the new code recorded (it reserved first), written through
/// the store; this worker, still on the old code, blocks it. Its page says why, and once the
/// new code is deployed a click on "retry" moves it on.
async fn blocked_run_and_retry(rt: &Runtime, client: &Client, base: &str, declined: RunId) {
    let shots = screenshots();
    // `reserve`'s call in the declined run gives the step id (which names its run).
    let (step_id, name) = rt
        .store()
        .events(&declined)
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::StepScheduled { step_id, name, .. } => Some((step_id, name)),
            _ => None,
        })
        .unwrap();
    let checkout_name = rt
        .store()
        .get_run(&declined)
        .await
        .unwrap()
        .unwrap()
        .workflow;
    let id = RunId::new();
    let at = SystemTime::now();
    rt.store()
        .create_run_with_history(
            NewRun::new(
                id,
                checkout_name.replace("::checkout", "::upgrade"),
                json!(["o-99"]),
                at,
            ),
            &[NewEvent {
                at,
                event: Event::StepScheduled {
                    step_id: step_id.replace(&declined.to_string(), &id.to_string()),
                    name,
                    input: json!(["o-99"]),
                },
            }],
        )
        .await
        .unwrap();
    eventually("the run to block", || async {
        (rt.get_run(&id).status().await.ok()? == RunStatus::Blocked).then_some(())
    })
    .await;

    // The list filters it, with its own badge.
    client
        .goto(&format!("{base}/?status=blocked"))
        .await
        .unwrap();
    assert_eq!(count(client, "table.runs tr[data-run-id]").await, 1);
    let badge = client
        .find(Locator::Css(&format!(r#"tr[data-run-id="{id}"] .badge"#)))
        .await
        .unwrap();
    assert_eq!(badge.text().await.unwrap(), "blocked");
    assert_eq!(
        badge.attr("class").await.unwrap().as_deref(),
        Some("badge blocked")
    );

    // Its page: the divergence first, and a retry button.
    client
        .find(Locator::Css(&format!(r#"a[href="/runs/{id}"]"#)))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let divergence = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#divergence"))
        .await
        .unwrap();
    let text = divergence.text().await.unwrap();
    assert!(
        text.contains("diverged from its recorded history") && text.contains("at event 1"),
        "{text}"
    );
    let expected = client.find(Locator::Css("#div-expected")).await.unwrap();
    assert!(
        expected.text().await.unwrap().contains("browser::reserve"),
        "{text}"
    );
    let found = client.find(Locator::Css("#div-found")).await.unwrap();
    assert!(
        found.text().await.unwrap().contains("browser::ship"),
        "{text}"
    );
    std::fs::write(
        shots.join("run-page-blocked.png"),
        client.screenshot().await.unwrap(),
    )
    .unwrap();

    // The new code is deployed; the retry moves the run on and the page follows by itself.
    DEPLOYED.store(true, Ordering::SeqCst);
    client
        .find(Locator::Css("#retry"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let notice = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(".banner.notice"))
        .await
        .unwrap();
    assert!(
        notice.text().await.unwrap().contains("Retry requested"),
        "{}",
        notice.text().await.unwrap()
    );
    eventually("the page to show the run completed", || async {
        let badge = client.find(Locator::Css(".run-head .badge")).await.ok()?;
        (badge.text().await.ok()? == "completed").then_some(())
    })
    .await;
    assert_eq!(count(client, "#divergence").await, 0);
    assert_eq!(count(client, "#retry").await, 0);
    let output = client.find(Locator::Css("#output")).await.unwrap();
    assert!(output.text().await.unwrap().contains("TRACK-o-99"));

    // A failed run has the button too.
    client
        .goto(&format!("{base}/runs/{declined}"))
        .await
        .unwrap();
    assert_eq!(count(client, "#retry").await, 1);
}
