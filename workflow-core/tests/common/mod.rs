//! Shared by the behaviour tests: one store per test, for every backend, and worker processes.
#![allow(dead_code)]

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use workflow_core::store::memory::MemoryStore;
use workflow_core::store::Store;
use workflow_core::{RunId, Runtime, StartError};

mod failing;
pub use failing::*;
pub mod stored;

/// The stores every behaviour test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
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

/// A fresh schema name for one test.
pub fn fresh_schema() -> String {
    format!(
        "wf_test_{}",
        workflow_core::RunId::new().to_string().to_lowercase()
    )
}

/// One test's database: build several runtimes on it to act as successive or competing workers.
pub struct TestDb {
    pub backend: Backend,
    memory: MemoryStore,
    pub dir: tempfile::TempDir,
    pub schema: String,
}

impl TestDb {
    pub fn new(backend: Backend) -> Self {
        TestDb {
            backend,
            memory: MemoryStore::new(),
            dir: tempfile::tempdir().expect("tempdir"),
            schema: fresh_schema(),
        }
    }

    pub fn sqlite_path(&self) -> std::path::PathBuf {
        self.dir.path().join("wf.db")
    }

    /// A builder on this test's store.
    pub fn builder(&self) -> workflow_core::RuntimeBuilder {
        let b = Runtime::builder();
        match self.backend {
            Backend::Memory => b.store(self.memory.clone()),
            Backend::Sqlite => b.sqlite(self.sqlite_path()),
            #[cfg(feature = "postgres")]
            Backend::Postgres => b
                .postgres(postgres_url().expect("checked by the test macro"))
                .schema(&self.schema),
            #[cfg(not(feature = "postgres"))]
            Backend::Postgres => unreachable!("postgres tests need the `postgres` feature"),
        }
    }

    /// A runtime tuned for tests: fast polling, short backoff, `lease` as given.
    pub async fn runtime_with_lease(&self, lease: Duration) -> Runtime {
        self.builder()
            .poll_interval(Duration::from_millis(20))
            .retry_backoff(Duration::from_millis(10))
            .lease(lease)
            .build()
            .await
            .expect("runtime builds")
    }

    pub async fn runtime(&self) -> Runtime {
        self.runtime_with_lease(Duration::from_secs(30)).await
    }

