//! Continue-as-new on every store: chains of runs that keep a hook token owned
//! throughout while payloads stream in, messages and requests sent across the seam, a parent
//! awaiting a child that continues, `return_value` on a chain's first run, and a
//! concurrency-1 queue held by a chain from its first run to its last.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Backend;
use workflow_core::prelude::*;
use workflow_core::store::Event;
use workflow_core::Queue;

// ---------------------------------------------------------------------------------------------
// Workflows

/// Continues as itself `n` times, then returns 42.
#[workflow]
async fn count_down(n: u32) -> Result<u32> {
    if n == 0 {
        return Ok(42);
    }
    continue_as_new(count_down, (n - 1,)).await
}

/// Starts `count_down(n)` as a child and adds one to its result.
#[workflow]
async fn parent_of_chain(n: u32) -> Result<u32> {
    let child = start_child(count_down, (n,)).await?;
    Ok(child.result().await? + 1)
}

/// Run `k` of a chain of `runs` runs receives payloads on `token` until it has
/// `total * (k + 1) / runs` of them, then continues as run `k + 1`; the last returns all.
#[workflow]
async fn hook_chain(
    token: String,
    k: u32,
    runs: u32,
    total: u32,
    mut got: Vec<u32>,
) -> Result<Vec<u32>> {
    let mut hook = create_hook::<u32>(token.clone());
    let until = (u64::from(total) * u64::from(k + 1) / u64::from(runs)) as usize;
    while got.len() < until {
        got.push(hook.recv().await?);
    }
    if k + 1 == runs {
        return Ok(got);
    }
    continue_as_new(hook_chain, (token, k + 1, runs, total, got)).await
}

/// Each run receives one message on "m"; `left` more runs follow.
#[workflow]
async fn mailbox(left: u32, mut got: Vec<String>) -> Result<Vec<String>> {
    got.push(recv::<String>("m").await?);
    if left == 0 {
        return Ok(got);
    }
    continue_as_new(mailbox, (left - 1, got)).await
}

/// The first run waits for "go" and continues without reading its requests; the next run
/// answers one request (doubling it) and returns what it answered.
#[workflow]
async fn deferring(first: bool) -> Result<u32> {
    if first {
        recv::<String>("go").await?;
        return continue_as_new(deferring, (false,)).await;
    }
    let mut asks = requests::<u32, u32>("ask");
    let Some(req) = futures::StreamExt::next(&mut asks).await else {
        return Err(Error::fatal("the requests stream ended"));
    };
    let x = *req.body();
    req.reply(x * 2)?;
    Ok(x)
}

#[step]
async fn wall_ms() -> Result<u64> {
    Ok(SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64)
}

/// Sleeps a little in each of its `left + 1` runs; the last returns the wall clock.
#[workflow]
async fn slow_chain(left: u32) -> Result<u64> {
    sleep(Duration::from_millis(20)).await;
    if left == 0 {
        return wall_ms().await;
    }
    continue_as_new(slow_chain, (left - 1,)).await
}

/// Returns the wall clock when it begins.
#[workflow]
async fn queued_marker() -> Result<u64> {
    wall_ms().await
}

/// Takes one payload from `token`, then waits on the gate hook `gate` (once per run), then
/// continues as new until it has `total` payloads.
#[workflow]
async fn gated_chain(
    token: String,
    gate: String,
    total: u32,
    mut got: Vec<u32>,
) -> Result<Vec<u32>> {
    let mut hook = create_hook::<u32>(token.clone());
    got.push(hook.recv().await?);
    if got.len() as u32 == total {
        return Ok(got);
    }
    let mut g = create_hook::<String>(format!("{gate}-{}", got.len()));
    g.recv().await?;
    drop(g);
    continue_as_new(gated_chain, (token, gate, total, got)).await
}

/// Takes one payload from `token` per run and continues after each until it has `total`.
#[workflow]
async fn one_per_round(token: String, total: u32, mut got: Vec<u32>) -> Result<Vec<u32>> {
    let mut hook = create_hook::<u32>(token.clone());
    got.push(hook.recv().await?);
    if got.len() as u32 == total {
        return Ok(got);
    }
    continue_as_new(one_per_round, (token, total, got)).await
}

