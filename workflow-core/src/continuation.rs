//! `continue_as_new(wf, args)`: how a run that would live forever keeps its history bounded.
//! The workflow returns it; the driver (`driver/chain.rs`) records the decision and, in one
//! store transaction ([`RunStore::continue_as_new`]), ends the run as
//! [`RunStatus::ContinuedAsNew`] and admits the next run, which inherits what the chain keeps.
//!
//! [`RunStore::continue_as_new`]: crate::store::RunStore::continue_as_new
//! [`RunStatus::ContinuedAsNew`]: crate::RunStatus::ContinuedAsNew

use std::future::{ready, IntoFuture, Ready};
use std::marker::PhantomData;

use crate::error::{Continuation, Error};
use crate::registry::{IntoWorkflow, WorkflowDef};

/// Ends the calling run and continues it as a new run of `workflow` with `args` (type-checked
/// like `rt.start(workflow, args)`; `workflow` may be this workflow or another). Written as
/// the body's last word:
///
/// ```text
/// return continue_as_new(poll, (cursor,)).await;
/// ```
///
/// # What it resolves to
///
/// Awaited, it resolves at once to an `Err` that carries the continuation
/// ([`Error::is_continue_as_new`]), typed as the `Result<T>` the body returns, whatever its
/// `T`. When the workflow body returns that value, the run does not fail: the driver records
/// the decision (a `run_continued_as_new` event naming the next run, the run's last) and, in
/// the same store transaction, ends the run as [`RunStatus::ContinuedAsNew`] and admits the
/// next run. That one inherits the run's hook tokens (no moment in which they are free),
/// unreceived hook payloads, messages and open requests, queue slot and partition key, parent,
/// deadline, version and schedule tick, and starts with a fresh, empty history.
/// `run.return_value()` on any run of the chain waits for the chain's final end; messages,
/// requests and events addressed to an old run of the chain reach its current run.
///
/// A run that continued is terminal, so it is never replayed and never admits a second next
/// run; a crash before the transaction commits leaves the run as it was, and its replay
/// reaches `continue_as_new` again. Returned where no run ends with it (inside a step, or
/// outside a workflow), the value is an ordinary fatal error.
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[workflow]
/// async fn count_down(n: u32) -> Result<u32> {
///     if n == 0 {
///         return Ok(42);
///     }
///     // Each run has a history of its own; the chain goes on in the next run.
///     return continue_as_new(count_down, (n - 1,)).await;
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().build().await?;
/// let run = rt.start(count_down, (3,)).await?;
/// assert_eq!(run.return_value().await?, 42); // the chain's final value
/// let first = run.info().await?;
/// assert_eq!(first.status, RunStatus::ContinuedAsNew);
/// assert!(first.next_run.is_some());
/// # Ok(())
/// # }
/// ```
///
/// [`RunStatus::ContinuedAsNew`]: crate::RunStatus::ContinuedAsNew
pub fn continue_as_new<F, Args, T>(workflow: F, args: Args) -> ContinueAsNew<T>
where
    F: IntoWorkflow<Args>,
{
    let _ = workflow;
    let input = <F::Def as WorkflowDef>::encode_args(&args).map_err(|e| {
        format!(
            "cannot serialize the arguments of continue_as_new({}): {e}",
            <F::Def as WorkflowDef>::NAME
        )
    });
    ContinueAsNew {
        continuation: Continuation {
            workflow: <F::Def as WorkflowDef>::NAME,
            input,
        },
        _t: PhantomData,
    }
}

/// A continuation to return; await it. From [`continue_as_new`].
#[must_use = "a continuation does nothing unless awaited and returned: `return continue_as_new(wf, args).await;`"]
pub struct ContinueAsNew<T> {
    continuation: Continuation,
    _t: PhantomData<fn() -> T>,
}

impl<T> IntoFuture for ContinueAsNew<T> {
    type Output = Result<T, Error>;
    type IntoFuture = Ready<Result<T, Error>>;

    fn into_future(self) -> Self::IntoFuture {
        ready(Err(Error::continuation(self.continuation)))
    }
}
