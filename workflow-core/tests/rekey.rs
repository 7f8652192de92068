//! `Runtime::rekey` (`workflow rekey`), on every store: payloads of every kind sealed
//! under an old key are sealed again under the current one, after which the old key can go;
//! a missing key is named; a stopped rekey resumes; a rekey racing a live worker and a
//! sender loses nothing. And rotation across processes (SQLite, PostgreSQL): runs started by
//! a process with the old key only, a process with the new key only leaves them blocked and
//! unchanged, a process with both finishes them.

mod common;

use std::time::Duration;

use common::{Backend, TestDb};
use futures::TryStreamExt;
use workflow_core::prelude::*;
use workflow_core::store::{Event, RunFilter};
use workflow_core::{RekeyError, RekeyOptions, RekeyReport, RunError};

const KEY_A: [u8; 32] = [0xa1; 32];
const KEY_B: [u8; 32] = [0xb2; 32];

fn keys_a() -> Keys {
    Keys::new().current("key-A", KEY_A)
}

fn keys_b() -> Keys {
    Keys::new().current("key-B", KEY_B)
}

fn keys_ba() -> Keys {
    Keys::new().current("key-B", KEY_B).old("key-A", KEY_A)
}

#[step]
async fn rk_echo(s: String) -> Result<String> {
    stream::<String>("chunks")
        .write(format!("{s}-chunk"))
        .await?;
    Ok(format!("{s}-result"))
}

#[step(max_retries = 0)]
async fn rk_fails(s: String) -> Result<()> {
    Err(Error::fatal(format!("{s}-step-error")))
}

/// Step arguments, results and errors, a chunk, a published value, then a hook payload and a
/// message (sent while it waits on the hook, so kept in the inbox until then).
#[workflow]
async fn rk_all(s: String, token: String) -> Result<String> {
    let r = rk_echo(s.clone()).await?;
    let e = rk_fails(s.clone()).await.unwrap_err().to_string();
    set_event("status", &format!("{s}-event"))?;
    let mut hook = create_hook::<String>(token);
    let p = hook.recv().await?;
    let m: String = recv("note").await?;
    Ok(format!("{r}|{e}|{p}|{m}"))
}

/// Answers requests "ask" until one fits its type: a body that does not is replied to with an
/// error (sealed like a reply), the first that does with a value.
#[workflow]
async fn rk_answers() -> Result<String> {
    let mut asks = requests::<String, String>("ask");
    let Some(req) = asks.next().await else {
        return Err(Error::fatal("the stream of requests ended"));
    };
    let body = req.body().clone();
    req.reply(format!("{body}-reply"))?;
    Ok(body)
}

#[workflow]
async fn rk_failing(s: String) -> Result<()> {
    Err(Error::fatal(format!("{s}-run-error")))
}

#[workflow]
async fn rk_child(s: String) -> Result<String> {
    Ok(format!("{s}-child"))
}

#[workflow]
async fn rk_parent(s: String) -> Result<String> {
    let child = start_child(rk_child, (s,)).await?;
    child.result().await
}

#[step]
async fn rk_add(sum: u64, m: u64) -> Result<u64> {
    Ok(sum + m)
}

/// Adds `n` messages.
#[workflow]
async fn rk_counter(n: u64) -> Result<u64> {
    let mut sum = 0;
    for _ in 0..n {
        let m: u64 = recv("n").await?;
        sum = rk_add(sum, m).await?;
    }
    Ok(sum)
}

async fn runtime(db: &TestDb, keys: Keys, worker: bool) -> Runtime {
    db.builder()
        .encryption(keys)
        .worker(worker)
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Duration::from_millis(10))
        .lease(Duration::from_millis(500))
        .build()
        .await
        .expect("runtime builds")
}

/// Everything the store hands out through the ordinary calls for every run, as text: records,
/// histories, inboxes, chunks, published values and the replies to requests as callers read
/// them.
async fn stored_view(rt: &Runtime) -> String {
    let store = rt.store();
    let mut text = String::new();
    for run in store
        .list_runs(&RunFilter::new().limit(1000))
        .await
        .unwrap()
    {
        text.push_str(&format!("{run:?}\n"));
        let events = store.events(&run.id).await.unwrap();
        text.push_str(&format!("{events:?}\n"));
        let inbox = store.payloads(&run.id, 0).await.unwrap();
        text.push_str(&format!("{inbox:?}\n"));
        for s in store.list_streams(&run.id).await.unwrap() {
            let page = store.read_stream(&run.id, &s.name, 0, 1000).await.unwrap();
            text.push_str(&format!("{:?}\n", page.chunks));
        }
        let published = store.run_events(&run.id).await.unwrap();
        text.push_str(&format!("{published:?}\n"));
        for r in store.run_requests(&run.id).await.unwrap() {
            let reply = store.request_reply(&run.id, r.id).await.unwrap();
            text.push_str(&format!("{r:?} {reply:?}\n"));
        }
    }
    text
}

