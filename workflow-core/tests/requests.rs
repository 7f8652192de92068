//! Requests to a running run, on every store: `run.request` gets the reply the
//! workflow records with `req.reply`; requests arrive in send order, each once, across a
//! worker restart; an idempotency key returns the first request's reply, also to a caller
//! after one that timed out; a run that ends without replying ends the wait with an error;
//! requests to ended or unknown runs store nothing; a durable timeout on `requests().next()`
//! consumes nothing and replay takes the same side. And a process test: the worker holding
//! the request is SIGKILLed before it replies, another one replies, the caller gets it.

mod common;

use std::time::Duration;

use common::{bounded, Backend, Place, TestDb, Worker};
use workflow_core::prelude::*;
use workflow_core::store::{Event, EventRecord};
use workflow_core::RunError;

// ---------------------------------------------------------------------------------------------
// Workflows

/// Answers `n` requests "double" with twice their body, in the order received; returns the
/// bodies in that order.
#[workflow]
async fn doubler(n: u32) -> Result<Vec<u32>> {
    let mut asks = requests::<u32, u32>("double");
    let mut got = Vec::new();
    while (got.len() as u32) < n {
        let Some(req) = asks.next().await else {
            return Err(Error::fatal("the stream of requests ended"));
        };
        got.push(*req.body());
        req.reply(2 * req.body())?;
    }
    Ok(got)
}

/// Answers one request after a message on "go" arrives; a second reply is an error.
#[workflow]
async fn answers_after_go() -> Result<String> {
    let mut asks = requests::<String, String>("ask");
    let Some(req) = asks.next().await else {
        return Err(Error::fatal("the stream of requests ended"));
    };
    recv::<()>("go").await?;
    req.reply(format!("re: {}", req.body()))?;
    let second = req.reply("again".to_owned());
    Ok(match second {
        Err(e) => e.to_string(),
        Ok(()) => "replied twice".to_owned(),
    })
}

/// Takes one request and ends without replying.
#[workflow]
async fn never_replies() -> Result<()> {
    let mut asks = requests::<u32, u32>("ask");
    let _ignored = asks.next().await;
    Ok(())
}

/// Waits `wait_ms` for a request, then (after the timeout) for the next one, which it answers.
#[workflow]
async fn times_out_then_answers(wait_ms: u64) -> Result<(bool, u32)> {
    let mut asks = requests::<u32, u32>("ask");
    let first = timeout(Duration::from_millis(wait_ms), asks.next()).await;
    let elapsed = first.is_err();
    let Some(req) = asks.next().await else {
        return Err(Error::fatal("the stream of requests ended"));
    };
    req.reply(req.body() + 1)?;
    Ok((elapsed, *req.body()))
}

// ---------------------------------------------------------------------------------------------
// Helpers

async fn history(rt: &Runtime, run: RunId) -> Vec<EventRecord> {
    rt.store().events(&run).await.unwrap()
}

/// The ids of the run's recorded `RequestReceived` events, in order.
fn received_ids(events: &[EventRecord]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Event::RequestReceived { payload_id, .. } => Some(*payload_id),
            _ => None,
        })
        .collect()
}

/// The request ids of the run's recorded `RequestReplied` events, in order.
fn replied_ids(events: &[EventRecord]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Event::RequestReplied { request_id, .. } => Some(*request_id),
            _ => None,
        })
        .collect()
}

