//! Talking to a running run, on every store: messages sent with `run.send` reach
//! `recv` in send order per topic, exactly once, also when sent before the workflow waits and
//! across a restart of the worker while they arrive; idempotency keys; sends that store
//! nothing (ended or unknown runs, payloads over the limit, invalid topics); and durable
//! `timeout`s whose loser consumes nothing, with replay taking the same side.

mod common;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::time::Duration;

use common::{bounded, Backend, Place, TestDb, Worker};
use workflow_core::prelude::*;
use workflow_core::store::{Event, EventRecord};
use workflow_core::RunError;

// ---------------------------------------------------------------------------------------------
// Workflows

/// Receives `rounds` messages on each of three topics, in turns (a, b, c, a, ...), after a
/// short durable sleep (so that some arrive before the first `recv`).
#[workflow]
async fn three_topics(rounds: u32) -> Result<Vec<Vec<u32>>> {
    sleep(Duration::from_millis(50)).await;
    let mut got = vec![Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (i, topic) in ["a", "b", "c"].into_iter().enumerate() {
            got[i].push(recv::<u32>(topic).await?);
        }
    }
    Ok(got)
}

/// Receives `n` messages on "n".
#[workflow]
async fn collect(n: u32) -> Result<Vec<u32>> {
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(recv::<u32>("n").await?);
    }
    Ok(got)
}

/// Receives two messages on "pay", then waits a short while for a third.
#[workflow]
async fn two_then_nothing() -> Result<(Vec<u32>, bool)> {
    let first = recv::<u32>("pay").await?;
    let second = recv::<u32>("pay").await?;
    let third = timeout(Duration::from_millis(300), recv::<u32>("pay")).await;
    Ok((vec![first, second], third.is_err()))
}

/// A `recv` bounded by a timeout that elapses (nothing is sent in time), then a plain `recv`
/// that takes the message sent after it.
#[workflow]
async fn times_out_then_receives(wait_ms: u64) -> Result<(bool, u32)> {
    let first = timeout(Duration::from_millis(wait_ms), recv::<u32>("late")).await;
    let elapsed = match first {
        Ok(v) => {
            v?;
            false
        }
        Err(Elapsed { .. }) => true,
    };
    let second = recv::<u32>("late").await?;
    Ok((elapsed, second))
}

/// A `recv` bounded by a long timeout that the message beats.
#[workflow]
async fn message_beats_timeout() -> Result<u32> {
    match timeout(Duration::from_secs(3600), recv::<u32>("soon")).await {
        Ok(v) => v,
        Err(_) => Err(Error::fatal("the hour passed")),
    }
}

/// A hook's `recv` and a child's result, each bounded by a timeout that elapses.
#[workflow]
async fn hook_and_child_time_out(token: String) -> Result<(bool, bool)> {
    let mut hook = create_hook::<u32>(token);
    let hook_elapsed = timeout(Duration::from_millis(100), hook.recv())
        .await
        .is_err();
    let child = start_child(collect, (1,)).await?;
    let child_elapsed = timeout(Duration::from_millis(100), child.result())
        .await
        .is_err();
    Ok((hook_elapsed, child_elapsed))
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// The run's recorded events.
async fn history(rt: &Runtime, run: RunId) -> Vec<EventRecord> {
    rt.store().events(&run).await.unwrap()
}

/// The payload ids of the run's recorded `MessageReceived` events, in order.
fn received_ids(events: &[EventRecord]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Event::MessageReceived { payload_id, .. } => Some(*payload_id),
            _ => None,
        })
        .collect()
}

