//! [`StreamStore`] for PostgreSQL: appending chunks, closing and reading streams. Binds requests
//! to the shared policy and the statements; holds no SQL and no decision of its own.

use std::time::SystemTime;

use serde_json::Value;

use super::stash::settle;
use super::PostgresStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::sql::policy::{self, EncodedChunk};
use crate::store::sql::rows::{ChunkRow, StreamRow, StreamStateRow};
use crate::store::sql::sql_id;
use crate::store::{Lease, StreamInfo, StreamPage, StreamStore};

#[async_trait::async_trait]
impl StreamStore for PostgresStore {
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let chunk = EncodedChunk::new(stream, attempt, &value, at)?;
        // One statement, its own transaction.
        let mut conn = self.conn().await?;
        let mut notes = Vec::new();
        let appended =
            policy::append_chunk(&mut self.noting(&mut conn, &mut notes), lease, &chunk).await;
        let appended = conn.kept(appended)?;
        self.inner.writer.announce(notes);
        Ok(appended)
    }

    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        _at: SystemTime,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let closed = policy::close_stream(&mut self.tx(&mut tx), lease, stream).await;
        settle(tx, closed).await
    }

    /// Two statements on one connection, the state first: each sees every commit made before
    /// it started, so what the state says was true before the chunks were read.
    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        let run = run.to_string();
        let mut conn = self.conn().await?;
        let read = async {
            let state: StreamStateRow = sqlx::query_as(&self.inner.sql.stream_state)
                .bind(&run)
                .bind(stream)
                .fetch_one(&mut *conn)
                .await?;
            let chunks: Vec<ChunkRow> = sqlx::query_as(&self.inner.sql.stream_chunks)
                .bind(&run)
                .bind(stream)
                .bind(sql_id(from))
                .bind(sql_id(limit))
                .fetch_all(&mut *conn)
                .await?;
            Ok::<_, sqlx::Error>((state, chunks))
        }
        .await;
        let (state, chunks) = conn.kept(read)?;
        state.page(&run, stream, chunks)
    }

    async fn list_streams(&self, run: &RunId) -> Result<Vec<StreamInfo>, StoreError> {
        let run = run.to_string();
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.list_streams)
            .bind(&run)
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<StreamRow> = conn.kept(rows)?;
        rows.into_iter().map(|r| r.decode(&run)).collect()
    }
}
