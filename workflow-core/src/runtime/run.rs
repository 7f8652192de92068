//! A handle on one run ([`Run`]): its record, status, streams and history, and what a client
//! may do to it (cancel, retry, fork); `return_value` waits for the run's end signal, which
//! the runtime gives at once for runs ending in this process.

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;

use super::{Inner, RunStream, Runtime, Told, Waiting};
use crate::crypto::places::{self, Owner};
use crate::crypto::OpenError;
use crate::error::{Error, RunError, StoreError};
use crate::history::{
    fork_history, to_millis, ExportedEvent, ExportedHistory, ExportedRun, HISTORY_FORMAT,
    HISTORY_FORMAT_VERSION,
};
use crate::ids::RunId;
use crate::payload::{PayloadError, PayloadKind};
use crate::store::{
    CancelOutcome, NewRun, RetryOutcome, RunOutcome, RunRecord, RunStatus, StreamInfo,
};

/// A handle on one run. `T` is the workflow's return type (`serde_json::Value` from
/// [`Runtime::get_run`]; [`Run::typed`] changes it).
pub struct Run<T = Value> {
    pub(super) id: RunId,
    pub(super) rt: Runtime,
    /// The first run of its chain: what the values its chain shares are sealed for. Known
    /// at once for a run this handle started (it begins one), else read from the run's
    /// record the first time it is needed and kept for this handle and its clones (a run's
    /// chain never changes).
    origin: Arc<OnceLock<RunId>>,
    _t: PhantomData<fn() -> T>,
}

impl<T> Run<T> {
    /// A handle on run `id`.
    pub(super) fn new(id: RunId, rt: Runtime) -> Self {
        Run {
            id,
            rt,
            origin: Arc::default(),
            _t: PhantomData,
        }
    }

    /// A handle on run `id`, just admitted by a start: the first run of its chain.
    pub(super) fn started(id: RunId, rt: Runtime) -> Self {
        Run {
            origin: Arc::new(OnceLock::from(id)),
            ..Run::new(id, rt)
        }
    }

    /// The same handle, reading values as JSON.
    pub(super) fn untyped(&self) -> Run<Value> {
        Run {
            id: self.id,
            rt: self.rt.clone(),
            origin: self.origin.clone(),
            _t: PhantomData,
        }
    }

    /// The run and the first run of its chain (see [`Inner::owner_of`]).
    pub(super) async fn owner(&self) -> Result<Owner, StoreError> {
        let known = self.origin.get().copied();
        let owner = self.rt.inner.owner_of(self.id, known).await?;
        if known.is_none() && self.rt.inner.config.payloads.transforms() {
            // Read from the record: later calls through this handle need no read.
            let _ = self.origin.set(owner.origin);
        }
        Ok(owner)
    }
}

impl<T> Clone for Run<T> {
    fn clone(&self) -> Self {
        Run {
            origin: self.origin.clone(),
            ..Run::new(self.id, self.rt.clone())
        }
    }
}

impl<T> std::fmt::Debug for Run<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run").field("id", &self.id).finish()
    }
}

impl<T> Run<T> {
    /// The run's id.
    pub fn id(&self) -> RunId {
        self.id
    }

    /// The same run, with its result read as `U`.
    pub fn typed<U>(self) -> Run<U> {
        Run {
            id: self.id,
            rt: self.rt,
            origin: self.origin,
            _t: PhantomData,
        }
    }

    /// The run as stored.
    pub async fn info(&self) -> Result<RunRecord, RunError> {
        let run = self.stored().await?;
        Ok(self.rt.inner.config.payloads.open_record(run))
    }

    /// The run's record as stored: sealed payloads stay sealed.
    async fn stored(&self) -> Result<RunRecord, RunError> {
        self.rt
            .inner
            .store
            .get_run(&self.id)
            .await?
            .ok_or(RunError::NotFound(self.id))
    }

