//! Messages in the SQL stores, written once: the send ([`send_message`]) over the statements
//! each dialect supplies ([`MessageTx`]). A message is a `hook_inbox` row under the reserved
//! token [`MESSAGE_TOKEN`] with its topic in the `topic` column (`rows.rs` reads it back as
//! [`Inbound::Message`]); its idempotency key, if any, is a `message_keys` row, kept until the
//! run is pruned (the inbox row goes once delivered). A request ([`send_request`]) is an inbox
//! row under [`REQUEST_TOKEN`] with its name in `topic`, and a `run_requests` row (its
//! idempotency key, and the reply once the workflow records one), kept until the run is pruned.
//!
//! [`Inbound::Message`]: crate::store::Inbound::Message

use std::future::Future;

use super::policy::Tx;
use super::{json, payload_id_of, sql_id, sql_time, status_of, time_of, to_json};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::{NewMessage, NewRequest, ReplyState, RequestRecord, SendOutcome};

pub(in crate::store) use super::{MESSAGE_TOKEN, REQUEST_TOKEN};

/// The statements each dialect writes for messages (its `messages.rs`), side by side.
pub(in crate::store) struct MessageSql {
    /// The inbox id of the message sent to run `1` with idempotency key `2`.
    pub key: &'static str,
    /// Queues a message: run `1`, token `2`, topic `3`, payload `4`, at `5`; lowers the run's
    /// wake time to `5` unless it is blocked. Its id (PostgreSQL: and whether no live lease
    /// holds the run).
    pub queue: &'static str,
    /// Records idempotency key `2` of run `1` for message `3`.
    pub keep_key: &'static str,
    /// Run `1`'s status.
    pub status: &'static str,
    /// Run `1`'s published keys and values (JSON), by key.
    pub events: &'static str,
    /// The id of the request sent to run `1` with idempotency key `2`.
    pub request_key: &'static str,
    /// Records request `2` of run `1`: name `3`, idempotency key `4`, at `5`.
    pub keep_request: &'static str,
    /// The reply (JSON, NULL while none) to request `2` of run `1`.
    pub reply: &'static str,
    /// Run `1`'s requests: id, name, key, at, whether replied; by id.
    pub requests: &'static str,
}

/// A run's status and the reply to one of its requests as read
/// (`MessageStore::request_reply`): `reply` is `None` without the request's row, `Some(None)`
/// while it has no reply.
pub(in crate::store) fn decode_reply(
    run: &str,
    status: Option<String>,
    reply: Option<Option<String>>,
) -> Result<Option<ReplyState>, StoreError> {
    let Some(status) = status else {
        return Ok(None);
    };
    let status = status_of(&status, run)?;
    let reply = match reply.flatten() {
        Some(r) => Some(json(&r, run, "a reply")?),
        None => None,
    };
    Ok(Some(ReplyState { status, reply }))
}

/// A `run_requests` row: id, name, key, at, whether replied.
pub(in crate::store) type RequestRow = (i64, String, Option<String>, i64, bool);

/// The requests of run `run` as listed (`MessageStore::run_requests`).
pub(in crate::store) fn decode_requests(
    run: &str,
    rows: Vec<RequestRow>,
) -> Result<Vec<RequestRecord>, StoreError> {
    rows.into_iter()
        .map(|(id, name, key, at, replied)| {
            Ok(RequestRecord {
                id: payload_id_of(id)?,
                at: time_of(at, run, "a request")?,
                name,
                idempotency_key: key,
                replied,
            })
        })
        .collect()
}

/// A run's status and published values as read (`MessageStore::run_events`).
pub(in crate::store) fn decode_events(
    run: &str,
    status: Option<String>,
    values: Vec<(String, String)>,
) -> Result<Option<crate::store::RunEvents>, StoreError> {
    let Some(status) = status else {
        return Ok(None);
    };
    let status = status_of(&status, run)?;
    let values = values
        .into_iter()
        .map(|(k, v)| {
            let what = format!("event {k:?}");
            Ok((super::json(&v, run, &what)?, k))
        })
        .map(|r: Result<(serde_json::Value, String), StoreError>| r.map(|(v, k)| (k, v)))
        .collect::<Result<_, _>>()?;
    Ok(Some(crate::store::RunEvents { status, values }))
}

/// A message (or request) ready for its row, encoded before the transaction.
pub(in crate::store) struct EncodedMessage {
    /// [`MESSAGE_TOKEN`] or [`REQUEST_TOKEN`].
    pub token: &'static str,
    /// A message's topic, a request's name.
    pub topic: String,
    /// JSON.
    pub payload: String,
    pub key: Option<String>,
    pub at: i64,
}

