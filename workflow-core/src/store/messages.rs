//! Messages to runs: `run.send(topic, msg)` puts a message into the run's inbox (the one hook
//! payloads and children's ends go through), where the workflow's `recv(topic)` takes it.
//! Each send is one atomic act: the run must exist and not have ended, and a message with an
//! idempotency key is stored at most once per run and key.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::Value;

use crate::error::StoreError;
use crate::ids::RunId;

use super::RunStatus;

/// A message to send to a run ([`MessageStore::send_message`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// The topic the workflow's `recv(topic)` waits on.
    pub topic: String,
    /// The message.
    pub payload: Value,
    /// At most one message per run and key is stored (`.idempotency_key(k)`).
    pub idempotency_key: Option<String>,
    /// When it was sent; the run is due from then on.
    pub at: SystemTime,
}

/// What [`MessageStore::send_message`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    /// The message is in the run's inbox with this id (global, in commit order).
    Queued(u64),
    /// A message with the same idempotency key was sent to the run before, with this id:
    /// nothing was written.
    Duplicate(u64),
    /// The run has ended with this status: nothing was written.
    Ended(RunStatus),
    /// No run has this id: nothing was written.
    NotFound,
}

/// What a run published with `set_event`, as [`MessageStore::run_events`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvents {
    /// The run's status, read with the values.
    pub status: RunStatus,
    /// The latest value of each key.
    pub values: BTreeMap<String, Value>,
}

/// Messages sent to runs by their id, and the values runs publish.
///
/// Publishing has no method of its own: an [`Event::EventSet`] among the events of
/// [`RunStore::append`] sets its key's latest value in the same act.
///
/// [`Event::EventSet`]: super::Event::EventSet
/// [`RunStore::append`]: super::RunStore::append
#[async_trait::async_trait]
pub trait MessageStore: Send + Sync + 'static {
    /// Puts `message` into the inbox of run `run` (read back by [`HookStore::payloads`] as
    /// [`Inbound::Message`]) and makes the run acquirable at `message.at` if no worker holds
    /// it, in one act; or writes nothing when the run is unknown or ended, or when a message
    /// with the same idempotency key was sent to it before. An ending run and a send to it
    /// take turns: the message is stored before the end or refused.
    ///
    /// [`HookStore::payloads`]: super::HookStore::payloads
    /// [`Inbound::Message`]: super::Inbound::Message
    async fn send_message(
        &self,
        run: &RunId,
        message: NewMessage,
    ) -> Result<SendOutcome, StoreError>;

    /// The run's status and the latest value of each key it published; `None` for an
    /// unknown run.
    async fn run_events(&self, run: &RunId) -> Result<Option<RunEvents>, StoreError>;
}
