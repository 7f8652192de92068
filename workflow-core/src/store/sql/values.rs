//! How values become columns and back, and how a column that does not hold what this crate
//! writes there is reported.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::error::StoreError;
use crate::store::{
    from_millis, to_millis, Append, EndHint, Inbound, InboxEntry, NewEvent, RunOutcome, RunStatus,
};

/// A time column: milliseconds since the Unix epoch.
pub(in crate::store) fn sql_time(t: SystemTime) -> i64 {
    i64::try_from(to_millis(t)).unwrap_or(i64::MAX)
}

/// The end of a lease taken at `now`, as a time column.
pub(in crate::store) fn lease_end(now: SystemTime, lease: Duration) -> i64 {
    let lease = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    sql_time(now).saturating_add(lease)
}

pub(in crate::store) fn sql_epoch(epoch: u64) -> i64 {
    // An epoch past i64::MAX cannot be stored, so it matches no row: the lease is lost.
    i64::try_from(epoch).unwrap_or(-1)
}

/// An id or a count as a column (ids never exceed i64::MAX, so "above" a larger id matches
/// nothing either way).
pub(in crate::store) fn sql_id(id: impl TryInto<i64>) -> i64 {
    id.try_into().unwrap_or(i64::MAX)
}

pub(in crate::store) fn payload_id_of(id: i64) -> Result<u64, StoreError> {
    u64::try_from(id).map_err(|e| StoreError::Corrupt(format!("payload id {id}: {e}")))
}

pub(in crate::store) fn to_json<T: serde::Serialize>(
    v: &T,
    what: &str,
) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::database(format!("cannot encode {what}: {e}")))
}

/// A column of run `run` that does not hold what this crate writes there.
pub(in crate::store) fn corrupt(run: &str, what: &str, why: impl fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("run {run}: {what}: {why}"))
}

/// A JSON column of run `run` read back.
pub(in crate::store) fn json<T: serde::de::DeserializeOwned>(
    s: &str,
    run: &str,
    what: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(s).map_err(|e| corrupt(run, what, e))
}

/// A time column read back.
pub(in crate::store) fn time_of(ms: i64, run: &str, what: &str) -> Result<SystemTime, StoreError> {
    Ok(from_millis(
        u64::try_from(ms).map_err(|e| corrupt(run, what, e))?,
    ))
}

/// A status column read back.
pub(in crate::store) fn status_of(s: &str, run: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(s).ok_or_else(|| corrupt(run, "status", format!("unknown status `{s}`")))
}

/// The owner column of hook `token` read back.
pub(in crate::store) fn owner_of(owner: &str, token: &str) -> Result<crate::RunId, StoreError> {
    owner
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("hook {token:?}: run_id: {e}")))
}

/// Events ready for their rows, column by column (PostgreSQL binds each column as an array).
#[derive(Debug, Default)]
pub(in crate::store) struct EncodedEvents {
    pub at: Vec<i64>,
    /// The serde tag, e.g. `step_completed`, for SQL inspection.
    pub kind: Vec<String>,
    /// JSON of the event.
    pub data: Vec<String>,
    /// The inbox ids of the payloads these events deliver (`HookReceived`).
    pub received: Vec<i64>,
    /// The values these events publish (`EventSet`): key and JSON.
    pub published: Vec<(String, String)>,
    /// The replies these events record (`RequestReplied`): request id and JSON of the reply.
    pub replies: Vec<(i64, String)>,
}

impl EncodedEvents {
    pub fn new(events: &[NewEvent]) -> Result<Self, StoreError> {
        let mut out = EncodedEvents::default();
        for e in events {
            out.at.push(sql_time(e.at));
            out.kind.push(e.event.kind().to_owned());
            out.data.push(to_json(&e.event, "an event")?);
            if let Some(payload_id) = e.event.delivered_payload() {
                out.received.push(sql_id(payload_id));
            }
            if let crate::store::Event::EventSet { key, value, .. } = &e.event {
                out.published
                    .push((key.clone(), to_json(value, "a published value")?));
            }
            if let crate::store::Event::RequestReplied {
                request_id, reply, ..
            } = &e.event
            {
                out.replies
                    .push((sql_id(*request_id), to_json(reply, "a reply")?));
            }
        }
        Ok(out)
    }

    /// True when the events only record: none delivers a payload, publishes a value or
    /// records a reply (nothing to write beside the events' rows).
    pub fn is_plain(&self) -> bool {
        self.received.is_empty() && self.published.is_empty() && self.replies.is_empty()
    }

