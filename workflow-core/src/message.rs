//! Talking to a running run, inside it: [`recv`] takes the messages sent to the run with
//! `run.send(topic, msg)`, and [`timeout`] bounds any durable wait with a durable timer.
//!
//! A message reaches the workflow through the run's inbox, like a hook's payload: the store
//! numbers it in commit order, the replay core delivers it (and records the delivery) only
//! while a `recv` of its topic waits, and replay hands the recorded ones back in history order.
//! So each message is received once, in send order per topic, across replays and crashes; a
//! message nobody waits for stays in the store.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::context::{current, RunCtx};
use crate::error::Error;
use crate::payload::{PayloadError, PayloadKind};
use crate::replay::Mailbox;

/// Topics (and event keys, request names) are non-empty UTF-8 of at most this many bytes.
pub(crate) const MAX_NAME_BYTES: usize = 1024;

/// Why `name` cannot be a `what` (a topic, a key), if it cannot: non-empty UTF-8 of at most
/// [`MAX_NAME_BYTES`] without control characters.
pub(crate) fn invalid_name(what: &str, name: &str) -> Option<String> {
    if name.is_empty() {
        Some(format!("a {what} must not be empty"))
    } else if name.len() > MAX_NAME_BYTES {
        Some(format!(
            "a {what} must be at most {MAX_NAME_BYTES} bytes; this one has {} (it starts with {:?})",
            name.len(),
            name.chars().take(32).collect::<String>()
        ))
    } else if let Some((at, c)) = name.char_indices().find(|(_, c)| c.is_control()) {
        Some(format!(
            "a {what} must not contain control characters; this one has {c:?} at byte {at}"
        ))
    } else {
        None
    }
}

/// Waits for the next message sent to this run on `topic` (with `run.send(topic, msg)`) and
/// reads it as a `T`.
///
/// Messages of one topic arrive in the order their sends committed, each exactly once,
/// across replays and crashes; those sent before the workflow got here wait for it.
///
/// Cancellation-safe: a `recv` dropped before it resolves (the loser of a [`timeout`] or a
/// `select`) takes nothing; the message waits for the next `recv` of its topic.
///
/// Errors: called outside a workflow, an invalid topic (empty, over 1 KiB, control
/// characters), or a message that does not deserialize into `T` (its raw value stays in the
/// run's history).
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// pub struct Approval { by: String }
///
/// #[workflow]
/// async fn expense(amount: u64) -> Result<String> {
///     let Approval { by } = recv::<Approval>("approval").await?;
///     Ok(format!("{amount} approved by {by}"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().build().await?;
/// let run = rt.start(expense, (120,)).await?;
/// run.send("approval", Approval { by: "ana".into() }).await?;
/// assert_eq!(run.return_value().await?, "120 approved by ana");
/// # Ok(())
/// # }
/// ```
pub fn recv<T: DeserializeOwned>(topic: impl Into<String>) -> Recv<T> {
    let topic = topic.into();
    Recv {
        ctx: current(),
        mailbox: Mailbox::Topic(topic.clone()),
        topic,
        receiver: None,
        _t: PhantomData,
    }
}

/// The future of [`recv`].
#[must_use = "a recv receives nothing unless awaited"]
pub struct Recv<T> {
    ctx: Option<Arc<RunCtx>>,
    topic: String,
    /// `topic`'s mailbox.
    mailbox: Mailbox,
    /// Its number among the run's receivers, once it waited.
    receiver: Option<u64>,
    _t: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Recv<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recv")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl<T> Unpin for Recv<T> {}

impl<T: DeserializeOwned> Future for Recv<T> {
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(ctx) = &this.ctx else {
            return Poll::Ready(Err(Error::fatal(
                "recv() was called outside a workflow; messages reach `#[workflow]` fns only",
            )));
        };
        if let Some(why) = invalid_name("message topic", &this.topic) {
            return Poll::Ready(Err(Error::fatal(why)));
        }
        let receiver = *this.receiver.get_or_insert_with(|| ctx.new_receiver());
        match ctx.take_message(&this.mailbox, receiver, cx.waker()) {
            Some((_, v)) => {
                this.receiver = None;
                let what = PayloadKind::Message { topic: &this.topic }.of_run(ctx.owner());
                Poll::Ready(ctx.payloads.decode(v, what).map_err(PayloadError::fatal))
            }
            None => Poll::Pending,
        }
    }
}

impl<T> Drop for Recv<T> {
    fn drop(&mut self) {
        if let (Some(ctx), Some(receiver)) = (&self.ctx, self.receiver) {
            ctx.stop_receiving(&self.mailbox, receiver);
        }
    }
}

/// What [`timeout`] gives when its time ran out first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline has elapsed")]
pub struct Elapsed(());

/// Waits for `fut` at most `d`: `Err(Elapsed)` if `d` passes first (and `fut` is dropped).
///
/// Inside a workflow the deadline is a durable timer (recorded like a
/// [`sleep`](crate::sleep)), and whichever of the two was recorded first wins, on every
/// replay too. It bounds any durable wait: [`recv`], the next of
/// [`requests`](crate::requests), a hook's `recv`, `child.return_value()`, a step. The loser
/// consumes nothing: a message not taken by a timed-out `recv` waits for the next one.
/// Outside a workflow it is `tokio::time::timeout`.
///
/// An approval with a deadline, its status published for whoever asks:
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// pub struct Approval { by: String }
///
/// #[step]
/// async fn escalate(expense: String) -> Result<String> {
///     Ok(format!("{expense} sent to the finance team"))  // a page, an email, a ticket
/// }
///
/// #[workflow]
/// async fn expense(id: String, deadline_ms: u64) -> Result<String> {
///     set_event("status", "waiting for approval")?;             // readers see it at once
///     let wait = Duration::from_millis(deadline_ms);
///     let outcome = match timeout(wait, recv::<Approval>("approval")).await {
///         Ok(approval) => format!("{id} approved by {}", approval?.by),
///         Err(Elapsed { .. }) => escalate(id).await?,           // the deadline passed first
///     };
///     set_event("status", &outcome)?;
///     Ok(outcome)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().build().await?;
///
/// // Approved in time (an HTTP route would do this with the run id from its URL).
/// let run = rt.start(expense, ("e-1".to_string(), 86_400_000)).await?;
/// let status: String = run.event::<String>("status").await?;  // waits until it is set
/// assert_eq!(status, "waiting for approval");
/// run.send("approval", Approval { by: "ana".into() }).idempotency_key("req-1").await?;
/// assert_eq!(run.return_value().await?, "e-1 approved by ana");
///
/// // Nobody answers: the durable deadline escalates.
/// let late = rt.start(expense, ("e-2".to_string(), 100)).await?;
/// assert_eq!(late.return_value().await?, "e-2 sent to the finance team");
/// assert_eq!(late.events().await?["status"], "e-2 sent to the finance team");
/// # Ok(())
/// # }
/// ```
pub async fn timeout<F: Future>(d: Duration, fut: F) -> Result<F::Output, Elapsed> {
    if current().is_none() {
        return tokio::time::timeout(d, fut).await.map_err(|_| Elapsed(()));
    }
    let mut fut = pin!(fut);
    let mut timer = pin!(crate::context::sleep(d));
    // The wait first: a result already delivered wins without a timer being recorded, the
    // same on replay.
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed(()))),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

crate::error::from_own_errors!(Elapsed);
