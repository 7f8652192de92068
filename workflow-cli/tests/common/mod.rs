//! A database — a SQLite file, or a PostgreSQL schema — filled by real workflows: one run
//! completed after a retry, one failed, one cancelled, one waiting on a hook, one sleeping; and
//! a way to run the real `workflow` binary against it with a time limit.

#![allow(dead_code)]

pub mod http;

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use workflow_core::prelude::*;
use workflow_core::store::{Event, NewEvent, NewRun};

/// Every wait in these tests ends by then.
pub const WAIT: Duration = Duration::from_secs(60);

#[step(max_retries = 3)]
async fn greet(name: String) -> Result<String> {
    // The first attempt fails, so the run shows two attempts of this step.
    if step_metadata().attempt == 1 {
        return Err(Error::retryable("greeting service timed out"));
    }
    Ok(format!("hello, {name}"))
}

#[workflow]
pub async fn welcome(name: String) -> Result<String> {
    greet(name).await
}

#[step(max_retries = 1)]
async fn charge(amount: u64) -> Result<u64> {
    Err(Error::retryable(format!("card declined for {amount}")))
}

#[workflow]
pub async fn billing(amount: u64) -> Result<u64> {
    charge(amount).await
}

#[step]
async fn note(what: String) -> Result<String> {
    Ok(what)
}

#[workflow]
pub async fn nap(who: String) -> Result<String> {
    note(format!("{who} goes to sleep")).await?;
    sleep(Duration::from_secs(3600)).await;
    note(format!("{who} woke up")).await
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Approval {
    pub approved: bool,
}

#[workflow]
pub async fn approval(order: String) -> Result<String> {
    note(format!("order {order} awaits approval")).await?;
    let mut hook = create_hook::<Approval>(format!("approval:{order}"));
    let Approval { approved } = hook.recv().await?;
    hook.dispose();
    note(format!("order {order} approved={approved}")).await
}

/// The keys whose `upgrade` runs take the new code: a process-global switch standing in for a
/// deploy (the worker runs in the test's process).
fn deployed() -> &'static Mutex<HashSet<String>> {
    static D: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    D.get_or_init(Default::default)
}

/// Deploys the new code for the `upgrade` run of `key`.
pub fn deploy(key: &str) {
    deployed().lock().unwrap().insert(key.to_owned());
}

/// The old code calls `note`; the new code calls `greet` instead.
#[workflow]
pub async fn upgrade(key: String) -> Result<String> {
    let new_code = deployed().lock().unwrap().contains(&key);
    if new_code {
        greet(key).await
    } else {
        note(key).await
    }
}

/// A run of `upgrade(key)` whose history was recorded by the new code (it scheduled `greet`),
/// written through the store; the fixture's worker, still on the old code, finds `note` instead
/// and blocks it. Returns once it is blocked; `deploy(key)` makes the code fit again.
pub async fn blocked_run(f: &Fixture, key: &str) -> RunId {
    blocked_run_expecting(f, key, None).await
}

/// [`blocked_run`] whose history names the step `step_name` (instead of `greet`'s name).
pub async fn blocked_run_expecting(f: &Fixture, key: &str, step_name: Option<&str>) -> RunId {
    let store = f.rt.store();
    let (step_id, name) = store
        .events(&f.completed)
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::StepScheduled { step_id, name, .. } => Some((step_id, name)),
            _ => None,
        })
        .expect("the completed run scheduled `greet`");
    let workflow = store
        .get_run(&f.completed)
        .await
        .unwrap()
        .unwrap()
        .workflow
        .replace("::welcome", "::upgrade");
    let name = step_name.map_or(name, str::to_owned);
    let id = RunId::new();
    // Step ids name their run.
    let step_id = step_id.replace(&f.completed.to_string(), &id.to_string());
    let at = SystemTime::now();
    let run = NewRun::new(id, workflow, serde_json::json!([key]), at);
    let history = [NewEvent {
        at,
        event: Event::StepScheduled {
            step_id,
            name,
            input: serde_json::json!([key]),
        },
    }];
    store.create_run_with_history(run, &history).await.unwrap();
    until_status(&f.rt, id, RunStatus::Blocked).await;
    id
}