    #[cfg(feature = "sqlite")]
    pub fn len(&self) -> usize {
        self.at.len()
    }

    #[cfg(feature = "sqlite")]
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

/// A run's end as the columns of its row.
#[derive(Debug)]
pub(in crate::store) struct EncodedEnd {
    pub status: RunStatus,
    /// JSON of the return value.
    pub output: Option<String>,
    /// JSON of the error.
    pub error: Option<String>,
}

impl EncodedEnd {
    /// The end of child `run` as its parent's inbox holds it (a `ChildNotice`).
    pub fn notice(&self, run: &str) -> String {
        crate::store::ChildNotice::encode(
            run,
            self.status,
            self.output.as_deref(),
            self.error.as_deref(),
        )
    }
}

/// An [`Append`] ready for the database. Encoded by the caller, not on SQLite's writer
/// thread, which every run's writes queue behind.
#[derive(Debug)]
pub(in crate::store) struct EncodedAppend {
    pub events: EncodedEvents,
    pub release_tokens: Vec<String>,
    pub end: Option<EncodedEnd>,
    /// The time of the write: its last event's, as the memory store has it; without events,
    /// the store's clock.
    pub now: i64,
    /// What the writer knows of the run's ties, for the dialect's choice of statement for
    /// the end ([`Append::end_hint`]).
    pub hint: EndHint,
    /// [`Append::carried`].
    pub carried: Vec<EncodedInbox>,
}

/// An inbox row as it is written: its id, `token` (a hook's, or one of the reserved tokens
/// of messages and requests, whose topic or name is in `topic`) and payload (JSON).
#[derive(Debug)]
pub(in crate::store) struct EncodedInbox {
    pub id: i64,
    pub token: String,
    pub topic: Option<String>,
    pub payload: String,
}

impl EncodedInbox {
    pub fn new(entry: &InboxEntry) -> Result<Self, StoreError> {
        let (token, topic, payload) = match &entry.what {
            Inbound::Hook { token, payload } => (token.clone(), None, payload),
            Inbound::Message { topic, payload } => (
                super::MESSAGE_TOKEN.to_owned(),
                Some(topic.clone()),
                payload,
            ),
            Inbound::Request { name, payload } => {
                (super::REQUEST_TOKEN.to_owned(), Some(name.clone()), payload)
            }
            Inbound::ChildEnded(_) => {
                return Err(StoreError::database(
                    "a child's end is not carried to the next run of a chain",
                ))
            }
        };
        Ok(EncodedInbox {
            id: i64::try_from(entry.id)
                .map_err(|_| StoreError::database("an inbox id beyond i64"))?,
            token,
            topic,
            payload: to_json(payload, "a carried payload")?,
        })
    }
}

impl EncodedAppend {
    /// `write`, timed by its last event or else by the local clock.
    #[cfg(feature = "sqlite")]
    pub fn new(write: &Append) -> Result<Self, StoreError> {
        Self::timed(write, SystemTime::now)
    }

    /// `write`, timed by its last event or else at `clock()` (the store's clock).
    pub fn timed(write: &Append, clock: impl FnOnce() -> SystemTime) -> Result<Self, StoreError> {
        let now = sql_time(write.events.last().map_or_else(clock, |e| e.at));
        let end = match &write.outcome {
            None => None,
            Some(RunOutcome::Completed(v)) => Some(EncodedEnd {
                status: RunStatus::Completed,
                output: Some(to_json(v, "the run's output")?),
                error: None,
            }),
            Some(RunOutcome::Failed(e)) => Some(EncodedEnd {
                status: RunStatus::Failed,
                output: None,
                error: Some(to_json(e, "the run's error")?),
            }),
        };
        Ok(EncodedAppend {
            events: EncodedEvents::new(&write.events)?,
            release_tokens: write.release_tokens.clone(),
            end,
            now,
            hint: write.end_hint,
            carried: write
                .carried
                .iter()
                .map(EncodedInbox::new)
                .collect::<Result<_, _>>()?,
        })
    }

    /// True when the append ends the run and does nothing else but add events (no payload
    /// delivered, no token given up by itself): the usual last write of a run.
    pub fn plain_end(&self) -> bool {
        self.end.is_some() && self.events.is_plain() && self.release_tokens.is_empty()
    }

    /// True when the append only adds events (no payload delivered, no tokens released, no
    /// end).
    pub fn events_only(&self) -> bool {
        self.events.is_plain() && self.release_tokens.is_empty() && self.end.is_none()
    }
}