    /// This test's store itself, opened like the runtimes open it.
    pub async fn open_store(&self) -> std::sync::Arc<dyn Store> {
        match self.backend {
            Backend::Memory => std::sync::Arc::new(self.memory.clone()),
            Backend::Sqlite => std::sync::Arc::new(
                workflow_core::store::sqlite::SqliteStore::open(self.sqlite_path())
                    .await
                    .expect("sqlite store opens"),
            ),
            #[cfg(feature = "postgres")]
            Backend::Postgres => std::sync::Arc::new(
                workflow_core::store::postgres::PostgresStore::connect(
                    &postgres_url().expect("checked by the test macro"),
                    &self.schema,
                )
                .await
                .expect("postgres store connects"),
            ),
            #[cfg(not(feature = "postgres"))]
            Backend::Postgres => unreachable!("postgres tests need the `postgres` feature"),
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

/// A runtime on `db` through a store whose failures the test sets, its next `admissions`
/// admissions failing (polling every 20 ms).
pub async fn failing_store(db: &TestDb, admissions: usize) -> (FailingAdmissions, Runtime) {
    let store = FailingAdmissions::new(db.open_store().await, admissions);
    let rt = db
        .builder()
        .store(store.clone())
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    (store, rt)
}

/// Whether PostgreSQL at `url` takes a store in `schema`; under `CI=true` an unreachable
/// database fails the test instead of skipping it.
#[cfg(feature = "postgres")]
pub async fn postgres_reachable(url: &str, schema: &str) -> bool {
    match workflow_core::store::postgres::PostgresStore::connect(url, schema).await {
        Ok(_) => true,
        Err(e) => {
            skip(&format!(
                "PostgreSQL at WORKFLOW_TEST_DATABASE_URL is unreachable: {e}"
            ));
            false
        }
    }
}

/// Bounds a test body so a bug fails instead of hanging CI.
pub async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(90), f)
        .await
        .expect("test timed out after 90 s")
}

/// Polls until the run has `status` (bounded by the test's own limit, [`bounded`]).
pub async fn until_status(
    rt: &Runtime,
    id: RunId,
    status: workflow_core::RunStatus,
) -> workflow_core::RunRecord {
    loop {
        let run = rt.get_run(&id).info().await.unwrap();
        if run.status == status {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Until this process drives no run in memory (`active_runs() == 0`): every run it had is
/// ended or evicted. Fails after 10 s (tests evict within milliseconds), naming `why`.
pub async fn until_no_active_runs(rt: &Runtime, why: &str) {
    let limit = Duration::from_secs(10);
    let polled = tokio::time::timeout(limit, async {
        while rt.active_runs() != 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        polled.is_ok(),
        "{why}: still {} runs driven in memory after {limit:?}",
        rt.active_runs()
    );
}

/// Sends `payload` to `token` once a hook owns it (polling while none does).
pub async fn resume_when_ready(rt: &Runtime, token: &str, payload: &str) {
    loop {
        match rt.resume_hook(token, payload).await {
            Ok(_) => return,
            Err(workflow_core::HookError::NotFound(_)) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("resume_hook({token}): {e}"),
        }
    }
}

/// Whether tests on `backend` run here (PostgreSQL needs the feature and a URL).
pub fn available(backend: Backend) -> bool {
    match backend {
        Backend::Postgres => {
            if !cfg!(feature = "postgres") {
                skip("built without the `postgres` feature (build with --all-features)");
                return false;
            }
            postgres_url().is_some()
        }
        _ => true,
    }
}

/// Generates one `#[tokio::test]` per backend for each listed `async fn name(Backend)`.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        $crate::on_every_store!(@backend memory, Memory, $($name),*);
        $crate::on_every_store!(@backend sqlite, Sqlite, $($name),*);
        $crate::on_every_store!(@backend postgres, Postgres, $($name),*);
    };
    (@backend $module:ident, $variant:ident, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let backend = $crate::common::Backend::$variant;
                    if $crate::common::available(backend) {
                        $crate::common::bounded(super::$name(backend)).await
                    }
                }
            )*
        }
    };
}