/// The stores the command is tested on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Says on stderr why a test is skipped, or fails it under `CI=true`, where nothing may be
/// skipped. Written to the process's stderr itself: libtest captures `eprintln!` and shows it
/// only for a failing test, so a skip would pass in silence.
pub fn skip(why: &str) {
    use std::io::Write;
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{why}, but CI=true requires this test to run");
    }
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
}

/// The PostgreSQL URL for tests, or `None` after saying why the test is skipped (a failure
/// under `CI=true`, see [`skip`]).
pub fn postgres_url() -> Option<String> {
    match std::env::var("WORKFLOW_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            skip("WORKFLOW_TEST_DATABASE_URL is not set");
            None
        }
    }
}

/// Whether tests on `backend` run here (PostgreSQL needs the feature and a URL).
pub fn available(backend: Backend) -> bool {
    if backend == Backend::Sqlite {
        return true;
    }
    if !cfg!(feature = "postgres") {
        skip("built without the `postgres` feature (build with --all-features)");
        return false;
    }
    postgres_url().is_some()
}

/// A whole test ends by then, or fails: each wait in it is bounded by [`WAIT`], and a test
/// makes several.
pub const TEST_LIMIT: Duration = Duration::from_secs(180);

/// Generates one test per store for each listed `async fn name(Backend)`, each bounded by
/// [`TEST_LIMIT`].
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $crate::on_both_stores!(@backend sqlite, Sqlite, $($name),*);
        $crate::on_both_stores!(@backend postgres, Postgres, $($name),*);
    };
    (@backend $module:ident, $variant:ident, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if $crate::common::available($crate::common::Backend::$variant) {
                        ::tokio::time::timeout(
                            $crate::common::TEST_LIMIT,
                            super::$name($crate::common::Backend::$variant),
                        )
                        .await
                        .unwrap_or_else(|_| {
                            panic!("test timed out after {:?}", $crate::common::TEST_LIMIT)
                        });
                    }
                }
            )*
        }
    };
}

/// One test's database: a SQLite file in a temporary folder, or a PostgreSQL schema of its
/// own, dropped at the end.
pub struct TestDb {
    pub backend: Backend,
    pub dir: tempfile::TempDir,
    pub schema: String,
}

impl TestDb {
    pub fn new(backend: Backend) -> Self {
        TestDb {
            backend,
            dir: tempfile::tempdir().unwrap(),
            // `wf_t_*` schemas left by interrupted runs are dropped by .ci/run.
            schema: format!("wf_t_cli_{}", RunId::new().to_string().to_lowercase()),
        }
    }

    pub fn sqlite_path(&self) -> PathBuf {
        self.dir.path().join("runs.db")
    }

    pub fn builder(&self) -> workflow_core::RuntimeBuilder {
        match self.backend {
            Backend::Sqlite => Runtime::builder().sqlite(self.sqlite_path()),
            #[cfg(feature = "postgres")]
            Backend::Postgres => Runtime::builder()
                .postgres(postgres_url().expect("checked by the test macro"))
                .schema(&self.schema),
            #[cfg(not(feature = "postgres"))]
            Backend::Postgres => unreachable!("postgres tests need the `postgres` feature"),
        }
    }

    /// The arguments that point the command at this database.
    pub fn args(&self) -> Vec<String> {
        match self.backend {
            Backend::Sqlite => vec!["--db".into(), self.sqlite_path().display().to_string()],
            Backend::Postgres => vec![
                "--database-url".into(),
                postgres_url().unwrap_or_default(),
                "--schema".into(),
                self.schema.clone(),
            ],
        }
    }
}

#[cfg(feature = "postgres")]
impl Drop for TestDb {
    fn drop(&mut self) {
        if self.backend != Backend::Postgres {
            return;
        }
        let (Some(url), schema) = (postgres_url(), self.schema.clone()) else {
            return;
        };
        // Drop runs inside the test's runtime: clean up from a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(s) =
                    workflow_core::store::postgres::PostgresStore::connect(&url, &schema).await
                {
                    let _ = s.drop_schema().await;
                }
            });
        })
        .join();
    }
}

