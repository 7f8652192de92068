//! Continue-as-new under payload encryption, on every store: what the
//! runs of a chain share crosses the seam sealed and opens on the other side. Messages and a
//! request waiting in the inbox at two seams are received and answered by the last run, an
//! event set before the seam is read through the chain after it, a parent awaiting a child
//! that continues gets its final value (and its error), and none of it is in the store in the
//! clear. The chain's payloads still open for `workflow rekey`, `--keys` reading, an export
//! and `testing::replay`, and one copied into an unrelated run does not open there.

mod common;

use std::time::Duration;

use common::stored::stored_text;
use common::{until_status, Backend, TestDb};
use workflow_core::prelude::*;
use workflow_core::store::{Event, NewMessage};
use workflow_core::{RekeyOptions, RunError, RunRecord};

/// Must never reach the store in the clear.
const MARKER: &str = "Kx4-chained-secret";

const KEY_A: [u8; 32] = [0x3c; 32];
const KEY_B: [u8; 32] = [0x4d; 32];

fn keys_a() -> Keys {
    Keys::new().current("chain-A", KEY_A)
}

async fn runtime(db: &TestDb, keys: Keys, worker: bool) -> Runtime {
    db.builder()
        .encryption(keys)
        .worker(worker)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("runtime builds")
}

// ---------------------------------------------------------------------------------------------
// Workflows

/// Run `k` of three waits for "go" and continues, reading neither its messages on "m" nor its
/// requests; the last run receives `n` messages, answers one request and returns the messages.
#[workflow]
async fn late_reader(k: u32, n: u32) -> Result<Vec<String>> {
    if k < 2 {
        recv::<String>("go").await?;
        return continue_as_new(late_reader, (k + 1, n)).await;
    }
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(recv::<String>("m").await?);
    }
    let mut asks = requests::<String, String>("ask");
    let Some(req) = futures::StreamExt::next(&mut asks).await else {
        return Err(Error::fatal("the requests stream ended"));
    };
    req.reply(format!("{}-reply", req.body()))?;
    Ok(got)
}

/// Publishes `s` and continues; the next run waits for "done" and returns.
#[workflow]
async fn publisher(s: String, first: bool) -> Result<String> {
    if first {
        set_event("status", &format!("{s}-event"))?;
        return continue_as_new(publisher, (s, false)).await;
    }
    recv::<String>("done").await?;
    Ok(format!("{s}-end"))
}

/// Continues `n` times, then returns `s`, or fails with it when `fail`.
#[workflow]
async fn sealed_count_down(n: u32, s: String, fail: bool) -> Result<String> {
    if n > 0 {
        return continue_as_new(sealed_count_down, (n - 1, s, fail)).await;
    }
    if fail {
        return Err(Error::fatal(format!("{s}-chain-error")));
    }
    Ok(format!("{s}-chain-value"))
}

/// Awaits a child that continues three times, and one that continues and fails.
#[workflow]
async fn parent_of_sealed_chains(s: String) -> Result<String> {
    let done = start_child(sealed_count_down, (3, s.clone(), false)).await?;
    let done = done.result().await?;
    let failed = start_child(sealed_count_down, (2, s, true)).await?;
    let failed = failed.result().await.unwrap_err().to_string();
    Ok(format!("{done}|{failed}"))
}

/// Receives one message on "m" and returns it.
#[workflow]
async fn one_message() -> Result<String> {
    recv::<String>("m").await
}

// ---------------------------------------------------------------------------------------------
// Tests

/// The runs of the chain from `first`, following `next_run`.
async fn chain(rt: &Runtime, first: RunId) -> Vec<RunRecord> {
    let mut out = Vec::new();
    let mut id = Some(first);
    while let Some(i) = id {
        let r = rt.get_run(&i).info().await.unwrap();
        id = r.next_run;
        out.push(r);
    }
    out
}

/// Waits until run `id` has continued; the run that continues it.
async fn next_of(rt: &Runtime, id: RunId) -> RunId {
    until_status(rt, id, RunStatus::ContinuedAsNew)
        .await
        .next_run
        .expect("a continued run names its next run")
}

