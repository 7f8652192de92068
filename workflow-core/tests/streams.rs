//! Streams from runs, on every store: chunks in order with their indexes, reading
//! from an index or the last few, the attempts of retried steps, the end of a stream on its
//! close and on its run's end, live delivery (in one process, and from a writer process to a
//! reader process), and the payload limit. Cross-process cases re-execute this test binary
//! (`child_main`) as the worker that writes.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{bounded, Backend, Place, TestDb, Worker};
use futures::{StreamExt, TryStreamExt};
use workflow_core::prelude::*;

/// The values of `chunks` with their index and attempt.
fn triples<T: Clone>(chunks: &[Chunk<T>]) -> Vec<(u64, u32, T)> {
    chunks
        .iter()
        .map(|c| (c.index, c.attempt, c.value.clone()))
        .collect()
}

/// The whole stream `name` of `run`, as it ends.
async fn read_all<T: serde::de::DeserializeOwned + Send + 'static>(
    run: &Run<impl Sized>,
    name: &str,
) -> Vec<Chunk<T>> {
    run.stream::<T>(name).try_collect().await.unwrap()
}

// ---------------------------------------------------------------------------------------------
// Writers

#[step]
async fn emit(n: u32, close: bool) -> Result<Vec<u64>> {
    let tokens = stream::<String>("tokens");
    let mut indexes = Vec::new();
    for i in 0..n {
        indexes.push(tokens.write(format!("tok-{i}")).await?);
    }
    if close {
        tokens.close().await?;
    }
    Ok(indexes)
}

#[workflow]
async fn emitting(n: u32, close: bool) -> Result<Vec<u64>> {
    emit(n, close).await
}

#[step(max_retries = 3)]
async fn flaky_emit() -> Result<()> {
    let attempt = step_metadata().attempt;
    let out = stream::<String>("out");
    out.write(format!("a{attempt}-1")).await?;
    out.write(format!("a{attempt}-2")).await?;
    if attempt == 1 {
        return Err(Error::retryable("first attempt fails after writing"));
    }
    Ok(())
}

#[workflow]
async fn retried_writer() -> Result<()> {
    flaky_emit().await
}

/// Writes a chunk per payload its hook receives, `n` of them, then closes (or not).
#[step]
async fn put(value: u32) -> Result<u64> {
    stream::<u32>("paced").write(value).await
}

#[step]
async fn close_paced() -> Result<()> {
    stream::<u32>("paced").close().await
}

#[workflow]
async fn paced(n: u32, close: bool) -> Result<()> {
    let mut next = create_hook::<u32>(format!("paced:{}", workflow_metadata().run_id));
    for _ in 0..n {
        let v = next.recv().await?;
        put(v).await?;
    }
    if close {
        close_paced().await?;
    }
    // Keeps running until told to end, so that the stream ends by its close alone.
    next.recv().await?;
    Ok(())
}

#[step]
async fn write_after_close() -> Result<String> {
    let s = stream::<u32>("once");
    s.write(1).await?;
    s.close().await?;
    s.close().await?;
    match s.write(2).await {
        Ok(i) => Err(Error::fatal(format!("wrote index {i} after the close"))),
        Err(e) => Ok(e.to_string()),
    }
}

#[workflow]
async fn closes_then_writes() -> Result<String> {
    write_after_close().await
}

#[step]
async fn oversized(len: u32) -> Result<String> {
    let s = stream::<String>("big");
    s.write("small".to_owned()).await?;
    match s.write("x".repeat(len as usize)).await {
        Ok(i) => Err(Error::fatal(format!("wrote index {i} over the limit"))),
        Err(e) => Ok(format!("fatal={} {e}", e.is_fatal())),
    }
}

#[workflow]
async fn writes_too_much(len: u32) -> Result<String> {
    oversized(len).await
}

/// Reads its own hook on a token another run owns, as a stream, until the stream ends and
/// twice after: what each poll yielded.
#[workflow]
async fn hook_stream_past_its_end(token: String) -> Result<String> {
    use futures::stream::FusedStream;
    let mut hook = create_hook::<String>(token);
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(match hook.next().await {
            Some(Ok(v)) => format!("payload {v}"),
            Some(Err(e)) if e.as_hook_conflict().is_some() => "conflict".to_owned(),
            Some(Err(e)) => format!("error {e}"),
            None => "end".to_owned(),
        });
    }
    seen.push(format!("terminated={}", hook.is_terminated()));
    Ok(seen.join(", "))
}

#[workflow]
async fn holds_token(token: String) -> Result<String> {
    create_hook::<String>(token).recv().await
}

// ---------------------------------------------------------------------------------------------
// Cases

