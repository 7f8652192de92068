//! Streams from runs: what a step writes with [`stream`] — durable, numbered
//! chunks, each recording the attempt that wrote it — and what clients read with
//! [`Run::stream`](crate::Run::stream): a [`RunStream`] that starts at an exact index, follows
//! live writes and ends after the stream's close or the run's end.
//!
//! The store numbers the chunks (one atomic append per write, fenced by the run's lease, so
//! nothing is written after the run ended); this module wakes readers: at once in this
//! process, through the store's notices where it pushes them (PostgreSQL), and otherwise at
//! the poll interval.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::{BoxStream, Fuse, FusedStream};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{step_runtime, Inner, Runtime, StreamWatch};
use crate::context::try_step_metadata;
use crate::error::{Error, StoreError};
use crate::ids::RunId;
use crate::payload::{PayloadError, PayloadKind};
use crate::store::StoredChunk;

/// Chunks a reader asks the store for at a time.
const BATCH: usize = 256;
/// The longest stream name, in bytes.
const MAX_NAME: usize = 255;

/// A stream of the current run, to write to from a step: `stream::<T>(name)`.
///
/// Each [`write`](StreamWriter::write) appends one chunk durably and returns its index (from
/// 0, in write order per run and name); readers see it at once. Chunks written by an attempt
/// that later fails stay, each with its attempt number, so a reader can tell a retry's chunks
/// apart. [`close`](StreamWriter::close) ends the stream: readers end after its last chunk, and
/// later writes are errors. A stream also ends, for its readers, when its run ends.
///
/// Called outside a step executed by a runtime (in a workflow body, a step called as a plain
/// fn, or a task the step spawned: the step's context does not follow `tokio::spawn`), `write`
/// and `close` return an error.
///
/// ```
/// use futures::TryStreamExt;
/// use workflow_core::prelude::*;
///
/// #[step]
/// async fn count_to(n: u32) -> Result<()> {
///     let numbers = stream::<u32>("numbers");
///     for i in 1..=n {
///         numbers.write(i).await?;
///     }
///     numbers.close().await
/// }
///
/// #[workflow]
/// async fn counting(n: u32) -> Result<()> {
///     count_to(n).await
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let rt = Runtime::builder().in_memory().build().await?;
/// let run = rt.start(counting, (3,)).await?;
/// let chunks: Vec<Chunk<u32>> = run.stream::<u32>("numbers").try_collect().await?;
/// let values: Vec<u32> = chunks.iter().map(|c| c.value).collect();
/// assert_eq!(values, [1, 2, 3]);
/// assert_eq!(chunks[2].index, 2);
/// assert_eq!(chunks[2].attempt, 1);
/// // The run's streams, with their length and state:
/// let streams = run.streams().await?;
/// assert_eq!((streams[0].name.as_str(), streams[0].len, streams[0].closed), ("numbers", 3, true));
/// # Ok(())
/// # }
/// ```
pub fn stream<T>(name: impl Into<String>) -> StreamWriter<T> {
    StreamWriter {
        name: name.into(),
        _t: PhantomData,
    }
}

/// The writing end of a run's stream, from [`stream`].
pub struct StreamWriter<T> {
    name: String,
    _t: PhantomData<fn(T)>,
}

impl<T> Clone for StreamWriter<T> {
    fn clone(&self) -> Self {
        StreamWriter {
            name: self.name.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for StreamWriter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamWriter")
            .field("name", &self.name)
            .finish()
    }
}

/// Where a write goes: the runtime executing the step, the run's lease there, the attempt.
struct Writing {
    rt: Arc<Inner>,
    lease: crate::store::Lease,
    attempt: u32,
}

impl<T> StreamWriter<T> {
    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn writing(&self, what: &str) -> Result<Writing, Error> {
        if let Some(why) = invalid_name(&self.name) {
            return Err(Error::fatal(why));
        }
        let called = format!("`stream({:?}).{what}()` was called", self.name);
        if let Some(e) = crate::transactional::forbidden(&called) {
            return Err(e);
        }
        let outside = || {
            Error::fatal(format!(
                "`stream({:?}).{what}()` was called outside a step executed by a workflow \
                 runtime; write to a stream inside a #[step] fn invoked from a #[workflow]",
                self.name
            ))
        };
        let meta = try_step_metadata().ok_or_else(outside)?;
        let rt = step_runtime().ok_or_else(outside)?;
        let lease = rt
            .lease_of(&meta.run_id)
            .ok_or_else(|| Error::from(StoreError::LeaseLost(meta.run_id)))?;
        Ok(Writing {
            rt,
            lease,
            attempt: meta.attempt,
        })
    }

