//! Streams: chunks appended under the run's lease, and closing a stream.

use std::time::SystemTime;

use super::{fence, Tx};
use crate::error::StoreError;
use crate::store::sql::{sql_epoch, sql_time, to_json};
use crate::store::Lease;

/// A chunk to append ([`append_chunk`]), encoded before the transaction.
pub(in crate::store) struct EncodedChunk {
    pub stream: String,
    pub attempt: i64,
    pub at: i64,
    /// JSON.
    pub value: String,
}

impl EncodedChunk {
    pub fn new(
        stream: &str,
        attempt: u32,
        value: &serde_json::Value,
        at: SystemTime,
    ) -> Result<Self, StoreError> {
        Ok(EncodedChunk {
            stream: stream.to_owned(),
            attempt: i64::from(attempt),
            at: sql_time(at),
            value: to_json(value, "the chunk")?,
        })
    }
}

/// What [`Tx::append_chunk`] did.
pub(in crate::store) enum ChunkAppend {
    /// Appended at this index.
    Appended(i64),
    /// The stream is closed; nothing written.
    Closed,
    /// The fence refused the write; nothing written.
    LeaseLost,
}

/// Appends `chunk` to its stream of the leased run; its index, or `None` (nothing written)
/// when the stream is closed. The index is drawn by the stream row's upsert, so concurrent
/// writers to one stream get distinct, gap-free indexes in commit order.
pub(in crate::store) async fn append_chunk(
    tx: &mut impl Tx,
    lease: &Lease,
    chunk: &EncodedChunk,
) -> Result<Option<u64>, StoreError> {
    let run = lease.run_id.to_string();
    match tx.append_chunk(&run, sql_epoch(lease.epoch), chunk).await? {
        ChunkAppend::Appended(idx) => u64::try_from(idx).map(Some).map_err(|e| {
            crate::store::sql::corrupt(&run, &format!("stream {:?}: len", chunk.stream), e)
        }),
        ChunkAppend::Closed => Ok(None),
        ChunkAppend::LeaseLost => Err(StoreError::LeaseLost(lease.run_id)),
    }
}

/// Closes stream `stream` of the leased run.
pub(in crate::store) async fn close_stream(
    tx: &mut impl Tx,
    lease: &Lease,
    stream: &str,
) -> Result<(), StoreError> {
    let run = fence(tx, lease).await?;
    tx.close_stream(&run, stream).await
}