/// Until the run's history holds an event `pred` accepts (bounded by the test's limit).
async fn until_recorded(rt: &Runtime, run: RunId, pred: impl Fn(&Event) -> bool) {
    while !history(rt, run).await.iter().any(|e| pred(&e.event)) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Until the store holds `n` requests to the run.
async fn until_requests(rt: &Runtime, run: RunId, n: usize) {
    while rt.store().run_requests(&run).await.unwrap().len() < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

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

/// A request gets the workflow's reply; a body that does not fit the workflow's type is
/// answered with an error naming the mismatch, and the workflow goes on with the next; a
/// second reply to one request is an error in the workflow.
async fn a_request_gets_its_reply(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db.runtime().await;
    let run = rt.start(doubler, (1,)).await.unwrap();
    let wrong = run.request::<&str, u32>("double", "twenty-one").await;
    match &wrong {
        Err(RunError::Payload(m)) => assert!(m.contains("does not fit"), "{m}"),
        other => panic!("expected a payload error, got {other:?}"),
    }
    assert_eq!(run.request::<u32, u32>("double", 21).await.unwrap(), 42);
    assert_eq!(run.return_value().await.unwrap(), [21]);

    let run = rt.start(answers_after_go, ()).await.unwrap();
    let caller = {
        let run = run.clone();
        tokio::spawn(async move { run.request::<&str, String>("ask", "hi").await })
    };
    until_recorded(&rt, run.id(), |e| {
        matches!(e, Event::RequestReceived { .. })
    })
    .await;
    run.send("go", ()).await.unwrap();
    assert_eq!(caller.await.unwrap().unwrap(), "re: hi");
    let second = run.return_value().await.unwrap();
    assert!(second.contains("replied to already"), "{second}");
    assert_eq!(replied_ids(&history(&rt, run.id()).await).len(), 1);
    let open = rt.store().run_requests(&run.id()).await.unwrap();
    assert!(open.iter().all(|r| r.replied), "{open:?}");
}

/// 30 requests, each sent after the one before it is stored, while the worker is replaced
/// midway: every caller gets its reply, the run takes them in send order, each once.
async fn requests_arrive_in_order_once_across_a_restart(backend: Backend) {
    const N: u32 = 30;
    let db = TestDb::new(backend);
    let lease = Duration::from_millis(500);
    let first = db.runtime_with_lease(lease).await;
    let client = client(&db).await;
    let run = client.start(doubler, (N,)).await.unwrap();
    let mut callers = Vec::new();
    let mut first = Some(first);
    let mut second = None;
    for n in 0..N {
        let asking = run.clone();
        callers.push(tokio::spawn(async move {
            asking.request::<u32, u32>("double", n).await
        }));
        until_requests(&client, run.id(), n as usize + 1).await;
        if n == N / 3 {
            // Some received by the first worker; then it stops while requests arrive.
            until_recorded(&client, run.id(), |e| {
                matches!(e, Event::RequestReplied { .. })
            })
            .await;
            if let Some(rt) = first.take() {
                rt.shutdown();
            }
        }
        if n == N / 2 {
            second = Some(db.runtime_with_lease(lease).await);
        }
    }
    let mut replies = Vec::new();
    for c in callers {
        replies.push(c.await.unwrap().unwrap());
    }
    drop(second);
    assert_eq!(replies, (0..N).map(|n| 2 * n).collect::<Vec<_>>());
    assert_eq!(
        run.return_value().await.unwrap(),
        (0..N).collect::<Vec<_>>()
    );
    let events = history(&client, run.id()).await;
    let ids = received_ids(&events);
    assert_eq!(ids.len(), N as usize);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "not in send order");
    assert_eq!(
        replied_ids(&events),
        ids,
        "each request replied to once, in order"
    );
}

/// A caller that timed out leaves its request with the run; a later request with the same
/// key (and another body) gets the first one's reply, also after the run ended; only one
/// request is stored.
async fn an_idempotency_key_returns_the_first_reply(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db.runtime().await;
    let run = rt.start(answers_after_go, ()).await.unwrap();
    let timed_out = run
        .request::<&str, String>("ask", "first")
        .idempotency_key("ask-1")
        .timeout(Duration::from_millis(100))
        .await;
    assert!(
        matches!(timed_out, Err(RunError::TimedOut { .. })),
        "{timed_out:?}"
    );
    until_recorded(&rt, run.id(), |e| {
        matches!(e, Event::RequestReceived { .. })
    })
    .await;
    run.send("go", ()).await.unwrap();
    let again = run
        .request::<&str, String>("ask", "second")
        .idempotency_key("ask-1")
        .await;
    assert_eq!(again.unwrap(), "re: first");
    run.return_value().await.unwrap();
    let after_end = run
        .request::<&str, String>("ask", "third")
        .idempotency_key("ask-1")
        .await;
    assert_eq!(after_end.unwrap(), "re: first");
    assert_eq!(rt.store().run_requests(&run.id()).await.unwrap().len(), 1);
}

/// A run that ends without replying ends its callers' waits with `NoReply`; requests to an
/// ended run, an unknown run, over the payload limit or with an invalid name store nothing.
async fn refused_or_unanswered_requests_fail_the_caller(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db
        .builder()
        .max_payload_bytes(64)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let run = rt.start(never_replies, ()).await.unwrap();
    let before = rt.store().last_payload_id().await.unwrap();
    let too_large = run.request::<String, u32>("ask", "x".repeat(100)).await;
    match too_large {
        Err(RunError::TooLarge(e)) => assert_eq!((e.size, e.limit), (102, 64)),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    for bad in ["", "a\nb"] {
        let sent = run.request::<u32, u32>(bad, 1).await;
        assert!(matches!(sent, Err(RunError::InvalidMessage(_))), "{sent:?}");
    }
    let unknown = RunId::new();
    let sent = rt.get_run(&unknown).request::<u32, u32>("ask", 1).await;
    assert!(
        matches!(sent, Err(RunError::NotFound(id)) if id == unknown),
        "{sent:?}"
    );
    assert_eq!(rt.store().last_payload_id().await.unwrap(), before);

    let unanswered = run.request::<u32, u32>("ask", 7).await;
    assert!(
        matches!(&unanswered, Err(RunError::NoReply { name, status: RunStatus::Completed, .. }) if name == "ask"),
        "{unanswered:?}"
    );
    let after_end = rt.store().last_payload_id().await.unwrap();
    let sent = run.request::<u32, u32>("ask", 8).await;
    assert!(
        matches!(
            sent,
            Err(RunError::Ended {
                status: RunStatus::Completed,
                ..
            })
        ),
        "{sent:?}"
    );
    assert_eq!(rt.store().last_payload_id().await.unwrap(), after_end);
    assert_eq!(rt.store().run_requests(&run.id()).await.unwrap().len(), 1);
}

/// A timed-out `requests().next()` takes nothing: the request sent after it goes to the next
/// `next()`. The worker is replaced between the two: the replay takes the timer's side again,
/// and the exported history replays against the workflow.
async fn a_timed_out_next_consumes_nothing_and_replay_takes_the_same_side(backend: Backend) {
    let db = TestDb::new(backend);
    let lease = Duration::from_millis(500);
    let first = db.runtime_with_lease(lease).await;
    let client = client(&db).await;
    let run = client.start(times_out_then_answers, (100,)).await.unwrap();
    until_recorded(&client, run.id(), |e| matches!(e, Event::TimerFired { .. })).await;
    first.shutdown();
    drop(first);
    let _second = db.runtime_with_lease(lease).await;
    assert_eq!(run.request::<u32, u32>("ask", 7).await.unwrap(), 8);
    assert_eq!(run.return_value().await.unwrap(), (true, 7));
    let events = history(&client, run.id()).await;
    assert_eq!(received_ids(&events).len(), 1);
    let exported = run.export().await.unwrap();
    workflow_core::testing::replay(times_out_then_answers, &exported).unwrap();
}

on_every_store!(
    a_request_gets_its_reply,
    requests_arrive_in_order_once_across_a_restart,
    an_idempotency_key_returns_the_first_reply,
    refused_or_unanswered_requests_fail_the_caller,
    a_timed_out_next_consumes_nothing_and_replay_takes_the_same_side,
);

// ---------------------------------------------------------------------------------------------
// A worker killed between the request and the reply

/// The worker processes: a runtime on the store named by the environment with a 1 s lease;
/// prints `READY`, then works until killed.
#[test]
#[ignore = "entry point of the worker processes the process test spawns"]
fn child_main() {
    if !Worker::is_child() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let _worker = Place::from_env()
            .builder()
            .lease(Duration::from_secs(1))
            .poll_interval(Duration::from_millis(50))
            .build()
            .await
            .expect("the worker's runtime builds");
        println!("READY");
        std::future::pending::<()>().await;
    });
}