/// The filled database and the runtime that drives its runs (it stays a worker, so resumed and
/// cancelled runs move on).
pub struct Fixture {
    /// `--db <file>` or `--database-url <url> --schema <name>`.
    pub store: Vec<String>,
    pub rt: Runtime,
    pub completed: RunId,
    pub failed: RunId,
    pub cancelled: RunId,
    pub waiting: RunId,
    pub token: String,
    pub sleeping: RunId,
    pub db: TestDb,
}

pub async fn fixture(backend: Backend) -> Fixture {
    tokio::time::timeout(WAIT, fill(TestDb::new(backend)))
        .await
        .expect("the fixture's runs did not reach their states in time")
}

async fn fill(db: TestDb) -> Fixture {
    let rt = db
        .builder()
        .retry_backoff(Duration::from_millis(20))
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();

    let completed = rt.start(welcome, ("ada".to_string(),)).await.unwrap();
    assert_eq!(completed.return_value().await.unwrap(), "hello, ada");

    let failed = rt.start(billing, (4200u64,)).await.unwrap();
    let err = failed.return_value().await.unwrap_err();
    assert!(err.to_string().contains("card declined for 4200"), "{err}");

    let cancelled = rt.start(nap, ("bob".to_string(),)).await.unwrap();
    until_timer(&rt, cancelled.id()).await;
    cancelled.cancel().await.unwrap();

    let order = RunId::new().to_string();
    let token = format!("approval:{order}");
    let waiting = rt.start(approval, (order,)).await.unwrap();
    while rt.get_hook_by_token(&token).await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let sleeping = rt.start(nap, ("cyd".to_string(),)).await.unwrap();
    until_timer(&rt, sleeping.id()).await;

    Fixture {
        store: db.args(),
        completed: completed.id(),
        failed: failed.id(),
        cancelled: cancelled.id(),
        waiting: waiting.id(),
        token,
        sleeping: sleeping.id(),
        rt,
        db,
    }
}

/// Until run `id` has scheduled its durable sleep.
async fn until_timer(rt: &Runtime, id: RunId) {
    loop {
        let events = rt.store().events(&id).await.unwrap();
        if events
            .iter()
            .any(|e| matches!(e.event, Event::TimerScheduled { .. }))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Until run `id` has status `want`.
pub async fn until_status(rt: &Runtime, id: RunId, want: RunStatus) {
    tokio::time::timeout(WAIT, async {
        while rt.get_run(&id).status().await.unwrap() != want {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("run {id} did not become {want} in time"));
}

/// What the binary did.
#[derive(Debug)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Asserts success and returns standard output.
    pub fn ok(self) -> String {
        assert_eq!(self.code, 0, "the command failed: {self:?}");
        assert!(self.stderr.is_empty(), "unexpected stderr: {self:?}");
        self.stdout
    }

    /// Asserts success and parses standard output as JSON.
    pub fn json(self) -> serde_json::Value {
        let out = self.ok();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
    }

    /// Asserts failure with `code` and a message on stderr containing `needle`, and nothing on
    /// stdout.
    pub fn fails(self, code: i32, needle: &str) {
        assert_eq!(self.code, code, "{self:?}");
        assert!(
            self.stderr.starts_with("error: ") && self.stderr.contains(needle),
            "stderr should say {needle:?}: {self:?}"
        );
        assert!(self.stdout.is_empty(), "{self:?}");
    }
}

/// The `workflow` binary.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_workflow")
}

/// Runs `workflow <store..> <args..>`, killed after [`WAIT`].
pub fn workflow(store: &[String], args: &[&str]) -> Output {
    let mut child = Command::new(binary())
        .args(store)
        .args(args)
        .env_remove("WORKFLOW_DB")
        .env_remove("WORKFLOW_DATABASE_URL")
        .env_remove("WORKFLOW_SCHEMA")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start the workflow binary");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`workflow {}` did not finish within {WAIT:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        code: status.code().unwrap_or(-1),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// [`workflow`] off the async threads, so this process's worker keeps running meanwhile.
pub async fn cli(store: &[String], args: &[&str]) -> Output {
    let store = store.to_vec();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        workflow(&store, &args)
    })
    .await
    .unwrap()
}

/// `--db <path>`.
pub fn sqlite_args(path: &Path) -> Vec<String> {
    vec!["--db".into(), path.display().to_string()]
}
