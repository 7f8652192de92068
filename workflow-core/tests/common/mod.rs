//! Shared by the behaviour tests: one store per test, for every backend, and worker processes.
#![allow(dead_code)]

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use workflow_core::store::memory::MemoryStore;
use workflow_core::store::{
    AcquireRequest, AdminStore, Admission, Append, CancelOutcome, ClaimOutcome, EventRecord,
    FailureOutcome, HookFilter, HookRecord, HookStore, InboxEntry, Lease, LeasedRun, NewEvent,
    NewRun, Notice, QueueStore, RetryOutcome, RunFilter, RunRecord, RunStore, Store, StreamStore,
};
use workflow_core::{RunId, Runtime, StartError, StoreError};

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

/// How [`FailingAdmissions::fail_appends`] makes an append fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendFailure {
    /// The database refuses the write (not transient): nothing is written.
    Refused,
    /// The connection is lost before the write (transient): nothing is written.
    Lost,
    /// The connection is lost after the commit, before the answer (transient): the write
    /// is there.
    LostAfterCommit,
}

/// A store that passes everything to another store, except that its next `failures`
/// admissions wait at a gate and then fail: for tests of what the runtime does when the store
/// refuses a start. Clones share the gate.
#[derive(Clone)]
pub struct FailingAdmissions(std::sync::Arc<Failing>);

pub struct Failing {
    inner: std::sync::Arc<dyn Store>,
    failures: std::sync::atomic::AtomicUsize,
    /// How many of the next appends that carry events panic inside the store call.
    append_panics: std::sync::atomic::AtomicUsize,
    /// Whether heartbeats fail (a worker that stalls: its leases expire).
    heartbeats_fail: std::sync::atomic::AtomicBool,
    /// How many of the next appends that carry events fail, and how ([`AppendFailure`]).
    append_failures: std::sync::atomic::AtomicUsize,
    append_failure: std::sync::Mutex<AppendFailure>,
    /// How many admissions are waiting at the gate now.
    pub waiting: std::sync::atomic::AtomicUsize,
    /// Each `read_stream` of a batch (limit above 0): (stream, from, chunks found), in order.
    stream_reads: std::sync::Mutex<Vec<(String, u64, usize)>>,
    gate: tokio::sync::Semaphore,
    /// How many times a run's record was read (`get_run`).
    pub run_reads: std::sync::atomic::AtomicUsize,
    /// Each run's end written, with the hint it carried.
    ends: std::sync::Mutex<Vec<(RunId, workflow_core::store::EndHint)>>,
}

impl std::ops::Deref for FailingAdmissions {
    type Target = Failing;
    fn deref(&self) -> &Failing {
        &self.0
    }
}

impl FailingAdmissions {
    pub fn new(inner: std::sync::Arc<dyn Store>, failures: usize) -> Self {
        FailingAdmissions(std::sync::Arc::new(Failing {
            inner,
            failures: failures.into(),
            append_panics: 0.into(),
            heartbeats_fail: false.into(),
            append_failures: 0.into(),
            append_failure: std::sync::Mutex::new(AppendFailure::Refused),
            waiting: 0.into(),
            stream_reads: Default::default(),
            gate: tokio::sync::Semaphore::new(0),
            run_reads: 0.into(),
            ends: std::sync::Mutex::default(),
        }))
    }

    /// The hint each run's end carried, by run, for the ends written so far.
    pub fn end_hints(&self) -> Vec<(RunId, workflow_core::store::EndHint)> {
        self.ends.lock().unwrap().clone()
    }

