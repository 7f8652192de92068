//! The crate's error types: [`Error`], the serializable error recorded for failed steps and runs,
//! and the per-concern errors of the client API ([`StartError`], [`StoreError`], [`RunError`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::divergence::Divergence;
use crate::ids::RunId;

/// What kind of failure an [`Error`] is; decides whether a step is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Retried with exponential backoff (or after `retry_after`) up to `max_retries`.
    Retryable,
    /// Never retried.
    Fatal,
    /// The run was cancelled.
    Cancelled,
    /// A hook token is owned by another run.
    HookConflict,
    /// Replay found different steps than the recorded history holds.
    Diverged,
    /// A step or workflow panicked.
    Panicked,
}

/// The error of steps and workflows, and of the run they make.
///
/// It is recorded in the run's history, so it is serializable and cloneable. Inside a `#[step]`
/// or `#[workflow]` body, `?` converts any `std::error::Error + Send + Sync + 'static` into it
/// as a *retryable* error (an `Error` passes through unchanged); use [`Error::fatal`] for
/// failures that retrying cannot fix. Elsewhere, [`Error::new`] does that conversion.
///
/// ```
/// use std::time::Duration;
/// use workflow_core::Error;
///
/// let e = Error::retryable("rate limited").retry_after(Duration::from_secs(2));
/// assert!(!e.is_fatal());
/// assert_eq!(e.retry_after_hint(), Some(Duration::from_secs(2)));
///
/// let parse: Result<u32, Error> = "x".parse::<u32>().map_err(Error::new);
/// assert!(parse.unwrap_err().to_string().contains("invalid digit"));
/// ```
///
/// # In your program
///
/// `Error` is a `std::error::Error` (its message holds the causes it had, as recorded), and so
/// is every error the client API returns ([`StartError`], [`RunError`], [`StoreError`],
/// [`HookError`], [`BuildError`], ...): `?` takes them into `anyhow::Error` or
/// `Box<dyn std::error::Error + Send + Sync>` alike.
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[step]
/// async fn parse_amount(text: String) -> Result<u64> {
///     Ok(text.trim().parse::<u64>()?) // a std error: retryable
/// }
///
/// #[workflow]
/// async fn invoice(id: u32, amount: String) -> Result<u64> {
///     let approved = create_hook::<bool>(format!("approve:{id}")).recv().await?;
///     if !approved {
///         return Err(Error::fatal(format!("invoice {id} was refused")));
///     }
///     parse_amount(amount).await
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> anyhow::Result<()> {
///     let rt = Runtime::builder().in_memory().build().await?;
///     let run = rt.start(invoice, (1, "12".to_string())).hook("approve:1").await?;
///     let _status: RunStatus = run.status().await?;
///     rt.resume_hook("approve:1", true).await?;
///     assert_eq!(run.return_value().await?, 12);
///     run.cancel().await?; // it has ended: nothing to do
///     let failed = rt.runs(RunFilter::new().status(RunStatus::Failed)).await?;
///     assert!(failed.is_empty());
///
///     // A failed run's error, as `main` would return it with `?`.
///     let run = rt.start(invoice, (2, "12".to_string())).hook("approve:2").await?;
///     rt.resume_hook("approve:2", false).await?;
///     let e: anyhow::Error = run.return_value().await.unwrap_err().into();
///     assert_eq!(e.to_string(), "invoice 2 was refused");
///     Ok(())
/// }
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Boxed, like the other rare parts, to keep `Result<T, Error>` small.
    hook_conflict: Option<Box<HookConflictError>>,
    /// Boxed: most errors are not divergences, and it would double the size of every `Result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    divergence: Option<Box<Divergence>>,
    /// The message, sealed (payload encryption): `message` then only says
    /// `"encrypted (key <id>)"` until the runtime opens it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sealed: Option<Box<serde_json::Value>>,
    /// The run to continue as, when this is the value of `continue_as_new(..)`: the driver
    /// of a workflow returning it continues the run instead of failing it. Never stored.
    #[serde(skip)]
    continuation: Option<Box<Continuation>>,
    /// Converted from a database driver's error that lost a race with another transaction
    /// (a serialization failure, a deadlock): inside a transactional step, its attempt runs
    /// again from a fresh transaction instead of counting as failed. Never stored.
    #[serde(skip)]
    lost_race: bool,
}

