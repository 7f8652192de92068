//! Rewriting stored payloads in place, for `workflow rekey`: the rows that hold
//! sealed payloads, read page by page, and a compare-and-set that replaces one row's value
//! only while it still holds what was read. The store knows nothing of keys or envelopes: it
//! hands out every row whose JSON holds the envelope marker (`$wf_sealed`) and writes back
//! what the caller gives it; which payloads need a new key is decided above it
//! (`runtime/rekey.rs`).

use serde_json::Value;

use crate::error::{Error, StoreError};
use crate::history::Event;
use crate::ids::RunId;
use crate::model::Inbound;

/// The tables that hold payloads, in the order `workflow rekey` reads them: the inbox before
/// the histories, since a payload delivered from the inbox moves into a history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PayloadTable {
    /// Runs: their arguments, return values and errors.
    Runs,
    /// The inbox: hook payloads, messages and children's ends not yet delivered.
    Inbox,
    /// Histories: every event that carries a payload or an error.
    Events,
    /// Stream chunks.
    Chunks,
    /// The latest value of each key a run published (`set_event`).
    Published,
    /// The caller-side copy of each request's reply (`run_requests`), which `run.request`
    /// reads (also for a repeat with the same idempotency key, after the run ended).
    Replies,
}

impl PayloadTable {
    /// Every table, in reading order.
    pub const ALL: [PayloadTable; 6] = [
        PayloadTable::Runs,
        PayloadTable::Inbox,
        PayloadTable::Events,
        PayloadTable::Chunks,
        PayloadTable::Published,
        PayloadTable::Replies,
    ];
}

/// Where a stored value is: a row (and for runs, a column) of a [`PayloadTable`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SealedAt {
    /// A run's arguments.
    RunInput(RunId),
    /// A run's return value.
    RunOutput(RunId),
    /// A run's error.
    RunError(RunId),
    /// Event `seq` of a run's history.
    Event {
        /// The run.
        run: RunId,
        /// The event's number.
        seq: u64,
    },
    /// Inbox entry `id` of a run.
    Inbox {
        /// The run it was sent to.
        run: RunId,
        /// The entry's id.
        id: u64,
    },
    /// Chunk `index` of a run's stream.
    Chunk {
        /// The run.
        run: RunId,
        /// The stream's name.
        stream: String,
        /// The chunk's index.
        index: u64,
    },
    /// The latest value a run published under `key`.
    Published {
        /// The run.
        run: RunId,
        /// The key.
        key: String,
    },
    /// The reply of a run to its request `id`, as its callers read it.
    Reply {
        /// The run that replied.
        run: RunId,
        /// The request's id.
        id: u64,
    },
}

impl SealedAt {
    /// The run the value belongs to.
    pub fn run(&self) -> RunId {
        match self {
            SealedAt::RunInput(r) | SealedAt::RunOutput(r) | SealedAt::RunError(r) => *r,
            SealedAt::Event { run, .. }
            | SealedAt::Inbox { run, .. }
            | SealedAt::Chunk { run, .. }
            | SealedAt::Published { run, .. }
            | SealedAt::Reply { run, .. } => *run,
        }
    }

    /// The table it is in.
    pub fn table(&self) -> PayloadTable {
        match self {
            SealedAt::RunInput(_) | SealedAt::RunOutput(_) | SealedAt::RunError(_) => {
                PayloadTable::Runs
            }
            SealedAt::Event { .. } => PayloadTable::Events,
            SealedAt::Inbox { .. } => PayloadTable::Inbox,
            SealedAt::Chunk { .. } => PayloadTable::Chunks,
            SealedAt::Published { .. } => PayloadTable::Published,
            SealedAt::Reply { .. } => PayloadTable::Replies,
        }
    }
}

/// What a stored value is, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum SealedValue {
    /// A payload: a run's arguments or return value, a chunk, a published value.
    Value(Value),
    /// A run's error.
    Error(Error),
    /// An event of a history.
    Event(Event),
    /// An inbox entry.
    Inbound(Inbound),
    /// A reply to a request: the value, or why the workflow could not read the request.
    Reply(Result<Value, Error>),
}