/// Until the run's history holds an event `pred` accepts (bounded by the test's limit).
async fn until_recorded(rt: &Runtime, run: RunId, pred: impl Fn(&Event) -> bool) {
    loop {
        if history(rt, run).await.iter().any(|e| pred(&e.event)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A runtime on `db` that executes nothing: a client.
async fn client(db: &TestDb) -> Runtime {
    db.builder()
        .worker(false)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("the client builds")
}

// ---------------------------------------------------------------------------------------------
// Cases

/// 300 messages on three topics, sent one after another while the run sleeps and receives:
/// each topic's messages arrive in send order, each once.
async fn messages_keep_send_order_per_topic(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db.runtime().await;
    let run = rt.start(three_topics, (100,)).await.unwrap();
    let mut sent = vec![Vec::new(), Vec::new(), Vec::new()];
    for n in 0..300u32 {
        let i = (n * 7 % 3) as usize;
        run.send(["a", "b", "c"][i], n).await.unwrap();
        sent[i].push(n);
    }
    assert_eq!(run.return_value().await.unwrap(), sent);
    let ids = received_ids(&history(&rt, run.id()).await);
    assert_eq!(ids.len(), 300);
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 300, "a message was delivered twice");
}

/// Messages sent to a run before any worker executed it wait for its `recv`s.
async fn messages_sent_before_the_run_begins_wait_for_recv(backend: Backend) {
    let db = TestDb::new(backend);
    let client = client(&db).await;
    let run = client.start(collect, (3,)).await.unwrap();
    for n in [5, 6, 7] {
        run.send("n", n).await.unwrap();
    }
    assert_eq!(run.status().await.unwrap(), RunStatus::Pending);
    let _worker = db.runtime().await;
    assert_eq!(run.return_value().await.unwrap(), [5, 6, 7]);
}

/// A worker stops while messages keep arriving; another takes the run over: every message is
/// received exactly once, in send order.
async fn exactly_once_across_a_restart_while_messages_arrive(backend: Backend) {
    const N: u32 = 200;
    let db = TestDb::new(backend);
    let lease = Duration::from_millis(500);
    let first = db.runtime_with_lease(lease).await;
    let client = client(&db).await;
    let run = client.start(collect, (N,)).await.unwrap();
    let sender = {
        let run = run.clone();
        tokio::spawn(async move {
            for n in 0..N {
                run.send("n", n).await.unwrap();
                if n % 20 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };
    // Some delivered by the first worker, then it stops mid-stream.
    loop {
        if received_ids(&history(&client, run.id()).await).len() >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.shutdown();
    drop(first);
    let _second = db.runtime_with_lease(lease).await;
    sender.await.unwrap();
    assert_eq!(
        run.return_value().await.unwrap(),
        (0..N).collect::<Vec<_>>()
    );
    let ids = received_ids(&history(&client, run.id()).await);
    assert_eq!(ids.len(), N as usize);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "deliveries out of commit order"
    );
    assert!(client
        .store()
        .payloads(&run.id(), 0)
        .await
        .unwrap()
        .is_empty());
}

/// A repeated idempotency key stores nothing, whatever its payload; the run receives the first
/// message with the key and the keyless one, and then nothing.
async fn an_idempotency_key_sends_once(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db.runtime().await;
    let run = rt.start(two_then_nothing, ()).await.unwrap();
    run.send("pay", 1).idempotency_key("req-42").await.unwrap();
    run.send("pay", 2).idempotency_key("req-42").await.unwrap();
    run.send("pay", 4).idempotency_key("req-42").await.unwrap();
    // Last: the run may end once it has two messages.
    run.send("pay", 3).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), (vec![1, 3], true));
}

/// Sends to an ended or unknown run, over the payload limit or on an invalid topic fail with
/// their errors and store nothing.
async fn refused_sends_store_nothing(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db
        .builder()
        .max_payload_bytes(64)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let before = rt.store().last_payload_id().await.unwrap();

    let live = rt.start(collect, (1,)).await.unwrap();
    let too_large = live.send("n", "x".repeat(100)).await;
    match too_large {
        Err(RunError::TooLarge(e)) => {
            assert_eq!((e.size, e.limit), (102, 64));
            assert!(e.what.contains("\"n\""), "{}", e.what);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    for bad in ["", "a\nb"] {
        let sent = live.send(bad, 1).await;
        assert!(matches!(sent, Err(RunError::InvalidMessage(_))), "{sent:?}");
    }
    let unknown = RunId::new();
    let sent = rt.get_run(&unknown).send("n", 1).await;
    assert!(
        matches!(sent, Err(RunError::NotFound(id)) if id == unknown),
        "{sent:?}"
    );
    assert_eq!(rt.store().last_payload_id().await.unwrap(), before);

    live.send("n", 9).await.unwrap();
    assert_eq!(live.return_value().await.unwrap(), [9]);
    let after_end = rt.store().last_payload_id().await.unwrap();
    let sent = live.send("n", 10).idempotency_key("late").await;
    assert!(
        matches!(sent, Err(RunError::Ended { id, status: RunStatus::Completed }) if id == live.id()),
        "{sent:?}"
    );
    assert_eq!(rt.store().last_payload_id().await.unwrap(), after_end);
    assert!(rt.store().payloads(&live.id(), 0).await.unwrap().is_empty());
}

/// A timed-out `recv` consumes nothing: the message sent after it goes to the next `recv`.
/// The worker is replaced between the two: the replay takes the timer's side again, and the
/// exported history replays against the workflow.
async fn a_timed_out_recv_consumes_nothing_and_replay_takes_the_same_side(backend: Backend) {
    let db = TestDb::new(backend);
    let lease = Duration::from_millis(500);
    let first = db.runtime_with_lease(lease).await;
    let client = client(&db).await;
    let run = client.start(times_out_then_receives, (100,)).await.unwrap();
    until_recorded(&client, run.id(), |e| matches!(e, Event::TimerFired { .. })).await;
    first.shutdown();
    drop(first);
    let _second = db.runtime_with_lease(lease).await;
    run.send("late", 7).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), (true, 7));
    let events = history(&client, run.id()).await;
    assert_eq!(received_ids(&events).len(), 1);
    let exported = run.export().await.unwrap();
    workflow_core::testing::replay(times_out_then_receives, &exported).unwrap();
}

/// A message that arrives before the timeout wins, and its timer never fires into the result.
async fn a_message_beats_its_timeout(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db.runtime().await;
    let run = rt.start(message_beats_timeout, ()).await.unwrap();
    run.send("soon", 11).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), 11);
    let exported = run.export().await.unwrap();
    workflow_core::testing::replay(message_beats_timeout, &exported).unwrap();
}

/// `timeout` bounds a hook's `recv` and a child's result as well.
async fn timeouts_bound_hooks_and_children(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db.runtime().await;
    let token = format!("timeout:{}", RunId::new());
    let run = rt.start(hook_and_child_time_out, (token,)).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), (true, true));
}