/// A `late_reader` chain whose last run receives `n` messages, started with the message
/// `-m0` and a request `ask` waiting in its first run's inbox; the request's caller.
async fn started_with_a_waiting_request(
    rt: &Runtime,
    n: u32,
) -> (
    Run<Vec<String>>,
    tokio::task::JoinHandle<Result<String, RunError>>,
) {
    let run = rt.start(late_reader, (0, n)).await.unwrap();
    run.send("m", format!("{MARKER}-m0")).await.unwrap();
    let asking = {
        let run = run.clone();
        tokio::spawn(async move {
            run.request::<String, String>("ask", format!("{MARKER}-ask"))
                .await
        })
    };
    // The request waits in the first run's inbox before it continues.
    tokio::time::timeout(Duration::from_secs(10), async {
        while rt.store().run_requests(&run.id()).await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the request reaches the first run's inbox within 10 s");
    (run, asking)
}

/// Messages and a request that wait in the inbox through two seams are received and answered
/// by the third run, including a message sent through a handle on the second run (which
/// begins no chain: the sender reads whose chain it is).
async fn what_waits_at_the_seam_is_read_by_the_next_run(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime(&db, keys_a(), true).await;
    let (run, asking) = started_with_a_waiting_request(&rt, 3).await;
    run.send("m", format!("{MARKER}-m1")).await.unwrap();
    run.send("go", "now").await.unwrap();
    let second = next_of(&rt, run.id()).await;
    // Through a handle on the second run, from a client that never saw the first.
    let client = runtime(&db, keys_a(), false).await;
    let handle = client.get_run(&second);
    handle.send("m", format!("{MARKER}-m2")).await.unwrap();
    handle.send("go", "now").await.unwrap();
    let want: Vec<String> = (0..3).map(|i| format!("{MARKER}-m{i}")).collect();
    assert_eq!(run.return_value().await.unwrap(), want);
    assert_eq!(
        asking.await.unwrap().unwrap(),
        format!("{MARKER}-ask-reply"),
        "the last run answered the request sent to the first"
    );
    let runs = chain(&rt, run.id()).await;
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[2].origin, Some(run.id()), "the chain's first run");
    assert_eq!(runs[0].origin, None);
    // The last run's history holds what it received, sealed.
    let events = rt.store().events(&runs[2].id).await.unwrap();
    let received = events
        .iter()
        .filter(|e| matches!(e.event, Event::MessageReceived { .. }))
        .count();
    assert_eq!(received, 3);
    // Any handle on the chain gives its value; the second-run handle is typed here.
    let typed = client.get_run(&second).typed::<Vec<String>>();
    assert_eq!(typed.return_value().await.unwrap(), want);
    assert!(
        !stored_text(&db, &rt).await.contains(MARKER),
        "the marker is in the {backend:?} store in the clear"
    );
    client.shutdown();
    rt.shutdown();
}

/// A value published before the seam is read after it, through the first run's handle and
/// through a handle on the next run.
async fn an_event_set_before_the_seam_is_read_after_it(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime(&db, keys_a(), true).await;
    let run = rt
        .start(publisher, (MARKER.to_owned(), true))
        .await
        .unwrap();
    let next = next_of(&rt, run.id()).await;
    let want = format!("{MARKER}-event");
    assert_eq!(run.event::<String>("status").await.unwrap(), want);
    let client = runtime(&db, keys_a(), false).await;
    let later = client.get_run(&next);
    assert_eq!(later.event::<String>("status").await.unwrap(), want);
    run.send("done", "yes").await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), format!("{MARKER}-end"));
    assert_eq!(
        later.event::<String>("status").latest().await.unwrap(),
        Some(want)
    );
    assert!(!stored_text(&db, &rt).await.contains(MARKER));
    client.shutdown();
    rt.shutdown();
}

/// A parent gets the final value of a child that continued three times, and the error of one
/// that continued and failed, both opened.
async fn a_parent_reads_the_end_of_an_encrypted_child_chain(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime(&db, keys_a(), true).await;
    let run = rt
        .start(parent_of_sealed_chains, (MARKER.to_owned(),))
        .await
        .unwrap();
    assert_eq!(
        run.return_value().await.unwrap(),
        format!("{MARKER}-chain-value|{MARKER}-chain-error")
    );
    // The chain's end also opens for a handle on its first run and on its last.
    let child = rt
        .start(sealed_count_down, (2, MARKER.to_owned(), false))
        .await
        .unwrap();
    let want = format!("{MARKER}-chain-value");
    assert_eq!(child.return_value().await.unwrap(), want);
    let last = chain(&rt, child.id()).await.pop().unwrap();
    assert_eq!(last.output, Some(serde_json::json!(want)), "info opens it");
    let client = runtime(&db, keys_a(), false).await;
    let on_last = client.get_run(&last.id).typed::<String>();
    assert_eq!(on_last.return_value().await.unwrap(), want);
    assert!(!stored_text(&db, &rt).await.contains(MARKER));
    client.shutdown();
    rt.shutdown();
}

