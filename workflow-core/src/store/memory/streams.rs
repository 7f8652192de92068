//! [`StreamStore`] in memory: appending to, closing, reading and listing the streams of runs. Each method takes the lock once
//! and calls the state's operations, so it is atomic; the rules themselves live in `state.rs`
//! and the shared store helpers, which this file must not repeat.

use std::time::SystemTime;

use serde_json::Value;

use super::MemoryStore;
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::{Lease, StoredChunk, StreamInfo, StreamPage, StreamStore};

#[async_trait::async_trait]
impl StreamStore for MemoryStore {
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let mut st = self.lock();
        let row = st.held(lease)?;
        let s = row.streams.entry(stream.to_owned()).or_default();
        if s.closed {
            return Ok(None);
        }
        let index = s.chunks.len() as u64;
        s.chunks.push(StoredChunk {
            index,
            attempt,
            at,
            value,
        });
        Ok(Some(index))
    }

    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        _at: SystemTime,
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        let row = st.held(lease)?;
        row.streams.entry(stream.to_owned()).or_default().closed = true;
        Ok(())
    }

    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        let st = self.lock();
        let Some(row) = st.runs.get(run) else {
            return Ok(StreamPage::default());
        };
        let mut page = StreamPage {
            run: Some(row.record.status),
            ..StreamPage::default()
        };
        if let Some(s) = row.streams.get(stream) {
            page.closed = s.closed;
            page.len = s.chunks.len() as u64;
            let from = usize::try_from(from).unwrap_or(usize::MAX);
            page.chunks = s.chunks.iter().skip(from).take(limit).cloned().collect();
        }
        Ok(page)
    }

    async fn list_streams(&self, run: &RunId) -> Result<Vec<StreamInfo>, StoreError> {
        let st = self.lock();
        Ok(st.runs.get(run).map_or_else(Vec::new, |row| {
            row.streams
                .iter()
                .map(|(name, s)| StreamInfo {
                    name: name.clone(),
                    len: s.chunks.len() as u64,
                    closed: s.closed,
                })
                .collect()
        }))
    }
}