    /// Reads the run's stream `name`, which its steps write: every chunk from index 0 (or `.from(i)`, or
    /// `.tail(n)`), then the live writes, until the stream is closed or the run ends. See
    /// [`RunStream`] and [`stream`](crate::stream) for the writing side.
    ///
    /// ```
    /// use futures::StreamExt;
    /// use workflow_core::prelude::*;
    ///
    /// #[step]
    /// async fn progress() -> Result<()> {
    ///     for pct in [25, 50, 75, 100] {
    ///         stream::<u8>("progress").write(pct).await?;
    ///     }
    ///     Ok(())
    /// }
    ///
    /// #[workflow]
    /// async fn job() -> Result<()> {
    ///     progress().await
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let run = rt.start(job, ()).await?;
    /// // Not closed: the stream ends with the run. The last two chunks only:
    /// let mut last = run.stream::<u8>("progress").tail(2);
    /// # run.return_value().await?;
    /// let first = last.next().await.unwrap()?;
    /// assert_eq!((first.index, first.value), (2, 75));
    /// assert_eq!(last.next().await.unwrap()?.value, 100);
    /// assert!(last.next().await.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn stream<U>(&self, name: impl Into<String>) -> RunStream<U> {
        RunStream::new(self.rt.clone(), self.id, name.into())
    }

    /// The run's streams, by name, with their length and whether they were closed.
    pub async fn streams(&self) -> Result<Vec<StreamInfo>, RunError> {
        Ok(self.rt.inner.store.list_streams(&self.id).await?)
    }

    /// The run's current status.
    pub async fn status(&self) -> Result<RunStatus, RunError> {
        Ok(self.info().await?.status)
    }

    /// Cancels the run: once this returns, the run is recorded as cancelled; the worker driving
    /// it stops at its next await point and in-flight step results are discarded. A run that
    /// already ended is left as it is (`Ok`).
    pub async fn cancel(&self) -> Result<(), RunError> {
        // A run that continued as new is cancelled in its chain's current run.
        let mut id = self.id;
        loop {
            let now = self.rt.inner.clock.tick().await;
            match self.rt.inner.store.cancel(&id, now).await? {
                CancelOutcome::Cancelled => {
                    if let Some(a) = self.rt.inner.active().get(&id) {
                        a.stop.notify_one();
                    }
                    self.rt.inner.run_ended(id, None, None);
                    self.rt.inner.slot_freed();
                    // Counted where the cancel is made (`workflow_runs_ended_total{status=
                    // "cancelled"}`); the label needs the workflow's name, read once the run
                    // is cancelled.
                    match self.rt.inner.store.get_run(&id).await {
                        Ok(Some(run)) => crate::telemetry::run_cancelled(&run.workflow),
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(run_id = %id, error = %e, "cancelled run not counted")
                        }
                    }
                }
                CancelOutcome::AlreadyEnded(RunStatus::ContinuedAsNew) => {
                    if let Some(next) = super::messages::next_of(&self.rt.inner, id).await? {
                        id = next;
                        continue;
                    }
                }
                CancelOutcome::AlreadyEnded(_) => {}
            }
            return Ok(());
        }
    }

    /// Tries a failed or blocked run again at once. A blocked run is handed to a worker now (it
    /// continues where it was if the code fits its history again, or blocks again). A failed
    /// run is re-opened: its recorded steps are not run again; the steps whose error ended it
    /// get a fresh set of attempts (or, if the workflow itself returned the error, it runs
    /// again from its replay). A run that completed, was cancelled or has not ended is an
    /// error ([`RunError::NotRetryable`]) and is left as it is.
    ///
    /// ```
    /// # use workflow_core::prelude::*;
    /// # use workflow_core::RunError;
    /// #[step]
    /// async fn fine() -> Result<u32> { Ok(1) }
    /// #[workflow]
    /// async fn done() -> Result<u32> { fine().await }
    /// # #[tokio::main] async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let run = rt.start(done, ()).await?;
    /// run.return_value().await?;
    /// // A completed run has nothing to retry.
    /// assert!(matches!(run.retry().await, Err(RunError::NotRetryable { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn retry(&self) -> Result<(), RunError> {
        let inner = &self.rt.inner;
        let now = inner.clock.tick().await;
        match inner.store.retry(&self.id, now).await? {
            RetryOutcome::Reopened | RetryOutcome::Unblocked => {
                inner.work.notify_one();
                Ok(())
            }
            RetryOutcome::NotRetryable(status) => Err(RunError::NotRetryable {
                id: self.id,
                status,
            }),
        }
    }

    /// Starts a new run of the same workflow with the same arguments whose history holds
    /// this run's recorded results of its first `from_step` steps (in the order they were
    /// scheduled); later steps run again, with this build's code. The copy claims no
    /// hook token, so a run that registered a hook before that step cannot be forked there
    /// ([`RunError::CannotFork`], as for a `from_step` beyond the steps it scheduled).
    ///
    /// Children started before that step are kept, not started again: the copy's
    /// `child.return_value()` gives the original child's end, also when the child ends after the
    /// fork (the copy reads it from the child's record, within the poll interval at first,
    /// then less often while the child runs on, up to once a minute). They stay the
    /// original's children: cancelling the copy does not cancel them.
    pub async fn fork(&self, from_step: usize) -> Result<Run<T>, RunError> {
        let inner = &self.rt.inner;
        let run = self.stored().await?;
        let mut events = inner.store.events(&self.id).await?;
        let id = RunId::new();
        // The copy begins a chain of its own.
        let (from, to) = (Owner::of(&run), Owner::first(id));
        // Sealed payloads belong to their run and place (step ids change in the copy): opened
        // as the original's, then sealed again for the copy.
        let payloads = &inner.config.payloads;
        let unreadable = |e: crate::crypto::OpenError| RunError::CannotFork {
            id: self.id,
            why: format!("a payload of its history could not be read: {e}"),
        };
        for e in &mut events {
            payloads
                .open_event(from, &mut e.event)
                .map_err(unreadable)?;
        }
        let mut history = fork_history(&events, from_step, &self.id, &id)
            .map_err(|why| RunError::CannotFork { id: self.id, why })?;
        for e in &mut history {
            payloads.seal_event(to, &mut e.event);
        }
        let input = payloads
            .reseal_at(
                run.input,
                &places::of_run(from, places::INPUT, ""),
                &places::of_run(to, places::INPUT, ""),
            )
            .map_err(unreadable)?;
        // A trace of its own, under the caller's span (feature `otel`).
        let (_span, trace) = crate::traces::start_span(&run.workflow, id, None);
        let new = NewRun::new(id, run.workflow, input, inner.clock.tick().await)
            .version(inner.config.version.clone())
            .queue(run.queue)
            .trace_context(trace);
        inner.store.create_run_with_history(new, &history).await?;
        inner.work.notify_one();
        Ok(Run::started(id, self.rt.clone()))
    }

    /// The run's history as documented, versioned JSON ([`ExportedHistory`]): feed it to
    /// `workflow_core::testing::replay` to check a new build against it, or keep it as a
    /// test fixture. `workflow export <id>` writes the same.
    pub async fn export(&self) -> Result<Value, RunError> {
        self.export_in(false).await
    }

    /// [`Run::export`] with every encrypted payload opened with the runtime's keys (as
    /// `workflow export --decrypt`): an error, naming the key, if one does not open.
    pub async fn export_decrypted(&self) -> Result<Value, RunError> {
        self.export_in(true).await
    }

    async fn export_in(&self, decrypt: bool) -> Result<Value, RunError> {
        // As stored: sealed payloads stay sealed unless `decrypt`.
        let mut run = self.stored().await?;
        let mut events = self.rt.inner.store.events(&self.id).await?;
        if decrypt {
            let payloads = &self.rt.inner.config.payloads;
            let unreadable = |e: crate::crypto::OpenError| {
                RunError::Store(StoreError::Corrupt(format!(
                    "cannot decrypt the history of run {}: a payload {e}",
                    self.id
                )))
            };
            let owner = Owner::of(&run);
            let input = places::of_run(owner, places::INPUT, "");
            run.input = payloads.open_at(run.input, &input).map_err(unreadable)?;
            for e in &mut events {
                payloads
                    .open_event(owner, &mut e.event)
                    .map_err(unreadable)?;
            }
        }
        let history = ExportedHistory {
            format: HISTORY_FORMAT.to_owned(),
            version: HISTORY_FORMAT_VERSION,
            run: ExportedRun {
                id: run.id,
                workflow: run.workflow,
                status: run.status.as_str().to_owned(),
                input: run.input,
                created_at_ms: to_millis(run.created_at),
                hook_token: run.hook_token,
                origin: run.origin,
            },
            events: events
                .into_iter()
                .map(|e| ExportedEvent {
                    seq: e.seq,
                    at_ms: to_millis(e.at),
                    event: e.event,
                })
                .collect(),
        };
        serde_json::to_value(history)
            .map_err(|e| RunError::Store(StoreError::database(format!("cannot export: {e}"))))
    }
}