/// What `continue_as_new(wf, args)` asks for: the next run's workflow and its arguments as
/// serialized (or why they could not be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Continuation {
    pub(crate) workflow: &'static str,
    pub(crate) input: Result<serde_json::Value, String>,
}

impl Error {
    fn of_kind(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            retry_after_ms: None,
            hook_conflict: None,
            divergence: None,
            sealed: None,
            continuation: None,
            lost_race: false,
        }
    }

    /// The value of `continue_as_new(..)`: an error (so it type-checks as any workflow's
    /// return value) that the driver recognises, failing the run only where nothing drives
    /// it (a step, or outside a workflow).
    pub(crate) fn continuation(c: Continuation) -> Self {
        let mut e = Error::of_kind(
            ErrorKind::Fatal,
            format!(
                "continue_as_new({}) was returned where no workflow run ends with it (inside a \
                 step, or outside a workflow)",
                c.workflow
            ),
        );
        e.continuation = Some(Box::new(c));
        e
    }

    /// The continuation this error carries, if it is the value of `continue_as_new(..)`.
    pub(crate) fn continuation_of(&self) -> Option<&Continuation> {
        self.continuation.as_deref()
    }

    /// True when this is the value of `continue_as_new(..)`: returned by a workflow body, the
    /// run continues as a new run instead of failing.
    pub fn is_continue_as_new(&self) -> bool {
        self.continuation.is_some()
    }

    /// The sealed envelope of the message, when it is sealed.
    pub(crate) fn sealed_message(&self) -> Option<&serde_json::Value> {
        self.sealed.as_deref()
    }

    /// The same error with its message sealed in `envelope` under key `key`.
    pub(crate) fn with_sealed_message(mut self, envelope: serde_json::Value, key: &str) -> Self {
        self.message = format!("encrypted (key {key})");
        self.sealed = Some(Box::new(envelope));
        self
    }

    /// The same error with its sealed message replaced by `message`.
    pub(crate) fn with_opened_message(mut self, message: String) -> Self {
        self.message = message;
        self.sealed = None;
        self
    }

    /// True when the message is sealed (payload encryption) and was not opened: it reads
    /// `"encrypted (key <id>)"`.
    pub fn is_encrypted(&self) -> bool {
        self.sealed.is_some()
    }

    /// An error that is never retried.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::of_kind(ErrorKind::Fatal, message)
    }

    /// An error that is retried; combine with [`Error::retry_after`] to set the delay.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::of_kind(ErrorKind::Retryable, message)
    }

    /// Retry no sooner than `delay` after this attempt failed.
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_after_ms = Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        self
    }

    pub(crate) fn cancelled(run_id: &RunId) -> Self {
        Self::of_kind(ErrorKind::Cancelled, format!("run {run_id} was cancelled"))
    }

    /// The error of a child run cancelled because its parent was.
    pub(crate) fn cancelled_with_parent(run_id: &RunId, parent: &RunId) -> Self {
        Self::of_kind(
            ErrorKind::Cancelled,
            format!("run {run_id} was cancelled with its parent run {parent}"),
        )
    }

    pub(crate) fn diverged(message: impl Into<String>) -> Self {
        Self::of_kind(ErrorKind::Diverged, message)
    }

    /// The error of a run blocked by `divergence`, with `message` saying so.
    pub(crate) fn diverged_at(message: impl Into<String>, divergence: Divergence) -> Self {
        let mut e = Self::diverged(message);
        e.divergence = Some(Box::new(divergence));
        e
    }

    pub(crate) fn panicked(message: impl Into<String>) -> Self {
        Self::of_kind(ErrorKind::Panicked, message)
    }

    /// The error a conflicted hook yields (see [`HookConflictError`]).
    pub fn hook_conflict(conflict: HookConflictError) -> Self {
        let mut e = Self::of_kind(ErrorKind::HookConflict, conflict.to_string());
        e.hook_conflict = Some(Box::new(conflict));
        e
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True for [`Error::fatal`] errors (and replay divergence, which retrying cannot fix).
    pub fn is_fatal(&self) -> bool {
        matches!(self.kind, ErrorKind::Fatal | ErrorKind::Diverged)
    }

    /// True when the run this error came from was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.kind == ErrorKind::Cancelled
    }

    /// True when replay of the run diverged from its recorded history.
    pub fn is_diverged(&self) -> bool {
        self.kind == ErrorKind::Diverged
    }

    /// Where replay left the recorded history, when this error blocked a run for it: the
    /// event, what the history expects and what the code did, as the message says them.
    pub fn divergence(&self) -> Option<&Divergence> {
        self.divergence.as_deref()
    }

    /// The hook conflict this error reports, if it is one.
    pub fn as_hook_conflict(&self) -> Option<&HookConflictError> {
        self.hook_conflict.as_deref()
    }

    /// The delay requested with [`Error::retry_after`].
    pub fn retry_after_hint(&self) -> Option<Duration> {
        self.retry_after_ms.map(Duration::from_millis)
    }

    /// True for a step body's panic, caught and made an error.
    pub(crate) fn is_panic(&self) -> bool {
        self.kind == ErrorKind::Panicked
    }

    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self.kind, ErrorKind::Retryable | ErrorKind::Panicked)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({:?}: {})", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