/// The first run takes one payload, then polls a second `recv` once and drops it (as a
/// `select` that another branch won would): the payload delivered to it is not taken before
/// the run continues. The next run takes one payload and returns all it has.
#[workflow]
async fn dropped_recv(token: String, first: bool, mut got: Vec<u32>) -> Result<Vec<u32>> {
    let mut hook = create_hook::<u32>(token.clone());
    got.push(hook.recv().await?);
    if !first {
        return Ok(got);
    }
    {
        let mut lost = std::pin::pin!(hook.recv());
        let _ = futures::poll!(lost.as_mut());
    }
    sleep(Duration::from_millis(200)).await;
    continue_as_new(dropped_recv, (token, false, got)).await
}

// ---------------------------------------------------------------------------------------------
// Tests

/// The chain of runs from `first`, following `next_run`, with their records.
async fn chain(rt: &Runtime, first: RunId) -> Vec<workflow_core::RunRecord> {
    let mut out = Vec::new();
    let mut id = Some(first);
    while let Some(i) = id {
        let r = rt.get_run(&i).info().await.unwrap();
        id = r.next_run;
        out.push(r);
    }
    out
}

async fn return_value_on_the_first_run_waits_for_the_chain(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db.runtime().await;
    let run = rt.start(count_down, (5,)).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), 42);
    let runs = chain(&rt, run.id()).await;
    assert_eq!(runs.len(), 6, "five continuations, six runs");
    for (i, r) in runs.iter().enumerate() {
        let last = i + 1 == runs.len();
        let want = if last {
            RunStatus::Completed
        } else {
            RunStatus::ContinuedAsNew
        };
        assert_eq!(r.status, want, "run {i}");
        assert_eq!(r.previous_run, (i > 0).then(|| runs[i - 1].id), "run {i}");
        let events = rt.get_run(&r.id).export().await.unwrap();
        let last_event = &events["events"].as_array().unwrap().last().unwrap()["event"];
        if !last {
            assert_eq!(last_event["type"], "run_continued_as_new");
            assert_eq!(last_event["next_run"], r.next_run.unwrap().to_string());
        }
    }
    // Any run of the chain gives the chain's value.
    let middle = rt.get_run(&runs[2].id).typed::<u32>();
    assert_eq!(middle.return_value().await.unwrap(), 42);
    rt.shutdown();
}

async fn a_hook_token_stays_owned_through_100_continuations(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db.runtime().await;
    let token = format!("chain-{}", RunId::new());
    let (runs, total) = (101, 1_000);
    let run = rt
        .start(hook_chain, (token.clone(), 0, runs, total, Vec::new()))
        .hook(&token)
        .await
        .unwrap();
    // Another task resumes the token 1,000 times while the chain continues 100 times: the
    // token never lacks an owner, so no resume is refused.
    let sender = {
        let (rt, token) = (rt.clone(), token.clone());
        tokio::spawn(async move {
            for i in 0..total {
                let sent = rt.resume_hook(&token, i).await;
                if let Err(e) = sent {
                    panic!("resume {i} refused during the chain: {e}");
                }
            }
        })
    };
    let got = run.return_value().await.unwrap();
    sender.await.unwrap();
    assert_eq!(
        got,
        (0..total).collect::<Vec<_>>(),
        "each payload once, in order"
    );
    let records = chain(&rt, run.id()).await;
    assert_eq!(records.len(), runs as usize);
    // Each payload is in exactly one run's history.
    let mut received = Vec::new();
    for r in &records {
        let events = rt.store().events(&r.id).await.unwrap();
        received.extend(events.into_iter().filter_map(|e| match e.event {
            Event::HookReceived { payload, .. } => payload.as_u64(),
            _ => None,
        }));
    }
    assert_eq!(received, (0..u64::from(total)).collect::<Vec<_>>());
    rt.shutdown();
}