    /// Ends the stream: its readers end after its last chunk, and later writes are errors.
    /// Closing a closed stream is a no-op.
    pub async fn close(&self) -> Result<(), Error> {
        let w = self.writing("close")?;
        let at = w.rt.clock_now();
        w.rt.store.close_stream(&w.lease, &self.name, at).await?;
        w.rt.stream_changed(w.lease.run_id);
        Ok(())
    }
}

impl<T: Serialize> StreamWriter<T> {
    /// Appends `value` to the stream durably and returns its index. A value over
    /// `max_payload_bytes` serialized, or a write to a closed stream, is a fatal error
    /// (writing it again would fail again); nothing is written then.
    pub async fn write(&self, value: T) -> Result<u64, Error> {
        let w = self.writing("write")?;
        let cx = PayloadKind::StreamChunk {
            stream: &self.name,
            index: None,
        };
        let value = w.rt.config.payloads.encode(&value, cx.of(w.lease.run_id));
        let value = value.map_err(PayloadError::fatal)?;
        let at = w.rt.clock_now();
        let written =
            w.rt.store
                .append_chunk(&w.lease, &self.name, w.attempt, value, at)
                .await?;
        let Some(index) = written else {
            return Err(Error::fatal(format!(
                "stream {:?} of run {} is closed; nothing more can be written to it",
                self.name, w.lease.run_id
            )));
        };
        w.rt.stream_changed(w.lease.run_id);
        Ok(index)
    }
}

/// Why `name` cannot name a stream, if it cannot: it must be 1 to 255 bytes of UTF-8 without
/// control characters.
pub(crate) fn invalid_name(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("a stream name must not be empty".to_owned());
    }
    if name.len() > MAX_NAME {
        return Some(format!(
            "stream name {:?}… is {} bytes, over the limit of {MAX_NAME}",
            name.chars().take(32).collect::<String>(),
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Some(format!("stream name {name:?} contains control characters"));
    }
    None
}

/// One chunk of a run's stream, as [`RunStream`] yields it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk<T> {
    /// Its place in the stream, from 0, in write order.
    pub index: u64,
    /// The attempt of the step that wrote it (from 1): chunks of a failed attempt stay.
    pub attempt: u32,
    /// As written.
    pub value: T,
}

/// Where a [`RunStream`] starts.
#[derive(Debug, Clone, Copy)]
enum Start {
    From(u64),
    Tail(u64),
}

/// A run's stream as a reader sees it: a [`futures::Stream`] of [`Chunk`]s in index order,
/// from [`Run::stream`](crate::Run::stream).
///
/// It starts at index 0, or where [`from`](RunStream::from) or [`tail`](RunStream::tail) say,
/// yields every chunk written so far, then follows live writes (in this process at once;
/// from other processes through the store's notices on PostgreSQL, else within the poll
/// interval), and ends after the stream is closed or the run ended, once it delivered every
/// chunk written before. A chunk whose value does not deserialize into `T` is yielded as an
/// `Err` and the stream goes on; a store error or an unknown run is yielded as an `Err` and
/// ends it (resume with `.from(last index + 1)`). It is fused ([`FusedStream`]): polled
/// again after its end, it yields `None`.
#[must_use = "a stream reads nothing unless polled"]
pub struct RunStream<T> {
    /// Keeps the runtime working while the stream is read.
    rt: Runtime,
    run: RunId,
    name: String,
    start: Start,
    reading: Option<Reading<T>>,
}

/// A [`RunStream`] once polled: its reader, fused so that it ends for good.
type Reading<T> = Fuse<BoxStream<'static, Result<Chunk<T>, Error>>>;

impl<T> std::fmt::Debug for RunStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStream")
            .field("run", &self.run)
            .field("name", &self.name)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl<T> RunStream<T> {
    pub(crate) fn new(rt: Runtime, run: RunId, name: String) -> Self {
        RunStream {
            rt,
            run,
            name,
            start: Start::From(0),
            reading: None,
        }
    }

    /// Starts at index `index` (a reader resuming after the chunk it saw last gives that
    /// chunk's index + 1). Only before the first poll.
    pub fn from(mut self, index: u64) -> Self {
        self.start = Start::From(index);
        self
    }

    /// Starts at the last `n` chunks written when the stream is first polled. Only before
    /// the first poll.
    pub fn tail(mut self, n: u64) -> Self {
        self.start = Start::Tail(n);
        self
    }
}

impl<T: DeserializeOwned + Send + 'static> Stream for RunStream<T> {
    type Item = Result<Chunk<T>, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let reading = this.reading.get_or_insert_with(|| {
            let reader = Reader::<T> {
                watch: StreamWatch::new(&this.rt.inner_arc(), this.run),
                run: this.run,
                name: this.name.clone(),
                start: Some(this.start),
                next: 0,
                buffer: VecDeque::new(),
                finished: false,
                _t: PhantomData,
            };
            futures::stream::unfold(reader, |mut r| async move {
                let item = r.next().await?;
                Some((item, r))
            })
            .boxed()
            .fuse()
        });
        reading.poll_next_unpin(cx)
    }
}