/// Waits until run `id` has recorded a hook registration (bounded by the test's limit).
async fn until_hooked(rt: &Runtime, id: RunId) {
    loop {
        let events = rt.store().events(&id).await.unwrap();
        if events
            .iter()
            .any(|e| matches!(e.event, Event::HookRegistered { .. }))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn print(what: &str, backend: Backend, r: &RekeyReport) {
    println!(
        "{what} ({backend:?}): rewritten {} payloads in {} rows, {} already current, {} rows \
         changed meanwhile, stopped early: {}, by kind: {:?}",
        r.rewritten(),
        r.rows_rewritten,
        r.current(),
        r.changed,
        r.stopped_early,
        r.kinds
    );
}

/// Every kind of payload under key A (also a request and the replies to it, one an error); a
/// rekey without A names it; a rekey with B current and A old leaves no payload under A; the
/// runs then read (and the one in flight finishes) with B alone, and a repeated request gets
/// its stored reply; a second rekey rewrites nothing.
async fn rekey_moves_every_payload_to_the_current_key(backend: Backend) {
    let db = TestDb::new(backend);
    let rt_a = runtime(&db, keys_a(), true).await;
    let token = format!("rk-{}", RunId::new());
    let s = "secret".to_owned();
    let waiting = rt_a
        .start(rk_all, (s.clone(), token.clone()))
        .await
        .unwrap();
    until_hooked(&rt_a, waiting.id()).await;
    waiting.send("note", format!("{s}-message")).await.unwrap();
    let failing = rt_a.start(rk_failing, (s.clone(),)).await.unwrap();
    assert!(failing.return_value().await.is_err());
    let parent = rt_a.start(rk_parent, (s.clone(),)).await.unwrap();
    assert_eq!(parent.return_value().await.unwrap(), "secret-child");
    let answering = rt_a.start(rk_answers, ()).await.unwrap();
    let misfit = answering
        .request::<u32, String>("ask", 7)
        .idempotency_key("misfit")
        .timeout(Duration::from_secs(30))
        .await;
    let Err(RunError::Payload(misfit)) = misfit else {
        panic!("a request that does not fit was answered: {misfit:?}")
    };
    let answer = answering
        .request::<String, String>("ask", format!("{s}-request"))
        .idempotency_key("fits")
        .timeout(Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(answer, "secret-request-reply");
    assert_eq!(answering.return_value().await.unwrap(), "secret-request");
    let replies = rt_a.store().run_requests(&answering.id()).await.unwrap();
    assert_eq!(replies.len(), 2);
    for r in &replies {
        let reply = rt_a.store().request_reply(&answering.id(), r.id).await;
        let reply = format!("{:?}", reply.unwrap().unwrap().reply);
        assert!(
            reply.contains("key-A"),
            "the reply to {r:?} is not sealed: {reply}"
        );
    }
    // Its status must be read before the worker goes: the message stays in the inbox.
    assert_eq!(
        rt_a.store().payloads(&waiting.id(), 0).await.unwrap().len(),
        1
    );
    rt_a.shutdown();
    assert!(stored_view(&rt_a).await.contains("key-A"));

    // Without key A: refused, naming it.
    let blind = runtime(&db, keys_b(), false).await;
    let err = blind.rekey(RekeyOptions::new()).await.unwrap_err();
    assert!(
        matches!(&err, RekeyError::MissingKey { key, .. } if key == "key-A"),
        "{err}"
    );
    assert!(err.to_string().contains("\"key-A\""), "{err}");

    let client = runtime(&db, keys_ba(), false).await;
    let report = client.rekey(RekeyOptions::new()).await.unwrap();
    print("rekey", backend, &report);
    assert!(report.complete(), "{report:?}");
    assert_eq!(report.key, "key-B");
    for kind in [
        "input",
        "output",
        "error",
        "step_input",
        "step_result",
        "step_error",
        "hook_payload",
        "stream_chunk",
        "message",
        "event",
        "request",
        "reply",
    ] {
        if kind == "hook_payload" {
            continue; // not received yet: the hook's payload is sent below, under B
        }
        assert!(
            report.kinds.get(kind).is_some_and(|c| c.rewritten > 0),
            "no {kind} was rewritten: {report:?}"
        );
    }
    let view = stored_view(&client).await;
    assert!(!view.contains("key-A"), "a payload still names key A");
    assert!(view.contains("key-B"));

    let again = client.rekey(RekeyOptions::new()).await.unwrap();
    print("second rekey", backend, &again);
    assert_eq!((again.rewritten(), again.rows_rewritten), (0, 0));
    assert_eq!(again.current(), report.rewritten() + report.current());

    // Key B alone reads everything and finishes the run in flight.
    let rt_b = runtime(&db, keys_b(), true).await;
    assert_eq!(
        rt_b.get_run(&parent.id())
            .typed::<String>()
            .return_value()
            .await
            .unwrap(),
        "secret-child"
    );
    let err = rt_b.get_run(&failing.id()).info().await.unwrap().error;
    assert_eq!(err.unwrap().to_string(), "secret-run-error");
    rt_b.resume_hook(&token, format!("{s}-hook")).await.unwrap();
    let out = rt_b
        .get_run(&waiting.id())
        .typed::<String>()
        .return_value()
        .await
        .unwrap();
    assert_eq!(
        out,
        "secret-result|secret-step-error|secret-hook|secret-message"
    );
    let chunks: Vec<Chunk<String>> = rt_b
        .get_run(&waiting.id())
        .stream("chunks")
        .try_collect()
        .await
        .unwrap();
    assert_eq!(chunks[0].value, "secret-chunk");
    let status: String = rt_b
        .get_run(&waiting.id())
        .event::<String>("status")
        .latest()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, "secret-event");
    // A repeated request reads the stored reply (the value, and the error), opened with B.
    let again = rt_b.get_run(&answering.id());
    let answer = again
        .request::<String, String>("ask", "unsent".to_owned())
        .idempotency_key("fits")
        .timeout(Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(answer, "secret-request-reply");
    let misfit_again = again
        .request::<u32, String>("ask", 8)
        .idempotency_key("misfit")
        .timeout(Duration::from_secs(30))
        .await;
    assert!(
        matches!(&misfit_again, Err(RunError::Payload(e)) if *e == misfit),
        "{misfit_again:?}, not {misfit}"
    );
}

/// A rekey stopped by its limit leaves the rest; a rerun finishes it; a third rewrites
/// nothing.
async fn a_stopped_rekey_resumes(backend: Backend) {
    let db = TestDb::new(backend);
    let rt_a = runtime(&db, keys_a(), true).await;
    for i in 0..3 {
        let run = rt_a.start(rk_failing, (format!("r{i}"),)).await.unwrap();
        assert!(run.return_value().await.is_err());
    }
    rt_a.shutdown();
    let client = runtime(&db, keys_ba(), false).await;
    let first = client
        .rekey(RekeyOptions::new().batch(1).limit(2))
        .await
        .unwrap();
    print("stopped rekey", backend, &first);
    assert!(first.stopped_early && !first.complete(), "{first:?}");
    assert_eq!(first.rows_rewritten, 2);
    assert!(stored_view(&client).await.contains("key-A"));

    let rest = client.rekey(RekeyOptions::new().batch(2)).await.unwrap();
    print("resumed rekey", backend, &rest);
    assert!(rest.complete() && rest.rows_rewritten > 0, "{rest:?}");
    assert!(rest.current() >= first.rewritten());
    assert!(!stored_view(&client).await.contains("key-A"));
    let done = client.rekey(RekeyOptions::new()).await.unwrap();
    assert_eq!(done.rewritten(), 0, "{done:?}");
}

/// A worker (new key current, old key kept) drives runs that add the messages a sender still
/// seals under the old key, while rekeys run again and again: every message is counted once,
/// and a last rekey, once the sender is done, leaves nothing under the old key.
async fn a_rekey_racing_a_live_worker_loses_nothing(backend: Backend) {
    const RUNS: u64 = 3;
    const MESSAGES: u64 = 20;
    let db = TestDb::new(backend);
    let worker = runtime(&db, keys_ba(), true).await;
    let sender = runtime(&db, keys_a(), false).await;
    let rekeyer = runtime(&db, keys_ba(), false).await;
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        runs.push(sender.start(rk_counter, (MESSAGES,)).await.unwrap());
    }
    let ids: Vec<RunId> = runs.iter().map(|r| r.id()).collect();
    let send = {
        let ids = ids.clone();
        tokio::spawn(async move {
            for m in 1..=MESSAGES {
                for id in &ids {
                    sender.get_run(id).send("n", m).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let (mut passes, mut changed, mut rewritten) = (0, 0, 0);
    while !send.is_finished() {
        let r = rekeyer.rekey(RekeyOptions::new().batch(7)).await.unwrap();
        passes += 1;
        changed += r.changed;
        rewritten += r.rewritten();
    }
    send.await.unwrap();
    let want = MESSAGES * (MESSAGES + 1) / 2;
    for id in &ids {
        let sum = worker
            .get_run(id)
            .typed::<u64>()
            .return_value()
            .await
            .unwrap();
        assert_eq!(sum, want, "run {id} lost a message");
    }
    println!(
        "racing rekeys ({backend:?}): {passes} passes beside the worker rewrote {rewritten} \
         payloads; {changed} rows changed under them"
    );
    let last = rekeyer.rekey(RekeyOptions::new()).await.unwrap();
    print("last rekey", backend, &last);
    assert!(last.complete(), "{last:?}");
    assert!(!stored_view(&rekeyer).await.contains("key-A"));
    worker.shutdown();
    let b_only = runtime(&db, keys_b(), false).await;
    for id in &ids {
        let sum = b_only.get_run(id).typed::<u64>().return_value().await;
        assert_eq!(sum.unwrap(), want);
    }
}

on_every_store!(
    rekey_moves_every_payload_to_the_current_key,
    a_stopped_rekey_resumes,
    a_rekey_racing_a_live_worker_loses_nothing,
);

#[tokio::test]
async fn a_runtime_without_keys_cannot_rekey() {
    let rt = Runtime::builder().in_memory().build().await.unwrap();
    let err = rt.rekey(RekeyOptions::new()).await.unwrap_err();
    assert!(matches!(err, RekeyError::NoKeys), "{err}");
}