async fn messages_sent_across_the_seam_reach_the_next_runs(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db.runtime().await;
    let run = rt.start(mailbox, (9, Vec::new())).await.unwrap();
    // All addressed to the first run: those sent after it continued go to the chain's
    // current run, those waiting in a run's inbox move with the chain.
    for i in 0..10 {
        run.send("m", format!("m{i}")).await.unwrap();
    }
    let got = run.return_value().await.unwrap();
    let want: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    assert_eq!(got, want);
    assert_eq!(chain(&rt, run.id()).await.len(), 10);
    rt.shutdown();
}

async fn an_open_request_is_answered_by_the_next_run(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db.runtime().await;
    let run = rt.start(deferring, (true,)).await.unwrap();
    let asking = {
        let run = run.clone();
        tokio::spawn(async move { run.request::<u32, u32>("ask", 21).await })
    };
    // The request is open in the first run before it continues.
    while rt.store().run_requests(&run.id()).await.unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    run.send("go", "now").await.unwrap();
    assert_eq!(asking.await.unwrap().unwrap(), 42, "the next run replied");
    assert_eq!(run.return_value().await.unwrap(), 21);
    let runs = chain(&rt, run.id()).await;
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].status, RunStatus::ContinuedAsNew);
    rt.shutdown();
}

async fn a_parent_awaiting_a_child_that_continues_gets_the_final_value(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db.runtime().await;
    let run = rt.start(parent_of_chain, (10,)).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), 43);
    rt.shutdown();
}

async fn a_concurrency_1_queue_admits_no_other_run_while_the_chain_lives(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .queue(Queue::new("one").concurrency(1))
        .build()
        .await
        .unwrap();
    let chain_run = rt.start(slow_chain, (5,)).queue("one").await.unwrap();
    // Admitted while the chain holds the queue's one slot.
    let marker = rt.start(queued_marker, ()).queue("one").await.unwrap();
    let chain_end = chain_run.return_value().await.unwrap();
    let marker_began = marker.return_value().await.unwrap();
    assert!(
        marker_began >= chain_end,
        "the other run began at {marker_began} ms, before the chain's last run ended at \
         {chain_end} ms"
    );
    assert_eq!(chain(&rt, chain_run.id()).await.len(), 6);
    rt.shutdown();
}

async fn requests_and_messages_sent_to_an_old_run_are_sealed_for_the_current_one(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .encryption(workflow_core::Keys::new().current("chain-key", [7u8; 32]))
        .build()
        .await
        .unwrap();
    let run = rt.start(deferring, (true,)).await.unwrap();
    run.send("go", "now").await.unwrap();
    while run.info().await.unwrap().next_run.is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Addressed to the first run, which continued: sealed again for the run that answers.
    let answer = run.request::<u32, u32>("ask", 21).await.unwrap();
    assert_eq!(answer, 42);
    assert_eq!(run.return_value().await.unwrap(), 21);
    rt.shutdown();
}

/// `f`, failing the test after 20 s (a lost payload leaves a chain waiting forever).
async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("the chain did not end within 20 s")
}

/// A payload accepted for the chain while its run waits on another hook is received by the
/// next run after the seam.
async fn a_payload_sent_while_the_run_waits_elsewhere_crosses_the_seam(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db.runtime().await;
    let token = format!("gated-{}", RunId::new());
    let gate = format!("gate-{}", RunId::new());
    let run = rt
        .start(gated_chain, (token.clone(), gate.clone(), 2, Vec::new()))
        .hook(&token)
        .await
        .unwrap();
    rt.resume_hook(&token, 1u32).await.unwrap();
    // The run took payload 1 and now waits on the gate: payload 2 is accepted for it
    // meanwhile, then the gate opens and the run continues.
    let gate_1 = format!("{gate}-1");
    while rt.get_hook_by_token(&gate_1).await.is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sent = rt.resume_hook(&token, 2u32).await.unwrap();
    assert_eq!(
        sent.run_id,
        run.id(),
        "the run that owns the token accepted it"
    );
    rt.resume_hook(&gate_1, "open").await.unwrap();
    let got = within(run.return_value()).await.unwrap();
    assert_eq!(got, vec![1, 2]);
    assert_eq!(chain(&rt, run.id()).await.len(), 2);
    rt.shutdown();
}