impl Error {
    /// Any error as a *retryable* [`Error`], its chain of causes kept in the message (all of it
    /// that survives recording): what `?` does to an error inside a `#[step]` or `#[workflow]`
    /// body. An [`Error`] passed in comes back as it was, kind and all.
    ///
    /// Elsewhere (in a closure, an async block, or a helper fn that returns
    /// `workflow_core::Result<T>`) `?` converts only an [`Error`], the errors of this crate's
    /// calls and those of the database drivers it re-exports; convert other errors with
    /// `.map_err(Error::new)`:
    ///
    /// ```
    /// use workflow_core::{Error, Result};
    ///
    /// fn port(text: &str) -> Result<u16> {
    ///     text.parse::<u16>().map_err(Error::new)
    /// }
    /// let e = port("http").unwrap_err();
    /// assert!(e.to_string().contains("invalid digit"));
    /// assert!(!e.is_fatal());
    /// ```
    pub fn new<E>(error: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        // An `Error` itself (a step's, a child run's, `continue_as_new(..)`'s): kept whole.
        let mut slot = Some(error);
        if let Some(same) = (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<Error>>() {
            if let Some(e) = same.take() {
                return e;
            }
        }
        let Some(error) = slot else {
            return Error::retryable("");
        };
        // A transactional step's statement that lost a race: its attempt runs again instead
        // of failing (see `Tx::postgres`).
        let lost_race = lost_a_race(&error);
        // Keep the chain of causes: it is all that survives serialization.
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(s) = source {
            // Many errors already end their message with their cause's: say it once.
            let cause = s.to_string();
            if !message.ends_with(&cause) {
                message.push_str(": ");
                message.push_str(&cause);
            }
            source = s.source();
        }
        let mut converted = Error::retryable(message);
        converted.lost_race = lost_race;
        converted
    }

    /// Whether this error was converted from a database driver's report of a lost race with
    /// another transaction (a serialization failure or a deadlock on PostgreSQL): a
    /// transactional step's attempt that ends with it runs again.
    pub(crate) fn lost_race(&self) -> bool {
        self.lost_race
    }
}

/// Whether `e` is PostgreSQL's serialization failure or deadlock (SQLSTATE 40001, 40P01).
#[cfg(feature = "postgres")]
pub(crate) fn pg_lost_a_race(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().is_some_and(|c| c == "40001" || c == "40P01"))
}

