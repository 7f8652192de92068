//! What code inside a run sees: the run's journal context (a task-local set while the driver
//! polls the workflow), the step context (a task-local set while a step attempt runs), and the
//! deterministic primitives built on them: step calls, `sleep`, `now`, `random`, metadata.
//!
//! The workflow never performs effects itself. Calling a step or a sleep *issues a command*
//! into the journal and waits for its result under a key (the step id or timer id); the driver
//! (`driver.rs`) executes commands, records them and delivers results one at a time.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use rand::distr::{Distribution, StandardUniform};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::error::Error;
use crate::ids::{step_id, RunId};
use crate::registry::{BoxFuture, StepDef, WorkflowValue};

tokio::task_local! {
    static WORKFLOW: Arc<RunCtx>;
    static STEP: StepMetadata;
}

/// Runs one attempt of a step body on serialized arguments.
pub(crate) type StepExec =
    Arc<dyn Fn(Value) -> BoxFuture<'static, Result<Value, Error>> + Send + Sync>;

/// A command the workflow issued during a poll.
pub(crate) enum Command {
    Step {
        step_id: String,
        def: &'static StepDef,
        input: Value,
        exec: StepExec,
    },
    Timer {
        timer_id: String,
        fire_at: SystemTime,
    },
}

/// The per-run state shared by the workflow's futures and its driver.
pub(crate) struct RunCtx {
    pub(crate) run_id: RunId,
    pub(crate) workflow: &'static str,
    pub(crate) started_at: SystemTime,
    journal: Mutex<Journal>,
}

struct Journal {
    clock: SystemTime,
    rng: ChaCha8Rng,
    step_counters: HashMap<&'static str, u32>,
    timers: u32,
    issued: Vec<Command>,
    ready: HashMap<String, Result<Value, Error>>,
    waiters: HashMap<String, Waker>,
}

impl RunCtx {
    pub(crate) fn new(run_id: RunId, workflow: &'static str, started_at: SystemTime) -> Arc<Self> {
        Arc::new(RunCtx {
            run_id,
            workflow,
            started_at,
            journal: Mutex::new(Journal {
                clock: started_at,
                rng: ChaCha8Rng::seed_from_u64(run_id.seed()),
                step_counters: HashMap::new(),
                timers: 0,
                issued: Vec::new(),
                ready: HashMap::new(),
                waiters: HashMap::new(),
            }),
        })
    }

    fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `fut` with this context visible to the primitives.
    pub(crate) fn scope<F: Future>(self: &Arc<Self>, fut: F) -> impl Future<Output = F::Output> {
        WORKFLOW.scope(self.clone(), fut)
    }

    /// Takes the commands issued since the last call, in issue order.
    pub(crate) fn take_issued(&self) -> Vec<Command> {
        std::mem::take(&mut self.journal().issued)
    }

