//! Requests to a running run, inside it: [`requests`] is the stream of the requests sent to
//! the run with `run.request(name, req)`, and [`Request::reply`] records the answer the
//! caller waits for.
//!
//! A request travels like a message (`message.rs`): through the run's inbox, in commit order,
//! delivered (and its delivery recorded as `RequestReceived`) only while a `requests` stream
//! of its name waits, in a mailbox of its own (a request never meets a `recv` of the same
//! name). A reply is recorded once per request as `RequestReplied`, not matched against the
//! history (a replay that replies again records nothing); the append that records it also
//! keeps it where the request's callers read it.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::context::{current, RunCtx};
use crate::crypto::places;
use crate::error::Error;
use crate::message::invalid_name;
use crate::payload::{PayloadError, PayloadKind};
use crate::replay::Mailbox;

/// The requests sent to this run under `name` (with `run.request::<Req, Resp>(name, req)`),
/// as a [`futures::Stream`] of [`Request`]s, each delivered once, in the order the sends
/// committed, across replays and crashes; those sent before the workflow got here wait for it.
/// Answer each with [`Request::reply`]; the caller's `run.request(..)` resolves with it.
///
/// Cancellation-safe: a [`Requests::next`] dropped before it resolves (the loser of a
/// [`timeout`](crate::timeout)) takes nothing; the request waits for the next one. The stream
/// never ends inside a workflow (the run decides when it stops listening); outside a workflow,
/// or for an invalid name (empty, over 1 KiB, control characters), it ends at once and says why
/// in a `tracing` error.
///
/// A request whose body does not fit `Req` is not yielded: it is answered with an error naming
/// the mismatch, which its caller gets as [`RunError::Payload`](crate::RunError::Payload).
///
/// ```
/// use workflow_core::prelude::*;
///
/// #[derive(Clone, serde::Serialize, serde::Deserialize)]
/// pub struct Ask { amount: u64 }
///
/// #[workflow]
/// async fn reviewer(limit: u64) -> Result<u32> {
///     let mut reviews = requests::<Ask, bool>("review");
///     let mut answered = 0;
///     // Listen for a day at most between two requests.
///     while let Ok(Some(req)) = timeout(Duration::from_secs(86_400), reviews.next()).await {
///         let ok = req.body().amount <= limit;
///         req.reply(ok)?;
///         answered += 1;
///         if !ok {
///             break;
///         }
///     }
///     Ok(answered)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().build().await?;
/// let run = rt.start(reviewer, (100,)).await?;
/// let yes: bool = run.request::<Ask, bool>("review", Ask { amount: 40 }).await?;
/// let no: bool = run.request::<Ask, bool>("review", Ask { amount: 400 }).await?;
/// assert!(yes && !no);
/// assert_eq!(run.return_value().await?, 2);
/// # Ok(())
/// # }
/// ```
pub fn requests<Req, Resp>(name: impl Into<String>) -> Requests<Req, Resp> {
    let name = name.into();
    Requests {
        ctx: current(),
        mailbox: Mailbox::Requests(name.clone()),
        name,
        receiver: None,
        _t: PhantomData,
    }
}

/// The stream of [`requests`].
#[must_use = "requests are received only when the stream is polled"]
pub struct Requests<Req, Resp> {
    ctx: Option<Arc<RunCtx>>,
    name: String,
    mailbox: Mailbox,
    /// Its number among the run's receivers while it waits.
    receiver: Option<u64>,
    _t: PhantomData<fn() -> (Req, Resp)>,
}

impl<Req, Resp> std::fmt::Debug for Requests<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<Req, Resp> Unpin for Requests<Req, Resp> {}

impl<Req, Resp> Requests<Req, Resp> {
    /// Stops waiting, if it waits: a request not delivered yet stays for the next wait.
    fn stop(&mut self) {
        if let (Some(ctx), Some(receiver)) = (&self.ctx, self.receiver.take()) {
            ctx.stop_receiving(&self.mailbox, receiver);
        }
    }
}

impl<Req: DeserializeOwned, Resp: Serialize> Requests<Req, Resp> {
    /// The next request. Dropping the future before it resolves takes nothing (so it can lose
    /// a [`timeout`](crate::timeout) or a `select`); `StreamExt::next` is the same without
    /// that promise, since a stream cannot tell that its caller stopped waiting.
    // Named like `StreamExt::next` on purpose: `reviews.next()`, as users write it, picks this
    // cancellation-safe one over the trait's; `Iterator` does not fit an async stream.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> NextRequest<'_, Req, Resp> {
        NextRequest { stream: self }
    }
}