/// Whether `e`, an error being converted, is a database driver's report of a lost race.
fn lost_a_race(e: &(dyn std::any::Any + 'static)) -> bool {
    #[cfg(feature = "postgres")]
    if let Some(e) = e.downcast_ref::<sqlx::Error>() {
        return pg_lost_a_race(e);
    }
    let _ = e;
    false
}

/// The errors of this crate's own calls (a step starting a run, reading a stream, resuming a
/// hook), and those of the database drivers it re-exports, convert into [`Error`] with `?`
/// anywhere, not only in a step's or workflow's body: as retryable errors, but for a
/// [`HookConflictError`], which keeps its kind.
macro_rules! from_own_errors {
    ($($error:ty),* $(,)?) => {
        $(
            impl From<$error> for $crate::error::Error {
                fn from(e: $error) -> Self {
                    $crate::error::Error::new(e)
                }
            }
        )*
    };
}

from_own_errors!(
    StoreError,
    DatabaseError,
    RunError,
    StartError,
    HookError,
    HookNotFoundError,
    PayloadTooLarge,
    BuildError,
    ScheduleError,
    crate::ids::ParseRunIdError,
);
// The errors of the capabilities above this module (keys, rekeying, durable timeouts, replay
// tests) say so where they are defined, with this macro.
pub(crate) use from_own_errors;

// The database drivers this crate re-exports for transactional steps (`tx.sqlite(..)`,
// `tx.postgres()`), whose errors a helper fn or a closure of a step returns as often as the body.
#[cfg(feature = "sqlite")]
from_own_errors!(rusqlite::Error);
#[cfg(feature = "postgres")]
from_own_errors!(sqlx::Error);

impl From<HookConflictError> for Error {
    fn from(conflict: HookConflictError) -> Self {
        Error::hook_conflict(conflict)
    }
}

/// A hook token is owned by another run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("hook token {token:?} is already in use by run {conflicting_run_id}")]
pub struct HookConflictError {
    /// The contested token.
    pub token: String,
    /// The run that owns it.
    pub conflicting_run_id: RunId,
}

/// A failure of the storage backend.
///
/// A [`StoreError::Database`] keeps the driver's own error (rusqlite's, sqlx's) as its
/// [`source`](std::error::Error::source), so callers can inspect it beyond the message.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be opened, read or written.
    Database(DatabaseError),
    /// The file or database exists but does not hold a workflow-rs store.
    Incompatible(String),
    /// Recorded data could not be decoded.
    Corrupt(String),
    /// This worker no longer holds the run's lease (it expired and another worker took the
    /// run over, or the run was cancelled or ended): the write was refused.
    LeaseLost(RunId),
    /// No run has this id.
    RunNotFound(RunId),
}

impl StoreError {
    /// A [`StoreError::Database`] with `message` and no underlying error.
    pub fn database(message: impl Into<String>) -> Self {
        StoreError::Database(DatabaseError::new(message))
    }

    /// True when retrying the same call later may succeed: the connection was lost, the
    /// database was busy or locked by another process, or no pooled connection was free in
    /// time. Refusals ([`StoreError::LeaseLost`]), bad data and bad input are not transient.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Database(e) if e.is_transient())
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Database(e) => write!(f, "database error: {e}"),
            StoreError::Incompatible(m) => f.write_str(m),
            StoreError::Corrupt(m) => write!(f, "corrupt record: {m}"),
            StoreError::LeaseLost(id) => {
                write!(f, "lease on run {id} was lost; the write was refused")
            }
            StoreError::RunNotFound(id) => write!(f, "run {id} not found"),
        }
    }
}

impl std::error::Error for StoreError {
    /// The driver's error behind a [`StoreError::Database`], if there was one.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Database(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

/// What a [`StoreError::Database`] says: a message for people (which names the driver's error
/// too), the driver's error itself, and whether retrying may help.
///
/// ```
/// use std::error::Error as _;
/// use workflow_core::{DatabaseError, StoreError};
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
/// let e = StoreError::Database(DatabaseError::with_source("cannot read runs: reset by peer", io));
/// assert_eq!(e.to_string(), "database error: cannot read runs: reset by peer");
/// assert!(e.source().unwrap().downcast_ref::<std::io::Error>().is_some());
/// ```
#[derive(Debug, Clone)]
pub struct DatabaseError {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
    transient: bool,
}

impl DatabaseError {
    /// An error with only a message (the store itself found the problem).
    pub fn new(message: impl Into<String>) -> Self {
        DatabaseError {
            message: message.into(),
            source: None,
            transient: false,
        }
    }

    /// An error the driver reported as `source`, described by `message`.
    pub fn with_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        DatabaseError {
            message: message.into(),
            source: Some(Arc::new(source)),
            transient: false,
        }
    }

    /// Marks the error as worth retrying (see [`StoreError::is_transient`]).
    pub fn transient(mut self, transient: bool) -> Self {
        self.transient = transient;
        self
    }

