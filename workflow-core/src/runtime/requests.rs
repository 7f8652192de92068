//! Asking a running run: [`Run::request`] and its builder [`SendRequest`]. The request is one
//! store act ([`MessageStore::send_request`]) that also makes the run due (its driver here
//! hears of it at once, other processes by the store's notice or poll); the caller then waits
//! for the reply in the store like an event reader (`events.rs`): it reads, then waits for the
//! run's change signal (here at once, from other processes by the store's notice) or the poll
//! interval, and reads again. The reply is durable before anyone sees it, so a caller's wait
//! survives the crash of the worker that replied, and of the one that did not yet.
//!
//! [`MessageStore::send_request`]: crate::store::MessageStore::send_request

use std::future::IntoFuture;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::messages::{checked_send, next_of};
use super::{Run, StreamWatch};
use crate::crypto::places::{of_run, Owner, REPLY};
use crate::error::RunError;
use crate::payload::{to_json, PayloadKind};
use crate::registry::BoxFuture;
use crate::store::{NewRequest, RunStatus, SendOutcome};

impl<T> Run<T> {
    /// Sends `req` to the run under `name`, for its workflow's
    /// [`requests::<Req, Resp>(name)`](crate::requests), and waits for the reply the workflow
    /// records with [`Request::reply`](crate::Request::reply). Await the returned builder.
    ///
    /// The request is durable once sent; the reply too once recorded, so the wait survives the
    /// crash of a worker (another one takes the run over and replies). Requests sent before the
    /// workflow listens wait for it, each delivered once, in send order.
    ///
    /// - [`.timeout(d)`](SendRequest::timeout) bounds this caller's wait
    ///   ([`RunError::TimedOut`]); the request is not withdrawn.
    /// - [`.idempotency_key(k)`](SendRequest::idempotency_key): one request per run and key;
    ///   a repeat (any payload) waits for the first one's reply, also after an earlier caller
    ///   timed out or the run ended.
    ///
    /// Errors: [`RunError::NotFound`] for an unknown run, [`RunError::Ended`] for a run that
    /// ended, [`RunError::TooLarge`] over `max_payload_bytes`, [`RunError::InvalidMessage`] for
    /// an invalid name or key (empty, over 1 KiB, control characters) or a value that does not
    /// serialize: nothing is stored for any of them. [`RunError::NoReply`] when the run ends
    /// without replying; [`RunError::Payload`] when the reply does not fit `Resp` (or the
    /// workflow could not read the request).
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn doubler() -> Result<()> {
    ///     let mut asks = requests::<u32, u32>("double");
    ///     let Some(req) = asks.next().await else { return Ok(()) };
    ///     let n = *req.body();
    ///     req.reply(2 * n)?;
    ///     Ok(())
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let run = rt.start(doubler, ()).await?;
    /// let doubled = run
    ///     .request::<u32, u32>("double", 21)
    ///     .idempotency_key("ask-1")
    ///     .timeout(Duration::from_secs(60))
    ///     .await?;
    /// assert_eq!(doubled, 42);
    /// // The same key: the first request's reply, even after the run ended.
    /// run.return_value().await?;
    /// assert_eq!(run.request::<u32, u32>("double", 5).idempotency_key("ask-1").await?, 42);
    /// # Ok(())
    /// # }
    /// ```
    pub fn request<Req: serde::Serialize, Resp: DeserializeOwned>(
        &self,
        name: impl Into<String>,
        req: Req,
    ) -> SendRequest<Resp> {
        SendRequest {
            run: self.untyped(),
            name: name.into(),
            payload: to_json(&req),
            key: None,
            timeout: None,
            _t: PhantomData,
        }
    }
}

/// A pending [`Run::request`]; await it for the reply.
#[must_use = "a request is sent only when awaited"]
pub struct SendRequest<Resp> {
    run: Run<Value>,
    name: String,
    /// The request serialized, sealed (for the run's chain) when it is sent.
    payload: Result<Value, serde_json::Error>,
    key: Option<String>,
    timeout: Option<Duration>,
    _t: PhantomData<fn() -> Resp>,
}

impl<Resp> std::fmt::Debug for SendRequest<Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRequest")
            .field("run", &self.run.id)
            .field("name", &self.name)
            .field("key", &self.key)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<Resp> SendRequest<Resp> {
    /// One request per run and `key`: a later request with the same key stores nothing and
    /// waits for the first one's reply.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Waits at most `d` for the reply; then [`RunError::TimedOut`]. The request stays with
    /// the run, which may still reply (a repeat with the same idempotency key gets it).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
}

impl<Resp: DeserializeOwned + Send + 'static> IntoFuture for SendRequest<Resp> {
    type Output = Result<Resp, RunError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let id = self.run.id;
            let inner = &self.run.rt.inner;
            // The request and its reply are the chain's: sealed for its first run, they open
            // in whichever run of the chain receives the request and for the caller.
            let owner = self.run.owner().await?;
            let kind = PayloadKind::Request { name: &self.name };
            let payload = inner.config.payloads.seal(self.payload, kind.of_run(owner));
            let payload = checked_send(
                "request name",
                "request idempotency key",
                &self.name,
                self.key.as_deref(),
                payload,
            )?;
            // Watching before the send: a reply recorded at once is not missed.
            let deadline = self.timeout.map(|d| Instant::now().checked_add(d));
            let mut watch = StreamWatch::new(inner, id);
            let request = NewRequest {
                name: self.name.clone(),
                payload,
                idempotency_key: self.key,
                at: inner.clock.tick().await,
            };
            // A run that continued as new passes its requests on: to the chain's current run,
            // whose reply the caller waits for.
            let mut id = id;
            let request_id = loop {
                break match inner.store.send_request(&id, request.clone()).await? {
                    SendOutcome::Queued(request_id) => {
                        // Not driven here: evicted (now acquirable), or driven elsewhere.
                        if !inner.payload_arrived(&id) {
                            inner.work.notify_one();
                        }
                        request_id
                    }
                    SendOutcome::Duplicate(request_id) => request_id,
                    // Sealed for the chain, so it goes on as it is.
                    SendOutcome::Ended(RunStatus::ContinuedAsNew) => {
                        match next_of(inner, id).await? {
                            Some(next) => {
                                id = next;
                                watch = StreamWatch::new(inner, id);
                                continue;
                            }
                            None => return Err(RunError::NotFound(id)),
                        }
                    }
                    SendOutcome::Ended(status) => return Err(RunError::Ended { id, status }),
                    SendOutcome::NotFound => return Err(RunError::NotFound(id)),
                };
            };
            let poll = inner.config.poll_interval;
            let place = request_id.to_string();
            loop {
                watch.seen();
                let Some(state) = inner.store.request_reply(&id, request_id).await? else {
                    return Err(RunError::NotFound(id));
                };
                match state.reply {
                    Some(Ok(v)) => {
                        let replier = Owner::new(id, Some(owner.origin));
                        let cx = PayloadKind::Reply { name: &self.name }
                            .of_run(replier)
                            .at(&place);
                        let decoded = inner.config.payloads.decode(v, cx);
                        return decoded.map_err(|e| RunError::Payload(e.to_string()));
                    }
                    Some(Err(e)) => {
                        let e = inner.config.payloads.open_error(
                            e,
                            &of_run(Owner::new(id, Some(owner.origin)), REPLY, &place),
                        );
                        return Err(RunError::Payload(e.to_string()));
                    }
                    // Not replied to when the run continued as new: the request moved to
                    // the next run, which replies.
                    None if state.status == RunStatus::ContinuedAsNew => {
                        match next_of(inner, id).await? {
                            Some(next) => {
                                id = next;
                                watch = StreamWatch::new(inner, id);
                                continue;
                            }
                            None => return Err(RunError::NotFound(id)),
                        }
                    }
                    None if state.status.is_terminal() => {
                        return Err(RunError::NoReply {
                            id,
                            name: self.name,
                            status: state.status,
                        })
                    }
                    None => {}
                }
                let wait = match deadline {
                    None | Some(None) => poll,
                    Some(Some(at)) => match at.checked_duration_since(Instant::now()) {
                        Some(left) if !left.is_zero() => left.min(poll),
                        _ => {
                            return Err(RunError::TimedOut {
                                id,
                                waited: self.timeout.unwrap_or_default(),
                            })
                        }
                    },
                };
                watch.changed(wait).await;
            }
        })
    }
}