/// A worker process: this test binary re-executed on its ignored `child_main` test with the
/// given environment.
pub struct Worker {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Worker {
    pub fn spawn(env: &[(&str, &str)]) -> Worker {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--ignored",
            "--exact",
            "child_main",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("WF_CHILD", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn worker");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker { child, lines }
    }

    /// Whether this process was started as a worker by [`Worker::spawn`].
    pub fn is_child() -> bool {
        std::env::var("WF_CHILD").is_ok()
    }

    /// The rest of the first output line containing `prefix`, waiting at most `timeout`.
    pub fn line(&self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // libtest prints `test child_main ... ` before the first line of output.
                Ok(l) if l.contains(prefix) => {
                    let at = l.find(prefix).unwrap_or(0) + prefix.len();
                    return l[at..].trim().to_owned();
                }
                Ok(_) => {}
                Err(e) => panic!("no `{prefix}` line from the worker within {timeout:?}: {e}"),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().unwrap();
    }

    /// Waits for the process to exit by itself (e.g. by aborting).
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lines of a step log file: (step id, attempt, label, pid).
/// Appends `<step_id> <attempt> <label> <pid> <unix ms>` to the step log named by `WF_LOG`:
/// called from step bodies in worker processes.
pub fn log_execution(label: &str) {
    use std::io::Write;
    let m = workflow_core::step_metadata();
    let ms = workflow_core::store::to_millis(SystemTime::now());
    let line = format!(
        "{} {} {label} {} {ms}\n",
        m.step_id,
        m.attempt,
        std::process::id()
    );
    let path = std::env::var("WF_LOG").expect("WF_LOG");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open log");
    f.write_all(line.as_bytes()).expect("write log");
}

/// A worker's side of a start storm: awaits its starts and prints
/// `STORM won=<ids> lost=<owners>` for [`storm_outcome`].
pub async fn report_storm(starts: Vec<tokio::task::JoinHandle<Result<RunId, StartError>>>) {
    use std::io::Write;
    let (mut won, mut lost) = (Vec::new(), Vec::new());
    for s in starts {
        match s.await.unwrap() {
            Ok(run) => won.push(run.to_string()),
            Err(StartError::HookConflict(c)) => lost.push(c.conflicting_run_id.to_string()),
            Err(e) => panic!("{e}"),
        }
    }
    println!("STORM won={} lost={}", won.join(","), lost.join(","));
    std::io::stdout().flush().unwrap();
}

/// The runs the storm workers admitted, and the owners their conflicts named.
pub fn storm_outcome(workers: &[Worker]) -> (Vec<String>, Vec<String>) {
    let (mut won, mut lost) = (Vec::new(), Vec::new());
    for w in workers {
        let line = w.line("STORM ", Duration::from_secs(60));
        let ids = |name: &str| -> Vec<String> {
            line.split(' ')
                .find_map(|f| f.strip_prefix(name))
                .unwrap_or("")
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        };
        won.extend(ids("won="));
        lost.extend(ids("lost="));
    }
    (won, lost)
}

pub fn read_log(log: &Path) -> Vec<(String, u32, String, u32)> {
    read_log_timed(log)
        .into_iter()
        .map(|(id, attempt, label, pid, _)| (id, attempt, label, pid))
        .collect()
}

/// Lines of a step log file with their optional fifth field, a Unix time in ms (0 if absent).
pub fn read_log_timed(log: &Path) -> Vec<(String, u32, String, u32, u64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            let ms = p.get(4).and_then(|v| v.parse().ok()).unwrap_or(0);
            (
                p[0].to_owned(),
                p[1].parse().unwrap(),
                p[2].to_owned(),
                p[3].parse().unwrap(),
                ms,
            )
        })
        .collect()
}

/// The body of a worker process's `child_main`: when this process was started by
/// [`Worker::spawn`], a worker runtime on the store its parent named, with the test's own
/// settings (`configure`), says READY on stdout and serves until it is killed.
pub fn serve_worker(
    configure: impl FnOnce(workflow_core::RuntimeBuilder) -> workflow_core::RuntimeBuilder,
) {
    if !Worker::is_child() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let _worker = configure(Place::from_env().builder())
            .build()
            .await
            .expect("worker runtime");
        println!("READY");
        std::io::Write::flush(&mut std::io::stdout()).unwrap();
        std::future::pending::<()>().await;
    });
}

/// Where a test's store is, as the test and its worker processes open it (passed to the
/// children through the environment).
#[derive(Clone)]
pub enum Place {
    #[cfg(feature = "postgres")]
    Postgres { url: String, schema: String },
    #[cfg(feature = "sqlite")]
    Sqlite { path: std::path::PathBuf },
}

impl Place {
    pub fn name(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => "PostgreSQL",
            #[cfg(feature = "sqlite")]
            Place::Sqlite { .. } => "SQLite",
        }
    }

    /// A runtime builder on this store.
    pub fn builder(&self) -> workflow_core::RuntimeBuilder {
        let b = Runtime::builder();
        match self {
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema } => b.postgres(url).schema(schema),
            #[cfg(feature = "sqlite")]
            Place::Sqlite { path } => b.sqlite(path),
        }
    }

    /// The environment that tells a child process where the store is.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema } => vec![
                ("WF_STORE", "postgres".into()),
                ("WF_PG_URL", url.clone()),
                ("WF_SCHEMA", schema.clone()),
            ],
            #[cfg(feature = "sqlite")]
            Place::Sqlite { path } => vec![
                ("WF_STORE", "sqlite".into()),
                ("WF_DB", path.to_str().unwrap().to_owned()),
            ],
        }
    }

    /// In a child process: the store its parent named in [`Place::env`].
    pub fn from_env() -> Place {
        let var = |k: &str| std::env::var(k).unwrap();
        match var("WF_STORE").as_str() {
            #[cfg(feature = "postgres")]
            "postgres" => Place::Postgres {
                url: var("WF_PG_URL"),
                schema: var("WF_SCHEMA"),
            },
            #[cfg(feature = "sqlite")]
            "sqlite" => Place::Sqlite {
                path: var("WF_DB").into(),
            },
            other => panic!("unknown store {other:?}"),
        }
    }
}
