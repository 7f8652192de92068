//! Messages and requests to runs: `run.send(topic, msg)` puts a message into the run's inbox
//! (the one hook payloads and children's ends go through), where the workflow's `recv(topic)`
//! takes it; `run.request(name, req)` puts a request there for the workflow's
//! `requests(name)`, and keeps a record of it where the workflow's reply is written. Each send
//! is one atomic act: the run must exist and not have ended, and a message (a request) with an
//! idempotency key is stored at most once per run and key.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::Value;

use crate::error::{Error, StoreError};
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

/// A request to send to a run ([`MessageStore::send_request`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequest {
    /// The name the workflow's `requests(name)` takes it under.
    pub name: String,
    /// The request.
    pub payload: Value,
    /// At most one request per run and key is stored; a repeat is answered with the first
    /// one's id (`.idempotency_key(k)`).
    pub idempotency_key: Option<String>,
    /// When it was sent; the run is due from then on.
    pub at: SystemTime,
}

/// Where a request stands, as its caller reads it ([`MessageStore::request_reply`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplyState {
    /// The run's status, read before the reply: a run that ended shows its reply, if it gave
    /// one.
    pub status: RunStatus,
    /// The recorded reply, if any (an `Err`: the workflow could not read the request).
    pub reply: Option<Result<Value, Error>>,
}

/// A request sent to a run, as [`MessageStore::run_requests`] lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    /// Its id (its inbox id).
    pub id: u64,
    /// The name it was sent under.
    pub name: String,
    /// Its idempotency key, if it had one.
    pub idempotency_key: Option<String>,
    /// When it was sent.
    pub at: SystemTime,
    /// Whether the workflow replied to it.
    pub replied: bool,
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

    /// Puts `request` into the inbox of run `run` (read back as [`Inbound::Request`], its
    /// inbox id the request's id), records it for its reply, and makes the run acquirable at
    /// `request.at` if no worker holds it, in one act. A request with the idempotency key of an
    /// earlier request to the run is that request ([`SendOutcome::Duplicate`] with its id),
    /// also after the run ended; otherwise nothing is written when the run is unknown or
    /// ended. An ending run and a request take turns like a message and the end.
    ///
    /// The reply is written by the append that records an [`Event::RequestReplied`].
    ///
    /// [`Inbound::Request`]: super::Inbound::Request
    /// [`Event::RequestReplied`]: super::Event::RequestReplied
    async fn send_request(
        &self,
        run: &RunId,
        request: NewRequest,
    ) -> Result<SendOutcome, StoreError>;

    /// The run's status and the reply to its request `id`, if recorded; `None` for an unknown
    /// run. The status is read first, so a run seen ended shows a reply it gave.
    async fn request_reply(&self, run: &RunId, id: u64) -> Result<Option<ReplyState>, StoreError>;

    /// The requests sent to the run, by id (replied or not).
    async fn run_requests(&self, run: &RunId) -> Result<Vec<RequestRecord>, StoreError>;
}