    /// The same error, its message prefixed with what was being done.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn context(mut self, doing: impl fmt::Display) -> Self {
        self.message = format!("{doing}: {}", self.message);
        self
    }

    /// The message, without the `database error: ` prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// See [`StoreError::is_transient`].
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

impl fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DatabaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<String> for DatabaseError {
    fn from(message: String) -> Self {
        DatabaseError::new(message)
    }
}

impl From<&str> for DatabaseError {
    fn from(message: &str) -> Self {
        DatabaseError::new(message)
    }
}

/// Why `workflow_core::api` calls fail outside any runtime.
pub(crate) const NO_RUNTIME: &str = "no workflow runtime is running in this process (none was \
     built, or every handle on it was dropped); build one with `Runtime::builder()...build().await` \
     and keep it";

/// No active hook owns the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no active hook owns token {token:?}")]
pub struct HookNotFoundError {
    /// The token.
    pub token: String,
}

/// Why `resume_hook` or `get_hook_by_token` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HookError {
    /// No active hook owns the token (not registered yet, or released).
    #[error(transparent)]
    NotFound(HookNotFoundError),
    /// The token is empty or longer than 1 KiB.
    #[error("invalid hook token: {0}")]
    InvalidToken(String),
    /// The payload is larger than the runtime's `max_payload_bytes`; nothing was written.
    #[error(transparent)]
    TooLarge(PayloadTooLarge),
    /// The payload could not be serialized.
    #[error("the payload for hook {token:?} could not be serialized: {message}")]
    Serialize {
        /// The token.
        token: String,
        /// What serde reported.
        message: String,
    },
    /// `workflow_core::api` was called where no runtime has been built.
    #[error("{}", NO_RUNTIME)]
    NoRuntime,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl HookError {
    /// The not-found error, if this is one.
    pub fn as_not_found(&self) -> Option<&HookNotFoundError> {
        match self {
            HookError::NotFound(e) => Some(e),
            _ => None,
        }
    }
}

/// The error of `resume_hook`, by the name its signature uses; the same type as [`HookError`].
pub type ResumeHookError = HookError;

/// Why `start` could not admit a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The run's token is owned by another run.
    #[error(transparent)]
    HookConflict(HookConflictError),
    /// The token given to `.hook(..)` is empty or longer than 1 KiB.
    #[error("invalid hook token: {0}")]
    InvalidToken(String),
    /// `workflow_core::api` was called where no runtime has been built.
    #[error("{}", NO_RUNTIME)]
    NoRuntime,
    /// The arguments are larger than the runtime's `max_payload_bytes`; nothing was written.
    #[error(transparent)]
    TooLarge(PayloadTooLarge),
    /// The arguments could not be serialized.
    #[error("arguments of workflow `{workflow}` could not be serialized: {message}")]
    Serialize {
        /// The workflow's name.
        workflow: String,
        /// What serde reported.
        message: String,
    },
    /// The payload given to `.or_resume(..)` could not be serialized.
    #[error("the payload for hook {token:?} could not be serialized: {message}")]
    SerializePayload {
        /// The hook token.
        token: String,
        /// What serde reported.
        message: String,
    },
    /// `.queue(name)` or `#[workflow(queue = "..")]` names a queue that neither this runtime
    /// nor any other on the store declared (`RuntimeBuilder::queue`); nothing was written.
    #[error("unknown queue {queue:?}: declare it with `Runtime::builder().queue(Queue::new({queue:?}))`")]
    UnknownQueue {
        /// The name given.
        queue: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A value over the runtime's `max_payload_bytes` (see
/// [`RuntimeBuilder::max_payload_bytes`](crate::RuntimeBuilder::max_payload_bytes)), refused
/// before anything was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} is {size} bytes serialized, over the limit of {limit} bytes (`max_payload_bytes`)")]
pub struct PayloadTooLarge {
    /// Which value: "the arguments of workflow `x`", "the payload for hook \"t\"", ...
    pub what: String,
    /// Its size as serialized JSON, in bytes.
    pub size: usize,
    /// The limit, in bytes.
    pub limit: usize,
}

/// Why a run handle's query failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// No run has this id.
    #[error("run {0} not found")]
    NotFound(RunId),
    /// `retry()` on a run that did not fail and is not blocked; nothing was changed.
    #[error("run {id} is {status}: only a failed or blocked run can be retried")]
    NotRetryable {
        /// The run.
        id: RunId,
        /// Its status.
        status: crate::RunStatus,
    },
    /// `fork()` cannot copy the run's history up to the requested step; nothing was created.
    #[error("cannot fork run {id}: {why}")]
    CannotFork {
        /// The run.
        id: RunId,
        /// Why.
        why: String,
    },
    /// The run has ended (with this status): nothing was sent to it.
    #[error("run {id} has ended ({status}): nothing was sent to it")]
    Ended {
        /// The run.
        id: RunId,
        /// How it ended.
        status: crate::RunStatus,
    },
    /// A message is larger than the runtime's `max_payload_bytes`; nothing was written.
    #[error(transparent)]
    TooLarge(PayloadTooLarge),
    /// The run ended without publishing the awaited event key.
    #[error("run {id} ended ({status}) without setting event {key:?}")]
    EventNotSet {
        /// The run.
        id: RunId,
        /// The key.
        key: String,
        /// How it ended.
        status: crate::RunStatus,
    },
    /// The run ended without replying to the awaited request.
    #[error("run {id} ended ({status}) without replying to request {name:?}")]
    NoReply {
        /// The run.
        id: RunId,
        /// The request's name.
        name: String,
        /// How it ended.
        status: crate::RunStatus,
    },
    /// A wait bounded with `.timeout(d)` ran out.
    #[error("waited {waited:?} on run {id} in vain")]
    TimedOut {
        /// The run.
        id: RunId,
        /// How long.
        waited: std::time::Duration,
    },
    /// A stored value does not fit the requested type.
    #[error("{0}")]
    Payload(String),
    /// A message could not be sent as given (an invalid topic, a value that does not
    /// serialize); nothing was written.
    #[error("invalid message: {0}")]
    InvalidMessage(String),
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for RunError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::RunNotFound(id) => RunError::NotFound(id),
            other => RunError::Store(other),
        }
    }
}