/// Payloads sent at once to a chain that takes one per run are each received by one run.
async fn payloads_sent_at_once_reach_one_run_each(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db.runtime().await;
    let token = format!("rounds-{}", RunId::new());
    // All three wait in the inbox when the first run begins.
    let run = rt
        .start(one_per_round, (token.clone(), 3, Vec::new()))
        .hook(&token)
        .delay(Duration::from_millis(300))
        .await
        .unwrap();
    for i in 1..=3u32 {
        rt.resume_hook(&token, i).await.unwrap();
    }
    let got = within(run.return_value()).await.unwrap();
    assert_eq!(got, vec![1, 2, 3]);
    assert_eq!(chain(&rt, run.id()).await.len(), 3);
    rt.shutdown();
}

/// A chain whose worker stops mid-chain ends on the worker that replaces it.
async fn a_chain_finishes_on_the_worker_that_replaces_a_stopped_one(backend: Backend) {
    let db = common::TestDb::new(backend);
    let token = format!("replaced-{}", RunId::new());
    let first = db.runtime_with_lease(Duration::from_millis(300)).await;
    let run = first
        .start(one_per_round, (token.clone(), 4, Vec::new()))
        .hook(&token)
        .await
        .unwrap();
    // Two payloads at once: the worker stops as soon as the chain has moved past its first
    // run, with the second payload not yet received.
    for i in 1..=2u32 {
        first.resume_hook(&token, i).await.unwrap();
    }
    while chain(&first, run.id()).await.len() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    first.shutdown();
    let second = db.runtime_with_lease(Duration::from_millis(300)).await;
    for i in 3..=4u32 {
        second.resume_hook(&token, i).await.unwrap();
    }
    let got = within(second.get_run(&run.id()).typed::<Vec<u32>>().return_value())
        .await
        .unwrap();
    assert_eq!(got, vec![1, 2, 3, 4]);
    second.shutdown();
}

/// A payload delivered to a `recv` the workflow dropped, and not taken since, goes to the
/// next run of the chain (the old run's history recorded its delivery).
async fn a_payload_delivered_to_a_dropped_recv_goes_to_the_next_run(backend: Backend) {
    let db = common::TestDb::new(backend);
    let rt = db.runtime().await;
    let token = format!("dropped-{}", RunId::new());
    let run = rt
        .start(dropped_recv, (token.clone(), true, Vec::new()))
        .hook(&token)
        .delay(Duration::from_millis(300))
        .await
        .unwrap();
    for i in 1..=2u32 {
        rt.resume_hook(&token, i).await.unwrap();
    }
    let got = within(run.return_value()).await.unwrap();
    assert_eq!(got, vec![1, 2]);
    let runs = chain(&rt, run.id()).await;
    assert_eq!(runs.len(), 2);
    let received = |events: Vec<workflow_core::store::EventRecord>| {
        events
            .into_iter()
            .filter(|e| matches!(e.event, Event::HookReceived { .. }))
            .count()
    };
    let first = rt.store().events(&runs[0].id).await.unwrap();
    assert_eq!(received(first), 2, "the first run recorded both deliveries");
    rt.shutdown();
}

on_every_store!(
    a_payload_delivered_to_a_dropped_recv_goes_to_the_next_run,
    a_payload_sent_while_the_run_waits_elsewhere_crosses_the_seam,
    payloads_sent_at_once_reach_one_run_each,
    a_chain_finishes_on_the_worker_that_replaces_a_stopped_one,
    requests_and_messages_sent_to_an_old_run_are_sealed_for_the_current_one,
    return_value_on_the_first_run_waits_for_the_chain,
    a_hook_token_stays_owned_through_100_continuations,
    messages_sent_across_the_seam_reach_the_next_runs,
    an_open_request_is_answered_by_the_next_run,
    a_parent_awaiting_a_child_that_continues_gets_the_final_value,
    a_concurrency_1_queue_admits_no_other_run_while_the_chain_lives,
);