    /// Makes `result` available under `key`, advances the clock to `at`, and wakes the waiter.
    pub(crate) fn deliver(&self, key: &str, at: SystemTime, result: Result<Value, Error>) {
        let waker = {
            let mut j = self.journal();
            if at > j.clock {
                j.clock = at;
            }
            j.ready.insert(key.to_owned(), result);
            j.waiters.remove(key)
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn issue(&self, cmd: Command) {
        self.journal().issued.push(cmd);
    }

    fn wait(self: &Arc<Self>, key: String) -> WaitFor {
        WaitFor {
            ctx: self.clone(),
            key,
        }
    }
}

/// Resolves with the result delivered under `key`. Dropping it consumes nothing.
struct WaitFor {
    ctx: Arc<RunCtx>,
    key: String,
}

impl Future for WaitFor {
    type Output = Result<Value, Error>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut j = self.ctx.journal();
        match j.ready.remove(&self.key) {
            Some(r) => {
                j.waiters.remove(&self.key);
                Poll::Ready(r)
            }
            None => {
                j.waiters.insert(self.key.clone(), cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

fn current() -> Option<Arc<RunCtx>> {
    WORKFLOW.try_with(|c| c.clone()).ok()
}

/// Sets the step context for one attempt.
pub(crate) fn step_scope<F: Future>(meta: StepMetadata, fut: F) -> impl Future<Output = F::Output> {
    STEP.scope(meta, fut)
}

/// Where a step runs: as a recorded step of the current run, or (outside any workflow, or
/// inside another step) as a plain async fn.
#[doc(hidden)]
pub async fn call_step<A, T, F, Fut>(def: &'static StepDef, args: A, body: F) -> Result<T, Error>
where
    A: WorkflowValue,
    T: WorkflowValue,
    F: Fn(A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, Error>> + Send + 'static,
{
    let Some(ctx) = current() else {
        return body(args).await;
    };
    let input = serde_json::to_value(&args).map_err(|e| {
        Error::fatal(format!(
            "the arguments of step `{}` could not be serialized: {e}",
            def.name
        ))
    })?;
    let id = {
        let mut j = ctx.journal();
        let n = j.step_counters.entry(def.name).or_insert(0);
        let id = step_id(&ctx.run_id, def.name, *n);
        *n += 1;
        id
    };
    let name = def.name;
    let exec: StepExec = Arc::new(move |input: Value| {
        let args = serde_json::from_value::<A>(input);
        let fut = args.map(&body);
        Box::pin(async move {
            let args_fut = fut.map_err(|e| {
                Error::fatal(format!(
                    "the recorded arguments of step `{name}` do not match this binary: {e}"
                ))
            })?;
            let out = args_fut.await?;
            serde_json::to_value(out).map_err(|e| {
                Error::fatal(format!(
                    "the result of step `{name}` could not be serialized: {e}"
                ))
            })
        })
    });
    ctx.issue(Command::Step {
        step_id: id.clone(),
        def,
        input,
        exec,
    });
    let value = ctx.wait(id).await?;
    serde_json::from_value(value).map_err(|e| {
        Error::fatal(format!(
            "the recorded result of step `{name}` does not match its type in this binary: {e}"
        ))
    })
}

/// Sleeps durably: inside a workflow the wake-up time is recorded and survives restarts (a
/// long sleep lets the worker evict the run from memory); outside, it is `tokio::time::sleep`.
///
/// Cancellation-safe: a sleep dropped before it fires (e.g. the losing branch of a `select`)
/// consumes nothing.
pub async fn sleep(duration: Duration) {
    match current() {
        Some(ctx) => {
            let at = ctx.journal().clock + duration;
            timer(ctx, at).await;
        }
        None => tokio::time::sleep(duration).await,
    }
}

/// Sleeps durably until `deadline` (see [`sleep`]).
pub async fn sleep_until(deadline: SystemTime) {
    match current() {
        Some(ctx) => timer(ctx, deadline).await,
        None => {
            let d = deadline
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            tokio::time::sleep(d).await;
        }
    }
}

async fn timer(ctx: Arc<RunCtx>, fire_at: SystemTime) {
    let id = {
        let mut j = ctx.journal();
        let id = format!("tmr_{}", j.timers);
        j.timers += 1;
        j.issued.push(Command::Timer {
            timer_id: id.clone(),
            fire_at,
        });
        id
    };
    // A timer's delivery carries no value and cannot fail.
    let _ = ctx.wait(id).await;
}

/// The current time. Inside a workflow: the time of the last event delivered to it (the run's
/// start before any), the same on every replay. Elsewhere: the wall clock.
pub fn now() -> SystemTime {
    match current() {
        Some(ctx) => ctx.journal().clock,
        None => SystemTime::now(),
    }
}

/// A random value. Inside a workflow: from a generator seeded by the run id, so replay draws
/// the same sequence. Elsewhere: from the thread's generator.
///
/// ```
/// let roll: u8 = workflow_core::random();
/// let coin: bool = workflow_core::random();
/// # let _ = (roll, coin);
/// ```
pub fn random<T>() -> T
where
    StandardUniform: Distribution<T>,
{
    match current() {
        Some(ctx) => ctx.journal().rng.random(),
        None => rand::random(),
    }
}

/// Facts about the running step attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepMetadata {
    /// Stable across retries and replays; use it as an idempotency key.
    pub step_id: String,
    /// The step's registered name.
    pub step_name: String,
    /// The run the step belongs to.
    pub run_id: RunId,
    /// From 1.
    pub attempt: u32,
    /// When this attempt started.
    pub started_at: SystemTime,
}

/// Facts about the running workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowMetadata {
    /// The run.
    pub run_id: RunId,
    /// The workflow's registered name.
    pub workflow_name: String,
    /// When the run was admitted.
    pub started_at: SystemTime,
}

/// The metadata of the step attempt running now, or `None` outside a recorded step.
pub fn try_step_metadata() -> Option<StepMetadata> {
    STEP.try_with(|m| m.clone()).ok()
}

/// The metadata of the step attempt running now.
///
/// # Panics
/// Outside a step executed by a runtime (in a workflow body, or a step called as a plain fn);
/// use [`try_step_metadata`] where that can happen.
pub fn step_metadata() -> StepMetadata {
    try_step_metadata().expect(
        "step_metadata() was called outside a step executed by a workflow runtime; \
         call it inside a #[step] fn invoked from a #[workflow], or use try_step_metadata()",
    )
}

/// The metadata of the running workflow, or `None` outside one.
pub fn try_workflow_metadata() -> Option<WorkflowMetadata> {
    current().map(|c| WorkflowMetadata {
        run_id: c.run_id,
        workflow_name: c.workflow.to_owned(),
        started_at: c.started_at,
    })
}

/// The metadata of the running workflow.
///
/// # Panics
/// Outside a workflow body run by a runtime; use [`try_workflow_metadata`] where that can happen.
pub fn workflow_metadata() -> WorkflowMetadata {
    try_workflow_metadata().expect(
        "workflow_metadata() was called outside a workflow run by a runtime; \
         use try_workflow_metadata() where that can happen",
    )
}