impl<T: DeserializeOwned> Run<T> {
    /// Waits for the run to end and returns its value: `Err` with the run's error if it failed,
    /// an error whose `is_cancelled()` is true if it was cancelled. Runs ending in this process
    /// wake the waiter at once; runs driven by other processes are seen within the poll interval.
    ///
    /// A run that continued as new (`continue_as_new(..)`) has not given its chain's value
    /// yet: this waits for the chain's final end, following [`RunRecord::next_run`] from run
    /// to run, and returns the last run's value (so the chain's last workflow must return a
    /// `T`).
    ///
    /// [`RunRecord::next_run`]: crate::store::RunRecord::next_run
    pub async fn return_value(&self) -> Result<T, Error> {
        // The chain's first run, once a record named it: the chain's end is sealed for it.
        let (mut id, mut origin) = (self.id, self.origin.get().copied());
        loop {
            match self.end_of(id, origin).await? {
                Link::Ended(result) => return result,
                Link::Next(next, first) => (id, origin) = (next, Some(first)),
            }
        }
    }

    /// Waits for run `id` (of this run's chain, whose first run is `origin` when known) to
    /// end: its value or error, or the run that continues it.
    async fn end_of(&self, id: RunId, origin: Option<RunId>) -> Result<Link<T>, Error> {
        // Until a record says otherwise, `id` is taken for its chain's first run: true for
        // every run but a later run of a chain, whose end then does not open as `id`'s and is
        // read from the record instead.
        let (guess, guessed) = (Owner::new(id, origin), origin.is_none());
        // A run that completed here never changes again, and one whose token is retained
        // cannot be pruned yet: remembered, it needs no read.
        if let Some(output) = self.rt.inner.completed_here(&id) {
            let end = Told {
                outcome: RunOutcome::Completed(output),
                plain: None,
            };
            if let Some(result) = self.told(guess, guessed, &end) {
                return Ok(Link::Ended(result));
            }
        }
        // Registered before the first read, so an end between the read and the wait counts.
        let mut ended = WaitForEnd::new(&self.rt.inner, id);
        // A run driven here tells its waiters its end as it writes it: no read before. An end
        // told before this call may be an earlier one (the run was retried since): read.
        let earlier = ended.signal.borrow().clone();
        let mut read = earlier.is_some() || !self.rt.inner.drives(&id);
        loop {
            if read {
                let run = self
                    .rt
                    .inner
                    .store
                    .get_run(&id)
                    .await
                    .map_err(RunError::from)?
                    .ok_or(RunError::NotFound(id))?;
                // Only what ends the wait is opened: the output, or the error.
                let owner = Owner::of(&run);
                let result = match run.status {
                    RunStatus::Completed => Some(
                        self.decode_of(owner, run.output.unwrap_or(Value::Null))
                            .map_err(PayloadError::fatal),
                    ),
                    RunStatus::Failed => Some(Err(run.error.map_or_else(
                        || Error::fatal(format!("run {id} failed")),
                        |e| {
                            let binding = places::of_run(owner, places::ERROR, "");
                            self.rt.inner.config.payloads.open_error(e, &binding)
                        },
                    ))),
                    RunStatus::Cancelled => Some(Err(Error::cancelled(&id))),
                    RunStatus::ContinuedAsNew => match run.next_run {
                        Some(next) => return Ok(Link::Next(next, owner.origin)),
                        None => Some(Err(Error::fatal(format!(
                            "run {id} continued as new, but its record names no next run"
                        )))),
                    },
                    RunStatus::Pending | RunStatus::Running | RunStatus::Blocked => None,
                };
                if let Some(result) = result {
                    return Ok(Link::Ended(result));
                }
            }
            // Read again when this run ends or leaves here, when notices were missed, or
            // after the poll interval (runs driven by processes that do not push).
            continue_waiting(&mut ended, self.rt.inner.config.poll_interval).await;
            let seen = ended.signal.borrow_and_update().clone();
            let told = seen.filter(|end| !earlier.as_ref().is_some_and(|e| Arc::ptr_eq(e, end)));
            read = true;
            if let Some(result) = told.and_then(|end| self.told(guess, guessed, &end)) {
                return Ok(Link::Ended(result));
            }
        }
    }

