//! Replay tests: check a build's workflow code against histories recorded by runs in
//! production, with no store, no runtime and no step bodies run.
//!
//! Export histories with `run.export()` or `workflow export <id>`, keep them as files, and
//! replay each against the workflow in a test: a change that would block the runs in flight
//! fails the test instead.
//!
//! ```
//! use workflow_core::prelude::*;
//! use workflow_core::testing::replay;
//!
//! #[step]
//! async fn charge(order: u64) -> Result<u64> { Ok(order * 100) }
//!
//! #[workflow]
//! async fn checkout(order: u64) -> Result<u64> {
//!     charge(order).await
//! }
//!
//! # #[tokio::main] async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
//! // Recorded by a run (in a real test: read from a file `workflow export` wrote).
//! let rt = Runtime::builder().in_memory().build().await?;
//! let run = rt.start(checkout, (7,)).await?;
//! run.return_value().await?;
//! let history = run.export().await?;
//!
//! // This build's `checkout` fits the history.
//! replay(checkout, &history)?;
//! # Ok(()) }
//! ```
//!
//! To test every history in a directory:
//!
//! ```no_run
//! # use workflow_core::prelude::*;
//! # #[step] async fn charge(order: u64) -> Result<u64> { Ok(order) }
//! # #[workflow] async fn checkout(order: u64) -> Result<u64> { charge(order).await }
//! #[test]
//! fn this_build_replays_production_histories() {
//!     for file in std::fs::read_dir("tests/histories").unwrap() {
//!         let path = file.unwrap().path();
//!         let history = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
//!         if let Err(e) = workflow_core::testing::replay(checkout, &history) {
//!             panic!("{}: {e}", path.display());
//!         }
//!     }
//! }
//! ```

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::task::{Context, Poll, Waker};

use serde_json::Value;

use crate::context::{RunCtx, StepExec};
use crate::divergence::Divergence;
use crate::history::{from_millis, ExportedHistory};
use crate::payload::Payloads;
use crate::registry::{IntoWorkflow, WorkflowRegistration};
use crate::replay::Replay;

/// Why [`replay()`] did not accept a history.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayError {
    /// The workflow's code does not fit the history: a run with this history would be
    /// blocked by this build.
    Diverged {
        /// The history event where it happened (its `seq`).
        event: u64,
        /// What the history holds there.
        expected: String,
        /// What the code did instead.
        found: String,
        /// The whole message, as a blocked run shows it.
        message: String,
        /// The same, as data: what a blocked run's error carries as
        /// [`Error::divergence`](crate::Error::divergence).
        divergence: Box<Divergence>,
    },
    /// The JSON is not an exported history this build reads.
    Invalid(String),
    /// The history is of another workflow, or its arguments do not fit this one.
    Mismatch(String),
}

crate::error::from_own_errors!(ReplayError);

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Diverged { message, .. } => f.write_str(message),
            ReplayError::Invalid(why) | ReplayError::Mismatch(why) => f.write_str(why),
        }
    }
}

impl ReplayError {
    /// Where the history and the code part, when that is why the history was not accepted.
    pub fn divergence(&self) -> Option<&Divergence> {
        match self {
            ReplayError::Diverged { divergence, .. } => Some(divergence.as_ref()),
            _ => None,
        }
    }
}

impl std::error::Error for ReplayError {}

impl From<Divergence> for ReplayError {
    fn from(d: Divergence) -> Self {
        ReplayError::Diverged {
            event: d.event,
            message: format!("the workflow diverged from the history: {d}"),
            expected: d.expected.clone(),
            found: d.found.clone(),
            divergence: Box::new(d),
        }
    }
}

/// Replays `history` (as `run.export()` gives it) against workflow `wf` as this build has it:
/// every recorded result is delivered in recorded order and every command the workflow issues
/// is matched against the history; no step body runs and nothing is written anywhere.
/// `Ok(())` when the whole history fits (the workflow may still be waiting at its end, as a
/// run in flight does); the first divergence otherwise, naming the event, what the history
/// expects and what the code did.
pub fn replay<Args, W: IntoWorkflow<Args>>(wf: W, history: &Value) -> Result<(), ReplayError> {
    replay_in(wf, history, Payloads::default())
}

