//! Hooks and the inbox: claiming tokens, resuming a hook with a payload, reading a run's
//! inbox, and the atomic start-or-resume.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::error::StoreError;
use crate::ids::RunId;

use super::*;

/// What [`HookStore::admit_or_resume`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitOrResume {
    /// The run exists and owns its start token (leased to the caller when a lease was asked
    /// for and the store leases at admission); the payload was not queued.
    Admitted(Option<Lease>),
    /// The token is owned by an active hook of run `run`: the payload is in its inbox, with
    /// id `payload_id`; no run was admitted.
    Resumed {
        /// The owner of the token.
        run: RunId,
        /// The queued payload's id.
        payload_id: u64,
    },
    /// The token is retained by this run, which ended: nothing was written.
    Conflict(RunId),
}

/// What [`HookStore::claim_hook`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The run now owns the token.
    Claimed,
    /// Another hook owns the token (or retains it); this run names the owner.
    Conflict(RunId),
}

/// An active hook, as [`HookStore::get_hook`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRecord {
    /// The token.
    pub token: String,
    /// The owning run.
    pub run_id: RunId,
    /// When the owner claimed it.
    pub created_at: SystemTime,
}

/// Which active hooks [`HookStore::list_hooks`] returns: the newest first (by claim time, then
/// token), at most `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HookFilter {
    /// Only the hook owning this exact token.
    pub token: Option<String>,
    /// Only hooks owned by this run.
    pub run_id: Option<RunId>,
    /// At most this many hooks (default 100).
    pub limit: usize,
}

impl Default for HookFilter {
    fn default() -> Self {
        HookFilter {
            token: None,
            run_id: None,
            limit: 100,
        }
    }
}

impl HookFilter {
    /// Every active hook, at most 100.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only the hook owning `token`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Only hooks owned by run `id`.
    pub fn run_id(mut self, id: RunId) -> Self {
        self.run_id = Some(id);
        self
    }

    /// At most `n` hooks.
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = n;
        self
    }
}

/// The error of [`HookStore::admit_or_resume`] for a run without a token to resume through.
pub(crate) fn no_token() -> StoreError {
    StoreError::database("admit_or_resume needs a run with a hook token")
}

/// Hook tokens and the inbox of payloads sent to them.
#[async_trait::async_trait]
pub trait HookStore: Send + Sync + 'static {
    /// `start(..).hook(token).or_resume(payload)`: in one act, either admits `run` claiming
    /// its token (as [`RunStore::create_run_leased`] with `lease`, or [`RunStore::create_run`]
    /// without; the payload is not queued), or, when an active hook owns the token, queues
    /// `payload` to its run as [`HookStore::resume_hook`] does at `run.created_at`. A token only
    /// retained by an ended run is [`AdmitOrResume::Conflict`] and nothing is written. There
    /// is no moment at which the token is owned but the payload finds no hook. `run` must
    /// carry a hook. Stores that cannot do this keep this default, which refuses.
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: Value,
    ) -> Result<AdmitOrResume, StoreError> {
        let _ = (run, lease, payload);
        Err(StoreError::database(
            "admit_or_resume is not supported by this store",
        ))
    }

    /// Claims `token` for hook `hook_key` of the leased run and appends the
    /// [`Event::HookRegistered`] that records the decision, in one act (fenced like
    /// [`RunStore::append`]). The token is free when no active hook owns it and no ended run
    /// retains it past `at`; a token the leased run owns already (one it inherited from the
    /// run it continues, see [`RunStore::continue_as_new`]) is claimed as it is.
    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Puts `payload` into the inbox of the run whose active hook owns `token`, and makes that
    /// run acquirable now if no worker holds it (a delayed run not before its
    /// [`NewRun::start_at`]). `None` when no active hook owns the token.
    async fn resume_hook(
        &self,
        token: &str,
        payload: Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError>;

    /// The run's inbox entries (payloads sent to its hooks, its children's ends) with ids
    /// above `after`, in id order.
    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<InboxEntry>, StoreError>;

    /// Payloads (id, run) with ids above `after`, in id order, at most `limit`: how a worker
    /// learns that runs it drives received something.
    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError>;

    /// The highest payload id so far (0 if none).
    async fn last_payload_id(&self) -> Result<u64, StoreError>;

    /// The active hook owning `token`, if any.
    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError>;

    /// Active hooks matching `filter`, the newest first: what inspection tools list. Not used
    /// by the runtime; stores that cannot list keep this default, which refuses.
    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        let _ = filter;
        Err(StoreError::database(
            "list_hooks is not supported by this store",
        ))
    }
}