/// A worker process takes the request (its delivery is recorded) and is SIGKILLed before it
/// replies; another worker process takes the run over and replies; the caller, in this
/// process, waiting all along, gets the reply; the run received the request once and replied
/// once.
fn a_killed_worker_s_request_is_answered_by_another(place: Place) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let env: Vec<(&str, String)> = place.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    rt.block_on(bounded(async {
        let client = place
            .builder()
            .worker(false)
            .poll_interval(Duration::from_millis(20))
            .build()
            .await
            .unwrap();
        let run = client.start(answers_after_go, ()).await.unwrap();
        let first = Worker::spawn(&env);
        first.line("READY", Duration::from_secs(60));
        let caller = {
            let run = run.clone();
            tokio::spawn(async move { run.request::<&str, String>("ask", "hello").await })
        };
        until_recorded(&client, run.id(), |e| {
            matches!(e, Event::RequestReceived { .. })
        })
        .await;
        first.kill();
        let second = Worker::spawn(&env);
        second.line("READY", Duration::from_secs(60));
        run.send("go", ()).await.unwrap();
        assert_eq!(caller.await.unwrap().unwrap(), "re: hello");
        run.return_value().await.unwrap();
        let events = history(&client, run.id()).await;
        assert_eq!(
            received_ids(&events).len(),
            1,
            "the request was received twice"
        );
        assert_eq!(replied_ids(&events).len(), 1);
        println!(
            "request across a SIGKILL on {}: the caller got the reply of the second worker",
            place.name()
        );
    }));
}

#[test]
fn a_killed_worker_s_request_is_answered_by_another_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_killed_worker_s_request_is_answered_by_another(Place::Sqlite {
        path: dir.path().join("wf.db"),
    });
}

#[cfg(feature = "postgres")]
#[test]
fn a_killed_worker_s_request_is_answered_by_another_on_postgres() {
    let Some(url) = common::postgres_url() else {
        return;
    };
    let db = TestDb::new(Backend::Postgres);
    let schema = db.schema.clone();
    a_killed_worker_s_request_is_answered_by_another(Place::Postgres { url, schema });
}