/// [`replay()`] of a history whose payloads are encrypted: `keys` open them, as they
/// open them for a runtime built with `.encryption(keys)`. A payload under a key `keys` lacks
/// is a [`ReplayError::Mismatch`] naming that key.
///
/// ```
/// use workflow_core::prelude::*;
/// use workflow_core::testing::{replay, replay_with_keys};
///
/// #[step]
/// async fn double(n: u64) -> Result<u64> { Ok(n * 2) }
///
/// #[workflow]
/// async fn doubled(n: u64) -> Result<u64> { double(n).await }
///
/// # #[tokio::main] async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let keys = Keys::new().current("k1", [3u8; 32]);
/// let rt = Runtime::builder().in_memory().encryption(keys.clone()).build().await?;
/// let run = rt.start(doubled, (21,)).await?;
/// run.return_value().await?;
/// let history = run.export().await?;
///
/// replay_with_keys(doubled, &history, &keys)?;
/// let err = replay(doubled, &history).unwrap_err();
/// assert!(err.to_string().contains("\"k1\""), "{err}");
/// # Ok(()) }
/// ```
pub fn replay_with_keys<Args, W: IntoWorkflow<Args>>(
    wf: W,
    history: &Value,
    keys: &crate::Keys,
) -> Result<(), ReplayError> {
    let ring = keys
        .ring()
        .map_err(|e| ReplayError::Invalid(e.to_string()))?;
    replay_in(wf, history, Payloads::default().with_keys(ring))
}

fn replay_in<Args, W: IntoWorkflow<Args>>(
    wf: W,
    history: &Value,
    payloads: Payloads,
) -> Result<(), ReplayError> {
    let _ = wf;
    let reg = WorkflowRegistration::of::<W::Def>();
    let history = ExportedHistory::from_json(history).map_err(ReplayError::Invalid)?;
    if history.run.workflow != reg.name {
        return Err(ReplayError::Mismatch(format!(
            "the history is of workflow `{}`, not `{}`",
            history.run.workflow, reg.name
        )));
    }
    let mut records = history.records();
    let owner = crate::crypto::places::Owner::new(history.run.id, history.run.origin);
    use crate::crypto::places::{unreadable_run, Unreadable};
    match unreadable_run(
        payloads.keys(),
        owner,
        &history.run.input,
        records.iter_mut().map(|e| &mut e.event),
    ) {
        Some(Unreadable::Key(key)) => {
            return Err(ReplayError::Mismatch(format!(
                "the history holds payloads encrypted with key {key:?}: replay it with \
                 `replay_with_keys` and that key"
            )))
        }
        Some(Unreadable::Form(form)) => {
            return Err(ReplayError::Mismatch(format!(
                "the history holds payloads sealed in a form this build does not read \
                 ({form}): replay it with the build of workflow-rs that wrote it, or a newer one"
            )))
        }
        None => {}
    }
    let sizes = payloads.clone();
    let measure = Box::new(move |e: &mut crate::history::Event| sizes.event_bytes(owner, e));
    let mut core: Replay<StepExec> = Replay::new(records, measure);
    let ctx = RunCtx::new(
        owner,
        reg.name,
        from_millis(history.run.created_at_ms),
        history.run.hook_token.clone(),
        payloads.with_max_bytes(usize::MAX),
        core.patches(),
        crate::config::HistoryLimits::default(),
    );
    let body = (reg.run)(
        &ctx.payloads,
        owner,
        crate::registry::RunInput {
            stored: history.run.input.clone(),
            known: None,
            remember_output: false,
        },
    )
    .map_err(|e| ReplayError::Mismatch(format!("the recorded arguments do not fit: {e}")))?;
    let mut fut = Box::pin(ctx.scope(body));
    let mut cx = Context::from_waker(Waker::noop());
    let now = from_millis(
        history
            .events
            .last()
            .map_or(history.run.created_at_ms, |e| e.at_ms),
    );
    loop {
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx)))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a non-string panic payload");
                Poll::Ready(Err(crate::Error::panicked(format!(
                    "the workflow panicked: {what}"
                ))))
            });
        core.issue(ctx.take_issued(), now)?;
        if let Poll::Ready(result) = polled {
            core.returned(result.map(|e| e.stored), now)?;
            return Ok(());
        }
        match core.next_delivery() {
            Some(Ok(delivery)) => ctx.deliver(delivery),
            Some(Err(d)) => return Err(d.into()),
            // The whole history is delivered; what the workflow waits on now is live.
            None => return Ok(()),
        }
    }
}