// ---------------------------------------------------------------------------------------------
// Events

/// Publishes stage 1, waits for "go", publishes stage 2 and a URL, and ends.
#[workflow]
async fn staged() -> Result<u32> {
    set_event("stage", &1u32)?;
    recv::<()>("go").await?;
    set_event("stage", &2u32)?;
    set_event("url", "https://pay.example/1")?;
    Ok(2)
}

/// A reader waits until a key is set and then sees the latest value; `.latest()` answers at
/// once; a bounded wait on a key never set times out; after the run's end a key it never set
/// is an error, not a hang; a restart replays the `set_event` calls without recording them
/// again.
async fn events_wake_readers_and_the_latest_wins(backend: Backend) {
    let db = TestDb::new(backend);
    let lease = Duration::from_millis(500);
    let first = db.runtime_with_lease(lease).await;
    let client = client(&db).await;
    let run = client.start(staged, ()).await.unwrap();
    assert_eq!(run.event::<u32>("stage").await.unwrap(), 1);
    assert_eq!(run.event::<String>("url").latest().await.unwrap(), None);
    let bounded = run
        .event::<String>("url")
        .timeout(Duration::from_millis(100))
        .await;
    assert!(
        matches!(bounded, Err(RunError::TimedOut { .. })),
        "{bounded:?}"
    );

    // Another worker replays the run (the first set_event is in its history) and goes on.
    first.shutdown();
    drop(first);
    let _second = db.runtime_with_lease(lease).await;
    let url = {
        let run = run.clone();
        tokio::spawn(async move { run.event::<String>("url").await })
    };
    run.send("go", ()).await.unwrap();
    assert_eq!(url.await.unwrap().unwrap(), "https://pay.example/1");
    assert_eq!(run.return_value().await.unwrap(), 2);
    assert_eq!(run.event::<u32>("stage").await.unwrap(), 2);
    let all = run.events().await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all["stage"], 2);
    let never = run.event::<u32>("never").await;
    assert!(
        matches!(&never, Err(RunError::EventNotSet { key, status: RunStatus::Completed, .. }) if key == "never"),
        "{never:?}"
    );
    let sets = history(&client, run.id())
        .await
        .iter()
        .filter(|e| matches!(e.event, Event::EventSet { .. }))
        .count();
    assert_eq!(sets, 3, "each set_event is recorded once");
    let unknown = client.get_run(&RunId::new()).events().await;
    assert!(matches!(unknown, Err(RunError::NotFound(_))), "{unknown:?}");
}

