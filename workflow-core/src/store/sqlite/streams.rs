//! [`StreamStore`] on SQLite: appending to, closing, reading and listing the streams of runs.
//! Each method sends its work to the writer (`write`) or a reader (`read`) and decodes the
//! rows; what a write decides is the shared policy's, which this file calls and must not
//! repeat.

use std::time::SystemTime;

use rusqlite::params;
use serde_json::Value;

use super::statements::SQL;
use super::tx::{all, now, one, Lite};
use super::SqliteStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::sql::policy::{self, EncodedChunk};
use crate::store::sql::rows::{ChunkRow, StreamRow, StreamStateRow};
use crate::store::sql::sql_id;
use crate::store::{Lease, StreamInfo, StreamPage, StreamStore};

#[async_trait::async_trait]
impl StreamStore for SqliteStore {
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let lease = lease.clone();
        let chunk = EncodedChunk::new(stream, attempt, &value, at)?;
        self.write(move |tx| now(policy::append_chunk(&mut Lite(tx), &lease, &chunk)))
            .await
    }

    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        _at: SystemTime,
    ) -> Result<(), StoreError> {
        let (lease, stream) = (lease.clone(), stream.to_owned());
        self.write(move |tx| now(policy::close_stream(&mut Lite(tx), &lease, &stream)))
            .await
    }

    /// The state first, then the chunks, each statement reading the last commit: what the
    /// state says was true before the chunks were read (see [`StreamPage`]).
    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        let (run, stream) = (run.to_string(), stream.to_owned());
        let (from, limit) = (sql_id(from), sql_id(limit));
        self.read(move |conn| {
            let state = one(conn, SQL.stream_state, [&run, &stream], |r| {
                StreamStateRow::from_sqlite(r)
            })?
            .unwrap_or(StreamStateRow {
                status: None,
                len: None,
                closed: None,
            });
            let args = params![run, stream, from, limit];
            let chunks = all(conn, SQL.stream_chunks, args, ChunkRow::from_sqlite)?;
            state.page(&run, &stream, chunks)
        })
        .await
    }

    async fn list_streams(&self, run: &RunId) -> Result<Vec<StreamInfo>, StoreError> {
        let run = run.to_string();
        self.read(move |conn| {
            let rows = all(conn, SQL.list_streams, [&run], StreamRow::from_sqlite)?;
            rows.into_iter().map(|r| r.decode(&run)).collect()
        })
        .await
    }
}
