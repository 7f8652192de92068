//! The client side of the runtime: its handles on runs ([`Runtime::get_run`],
//! [`Runtime::runs`]), sending payloads to hooks ([`HookRef`], [`HookInfo`]), listing hooks,
//! queues and run counts, and pruning. A start is built in `start` and a run handle's queries
//! live in `run`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::{Run, Runtime, Start};
use crate::context::invalid_token;
use crate::crypto::places;
use crate::error::{HookError, HookNotFoundError, StoreError};
use crate::ids::RunId;
use crate::payload::{PayloadError, PayloadKind};
use crate::registry::{IntoWorkflow, WorkflowDef};
use crate::store::{
    HookFilter, HookRecord, PruneStats, QueueEntry, QueueInfo, RunCount, RunFilter, RunRecord,
    Store,
};

impl Runtime {
    /// The store this runtime uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Starts a run of `workflow` with `args` (a tuple of its arguments). Await the returned
    /// builder; it resolves once the run is durably admitted.
    ///
    /// Once polled, the admission goes on in a task of its own: dropping the future (a
    /// timeout, a cancelled request) does not undo or strand it, so the run may exist even
    /// though this call never answered. Give such starts a `.hook(token)` to make retrying
    /// them safe: a retry then finds the run instead of starting a second one.
    pub fn start<F, Args>(&self, workflow: F, args: Args) -> Start<<F as IntoWorkflow<Args>>::Def>
    where
        F: IntoWorkflow<Args>,
    {
        let _ = workflow;
        // Serialized here, so that the pending start is `Send` whatever the arguments are: only
        // the macro's check reports arguments that cannot be recorded. Checked (and made
        // ready for the store) once the run has its id, when the start is awaited.
        let input = <F::Def as WorkflowDef>::encode_args(&args);
        let queue = <F::Def as WorkflowDef>::QUEUE.map(QueueEntry::new);
        Start::new(self.clone(), input, queue)
    }

    /// A handle on run `id` (whether or not it exists: queries on an unknown id fail with
    /// [`RunError::NotFound`](crate::RunError::NotFound)).
    pub fn get_run(&self, id: &RunId) -> Run<Value> {
        Run::new(*id, self.clone())
    }