impl<Req: DeserializeOwned, Resp: Serialize> futures::Stream for Requests<Req, Resp> {
    type Item = Request<Req, Resp>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(ctx) = this.ctx.clone() else {
            tracing::error!(
                name = %this.name,
                "requests() was polled outside a workflow; requests reach `#[workflow]` fns only"
            );
            return Poll::Ready(None);
        };
        if let Some(why) = invalid_name("request name", &this.name) {
            tracing::error!(run_id = %ctx.run_id, "requests(): {why}");
            return Poll::Ready(None);
        }
        loop {
            let receiver = *this.receiver.get_or_insert_with(|| ctx.new_receiver());
            let Some((id, body)) = ctx.take_message(&this.mailbox, receiver, cx.waker()) else {
                return Poll::Pending;
            };
            this.receiver = None;
            let what = PayloadKind::Request { name: &this.name }.of_run(ctx.owner());
            match ctx.payloads.decode(body, what) {
                Ok(body) => {
                    return Poll::Ready(Some(Request {
                        ctx: ctx.clone(),
                        id,
                        name: this.name.clone(),
                        body,
                        _resp: PhantomData,
                    }))
                }
                // Its caller learns why (sealed like a reply: serde's message may quote the
                // body); the workflow waits for the next one.
                Err(e) => {
                    let place = id.to_string();
                    let at = places::of_run(ctx.owner(), places::REPLY, &place);
                    let error = ctx.payloads.seal_error(e.fatal(), &at);
                    ctx.reply(id, this.name.clone(), Err(error));
                }
            }
        }
    }
}

impl<Req, Resp> Drop for Requests<Req, Resp> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The future of [`Requests::next`].
#[must_use = "a request is received only when awaited"]
pub struct NextRequest<'a, Req, Resp> {
    stream: &'a mut Requests<Req, Resp>,
}

impl<Req, Resp> std::fmt::Debug for NextRequest<'_, Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextRequest")
            .field("name", &self.stream.name)
            .finish()
    }
}

impl<Req: DeserializeOwned, Resp: Serialize> Future for NextRequest<'_, Req, Resp> {
    type Output = Option<Request<Req, Resp>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        futures::Stream::poll_next(Pin::new(&mut *self.get_mut().stream), cx)
    }
}

impl<Req, Resp> Drop for NextRequest<'_, Req, Resp> {
    fn drop(&mut self) {
        self.stream.stop();
    }
}

/// One request sent to the run with `run.request(name, req)`: its body, and the reply its
/// caller waits for ([`Request::reply`]).
pub struct Request<Req, Resp> {
    ctx: Arc<RunCtx>,
    id: u64,
    name: String,
    body: Req,
    _resp: PhantomData<fn(Resp)>,
}

impl<Req: std::fmt::Debug, Resp> std::fmt::Debug for Request<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("body", &self.body)
            .finish()
    }
}

impl<Req, Resp: Serialize> Request<Req, Resp> {
    /// The request as sent.
    pub fn body(&self) -> &Req {
        &self.body
    }

    /// The name it was sent under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its id: unique in the store, the same on every replay.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Answers the request: recorded once (a replay records nothing again) and kept where
    /// the caller's `run.request(..)` reads it, in the same write. The caller gets it even if
    /// this worker crashes right after, and so does a later request with the same
    /// idempotency key.
    ///
    /// Errors (nothing recorded): a second reply to the same request, a reply over
    /// `max_payload_bytes` or one that does not serialize, a reply from inside a step.
    pub fn reply(&self, value: Resp) -> Result<(), Error> {
        if crate::context::try_step_metadata().is_some() {
            return Err(Error::fatal(
                "req.reply() was called inside a step; reply in the workflow body",
            ));
        }
        let place = self.id.to_string();
        let what = PayloadKind::Reply { name: &self.name }
            .of_run(self.ctx.owner())
            .at(&place);
        let value = self
            .ctx
            .payloads
            .encode(&value, what)
            .map_err(PayloadError::fatal)?;
        if self.ctx.reply(self.id, self.name.clone(), Ok(value)) {
            Ok(())
        } else {
            Err(Error::fatal(format!(
                "request {:?} ({}) was replied to already; a request gets one reply",
                self.name, self.id
            )))
        }
    }
}