/// Publishes from a step: its first attempt sets "progress" to 10 and fails, the retry sets
/// it to 50 and "stage" to "charged" and returns.
#[step(max_retries = 2)]
async fn charge_with_progress(amount: u32) -> Result<u32> {
    let attempt = step_metadata().attempt;
    set_event(
        "progress",
        &(attempt * 10 + if attempt > 1 { 30 } else { 0 }),
    )?;
    if attempt == 1 {
        return Err(Error::retryable("the card network is busy"));
    }
    set_event("stage", "charged")?;
    Ok(amount)
}

/// Runs the publishing step, publishes from the body (with the size of its history after
/// the step, as this execution sees it), waits for "go", and returns the step's value and
/// that size as the execution that ends sees it.
#[workflow]
async fn publishes_from_a_step() -> Result<(u32, u64)> {
    let charged = charge_with_progress(7).await?;
    let seen = workflow_metadata().history_events;
    set_event("stage", "waiting")?;
    set_event("history after the step", &seen)?;
    recv::<()>("go").await?;
    Ok((charged, seen))
}

/// `set_event` in a step: each attempt's values are recorded with its outcome (the failed
/// attempt's too), readers see them, the body's later value wins, and a restart that replays
/// the step (without running it) records nothing again and counts the same history.
async fn a_step_publishes_with_its_attempt(backend: Backend) {
    let db = TestDb::new(backend);
    let lease = Duration::from_millis(500);
    let first = db.runtime_with_lease(lease).await;
    let client = client(&db).await;
    let run = client.start(publishes_from_a_step, ()).await.unwrap();
    let waiting = bounded(async {
        loop {
            match run.event::<String>("stage").latest().await.unwrap() {
                Some(s) if s == "waiting" => return s,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await;
    assert_eq!(waiting, "waiting");
    assert_eq!(run.event::<u32>("progress").await.unwrap(), 50);

    first.shutdown();
    drop(first);
    let _second = db.runtime_with_lease(lease).await;
    run.send("go", ()).await.unwrap();
    let (charged, replayed) = bounded(run.return_value()).await.unwrap();
    assert_eq!(charged, 7);
    let live = run.event::<u64>("history after the step").await.unwrap();
    assert_eq!(
        replayed, live,
        "the replay counts the step's values as the live run did"
    );
    let all = run.events().await.unwrap();
    assert_eq!(all["progress"], 50);
    assert_eq!(all["stage"], "waiting");
    let sets: Vec<(String, serde_json::Value)> = history(&client, run.id())
        .await
        .into_iter()
        .filter_map(|e| match e.event {
            Event::EventSet { key, value, .. } => Some((key, value)),
            _ => None,
        })
        .collect();
    let expected = [
        ("progress", serde_json::json!(10)),
        ("progress", serde_json::json!(50)),
        ("stage", serde_json::json!("charged")),
        ("stage", serde_json::json!("waiting")),
        ("history after the step", serde_json::json!(live)),
    ];
    let expected: Vec<(String, serde_json::Value)> = expected
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(sets, expected, "each attempt's values once, in order");
}

on_every_store!(
    messages_keep_send_order_per_topic,
    messages_sent_before_the_run_begins_wait_for_recv,
    exactly_once_across_a_restart_while_messages_arrive,
    an_idempotency_key_sends_once,
    refused_sends_store_nothing,
    a_timed_out_recv_consumes_nothing_and_replay_takes_the_same_side,
    a_message_beats_its_timeout,
    timeouts_bound_hooks_and_children,
    events_wake_readers_and_the_latest_wins,
    a_step_publishes_with_its_attempt,
);

// ---------------------------------------------------------------------------------------------
// A storm of senders in other processes

/// Waits for the number of distinct messages to expect on "count", then receives them on
/// "storm": their keys, in the order received.
#[workflow]
async fn storm_sink() -> Result<Vec<String>> {
    let n = recv::<u32>("count").await?;
    let mut keys = Vec::new();
    for _ in 0..n {
        keys.push(recv::<String>("storm").await?);
    }
    Ok(keys)
}

/// The sender processes: `WF_SENDS` sends to run `WF_RUN` on "storm", each with a random key
/// of 1,500 (so some repeat within and across processes) as both its idempotency key and
/// its message; prints each key it sent on a `KEY` line, then `DONE`.
#[test]
#[ignore = "entry point of the sender processes the storm spawns"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = Place::from_env()
            .builder()
            .worker(false)
            .build()
            .await
            .expect("the sender's runtime builds");
        let run: RunId = std::env::var("WF_RUN").unwrap().parse().unwrap();
        let sends: u32 = std::env::var("WF_SENDS").unwrap().parse().unwrap();
        let run = client.get_run(&run);
        let mut out = std::io::stdout().lock();
        for _ in 0..sends {
            let key = format!("k{}", rand_key());
            run.send("storm", &key)
                .idempotency_key(&key)
                .await
                .expect("a send in the storm");
            writeln!(out, "KEY {key}").unwrap();
        }
        writeln!(out, "DONE").unwrap();
        out.flush().unwrap();
    });
}

/// A key of 1,500, from the process's own random state (no workflow, so no determinism
/// needed).
fn rand_key() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    (h.finish() % 1_500) as u32
}

