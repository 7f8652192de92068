//! Talking to a running run from outside it: [`Run::send`] and its builder [`SendMessage`].
//! A send is one store act ([`MessageStore::send_message`]) that also makes the run due; the
//! run's driver here hears of it at once, other processes by the store's notice or poll.
//!
//! [`MessageStore::send_message`]: crate::store::MessageStore::send_message

use std::future::IntoFuture;

use serde_json::Value;

use super::Run;
use crate::error::RunError;
use crate::message::invalid_name;
use crate::payload::{to_json, PayloadError, PayloadKind};
use crate::registry::BoxFuture;
use crate::store::{NewMessage, RunStatus, SendOutcome};

impl<T> Run<T> {
    /// Sends `msg` to the run on `topic`, for its workflow's [`recv`](crate::recv). Await the
    /// returned builder; once it resolves the message is durable, and the run receives it
    /// exactly once, after every message sent on the topic before it.
    ///
    /// Messages sent before the workflow calls `recv` wait for it. With
    /// [`.idempotency_key(k)`](SendMessage::idempotency_key) at most one message per run and
    /// key is stored, whatever the number of sends (a repeat with another payload is a no-op:
    /// the first stays).
    ///
    /// Errors, with nothing stored: [`RunError::NotFound`] for an unknown run,
    /// [`RunError::Ended`] for a run that ended, [`RunError::TooLarge`] over
    /// `max_payload_bytes`, [`RunError::InvalidMessage`] for an invalid topic (empty, over
    /// 1 KiB, control characters) or a value that does not serialize.
    ///
    /// ```
    /// use workflow_core::prelude::*;
    ///
    /// #[workflow]
    /// async fn tally(n: u32) -> Result<u32> {
    ///     let mut sum = 0;
    ///     for _ in 0..n {
    ///         sum += recv::<u32>("add").await?;
    ///     }
    ///     Ok(sum)
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    /// let rt = Runtime::builder().in_memory().build().await?;
    /// let run = rt.start(tally, (2,)).await?;
    /// run.send("add", 40).idempotency_key("first").await?;
    /// run.send("add", 99).idempotency_key("first").await?; // a no-op: the key was used
    /// run.send("add", 2).await?;
    /// assert_eq!(run.return_value().await?, 42);
    /// assert!(matches!(run.send("add", 1).await, Err(workflow_core::RunError::Ended { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn send<M: serde::Serialize>(&self, topic: impl Into<String>, msg: M) -> SendMessage {
        SendMessage {
            run: self.untyped(),
            topic: topic.into(),
            payload: to_json(&msg),
            key: None,
        }
    }
}

/// A pending [`Run::send`]; await it.
#[must_use = "a message is sent only when the send is awaited"]
pub struct SendMessage {
    run: Run<Value>,
    topic: String,
    /// The message serialized, sealed (for the run's chain) when it is sent.
    payload: Result<Value, serde_json::Error>,
    key: Option<String>,
}

impl std::fmt::Debug for SendMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendMessage")
            .field("run", &self.run.id)
            .field("topic", &self.topic)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl SendMessage {
    /// At most one message per run and `key` is stored: a later send with the same key (and
    /// any payload) stores nothing and succeeds.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// What a send to a run (a message or a request) checks before it touches the store: its
/// name (`name_is`: "message topic", "request name"), its idempotency key (`key_is`), and its
/// payload's encoding and size. Nothing is stored when it fails.
pub(super) fn checked_send(
    name_is: &str,
    key_is: &str,
    name: &str,
    key: Option<&str>,
    payload: Result<Value, PayloadError>,
) -> Result<Value, RunError> {
    if let Some(why) = invalid_name(name_is, name) {
        return Err(RunError::InvalidMessage(why));
    }
    if let Some(why) = key.and_then(|k| invalid_name(key_is, k)) {
        return Err(RunError::InvalidMessage(why));
    }
    match payload {
        Ok(p) => Ok(p),
        Err(PayloadError::TooLarge(e)) => Err(RunError::TooLarge(e)),
        Err(e) => Err(RunError::InvalidMessage(e.to_string())),
    }
}

impl IntoFuture for SendMessage {
    type Output = Result<(), RunError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let id = self.run.id;
            let inner = &self.run.rt.inner;
            // Sealed for the chain's first run, as every run of the chain reads it: it opens
            // in whichever run of the chain receives it.
            let kind = PayloadKind::Message { topic: &self.topic };
            let owner = self.run.owner().await?;
            let payload = inner.config.payloads.seal(self.payload, kind.of_run(owner));
            let payload = checked_send(
                "message topic",
                "message idempotency key",
                &self.topic,
                self.key.as_deref(),
                payload,
            )?;
            let message = NewMessage {
                topic: self.topic,
                payload,
                idempotency_key: self.key,
                at: inner.clock.tick().await,
            };
            // A run that continued as new passes its messages on: to the chain's current run.
            let mut to = id;
            loop {
                return match inner.store.send_message(&to, message.clone()).await? {
                    SendOutcome::Queued(_) => {
                        // Not driven here: evicted (now acquirable), or driven elsewhere.
                        if !inner.payload_arrived(&to) {
                            inner.work.notify_one();
                        }
                        Ok(())
                    }
                    SendOutcome::Duplicate(_) => Ok(()),
                    // Sealed for the chain, so it goes on as it is.
                    SendOutcome::Ended(RunStatus::ContinuedAsNew) => {
                        match next_of(inner, to).await? {
                            Some(next) => {
                                to = next;
                                continue;
                            }
                            None => Err(RunError::NotFound(to)),
                        }
                    }
                    SendOutcome::Ended(status) => Err(RunError::Ended { id, status }),
                    SendOutcome::NotFound => Err(RunError::NotFound(id)),
                };
            }
        })
    }
}

/// The run that continues run `id` (`continue_as_new`), as its record names it.
pub(super) async fn next_of(
    inner: &super::Inner,
    id: crate::ids::RunId,
) -> Result<Option<crate::ids::RunId>, crate::error::StoreError> {
    Ok(inner.store.get_run(&id).await?.and_then(|r| r.next_run))
}