/// A stored value as [`RekeyStore::sealed_rows`] read it.
#[derive(Debug, Clone, PartialEq)]
pub struct SealedRow {
    /// Where it is.
    pub at: SealedAt,
    /// What it holds.
    pub value: SealedValue,
    /// The row's value exactly as stored (its JSON text), which
    /// [`RekeyStore::replace_sealed`] compares against.
    pub stored: String,
}

/// Reading the rows that hold sealed payloads, and replacing one row's value while nobody
/// changed it: what `workflow rekey` ([`Runtime::rekey`](crate::Runtime::rekey)) is made of.
/// Safe beside live workers: a row that changed after it was read (a delivered inbox entry, a
/// run that ended, a value published again) is left as the other writer left it.
///
/// ```
/// use serde_json::json;
/// use workflow_core::store::memory::MemoryStore;
/// use workflow_core::store::{NewRun, PayloadTable, RekeyStore, RunStore, SealedValue};
/// use workflow_core::RunId;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), workflow_core::StoreError> {
/// let store = MemoryStore::new();
/// let id = RunId::new();
/// let sealed = json!({"$wf_sealed": 1, "key": "old", "nonce": "..", "data": ".."});
/// store
///     .create_run(NewRun::new(id, "orders", sealed, std::time::SystemTime::now()))
///     .await?;
/// let rows = store.sealed_rows(PayloadTable::Runs, None, 100).await?;
/// assert_eq!(rows.len(), 1);
/// let new = SealedValue::Value(json!({"$wf_sealed": 1, "key": "new", "nonce": "..", "data": ".."}));
/// assert!(store.replace_sealed(&rows[0], &new).await?);
/// // The row no longer holds what was read: a second replacement writes nothing.
/// assert!(!store.replace_sealed(&rows[0], &new).await?);
/// assert_eq!(store.get_run(&id).await?.unwrap().input["key"], "new");
/// # Ok(())
/// # }
/// ```
#[async_trait::async_trait]
pub trait RekeyStore: Send + Sync + 'static {
    /// At most `limit` rows of `table` whose stored JSON holds the envelope marker
    /// `$wf_sealed`, in a fixed order of their place, after `after` (the `at` of the last
    /// row of the previous page of the same table; `None`: from the start). For
    /// [`PayloadTable::Runs`], `limit` counts runs, each giving a row per column that holds
    /// the marker. A page shorter than `limit` (in rows, or runs) is the last. Stores that
    /// cannot keep this default, which refuses.
    async fn sealed_rows(
        &self,
        table: PayloadTable,
        after: Option<&SealedAt>,
        limit: usize,
    ) -> Result<Vec<SealedRow>, StoreError> {
        let _ = (table, after, limit);
        Err(StoreError::database(
            "sealed_rows is not supported by this store",
        ))
    }

    /// Replaces the value at `row.at` by `value` (of the same kind: an event of the same
    /// variant, an inbox entry of the same kind), in one act, if the row still holds
    /// `row.stored`; `false` when it does not (it changed or is gone): nothing was written.
    async fn replace_sealed(
        &self,
        row: &SealedRow,
        value: &SealedValue,
    ) -> Result<bool, StoreError> {
        let _ = (row, value);
        Err(StoreError::database(
            "replace_sealed is not supported by this store",
        ))
    }
}

/// Whether stored JSON text holds the envelope marker.
pub(crate) fn holds_marker(json: &str) -> bool {
    json.contains(crate::crypto::MARKER)
}

/// Why `value` cannot replace what `row` holds: it is not of the same kind (a value for a
/// value, an error for an error, a reply for a reply, an event or inbox entry of the same
/// variant).
pub(crate) fn mismatched(row: &SealedRow, value: &SealedValue) -> Option<StoreError> {
    use std::mem::discriminant;
    let fits = match (&row.value, value) {
        (SealedValue::Value(_), SealedValue::Value(_))
        | (SealedValue::Error(_), SealedValue::Error(_))
        | (SealedValue::Reply(_), SealedValue::Reply(_)) => true,
        (SealedValue::Event(a), SealedValue::Event(b)) => discriminant(a) == discriminant(b),
        (SealedValue::Inbound(a), SealedValue::Inbound(b)) => discriminant(a) == discriminant(b),
        _ => false,
    };
    (!fits).then(|| {
        StoreError::database(format!(
            "replace_sealed: a value of another kind cannot replace the value at {:?}",
            row.at
        ))
    })
}