/// 8 processes × 500 sends to one run with random idempotency keys (some repeated): the run
/// receives exactly the distinct keys, each once, in commit order (increasing inbox ids).
fn storm_of_senders(place: Place) {
    const PROCESSES: usize = 8;
    const SENDS: u32 = 500;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (worker, run) = rt.block_on(async {
        let worker = place
            .builder()
            .poll_interval(Duration::from_millis(20))
            .build()
            .await
            .unwrap();
        let run = worker.start(storm_sink, ()).await.unwrap();
        (worker, run)
    });
    let run_id = run.id().to_string();
    let sends = SENDS.to_string();
    let mut env: Vec<(&str, String)> = place.env();
    env.push(("WF_RUN", run_id));
    env.push(("WF_SENDS", sends));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let senders: Vec<Worker> = (0..PROCESSES).map(|_| Worker::spawn(&env)).collect();
    let mut sent = Vec::new();
    for s in &senders {
        loop {
            let line = s.line("", Duration::from_secs(120));
            if line.ends_with("DONE") {
                break;
            }
            if let Some(key) = line.split("KEY ").nth(1) {
                sent.push(key.to_owned());
            }
        }
    }
    assert_eq!(sent.len(), PROCESSES * SENDS as usize);
    let distinct: BTreeSet<String> = sent.iter().cloned().collect();
    let received = rt.block_on(bounded(async {
        run.send("count", distinct.len() as u32).await.unwrap();
        run.return_value().await.unwrap()
    }));
    let got: BTreeSet<String> = received.iter().cloned().collect();
    assert_eq!(got.len(), received.len(), "a key was received twice");
    assert_eq!(
        got, distinct,
        "the run received other keys than the distinct ones sent"
    );
    let ids = rt.block_on(async { received_ids(&history(&worker, run.id()).await) });
    let storm_ids = &ids[1..];
    assert!(
        storm_ids.windows(2).all(|w| w[0] < w[1]),
        "not received in commit order"
    );
    println!(
        "storm on {}: {PROCESSES} processes x {SENDS} sends, {} distinct keys received once each, \
         in commit order",
        place.name(),
        distinct.len()
    );
    for mut s in senders {
        s.wait_exit(Duration::from_secs(30));
    }
}

#[test]
fn a_storm_of_senders_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    storm_of_senders(Place::Sqlite {
        path: dir.path().join("wf.db"),
    });
}

#[cfg(feature = "postgres")]
#[test]
fn a_storm_of_senders_on_postgres() {
    let Some(url) = common::postgres_url() else {
        return;
    };
    let db = TestDb::new(Backend::Postgres);
    let schema = db.schema.clone();
    storm_of_senders(Place::Postgres { url, schema });
}