on_every_store!(
    chunks_arrive_in_write_order_with_their_indexes,
    from_and_tail_start_where_asked,
    chunks_of_a_failed_attempt_stay_with_their_attempt,
    a_stream_ends_on_close_while_its_run_goes_on,
    a_stream_ends_with_its_run,
    a_live_reader_gets_each_chunk_as_it_is_written,
    a_reader_is_woken_by_the_write_not_by_its_poll,
    a_closed_stream_refuses_writes,
    a_chunk_over_the_payload_limit_is_refused,
    streams_polled_after_their_end_yield_none,
);

/// Every stream the crate returns is fused: polled again after its end it yields `None`
/// (and says it is terminated), whether it ended on a close, with its run, on an error, or
/// is a hook's stream that ended on its registration error.
async fn streams_polled_after_their_end_yield_none(b: Backend) {
    use futures::stream::FusedStream;
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    // Ended by its close.
    let closed = rt.start(emitting, (2, true)).await.unwrap();
    closed.return_value().await.unwrap();
    // Ended with its run (never closed).
    let open = rt.start(emitting, (2, false)).await.unwrap();
    open.return_value().await.unwrap();
    for run in [&closed, &open] {
        let mut s = run.stream::<String>("tokens");
        assert!(!s.is_terminated(), "not polled yet");
        for i in 0..2 {
            assert_eq!(s.next().await.unwrap().unwrap().index, i);
        }
        assert!(s.next().await.is_none());
        assert!(s.is_terminated());
        assert!(s.next().await.is_none(), "a second poll after the end");
        assert!(s.next().await.is_none(), "a third poll after the end");
    }
    // Ended on an error (an unknown run).
    let mut s = rt.get_run(&RunId::new()).stream::<String>("tokens");
    assert!(s.next().await.unwrap().is_err());
    assert!(s.next().await.is_none());
    assert!(s.next().await.is_none());
    assert!(s.is_terminated());
    // A hook's stream ends after its registration's error, and stays ended.
    let token = format!("held-{}", RunId::new());
    let owner = rt
        .start(holds_token, (token.clone(),))
        .hook(&token)
        .await
        .unwrap();
    let run = rt
        .start(hook_stream_past_its_end, (token.clone(),))
        .await
        .unwrap();
    assert_eq!(
        run.return_value().await.unwrap(),
        "conflict, end, end, terminated=true"
    );
    rt.resume_hook(&token, "done").await.unwrap();
    assert_eq!(owner.return_value().await.unwrap(), "done");
}

async fn chunks_arrive_in_write_order_with_their_indexes(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(emitting, (300, true)).await.unwrap();
    // Read while it is written: 300 chunks, more than one page of the reader.
    let live: Vec<Chunk<String>> = read_all(&run, "tokens").await;
    let indexes = run.return_value().await.unwrap();
    assert_eq!(indexes, (0..300).collect::<Vec<u64>>());
    let want: Vec<(u64, u32, String)> = (0..300).map(|i| (i, 1, format!("tok-{i}"))).collect();
    assert_eq!(triples(&live), want);
    // And again once the run ended, from another runtime on the store.
    let other = db.runtime().await;
    let again: Vec<Chunk<String>> = read_all(&other.get_run(&run.id()), "tokens").await;
    assert_eq!(triples(&again), want);
    let streams = run.streams().await.unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(
        (streams[0].name.as_str(), streams[0].len, streams[0].closed),
        ("tokens", 300, true)
    );
}

async fn from_and_tail_start_where_asked(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    // Not closed: each read below ends with the run.
    let run = rt.start(emitting, (10, false)).await.unwrap();
    run.return_value().await.unwrap();
    let values =
        |chunks: Vec<Chunk<String>>| -> Vec<u64> { chunks.iter().map(|c| c.index).collect() };
    let from = |i| run.stream::<String>("tokens").from(i).try_collect();
    assert_eq!(values(from(7).await.unwrap()), [7, 8, 9]);
    assert_eq!(values(from(0).await.unwrap()), (0..10).collect::<Vec<_>>());
    assert!(from(10).await.unwrap().is_empty());
    assert!(from(u64::MAX).await.unwrap().is_empty());
    let tail = |n| run.stream::<String>("tokens").tail(n).try_collect();
    assert_eq!(values(tail(3).await.unwrap()), [7, 8, 9]);
    assert_eq!(
        values(tail(100).await.unwrap()),
        (0..10).collect::<Vec<_>>()
    );
    assert!(tail(0).await.unwrap().is_empty());
    // A stream nobody wrote ends with the run, empty.
    assert!(read_all::<String>(&run, "nothing").await.is_empty());
}