    /// Makes the next `n` appends carrying events panic (a bug in code the driver calls).
    pub fn panic_on_appends(&self, n: usize) {
        self.append_panics
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the next `n` appends carrying events fail as `how` says.
    pub fn fail_appends(&self, n: usize, how: AppendFailure) {
        *self.append_failure.lock().unwrap() = how;
        self.append_failures
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes heartbeats fail (`true`) or reach the store again.
    pub fn fail_heartbeats(&self, fail: bool) {
        self.heartbeats_fail
            .store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a reader of `stream` has read from chunk `from` and found nothing: it waits for
    /// that chunk.
    pub fn read_nothing_from(&self, stream: &str, from: u64) -> bool {
        self.stream_reads
            .lock()
            .unwrap()
            .iter()
            .any(|(s, f, got)| s == stream && *f == from && *got == 0)
    }

    /// Lets the admissions waiting at the gate fail, and every later one through at once.
    pub fn open_gate(&self) {
        self.gate
            .add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
    }

    async fn maybe_fail(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let fail = self
            .failures
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !fail {
            return Ok(());
        }
        self.waiting.fetch_add(1, SeqCst);
        let _permit = self.gate.acquire().await;
        self.waiting.fetch_sub(1, SeqCst);
        Err(StoreError::Database("injected admission failure".into()))
    }
}

#[async_trait::async_trait]
impl RunStore for FailingAdmissions {
    async fn create_run(&self, run: NewRun) -> Result<Admission, StoreError> {
        self.maybe_fail().await?;
        self.inner.create_run(run).await
    }

    async fn create_run_leased(
        &self,
        run: NewRun,
        lease: Duration,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        self.maybe_fail().await?;
        self.inner.create_run_leased(run, lease).await
    }

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        self.run_reads
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.get_run(id).await
    }

    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        self.inner.events(id).await
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Vec<LeasedRun>, StoreError> {
        self.inner.acquire(req).await
    }

    async fn append(&self, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        if !write.events.is_empty()
            && self
                .append_panics
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            panic!("injected panic in append");
        }
        let fail = !write.events.is_empty()
            && self
                .append_failures
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if write.outcome.is_some() {
            self.ends
                .lock()
                .unwrap()
                .push((lease.run_id, write.end_hint));
        }
        if !fail {
            return self.inner.append(lease, write).await;
        }
        let how = *self.append_failure.lock().unwrap();
        let error = |transient| {
            StoreError::Database(
                workflow_core::DatabaseError::new("injected append failure").transient(transient),
            )
        };
        match how {
            AppendFailure::Refused => Err(error(false)),
            AppendFailure::Lost => Err(error(true)),
            AppendFailure::LostAfterCommit => {
                self.inner.append(lease, write).await?;
                Err(error(true))
            }
        }
    }

    async fn record_failure(
        &self,
        lease: &Lease,
        cause: &workflow_core::Error,
        now: SystemTime,
    ) -> Result<FailureOutcome, StoreError> {
        self.inner.record_failure(lease, cause, now).await
    }

    async fn block(
        &self,
        lease: &Lease,
        divergence: &workflow_core::Error,
        now: SystemTime,
    ) -> Result<SystemTime, StoreError> {
        self.inner.block(lease, divergence, now).await
    }

    async fn retry(&self, id: &RunId, now: SystemTime) -> Result<RetryOutcome, StoreError> {
        self.inner.retry(id, now).await
    }

    async fn wake_blocked(&self, now: SystemTime) -> Result<u64, StoreError> {
        self.inner.wake_blocked(now).await
    }

    async fn create_run_with_history(
        &self,
        run: NewRun,
        history: &[NewEvent],
    ) -> Result<(), StoreError> {
        self.inner.create_run_with_history(run, history).await
    }

    async fn release(
        &self,
        lease: &Lease,
        wake_at: SystemTime,
        payloads_seen: u64,
    ) -> Result<(), StoreError> {
        self.inner.release(lease, wake_at, payloads_seen).await
    }

    async fn start_child(
        &self,
        lease: &Lease,
        child_key: &str,
        child: NewRun,
    ) -> Result<workflow_core::store::Admission, StoreError> {
        self.inner.start_child(lease, child_key, child).await
    }

    async fn ended_among(&self, runs: &[RunId]) -> Result<Vec<RunId>, StoreError> {
        self.inner.ended_among(runs).await
    }

    async fn now(&self) -> Result<Option<SystemTime>, StoreError> {
        self.inner.now().await
    }

    async fn heartbeat(
        &self,
        leases: &[Lease],
        lease: Duration,
        now: SystemTime,
    ) -> Result<Vec<RunId>, StoreError> {
        if self
            .heartbeats_fail
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(StoreError::Database("injected heartbeat failure".into()));
        }
        self.inner.heartbeat(leases, lease, now).await
    }

    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        self.inner.cancel(id, now).await
    }

    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<Notice>> {
        self.inner.notices()
    }
}