    /// The result an in-process end told: its value, or its error opened.
    /// `None` when run `run`'s chain was `guessed` and the end does not open as its (it
    /// is a later run of a chain: its record names the chain's first run).
    /// A plain output told with the end (its driver here sealed it) is read as it is: it is
    /// the run's whichever run of its chain `run` guessed.
    fn told(&self, run: Owner, guessed: bool, end: &Told) -> Option<Result<T, Error>> {
        let payloads = &self.rt.inner.config.payloads;
        match (&end.outcome, &end.plain) {
            (RunOutcome::Completed(_), Some(plain)) => {
                let cx = PayloadKind::WorkflowOutput { workflow: None }.of_run(run);
                Some(
                    payloads
                        .decode_plain(plain, cx)
                        .map_err(PayloadError::fatal),
                )
            }
            (RunOutcome::Completed(v), None) => match self.decode_of(run, v.clone()) {
                Err(PayloadError::Sealed {
                    cause: OpenError::Unauthentic { .. },
                    ..
                }) if guessed => None,
                result => Some(result.map_err(PayloadError::fatal)),
            },
            (RunOutcome::Failed(e), _) => {
                let binding = places::of_run(run, places::ERROR, "");
                match payloads.try_open_error(e.clone(), &binding) {
                    Err(OpenError::Unauthentic { .. }) if guessed => None,
                    _ => Some(Err(payloads.open_error(e.clone(), &binding))),
                }
            }
        }
    }