/// Why a runtime could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Two workflows or two steps share a name.
    #[error("{kind} name `{name}` is registered twice; give one of them `name = \"..\"`")]
    DuplicateName {
        /// `workflow` or `step`.
        kind: &'static str,
        /// The shared name.
        name: String,
    },
    /// A queue given to `RuntimeBuilder::queue` cannot hold runs: an empty name, a
    /// concurrency of 0, a rate limit of 0 runs or over a zero period, or declared twice.
    #[error("queue {name:?}: {why}")]
    InvalidQueue {
        /// The queue's name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The limits given to `RuntimeBuilder::history_limits` cannot be a history's: a limit
    /// of 0, or one whose hard limit (5 times it) does not fit in a `u64`.
    #[error("history_limits({events}, {bytes}): {why}")]
    HistoryLimits {
        /// The soft limit of events, as given.
        events: u64,
        /// The soft limit of bytes, as given.
        bytes: u64,
        /// What is wrong with it.
        why: String,
    },
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The keys given to `RuntimeBuilder::encryption` are not usable; the message names the key.
    #[error(transparent)]
    Keys(#[from] crate::crypto::KeyError),
    /// A schedule given to `RuntimeBuilder::schedule` could not be stored.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

/// Why a schedule was refused, or a call about a schedule failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The cron expression is not one this crate accepts; `field` names the part at fault
    /// (`minute`, `hour`, `day of month`, `month`, `day of week` or `second`) when one alone
    /// is.
    #[error("invalid cron expression {expr:?}{}: {reason}", field.map(|f| format!(" (the {f} field)")).unwrap_or_default())]
    Cron {
        /// The expression as given.
        expr: String,
        /// The field at fault, when one alone is.
        field: Option<&'static str>,
        /// What is wrong with it.
        reason: String,
    },
    /// The time zone is not in the time zone database.
    #[error("unknown time zone {zone:?}: {reason}")]
    Zone {
        /// The zone as given.
        zone: String,
        /// Why it was refused.
        reason: String,
    },
    /// No schedule has this name in the store.
    #[error("no schedule is named {name:?}")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// The schedule's name is empty or has control characters.
    #[error("invalid schedule name {name:?}: a name is 1 to 200 characters, none of them control characters")]
    InvalidName {
        /// The name as given.
        name: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
