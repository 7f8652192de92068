//! A SQLite file filled by real workflows — one run completed after a retry, one failed, one
//! cancelled, one waiting on a hook, one sleeping — and a way to run the real `workflow` binary
//! against it with a time limit.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use workflow_core::prelude::*;
use workflow_core::store::Event;

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

/// The filled database and the runtime that drives its runs (it stays a worker, so resumed and
/// cancelled runs move on).
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub db: PathBuf,
    pub rt: Runtime,
    pub completed: RunId,
    pub failed: RunId,
    pub cancelled: RunId,
    pub waiting: RunId,
    pub token: String,
    pub sleeping: RunId,
}

pub async fn fixture() -> Fixture {
    tokio::time::timeout(WAIT, fill())
        .await
        .expect("the fixture's runs did not reach their states in time")
}

async fn fill() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    let rt = Runtime::builder()
        .sqlite(&db)
        .retry_backoff(Duration::from_millis(20))
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();

    let completed = rt.start(welcome, ("ada".to_string(),)).await.unwrap();
    assert_eq!(completed.return_value().await.unwrap(), "hello, ada");

    let failed = rt.start(billing, (4200u64,)).await.unwrap();
    assert!(failed.return_value().await.is_err());

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
        db,
        dir,
        completed: completed.id(),
        failed: failed.id(),
        cancelled: cancelled.id(),
        waiting: waiting.id(),
        token,
        sleeping: sleeping.id(),
        rt,
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

/// Runs `workflow --db <db> args..` (or without `--db` when `db` is `None`), killed after
/// [`WAIT`].
pub fn workflow(db: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(binary());
    if let Some(db) = db {
        cmd.arg("--db").arg(db);
    }
    cmd.args(args)
        .env_remove("WORKFLOW_DB")
        .env_remove("WORKFLOW_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("cannot start the workflow binary");
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
pub async fn cli(db: Option<&Path>, args: &[&str]) -> Output {
    let db = db.map(Path::to_path_buf);
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        workflow(db.as_deref(), &args)
    })
    .await
    .unwrap()
}