    /// Run `run`'s output as a `T`.
    fn decode_of(&self, run: Owner, output: Value) -> Result<T, PayloadError> {
        let cx = PayloadKind::WorkflowOutput { workflow: None }.of_run(run);
        self.rt.inner.config.payloads.decode(output, cx)
    }
}

/// Where a run of a chain ended: the chain's end, or the next run.
enum Link<T> {
    Ended(Result<T, Error>),
    /// The next run, and the chain's first run.
    Next(RunId, RunId),
}

/// Waits for the end of the run `ended` watches, at most `poll`.
async fn continue_waiting(ended: &mut WaitForEnd, poll: std::time::Duration) {
    let _ = tokio::time::timeout(poll, ended.signal.changed()).await;
}

/// One `return_value` call's registration in [`Inner::waiting`]; removed on drop.
struct WaitForEnd {
    inner: Arc<Inner>,
    run: RunId,
    signal: watch::Receiver<Option<Arc<Told>>>,
}

impl WaitForEnd {
    fn new(inner: &Arc<Inner>, run: RunId) -> Self {
        let mut waiting = crate::sync::lock(&inner.waiting);
        let w = waiting.entry(run).or_insert_with(|| Waiting {
            ended: watch::channel(None).0,
            waiters: 0,
        });
        w.waiters += 1;
        let signal = w.ended.subscribe();
        drop(waiting);
        WaitForEnd {
            inner: inner.clone(),
            run,
            signal,
        }
    }
}

impl Drop for WaitForEnd {
    fn drop(&mut self) {
        let mut waiting = crate::sync::lock(&self.inner.waiting);
        if let Some(w) = waiting.get_mut(&self.run) {
            w.waiters -= 1;
            if w.waiters == 0 {
                waiting.remove(&self.run);
            }
        }
    }
}