/// `workflow rekey`, reading with the keys (the CLI's `--keys`), a decrypted export and
/// `testing::replay` open what a chain's later run holds; a message copied from it into an
/// unrelated run does not open there.
async fn every_reader_opens_a_chains_payloads_and_no_other_run_does(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime(&db, keys_a(), true).await;
    let (run, asking) = started_with_a_waiting_request(&rt, 1).await;
    run.send("go", "now").await.unwrap();
    let second = next_of(&rt, run.id()).await;
    rt.get_run(&second).send("go", "now").await.unwrap();
    let want = vec![format!("{MARKER}-m0")];
    assert_eq!(run.return_value().await.unwrap(), want);
    asking.await.unwrap().unwrap();
    let last = chain(&rt, run.id()).await.pop().unwrap();

    // Read with the keys, as `workflow show --keys` does.
    let mut events = rt.store().events(&last.id).await.unwrap();
    rt.reveal_history(&last, &mut events);
    let opened = events.iter().any(|e| {
        matches!(&e.event, Event::MessageReceived { payload, .. }
            if *payload == serde_json::json!(format!("{MARKER}-m0")))
    });
    assert!(
        opened,
        "the message opens for a reader with the keys: {events:?}"
    );

    // A decrypted export, and its replay against this build's code.
    let exported = rt.get_run(&last.id).export().await.unwrap();
    assert_eq!(exported["run"]["origin"], run.id().to_string());
    workflow_core::testing::replay_with_keys(late_reader, &exported, &keys_a()).unwrap();
    let decrypted = rt.get_run(&last.id).export_decrypted().await.unwrap();
    assert!(decrypted
        .to_string()
        .contains(&format!("{MARKER}-ask-reply")));

    // Rekey under a new key; then the new key alone reads the chain through any run.
    rt.shutdown();
    let rotated = Keys::new().current("chain-B", KEY_B).old("chain-A", KEY_A);
    let admin = runtime(&db, rotated, false).await;
    let report = admin.rekey(RekeyOptions::new()).await.unwrap();
    assert!(report.complete() && report.rewritten() > 0, "{report:?}");
    admin.shutdown();
    let only_b = runtime(&db, Keys::new().current("chain-B", KEY_B), true).await;
    let again = only_b.get_run(&run.id()).typed::<Vec<String>>();
    assert_eq!(again.return_value().await.unwrap(), want);
    let mut events = only_b.store().events(&last.id).await.unwrap();
    only_b.reveal_history(&last, &mut events);
    let reply_opened = events.iter().any(|e| {
        matches!(&e.event, Event::RequestReplied { reply: Ok(v), .. }
            if *v == serde_json::json!(format!("{MARKER}-ask-reply")))
    });
    assert!(
        reply_opened,
        "the reply opens under the new key: {events:?}"
    );

    // A message of the chain copied into an unrelated run's inbox does not open there.
    let sealed = only_b
        .store()
        .events(&last.id)
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::MessageReceived { payload, .. } => Some(payload),
            _ => None,
        })
        .unwrap();
    let other = only_b.start(one_message, ()).await.unwrap();
    let copied = NewMessage {
        topic: "m".to_owned(),
        payload: sealed,
        idempotency_key: None,
        at: std::time::SystemTime::now(),
    };
    only_b
        .store()
        .send_message(&other.id(), copied)
        .await
        .unwrap();
    // A send through the client wakes the run's driver, which then reads both; a store that
    // pushes its notices (PostgreSQL) may have woken it already, and the run may have failed
    // before the nudge arrives.
    match other.send("nudge", 1).await {
        Ok(()) | Err(RunError::Ended { .. }) => {}
        Err(e) => panic!("the nudge: {e}"),
    }
    let err = tokio::time::timeout(Duration::from_secs(20), other.return_value())
        .await
        .expect("the unrelated run ends")
        .unwrap_err();
    assert!(
        err.to_string().contains("does not decrypt"),
        "an unrelated run cannot read the chain's message: {err}"
    );
    only_b.shutdown();
}

/// A handle on a later run of a chain (from `get_run`, which does not know whose chain it
/// is) reads the run's record once for everything it seals, not once per send.
async fn a_handle_reads_its_chain_once(backend: Backend) {
    use std::sync::atomic::Ordering::SeqCst;
    let db = TestDb::new(backend);
    let rt = runtime(&db, keys_a(), true).await;
    let store = common::FailingAdmissions::new(db.open_store().await, 0);
    let client = db
        .builder()
        .store(store.clone())
        .encryption(keys_a())
        .worker(false)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("client builds");
    let run = rt.start(late_reader, (0, 3)).await.unwrap();
    run.send("go", "now").await.unwrap();
    let second = next_of(&rt, run.id()).await;
    let handle = client.get_run(&second);
    let reads = store.run_reads.load(SeqCst);
    for i in 0..3 {
        handle.send("m", format!("{MARKER}-m{i}")).await.unwrap();
    }
    handle.send("go", "now").await.unwrap();
    assert_eq!(
        store.run_reads.load(SeqCst),
        reads + 1,
        "one read for four sends"
    );
    // The run has continued since: the request follows the chain (reading where it went).
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        handle.request::<String, String>("ask", format!("{MARKER}-ask")),
    )
    .await
    .expect("answered within 10 s")
    .unwrap();
    assert_eq!(reply, format!("{MARKER}-ask-reply"));
    let got = tokio::time::timeout(Duration::from_secs(10), run.return_value())
        .await
        .expect("the chain ends within 10 s")
        .unwrap();
    assert_eq!(
        got,
        (0..3).map(|i| format!("{MARKER}-m{i}")).collect::<Vec<_>>()
    );
    client.shutdown();
    rt.shutdown();
}

on_every_store!(
    what_waits_at_the_seam_is_read_by_the_next_run,
    an_event_set_before_the_seam_is_read_after_it,
    a_parent_reads_the_end_of_an_encrypted_child_chain,
    every_reader_opens_a_chains_payloads_and_no_other_run_does,
    a_handle_reads_its_chain_once,
);
