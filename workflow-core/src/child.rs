//! Child runs: a workflow starts another workflow's run with [`start_child`] and
//! waits for its end with [`Child::return_value`], durably.
//!
//! The start is a recorded command: the store admits the child and records
//! [`Event::ChildStarted`](crate::store::Event::ChildStarted) in the parent's history in one
//! transaction, so a replay returns the same child and never starts a second one. Awaiting the
//! result suspends the parent (it may be evicted meanwhile); the child's end, in whatever
//! process it runs, puts a notice into the parent's inbox and wakes it, and the parent records
//! the result when it delivers it, so later replays read it from the history.

use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::context::{current, invalid_token, mismatched_delivery, Command, Ready, RunCtx};
use crate::crypto::places;
use crate::error::{Error, HookConflictError};
use crate::ids::RunId;
use crate::payload::{PayloadError, PayloadKind};
use crate::queue::entry;
use crate::registry::{BoxFuture, IntoWorkflow, WorkflowDef};
use crate::replay::{ChildCall, Key};
use crate::store::QueueEntry;

/// Starts a run of `workflow` with `args` (a tuple of its arguments) as a child of the
/// calling workflow's run; await the returned builder. Only inside a `#[workflow]` fn.
///
/// The child runs on any worker of the store, like any run; its id is recorded in the
/// parent's history, so a replay of the parent gets the same [`Child`] back. Cancelling the
/// parent cancels its unfinished children, unless started with [`StartChild::detached`].
/// A child inherits its parent's deadline (`rt.start(..).timeout(d)`, the same instant, not
/// a fresh budget) unless its own [`StartChild::timeout`] replaces it, so a parent failing
/// at its deadline leaves no attached child running past it; a detached child inherits
/// nothing.
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[step]
/// async fn pack(item: String) -> Result<String> {
///     Ok(format!("parcel with {item}"))
/// }
///
/// #[workflow]
/// async fn ship(item: String) -> Result<String> {
///     pack(item).await
/// }
///
/// #[workflow]
/// async fn order(item: String) -> Result<String> {
///     let shipment = start_child(ship, (item,)).await?;
///     // The order is suspended until the shipment ends, wherever it runs.
///     let parcel = shipment.return_value().await?;
///     Ok(format!("shipped the {parcel}"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().build().await?;
/// let run = rt.start(order, ("tea".to_owned(),)).await?;
/// assert_eq!(run.return_value().await?, "shipped the parcel with tea");
/// # Ok(())
/// # }
/// ```
pub fn start_child<F, Args>(workflow: F, args: Args) -> StartChild<F::Def>
where
    F: IntoWorkflow<Args>,
{
    let _ = workflow;
    // Serialized here, so that the pending start is `Send` whatever the arguments are;
    // checked against the limit inside the parent run, which the check names.
    let input = <F::Def as WorkflowDef>::encode_args(&args);
    StartChild {
        input,
        hook: None,
        timeout: None,
        detached: false,
        queue: <F::Def as WorkflowDef>::QUEUE.map(QueueEntry::new),
        _def: PhantomData,
    }
}

/// A pending child start; await it. From [`start_child`].
#[must_use = "a child run is started only when the start is awaited"]
pub struct StartChild<W: WorkflowDef> {
    input: Result<Value, serde_json::Error>,
    hook: Option<String>,
    timeout: Option<Duration>,
    detached: bool,
    /// From the child workflow's `#[workflow(queue = "..")]` until `.queue(..)` names another.
    queue: Option<QueueEntry>,
    _def: PhantomData<fn() -> W>,
}

impl<W: WorkflowDef> StartChild<W> {
    /// Claims hook `token` atomically with the child's admission, as
    /// [`Start::hook`](crate::Start::hook) does: when another run owns the token, no child is
    /// started and the start fails with a hook-conflict error
    /// ([`Error::as_hook_conflict`] names the owner). The decision is recorded, so a
    /// replay decides the same.
    pub fn hook(mut self, token: impl Into<String>) -> Self {
        self.hook = Some(token.into());
        self
    }

    /// A deadline for the child run, from its admission, as
    /// [`Start::timeout`](crate::Start::timeout): a child not ended by then fails with an
    /// error saying it timed out, which [`Child::return_value`] returns. It replaces the deadline
    /// the child would inherit from its parent, later or earlier (`Duration::MAX`: none).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// Cancelling the parent leaves this child running (by default a cancellation of the
    /// parent cancels its unfinished children, down the tree), and the child does not
    /// inherit the parent's deadline.
    pub fn detached(mut self) -> Self {
        self.detached = true;
        self
    }