impl EncodedMessage {
    pub fn new(m: &NewMessage) -> Result<Self, StoreError> {
        Ok(EncodedMessage {
            token: MESSAGE_TOKEN,
            topic: m.topic.clone(),
            payload: to_json(&m.payload, "the message")?,
            key: m.idempotency_key.clone(),
            at: sql_time(m.at),
        })
    }

    pub fn request(r: &NewRequest) -> Result<Self, StoreError> {
        Ok(EncodedMessage {
            token: REQUEST_TOKEN,
            topic: r.name.clone(),
            payload: to_json(&r.payload, "the request")?,
            key: r.idempotency_key.clone(),
            at: sql_time(r.at),
        })
    }
}

/// The statements of a send, beside [`Tx`]'s.
pub(in crate::store) trait MessageTx: Tx {
    /// The inbox id of the message sent to `run` with idempotency key `key`, if any.
    fn message_key(
        &mut self,
        run: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>>;

    /// Queues `message` to `run` under its token, lowers the run's wake time to the
    /// message's (unless it is blocked) and announces the payload where the dialect can; its
    /// inbox id.
    fn queue_message(
        &mut self,
        run: &str,
        message: &EncodedMessage,
    ) -> impl Future<Output = Result<i64, StoreError>>;

    /// Records that `run` got message `id` with idempotency key `key` (the primary key
    /// (run, key) refuses a second).
    fn keep_message_key(
        &mut self,
        run: &str,
        key: &str,
        id: i64,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// The id of the request sent to `run` with idempotency key `key`, if any.
    fn request_key(
        &mut self,
        run: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>>;

    /// Records request `id` (queued as `request`) of `run`, for its reply (the unique
    /// (run, key) refuses a second with its key).
    fn keep_request(
        &mut self,
        run: &str,
        id: i64,
        request: &EncodedMessage,
    ) -> impl Future<Output = Result<(), StoreError>>;
}

/// Sends `message` to `run` in the caller's transaction: nothing is written when the run is
/// unknown or ended, or when its idempotency key was used for the run before.
///
/// The inbox lock comes first (PostgreSQL: ids drawn in commit order, and the order every
/// writer that queues payloads takes its locks in), then the run's row, locked against its
/// end: the message is stored before the end or refused after it.
pub(in crate::store) async fn send_message(
    tx: &mut impl MessageTx,
    run: &RunId,
    message: &EncodedMessage,
) -> Result<SendOutcome, StoreError> {
    tx.lock_inbox_for_end(None).await?;
    let key = run.to_string();
    let Some(status) = tx.run_status(&key).await? else {
        return Ok(SendOutcome::NotFound);
    };
    let status = status_of(&status, &key)?;
    if status.is_terminal() {
        return Ok(SendOutcome::Ended(status));
    }
    if let Some(k) = &message.key {
        if let Some(first) = tx.message_key(&key, k).await? {
            return Ok(SendOutcome::Duplicate(payload_id_of(first)?));
        }
    }
    let id = tx.queue_message(&key, message).await?;
    if let Some(k) = &message.key {
        tx.keep_message_key(&key, k, id).await?;
    }
    Ok(SendOutcome::Queued(payload_id_of(id)?))
}

/// Sends `request` to `run` in the caller's transaction: a request with the idempotency key of
/// an earlier one to the run is that one (its id, nothing written), whether or not the run
/// ended; otherwise nothing is written when the run is unknown or ended. Locks as
/// [`send_message`] does.
pub(in crate::store) async fn send_request(
    tx: &mut impl MessageTx,
    run: &RunId,
    request: &EncodedMessage,
) -> Result<SendOutcome, StoreError> {
    tx.lock_inbox_for_end(None).await?;
    let key = run.to_string();
    if let Some(k) = &request.key {
        if let Some(first) = tx.request_key(&key, k).await? {
            return Ok(SendOutcome::Duplicate(payload_id_of(first)?));
        }
    }
    let Some(status) = tx.run_status(&key).await? else {
        return Ok(SendOutcome::NotFound);
    };
    let status = status_of(&status, &key)?;
    if status.is_terminal() {
        return Ok(SendOutcome::Ended(status));
    }
    let id = tx.queue_message(&key, request).await?;
    tx.keep_request(&key, id, request).await?;
    Ok(SendOutcome::Queued(payload_id_of(id)?))
}

/// The id of request `id` as bound.
pub(in crate::store) fn request_id(id: u64) -> i64 {
    sql_id(id)
}
