//! Administration: listing runs for inspection tools, and pruning ended runs.

use std::time::SystemTime;

use crate::error::StoreError;
use crate::ids::RunId;

use super::*;

/// Which runs [`AdminStore::list_runs`] returns: the newest first (by admission time, then id), at
/// most `limit`.
///
/// ```
/// use workflow_core::store::RunFilter;
/// use workflow_core::RunStatus;
///
/// let failed_orders = RunFilter::new()
///     .status(RunStatus::Failed)
///     .workflow("process_order")
///     .limit(20);
/// assert_eq!(failed_orders.limit, 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunFilter {
    /// Only runs in this state.
    pub status: Option<RunStatus>,
    /// Only runs of this workflow (its registered name).
    pub workflow: Option<String>,
    /// Only the children of this run (`start_child`).
    pub parent: Option<RunId>,
    /// Only runs started in this queue.
    pub queue: Option<String>,
    /// Only runs started by a build of this version ([`RuntimeBuilder::version`]).
    ///
    /// [`RuntimeBuilder::version`]: crate::RuntimeBuilder::version
    pub version: Option<String>,
    /// Only runs admitted at or after this time.
    pub created_after: Option<SystemTime>,
    /// Only runs admitted before this time.
    pub created_before: Option<SystemTime>,
    /// Only the runs after this one in the listing's order (newest first): the next page.
    pub after: Option<RunId>,
    /// At most this many runs (default 100).
    pub limit: usize,
}

impl Default for RunFilter {
    fn default() -> Self {
        RunFilter {
            status: None,
            workflow: None,
            parent: None,
            queue: None,
            version: None,
            created_after: None,
            created_before: None,
            after: None,
            limit: 100,
        }
    }
}

impl RunFilter {
    /// Every run, at most 100.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only runs in state `status`.
    pub fn status(mut self, status: RunStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Only runs of workflow `name`.
    pub fn workflow(mut self, name: impl Into<String>) -> Self {
        self.workflow = Some(name.into());
        self
    }

    /// Only the runs `parent` started with `start_child`.
    pub fn parent(mut self, parent: RunId) -> Self {
        self.parent = Some(parent);
        self
    }

    /// Only runs started in queue `name`.
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queue = Some(name.into());
        self
    }

    /// Only runs started by a build of version `v` (as given to
    /// [`RuntimeBuilder::version`](crate::RuntimeBuilder::version)): e.g. the runs that
    /// predate a deploy.
    pub fn version(mut self, v: impl Into<String>) -> Self {
        self.version = Some(v.into());
        self
    }

    /// Only runs admitted at or after `t`.
    pub fn created_after(mut self, t: SystemTime) -> Self {
        self.created_after = Some(t);
        self
    }

    /// Only runs admitted before `t`.
    pub fn created_before(mut self, t: SystemTime) -> Self {
        self.created_before = Some(t);
        self
    }

    /// The page after run `last` in the listing's order (newest first): pass the last run of
    /// the previous page. A run that is not in the store is
    /// [`StoreError::RunNotFound`](crate::StoreError::RunNotFound).
    pub fn after(mut self, last: &RunId) -> Self {
        self.after = Some(*last);
        self
    }

    /// At most `n` runs.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
}

/// What [`AdminStore::prune`] deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PruneStats {
    /// Ended runs deleted, each with everything recorded for it.
    pub runs: u64,
    /// Events of those runs deleted with them.
    pub events: u64,
}

/// How many runs of one workflow are in one status (see [`AdminStore::run_counts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCount {
    /// The registered workflow name.
    pub workflow: String,
    /// The status they are in.
    pub status: RunStatus,
    /// How many.
    pub runs: u64,
}

/// Listing and pruning: what inspection tools and operators use; the runtime does not.
#[async_trait::async_trait]
pub trait AdminStore: Send + Sync + 'static {
    /// Runs matching `filter`, the newest first: what inspection tools list. Not used by the
    /// runtime; stores that cannot list keep this default, which refuses.
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let _ = filter;
        Err(StoreError::database(
            "list_runs is not supported by this store",
        ))
    }

    /// How many runs the store holds, by workflow and status, ordered by workflow then status
    /// (as stored: pruned runs are gone). One aggregate read, whatever the number of runs:
    /// what `workflow web`'s `/metrics` serves. Stores that cannot count keep this default,
    /// which refuses.
    async fn run_counts(&self) -> Result<Vec<RunCount>, StoreError> {
        Err(StoreError::database(
            "run_counts is not supported by this store",
        ))
    }

    /// Deletes, in one act, every run that ended (completed, failed or cancelled) before
    /// `ended_before` (its `updated_at`), with its events, inbox payloads, hook rows and
    /// streams —
    /// except a run that still owns a hook row retained past `now`: its token must keep
    /// refusing duplicates and naming the run. A run that has not ended is never touched.
    /// Payload ids are never reused after their payloads are deleted. Stores that cannot
    /// prune keep this default, which refuses.
    async fn prune(
        &self,
        ended_before: SystemTime,
        now: SystemTime,
    ) -> Result<PruneStats, StoreError> {
        let _ = (ended_before, now);
        Err(StoreError::database("prune is not supported by this store"))
    }
}
