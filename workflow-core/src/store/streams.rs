//! Streams from runs: numbered chunks a step appends and readers follow.

use std::time::SystemTime;

use serde_json::Value;

use crate::error::StoreError;
use crate::ids::RunId;

use super::*;

/// A chunk of a run's stream as stored: the `index`-th value written to the stream,
/// from 0, by step attempt `attempt`, at `at`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredChunk {
    /// Its place in the stream, from 0, in write order.
    pub index: u64,
    /// The attempt of the step that wrote it (from 1).
    pub attempt: u32,
    /// When it was written.
    pub at: SystemTime,
    /// As written.
    pub value: Value,
}

/// What [`StreamStore::read_stream`] found. `run`, `closed` and `len` are read before the chunks,
/// so a reader that sees the run ended (or the stream closed) and reads fewer chunks than it
/// asked for has read the whole stream: no chunk is written after a run's end or a close.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamPage {
    /// The run's status; `None` for an unknown run.
    pub run: Option<RunStatus>,
    /// Whether the stream is closed.
    pub closed: bool,
    /// How many chunks the stream holds (the index the next write gets).
    pub len: u64,
    /// The chunks from the index asked for, in order, at most the limit asked for.
    pub chunks: Vec<StoredChunk>,
}

/// One stream of a run, as [`StreamStore::list_streams`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// Its name.
    pub name: String,
    /// How many chunks it holds.
    pub len: u64,
    /// Whether it was closed.
    pub closed: bool,
}

/// Streams of chunks written by steps. Stores without streams keep the defaults, which
/// refuse.
#[async_trait::async_trait]
pub trait StreamStore: Send + Sync + 'static {
    /// Appends `value` to stream `stream` of the leased run as written by step attempt
    /// `attempt` at `at`, and returns its index: the stream's length before it, assigned by
    /// the store atomically (from 0 per run and stream). Fenced like [`RunStore::append`]
    /// ([`StoreError::LeaseLost`], nothing written); `Ok(None)`, nothing written, when the
    /// stream is closed. Stores that push changes announce it ([`Notice::Chunk`]). Stores
    /// without streams keep this default, which refuses.
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let _ = (lease, stream, attempt, value, at);
        Err(StoreError::database(
            "streams are not supported by this store",
        ))
    }

    /// Closes stream `stream` of the leased run (creating it, empty, if nothing was written
    /// to it): later appends are refused, readers end after its last chunk. Closing a closed
    /// stream changes nothing. Fenced like [`RunStore::append`]; announced like an append.
    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let _ = (lease, stream, at);
        Err(StoreError::database(
            "streams are not supported by this store",
        ))
    }

    /// The chunks of stream `stream` of run `run` from index `from` on, at most `limit`, with
    /// the run's status and the stream's state read before them (see [`StreamPage`]). An
    /// unknown stream reads as empty and open.
    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        let _ = (run, stream, from, limit);
        Err(StoreError::database(
            "streams are not supported by this store",
        ))
    }

    /// The streams of run `run`, by name.
    async fn list_streams(&self, run: &RunId) -> Result<Vec<StreamInfo>, StoreError> {
        let _ = run;
        Err(StoreError::database(
            "streams are not supported by this store",
        ))
    }
}