    /// The runs matching `filter`, the newest first (by creation time): by status, workflow,
    /// parent, queue, creation time and page; at most `filter.limit` of them.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn check(amount: u64) -> Result<u64> {
    ///     if amount > 100 {
    ///         return Err(Error::fatal("over the limit"));
    ///     }
    ///     Ok(amount)
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let small = rt.start(check, (5,)).await?;
    /// let large = rt.start(check, (500,)).await?;
    /// # let _ = small.return_value().await;
    /// # let _ = large.return_value().await;
    ///
    /// let failed = rt.runs(RunFilter::new().status(RunStatus::Failed).limit(50)).await?;
    /// assert_eq!(failed.len(), 1);
    /// assert_eq!(failed[0].id, large.id());
    /// assert!(failed[0].error.as_ref().unwrap().to_string().contains("over the limit"));
    ///
    /// let all = rt.runs(RunFilter::new()).await?;
    /// let ids: Vec<RunId> = all.iter().map(|r| r.id).collect();
    /// assert_eq!(ids, [large.id(), small.id()]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn runs(&self, filter: RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let runs = self.inner.store.list_runs(&filter).await?;
        let payloads = &self.inner.config.payloads;
        Ok(runs.into_iter().map(|r| payloads.open_record(r)).collect())
    }

    /// For tools that show what a store holds (the `workflow` CLI and dashboard): `run`'s
    /// record with every payload opened with this runtime's keys
    /// ([`RuntimeBuilder::encryption`](crate::RuntimeBuilder::encryption)); a payload that does
    /// not open reads `"encrypted (key <id>)"` instead (an error's message already does).
    pub fn reveal_record(&self, run: RunRecord) -> RunRecord {
        let payloads = &self.inner.config.payloads;
        let mut run = payloads.open_record(run);
        let owner = places::Owner::of(&run);
        let input = places::of_run(owner, places::INPUT, "");
        payloads.reveal_at(&mut run.input, &input);
        if let Some(out) = &mut run.output {
            payloads.reveal_at(out, &places::of_run(owner, places::OUTPUT, ""));
        }
        run
    }

    /// [`Runtime::reveal_record`] for the events of `run`'s history (`run` as stored: the
    /// values the runs of a chain share are sealed for its first run, which the record names).
    pub fn reveal_history(&self, run: &RunRecord, events: &mut [crate::store::EventRecord]) {
        let owner = places::Owner::of(run);
        for e in events {
            self.inner.config.payloads.reveal_event(owner, &mut e.event);
        }
    }

    /// [`Runtime::reveal_record`] for a chunk of `run`'s stream `stream`.
    pub fn reveal_chunk(&self, run: RunId, stream: &str, value: &mut Value) {
        let binding = places::of_run(places::Owner::first(run), places::STREAM_CHUNK, stream);
        self.inner.config.payloads.reveal_at(value, &binding);
    }

    /// Sends `payload` to the run whose active hook owns `token`. The payload is durable once
    /// this returns and reaches the workflow's `recv()` in the order the calls committed.
    ///
    /// [`HookError::NotFound`] when no active hook owns the token (the run has not registered
    /// it yet, or released it). To start a run or else send to its owner, without that gap,
    /// use [`Start::or_resume`].
    pub async fn resume_hook<P: serde::Serialize>(
        &self,
        token: impl Into<String>,
        payload: P,
    ) -> Result<HookRef, HookError> {
        let token = token.into();
        if let Some(why) = invalid_token(&token) {
            return Err(HookError::InvalidToken(why));
        }
        let cx = PayloadKind::HookPayload { token: &token }.unbound();
        let payload = match self.inner.config.payloads.encode(&payload, cx) {
            Ok(payload) => payload,
            Err(PayloadError::TooLarge(e)) => return Err(HookError::TooLarge(e)),
            Err(e) => {
                return Err(HookError::Serialize {
                    message: e.cause(),
                    token,
                })
            }
        };
        let at = self.inner.clock.tick().await;
        match self.inner.store.resume_hook(&token, payload, at).await? {
            Some((run_id, _)) => {
                // Not driven here: evicted (now acquirable), or driven elsewhere. A driver
                // evicting the run right now looks for work once it has left.
                if !self.inner.payload_arrived(&run_id) {
                    self.inner.work.notify_one();
                }
                Ok(HookRef { token, run_id })
            }
            None => Err(HookError::NotFound(HookNotFoundError { token })),
        }
    }

    /// The active hook owning `token`. Advisory: a later `start` is not atomic with this
    /// look-up (use `start(..).hook(token)` for that).
    pub async fn get_hook_by_token(&self, token: impl AsRef<str>) -> Result<HookInfo, HookError> {
        let token = token.as_ref();
        if let Some(why) = invalid_token(token) {
            return Err(HookError::InvalidToken(why));
        }
        match self.inner.store.get_hook(token).await? {
            Some(h) => Ok(HookInfo {
                token: h.token,
                run_id: h.run_id,
                created_at: h.created_at,
            }),
            None => Err(HookError::NotFound(HookNotFoundError {
                token: token.to_owned(),
            })),
        }
    }

    /// The active hooks matching `filter` (a token, a run, a limit), the newest first: the
    /// tokens [`Runtime::resume_hook`] can reach now.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    /// use workflow_core::store::HookFilter;
    ///
    /// #[workflow]
    /// async fn approve(order: u32) -> Result<bool> {
    ///     Ok(create_hook::<bool>(format!("approve:{order}")).recv().await?)
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// // The token is the run's from admission on.
    /// let run = rt.start(approve, (7,)).hook("approve:7").await?;
    /// let hooks = rt.hooks(&HookFilter::new().run_id(run.id())).await?;
    /// assert_eq!(hooks.len(), 1);
    /// assert_eq!(hooks[0].token, "approve:7");
    /// # rt.resume_hook("approve:7", true).await?;
    /// # run.return_value().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        self.inner.store.list_hooks(filter).await
    }

    /// Every queue declared on the store ([`RuntimeBuilder::queue`](crate::RuntimeBuilder::queue)),
    /// by name, with its limits and how many of its runs hold a slot, wait for one, and began
    /// within the rate window, now.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    /// use workflow_core::Queue;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder()
    ///     .in_memory()
    ///     .queue(Queue::new("emails").concurrency(4))
    ///     .build()
    ///     .await?;
    /// let queues = rt.queues().await?;
    /// assert_eq!(queues[0].def.name, "emails");
    /// assert_eq!(queues[0].def.concurrency, Some(4));
    /// assert_eq!((queues[0].occupied, queues[0].waiting), (0, 0));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn queues(&self) -> Result<Vec<QueueInfo>, StoreError> {
        let now = self.inner.clock.tick().await;
        self.inner.store.list_queues(now).await
    }

    /// How many runs the store holds by workflow and status, ordered by workflow then status
    /// (pruned runs are gone): one aggregate read, whatever the number of runs.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    /// use workflow_core::store::RunCount;
    ///
    /// #[workflow]
    /// async fn greet(name: String) -> Result<String> {
    ///     Ok(format!("hello, {name}"))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// rt.start(greet, ("Ada".to_string(),)).await?.return_value().await?;
    /// let counts = rt.run_counts().await?;
    /// assert_eq!(counts.len(), 1);
    /// assert_eq!((counts[0].status, counts[0].runs), (RunStatus::Completed, 1));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_counts(&self) -> Result<Vec<RunCount>, StoreError> {
        self.inner.store.run_counts().await
    }

    /// Deletes the runs that ended (completed, failed or cancelled) more than `older_than`
    /// ago, with everything recorded for them: events, hook payloads, released tokens. Runs
    /// that have not ended are never touched, nor is a run whose token is still retained
    /// (`min_retention`): the token keeps refusing duplicate starts and naming its run until
    /// its retention ends, and a later prune takes the run. One atomic store operation;
    /// returns how many runs and events it deleted.
    ///
    /// An `older_than` reaching back before the Unix epoch deletes nothing.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    /// use workflow_core::store::memory::MemoryStore;
    /// use workflow_core::PruneStats;
    ///
    /// #[workflow]
    /// async fn greet(name: String) -> Result<String> {
    ///     Ok(format!("hello, {name}"))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().store(MemoryStore::new()).build().await?;
    /// let run = rt.start(greet, ("Ada".to_string(),)).await?;
    /// run.return_value().await?;
    ///
    /// // Ended just now: a 30-day horizon keeps it.
    /// let stats = rt.prune(Duration::from_secs(30 * 24 * 3600)).await?;
    /// assert_eq!(stats, PruneStats { runs: 0, events: 0 });
    /// assert_eq!(run.status().await?, RunStatus::Completed);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn prune(&self, older_than: Duration) -> Result<PruneStats, StoreError> {
        let now = self.inner.clock.tick().await;
        let ended_before = now
            .checked_sub(older_than)
            .map_or(SystemTime::UNIX_EPOCH, |t| t.max(SystemTime::UNIX_EPOCH));
        self.inner.store.prune(ended_before, now).await
    }
}

/// Where `resume_hook` delivered a payload.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HookRef {
    /// The token.
    pub token: String,
    /// The run owning it.
    pub run_id: RunId,
}

/// An active hook, from `get_hook_by_token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookInfo {
    /// The token.
    pub token: String,
    /// The run owning it.
    pub run_id: RunId,
    /// When that run claimed it.
    pub created_at: SystemTime,
}