impl<T: DeserializeOwned + Send + 'static> FusedStream for RunStream<T> {
    fn is_terminated(&self) -> bool {
        self.reading.as_ref().is_some_and(|r| r.is_terminated())
    }
}

/// The state of one reading [`RunStream`].
struct Reader<T> {
    watch: StreamWatch,
    run: RunId,
    name: String,
    /// Where to start, until the first read.
    start: Option<Start>,
    /// The index of the next chunk to read from the store.
    next: u64,
    buffer: VecDeque<StoredChunk>,
    /// Every chunk is in `buffer`: the stream ends when it is empty.
    finished: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Reader<T> {
    async fn next(&mut self) -> Option<Result<Chunk<T>, Error>> {
        loop {
            if let Some(c) = self.buffer.pop_front() {
                return Some(self.decode(c));
            }
            if self.finished {
                return None;
            }
            match self.read().await {
                Ok(true) => {}
                Ok(false) => {
                    let poll = self.watch.runtime().stream_poll();
                    self.watch.changed(poll).await;
                }
                Err(e) => {
                    self.finished = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// Reads the next batch into the buffer; false when there was nothing new and the stream
    /// goes on (wait for a change).
    async fn read(&mut self) -> Result<bool, Error> {
        if let Some(why) = invalid_name(&self.name) {
            return Err(Error::fatal(why));
        }
        // Marked before the read: a write committed after it wakes the wait that follows.
        self.watch.seen();
        let store = self.watch.runtime().store.clone();
        if let Some(start) = self.start.take() {
            self.next = match start {
                Start::From(i) => i,
                Start::Tail(n) => {
                    let page = store.read_stream(&self.run, &self.name, 0, 0).await?;
                    page.len.saturating_sub(n)
                }
            };
        }
        let page = store
            .read_stream(&self.run, &self.name, self.next, BATCH)
            .await?;
        let Some(status) = page.run else {
            return Err(Error::fatal(format!("run {} not found", self.run)));
        };
        let got = page.chunks.len();
        if let Some(last) = page.chunks.last() {
            self.next = last.index + 1;
        }
        self.buffer.extend(page.chunks);
        // The state was read before the chunks, and nothing is written after a close or the
        // run's end: a short batch then holds the rest of the stream.
        if got < BATCH && (page.closed || status.is_terminal()) {
            self.finished = true;
        }
        Ok(got > 0 || self.finished)
    }

    fn decode(&self, c: StoredChunk) -> Result<Chunk<T>, Error> {
        let cx = PayloadKind::StreamChunk {
            stream: &self.name,
            index: Some(c.index),
        };
        let payloads = &self.watch.runtime().config.payloads;
        let value = payloads
            .decode(c.value, cx.of(self.run))
            .map_err(PayloadError::fatal)?;
        Ok(Chunk {
            index: c.index,
            attempt: c.attempt,
            value,
        })
    }
}