#[async_trait::async_trait]
impl HookStore for FailingAdmissions {
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: serde_json::Value,
    ) -> Result<workflow_core::store::AdmitOrResume, StoreError> {
        self.maybe_fail().await?;
        self.inner.admit_or_resume(run, lease, payload).await
    }

    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim_hook(lease, hook_key, token, at).await
    }

    async fn resume_hook(
        &self,
        token: &str,
        payload: serde_json::Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError> {
        self.inner.resume_hook(token, payload, at).await
    }

    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<InboxEntry>, StoreError> {
        self.inner.payloads(run, after).await
    }

    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError> {
        self.inner.payloads_since(after, limit).await
    }

    async fn last_payload_id(&self) -> Result<u64, StoreError> {
        self.inner.last_payload_id().await
    }

    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError> {
        self.inner.get_hook(token).await
    }

    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        self.inner.list_hooks(filter).await
    }
}

#[async_trait::async_trait]
impl workflow_core::store::MessageStore for FailingAdmissions {
    async fn send_message(
        &self,
        run: &RunId,
        message: workflow_core::store::NewMessage,
    ) -> Result<workflow_core::store::SendOutcome, StoreError> {
        self.inner.send_message(run, message).await
    }

    async fn run_events(
        &self,
        run: &RunId,
    ) -> Result<Option<workflow_core::store::RunEvents>, StoreError> {
        self.inner.run_events(run).await
    }
}

#[async_trait::async_trait]
impl StreamStore for FailingAdmissions {
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: serde_json::Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        self.inner
            .append_chunk(lease, stream, attempt, value, at)
            .await
    }

    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        self.inner.close_stream(lease, stream, at).await
    }

    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<workflow_core::store::StreamPage, StoreError> {
        let page = self.inner.read_stream(run, stream, from, limit).await?;
        if limit > 0 {
            let read = (stream.to_owned(), from, page.chunks.len());
            self.stream_reads.lock().unwrap().push(read);
        }
        Ok(page)
    }

    async fn list_streams(
        &self,
        run: &RunId,
    ) -> Result<Vec<workflow_core::store::StreamInfo>, StoreError> {
        self.inner.list_streams(run).await
    }
}

#[async_trait::async_trait]
impl QueueStore for FailingAdmissions {
    async fn define_queues(
        &self,
        queues: &[workflow_core::store::QueueDef],
    ) -> Result<(), StoreError> {
        self.inner.define_queues(queues).await
    }

    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        self.inner.queue_opening(now).await
    }

    async fn list_queues(
        &self,
        now: SystemTime,
    ) -> Result<Vec<workflow_core::store::QueueInfo>, StoreError> {
        self.inner.list_queues(now).await
    }
}

#[async_trait::async_trait]
impl workflow_core::store::TransactionalStore for FailingAdmissions {
    async fn begin_step(
        &self,
        lease: &Lease,
    ) -> Result<Option<Box<dyn workflow_core::store::StepTransaction>>, StoreError> {
        self.inner.begin_step(lease).await
    }
}

#[async_trait::async_trait]
impl workflow_core::store::ScheduleStore for FailingAdmissions {
    async fn define_schedule(
        &self,
        def: &workflow_core::store::ScheduleDef,
        next: Option<SystemTime>,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        self.inner.define_schedule(def, next, at).await
    }

    async fn list_schedules(&self) -> Result<Vec<workflow_core::store::ScheduleState>, StoreError> {
        self.inner.list_schedules().await
    }

    async fn fire_tick(
        &self,
        tick: workflow_core::store::NewTick,
    ) -> Result<workflow_core::store::TickWrite, StoreError> {
        self.inner.fire_tick(tick).await
    }

    async fn advance_schedule(&self, name: &str, next: SystemTime) -> Result<bool, StoreError> {
        self.inner.advance_schedule(name, next).await
    }

    async fn schedule_ticks(
        &self,
        name: &str,
        n: usize,
    ) -> Result<Vec<workflow_core::TickRecord>, StoreError> {
        self.inner.schedule_ticks(name, n).await
    }

    async fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
        next: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        self.inner.set_schedule_paused(name, paused, next).await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, StoreError> {
        self.inner.delete_schedule(name).await
    }
}

#[async_trait::async_trait]
impl AdminStore for FailingAdmissions {
    async fn prune(
        &self,
        ended_before: SystemTime,
        now: SystemTime,
    ) -> Result<workflow_core::PruneStats, StoreError> {
        self.inner.prune(ended_before, now).await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(filter).await
    }
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