async fn chunks_of_a_failed_attempt_stay_with_their_attempt(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(retried_writer, ()).await.unwrap();
    run.return_value().await.unwrap();
    let chunks: Vec<Chunk<String>> = read_all(&run, "out").await;
    assert_eq!(
        triples(&chunks),
        [
            (0, 1, "a1-1".to_owned()),
            (1, 1, "a1-2".to_owned()),
            (2, 2, "a2-1".to_owned()),
            (3, 2, "a2-2".to_owned()),
        ]
    );
}

async fn a_stream_ends_on_close_while_its_run_goes_on(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(paced, (2, true)).await.unwrap();
    let token = format!("paced:{}", run.id());
    let reader = tokio::spawn({
        let run = run.clone();
        async move { read_all::<u32>(&run, "paced").await }
    });
    for v in [10, 20] {
        resume(&rt, &token, v).await;
    }
    let chunks = reader.await.unwrap();
    assert_eq!(triples(&chunks), [(0, 1, 10), (1, 1, 20)]);
    assert_eq!(run.status().await.unwrap(), RunStatus::Running);
    resume(&rt, &token, 0).await;
    run.return_value().await.unwrap();
}

async fn a_stream_ends_with_its_run(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(paced, (3, false)).await.unwrap();
    let token = format!("paced:{}", run.id());
    let mut reader = run.stream::<u32>("paced");
    resume(&rt, &token, 1).await;
    assert_eq!(reader.next().await.unwrap().unwrap().value, 1);
    // The reader waits for the next chunk; the run's end (a cancel) ends the stream.
    let rest = tokio::spawn(async move { reader.try_collect::<Vec<_>>().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    run.cancel().await.unwrap();
    assert!(rest.await.unwrap().unwrap().is_empty());
    // A completed run's stream ends after its last chunk.
    let run = rt.start(emitting, (3, false)).await.unwrap();
    let chunks: Vec<Chunk<String>> = read_all(&run, "tokens").await;
    assert_eq!(chunks.len(), 3);
}

async fn a_live_reader_gets_each_chunk_as_it_is_written(b: Backend) {
    let db = TestDb::new(b);
    // The store records the reader's reads.
    let (store, rt) = common::failing_store(&db, 0).await;
    let run = rt.start(paced, (5, true)).await.unwrap();
    let token = format!("paced:{}", run.id());
    let mut reader = run.stream::<u32>("paced");
    for i in 0..5 {
        let next = tokio::spawn(async move {
            let c = reader.next().await;
            (reader, c)
        });
        // The reader is already waiting when the chunk is written: it has read from chunk
        // `i` and found nothing.
        while !store.read_nothing_from("paced", u64::from(i)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!next.is_finished(), "chunk {i} read before it was written");
        resume(&rt, &token, i * 100).await;
        let (back, c) = next.await.unwrap();
        reader = back;
        let c = c.unwrap().unwrap();
        assert_eq!((c.index, c.value), (u64::from(i), i * 100));
    }
    assert!(reader.next().await.is_none());
    resume(&rt, &token, 0).await;
    run.return_value().await.unwrap();
}

/// With an hour-long poll interval, only the wake-up of the write (and of the run's end) can
/// deliver in time: the test would hit its bound otherwise.
async fn a_reader_is_woken_by_the_write_not_by_its_poll(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .poll_interval(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    let run = rt.start(paced, (3, false)).await.unwrap();
    let token = format!("paced:{}", run.id());
    let mut reader = run.stream::<u32>("paced");
    for i in 0..3 {
        resume(&rt, &token, i).await;
        let c = reader.next().await.unwrap().unwrap();
        assert_eq!((c.index, c.value), (u64::from(i), i));
    }
    let rest = tokio::spawn(async move { reader.try_collect::<Vec<_>>().await });
    resume(&rt, &token, 0).await;
    run.return_value().await.unwrap();
    assert!(rest.await.unwrap().unwrap().is_empty(), "ends with the run");
}

async fn a_closed_stream_refuses_writes(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(closes_then_writes, ()).await.unwrap();
    let message = run.return_value().await.unwrap();
    assert!(message.contains("stream \"once\""), "{message}");
    assert!(message.contains("is closed"), "{message}");
    let chunks: Vec<Chunk<u32>> = read_all(&run, "once").await;
    assert_eq!(triples(&chunks), [(0, 1, 1)]);
}

async fn a_chunk_over_the_payload_limit_is_refused(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .max_payload_bytes(150)
        .build()
        .await
        .unwrap();
    let run = rt.start(writes_too_much, (200,)).await.unwrap();
    let message = run.return_value().await.unwrap();
    assert!(message.starts_with("fatal=true "), "{message}");
    assert!(
        message.contains(
            "a chunk for stream \"big\" is 202 bytes serialized, over the limit of 150 bytes"
        ),
        "{message}"
    );
    let chunks: Vec<Chunk<String>> = read_all(&run, "big").await;
    assert_eq!(triples(&chunks), [(0, 1, "small".to_owned())]);
}

/// Sends `v` to the hook owning `token`, once the run has registered it.
async fn resume(rt: &Runtime, token: &str, v: u32) {
    loop {
        match rt.resume_hook(token, v).await {
            Ok(_) => return,
            Err(HookError::NotFound(_)) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn writing_outside_a_step_is_an_error() {
    let err = stream::<u32>("x").write(1).await.unwrap_err();
    assert!(err.to_string().contains("outside a step"), "{err}");
    let err = stream::<u32>("x").close().await.unwrap_err();
    assert!(err.to_string().contains("`stream(\"x\").close()`"), "{err}");
    // A step called as a plain fn is outside a step too.
    let err = emit(1, false).await.unwrap_err();
    assert!(err.to_string().contains("outside a step"), "{err}");
}

#[tokio::test]
async fn invalid_stream_names_are_errors() {
    let db = TestDb::new(Backend::Memory);
    let rt = db.runtime().await;
    let run = rt.start(emitting, (1, true)).await.unwrap();
    run.return_value().await.unwrap();
    for name in ["", "a\nb"] {
        let err = run
            .stream::<String>(name)
            .next()
            .await
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("stream name"), "{err}");
    }
    let long = "n".repeat(256);
    let err = run
        .stream::<String>(long)
        .next()
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("over the limit of 255"), "{err}");
    let unknown = rt.get_run(&RunId::new());
    let err = unknown
        .stream::<String>("tokens")
        .next()
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
}

#[tokio::test]
async fn a_chunk_of_another_type_is_an_error_and_the_stream_goes_on() {
    let db = TestDb::new(Backend::Memory);
    let rt = db.runtime().await;
    let run = rt.start(emitting, (2, true)).await.unwrap();
    run.return_value().await.unwrap();
    let read: Vec<Result<Chunk<u32>>> = run.stream::<u32>("tokens").collect().await;
    assert_eq!(read.len(), 2);
    for r in read {
        let err = r.unwrap_err();
        assert!(err.to_string().contains("does not deserialize"), "{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Across processes: the writer is a worker process, the reader this one

/// The worker process of the cross-process cases: drives runs on the store its parent names.
#[test]
#[ignore = "entry point of the worker processes the stream tests spawn"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let _rt = Place::from_env()
            .builder()
            .poll_interval(Duration::from_millis(20))
            .build()
            .await
            .expect("the worker's runtime builds");
        println!("READY");
        std::io::stdout().flush().unwrap();
        std::future::pending::<()>().await;
    });
}

/// A reader in this process follows a stream written by a worker process, chunk by chunk, and
/// ends on the close; it polls every `reader_poll` (PostgreSQL's notices make an hour work).
fn live_across_processes(place: Place, reader_poll: Duration) {
    let env = place.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let worker = Worker::spawn(&env);
    worker.line("READY", Duration::from_secs(60));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(bounded(async {
        // Not a worker: every run is driven by the other process.
        let client = place
            .builder()
            .poll_interval(reader_poll)
            .worker(false)
            .build()
            .await
            .unwrap();
        let run = client.start(paced, (4, true)).await.unwrap();
        let token = format!("paced:{}", run.id());
        let mut reader = run.stream::<u32>("paced");
        for i in 0..4 {
            resume(&client, &token, i + 1).await;
            let c = reader.next().await.unwrap().unwrap();
            assert_eq!((c.index, c.attempt, c.value), (u64::from(i), 1, i + 1));
        }
        assert!(reader.next().await.is_none(), "ends on the close");
        resume(&client, &token, 0).await;
        run.return_value().await.unwrap();
        let resumed: Vec<Chunk<u32>> = run.stream("paced").from(2).try_collect().await.unwrap();
        assert_eq!(triples(&resumed), [(2, 1, 3), (3, 1, 4)]);
    }));
    drop(worker);
}

#[test]
fn live_across_processes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    // The poll is how a SQLite reader learns of other processes' writes.
    let path = dir.path().join("wf.db");
    live_across_processes(Place::Sqlite { path }, Duration::from_millis(20));
}

#[cfg(feature = "postgres")]
#[test]
fn live_across_processes_on_postgres() {
    let Some(url) = common::postgres_url() else {
        return;
    };
    let db = TestDb::new(Backend::Postgres);
    // The notices alone: a reader polling hourly gets every chunk at once.
    let schema = db.schema.clone();
    live_across_processes(Place::Postgres { url, schema }, Duration::from_secs(3600));
}