    /// Enters the child in queue `name`, as [`Start::queue`](crate::Start::queue)
    /// does; replaces the child workflow's `#[workflow(queue = "..")]`. A queue declared
    /// nowhere on the store fails the start (recorded, no child).
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        entry(&mut self.queue).name = name.into();
        self
    }

    /// The child's partition key in its queue, as
    /// [`Start::partition_key`](crate::Start::partition_key). No effect without a queue.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        entry(&mut self.queue).partition_key = Some(key.into());
        self
    }

    /// The child's priority in its queue, as [`Start::priority`](crate::Start::priority).
    /// No effect without a queue.
    pub fn priority(mut self, p: i32) -> Self {
        entry(&mut self.queue).priority = p;
        self
    }
}

impl<W: WorkflowDef> IntoFuture for StartChild<W> {
    type Output = Result<Child<W::Output>, Error>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let Some(ctx) = current() else {
                return Err(Error::fatal(format!(
                    "start_child({}) was called outside a workflow; child runs exist only \
                     inside `#[workflow]` fns (use `rt.start(..)` elsewhere)",
                    W::NAME
                )));
            };
            // The child's id is chosen here, with the call: its arguments are sealed for it.
            let child_id = RunId::new();
            let cx = PayloadKind::ChildInput { workflow: W::NAME }.of(child_id);
            let input = ctx
                .payloads
                .seal(self.input, cx)
                .map_err(PayloadError::fatal)?;
            if let Some(why) = self.hook.as_deref().and_then(invalid_token) {
                return Err(Error::fatal(why));
            }
            let child_key = ctx.next_child_key();
            ctx.issue(Command::StartChild(ChildCall {
                child_key,
                workflow: W::NAME,
                child_id,
                input,
                hook: self.hook.clone(),
                timeout: self.timeout,
                detached: self.detached,
                queue: self.queue.clone().filter(|q| !q.name.is_empty()),
            }));
            match ctx.wait(Key::Child(child_key)).await {
                Ready::ChildStarted {
                    refused: Some(why), ..
                } => Err(Error::fatal(why)),
                Ready::ChildStarted {
                    child_id,
                    conflict: None,
                    ..
                } => Ok(Child {
                    id: child_id,
                    ctx,
                    _t: PhantomData,
                }),
                Ready::ChildStarted {
                    conflict: Some(owner),
                    ..
                } => Err(Error::hook_conflict(HookConflictError {
                    token: self.hook.unwrap_or_default(),
                    conflicting_run_id: owner,
                })),
                _ => Err(mismatched_delivery("start_child")),
            }
        })
    }
}

/// A child run started with [`start_child`].
pub struct Child<T> {
    id: RunId,
    ctx: Arc<RunCtx>,
    _t: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Child<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Child").field("id", &self.id).finish()
    }
}

impl<T> Child<T> {
    /// The child run's id (the same on every replay).
    pub fn id(&self) -> RunId {
        self.id
    }
}

impl<T: DeserializeOwned> Child<T> {
    /// Waits, durably, for the child's end: its return value, or its error (a child that was
    /// cancelled or timed out gives that error). The parent is suspended meanwhile and may be
    /// evicted; the child's end wakes it, in this process at once, elsewhere through the
    /// store. The result is recorded in the parent's history.
    ///
    /// The name is [`Run::return_value`](crate::Run::return_value)'s, which waits for a run's
    /// end from outside; [`Child::result`] is another name for this.
    #[doc(alias = "result")]
    pub async fn return_value(self) -> Result<T, Error> {
        self.ctx.issue(Command::AwaitChild { child_id: self.id });
        let value = match self.ctx.wait(Key::ChildEnd(self.id)).await {
            Ready::ChildEnded(result) => {
                let binding = places::of_run(places::Owner::first(self.id), places::ERROR, "");
                result.map_err(|e| self.ctx.payloads.open_error(e, &binding))?
            }
            _ => return Err(mismatched_delivery("Child::return_value")),
        };
        self.ctx
            .payloads
            .decode(value, PayloadKind::ChildResult.of(self.id))
            .map_err(PayloadError::fatal)
    }

    /// Another name for [`Child::return_value`], which it calls.
    pub async fn result(self) -> Result<T, Error> {
        self.return_value().await
    }
}
