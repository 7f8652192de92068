//! Hooks and idempotent starts, run on every store.

mod common;

use std::collections::HashMap;
use std::future::IntoFuture;
use std::pin::pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{Backend, TestDb};
use futures::future::Either;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use workflow_core::prelude::*;
use workflow_core::store::Event;

/// A hook payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Note {
    text: String,
}

fn note(text: impl Into<String>) -> Note {
    Note { text: text.into() }
}

/// What an order run returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// It handled the order, with these notes.
    Processed(String),
    /// Another run owns the order.
    Duplicate(RunId),
}

/// Polls until `token` is owned by an active hook; returns the owner.
async fn owner_of(rt: &Runtime, token: &str) -> RunId {
    loop {
        if let Ok(h) = rt.get_hook_by_token(token).await {
            return h.run_id;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls until run `id` recorded its hook registration.
async fn registered(rt: &Runtime, id: RunId) {
    loop {
        let events = rt.store().events(&id).await.unwrap();
        if events
            .iter()
            .any(|e| matches!(e.event, Event::HookRegistered { .. }))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn wait_status(run: &Run<impl Sized>, status: RunStatus) {
    while run.status().await.unwrap() != status {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------------------------

/// Checks for a conflict, then processes the first note.
#[workflow]
async fn checked(token: String) -> Result<Outcome> {
    let mut hook = create_hook::<Note>(token);
    if let Some(conflict) = hook.get_conflict().await {
        return Ok(Outcome::Duplicate(conflict.run_id));
    }
    let n = hook.recv().await?;
    Ok(Outcome::Processed(n.text))
}

/// Reads without checking: a conflict fails the run.
#[workflow]
async fn unchecked(token: String) -> Result<Outcome> {
    let mut hook = create_hook::<Note>(token);
    let n = hook.recv().await?;
    Ok(Outcome::Processed(n.text))
}

async fn two_runs_one_token(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("order:{}", RunId::new());
    let first = rt.start(checked, (token.clone(),)).await.unwrap();
    assert_eq!(owner_of(&rt, &token).await, first.id());

    let dup = rt.start(checked, (token.clone(),)).await.unwrap();
    assert_eq!(
        dup.return_value().await.unwrap(),
        Outcome::Duplicate(first.id())
    );

    let bad = rt.start(unchecked, (token.clone(),)).await.unwrap();
    let err = bad.return_value().await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&token) && msg.contains(&first.id().to_string()),
        "{msg}"
    );
    assert_eq!(
        err.as_hook_conflict().unwrap().conflicting_run_id,
        first.id()
    );
    assert_eq!(bad.status().await.unwrap(), RunStatus::Failed);

    // The first still owns the token and completes.
    let r = rt.resume_hook(&token, note("confirmed")).await.unwrap();
    assert_eq!(r.run_id, first.id());
    assert_eq!(
        first.return_value().await.unwrap(),
        Outcome::Processed("confirmed".into())
    );
}

#[step]
async fn noop_step() -> Result<()> {
    Ok(())
}

/// Owns the token briefly, disposes it, then keeps running for a while.
#[workflow]
async fn disposes_early(token: String) -> Result<()> {
    let mut hook = create_hook::<Note>(token);
    assert!(hook.get_conflict().await.is_none());
    hook.dispose();
    noop_step().await?;
    sleep(Duration::from_secs(3600)).await;
    Ok(())
}

async fn tokens_are_reused_after_completion_dispose_and_cancel(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;

    // After completion.
    let token = format!("reuse:{}", RunId::new());
    let a = rt.start(checked, (token.clone(),)).await.unwrap();
    owner_of(&rt, &token).await;
    rt.resume_hook(&token, note("one")).await.unwrap();
    a.return_value().await.unwrap();
    assert!(rt
        .get_hook_by_token(&token)
        .await
        .unwrap_err()
        .as_not_found()
        .is_some());
    let b2 = rt.start(checked, (token.clone(),)).await.unwrap();
    assert_eq!(owner_of(&rt, &token).await, b2.id());
    rt.resume_hook(&token, note("two")).await.unwrap();
    assert_eq!(
        b2.return_value().await.unwrap(),
        Outcome::Processed("two".into())
    );

    // After an explicit dispose while the owner still runs.
    let token = format!("dispose:{}", RunId::new());
    let owner = rt.start(disposes_early, (token.clone(),)).await.unwrap();
    loop {
        let events = rt.store().events(&owner.id()).await.unwrap();
        if events
            .iter()
            .any(|e| matches!(e.event, Event::HookReleased { .. }))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let next = rt.start(checked, (token.clone(),)).await.unwrap();
    assert_eq!(owner_of(&rt, &token).await, next.id());
    assert_eq!(owner.status().await.unwrap(), RunStatus::Running);
    rt.resume_hook(&token, note("three")).await.unwrap();
    assert_eq!(
        next.return_value().await.unwrap(),
        Outcome::Processed("three".into())
    );
    owner.cancel().await.unwrap();

    // After cancel: the token is free as soon as cancel() returns.
    let token = format!("cancel:{}", RunId::new());
    let victim = rt.start(checked, (token.clone(),)).await.unwrap();
    owner_of(&rt, &token).await;
    victim.cancel().await.unwrap();
    assert!(
        rt.get_hook_by_token(&token).await.is_err(),
        "released with the cancel"
    );
    let heir = rt.start(checked, (token.clone(),)).await.unwrap();
    assert_eq!(owner_of(&rt, &token).await, heir.id());
    rt.resume_hook(&token, note("four")).await.unwrap();
    assert_eq!(
        heir.return_value().await.unwrap(),
        Outcome::Processed("four".into())
    );
}

async fn resume_before_registration_and_the_route_pattern(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("route:{}", RunId::new());
    let err = rt.resume_hook(&token, note("early")).await.unwrap_err();
    assert_eq!(err.as_not_found().unwrap().token, token);
    assert!(err.to_string().contains(&token));

    // The usual route: resume; else start, then retry the resume until the hook exists.
    let started = rt.start(checked, (token.clone(),)).await.unwrap();
    let mut delivered = None;
    for _ in 0..500 {
        match rt.resume_hook(&token, note("routed")).await {
            Ok(r) => {
                delivered = Some(r);
                break;
            }
            Err(HookError::NotFound(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(delivered.unwrap().run_id, started.id());
    assert_eq!(
        started.return_value().await.unwrap(),
        Outcome::Processed("routed".into())
    );

    // Invalid tokens are clear errors.
    assert!(matches!(
        rt.resume_hook("", note("x")).await,
        Err(HookError::InvalidToken(_))
    ));
    let long = "t".repeat(1025);
    assert!(matches!(
        rt.start(checked, (long.clone(),)).hook(&long).await,
        Err(StartError::InvalidToken(_))
    ));
}

/// A token with a control character is refused at every entry point with an error naming the
/// rule, before anything is written; inside a workflow it fails the run instead of looping.
async fn tokens_with_control_characters_are_refused(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    for bad in ["order\0:1", "order:\u{1b}[31m", "line\nbreak", "c1\u{85}"] {
        match rt.resume_hook(bad, note("x")).await {
            Err(HookError::InvalidToken(why)) => assert!(why.contains("control"), "{why}"),
            other => panic!("resume_hook({bad:?}): {other:?}"),
        }
        assert!(matches!(
            rt.get_hook_by_token(bad).await,
            Err(HookError::InvalidToken(_))
        ));
        assert!(matches!(
            rt.start(checked, (bad.to_owned(),)).hook(bad).await,
            Err(StartError::InvalidToken(_))
        ));
    }
    let listed = rt
        .store()
        .list_runs(&workflow_core::store::RunFilter::new())
        .await
        .unwrap();
    assert!(
        listed.is_empty(),
        "a refused start writes nothing: {listed:?}"
    );

    let run = rt.start(checked, ("order\0:2".to_owned(),)).await.unwrap();
    let err = common::bounded(run.return_value()).await.unwrap_err();
    assert!(err.to_string().contains("control characters"), "{err}");
    assert_eq!(run.status().await.unwrap(), RunStatus::Failed);
}

// ---------------------------------------------------------------------------------------------
// Atomic start

#[step]
async fn record_note(order: String, text: String) -> Result<()> {
    notes().lock().unwrap().entry(order).or_default().push(text);
    Ok(())
}

fn notes() -> &'static Mutex<HashMap<String, Vec<String>>> {
    static N: OnceLock<Mutex<HashMap<String, Vec<String>>>> = OnceLock::new();
    N.get_or_init(Default::default)
}

/// An announcement workflow: record the start note, then every update in order.
#[workflow]
async fn process_order(order_id: String, note_text: String, expect: u32) -> Result<u32> {
    record_note(order_id.clone(), note_text).await?;
    let mut updates = create_hook::<Note>(format!("order:{order_id}"));
    assert!(
        updates.get_conflict().await.is_none(),
        "bound to the start token"
    );
    let mut seen = 1;
    while seen < expect {
        let update = updates.next().await.expect("hook streams never end")?;
        record_note(order_id.clone(), update.text).await?;
        seen += 1;
    }
    Ok(seen)
}

async fn atomic_start_under_contention(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let order = RunId::new().to_string();
    let token = format!("order:{order}");
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let rt = rt.clone();
            let (order, token) = (order.clone(), token.clone());
            tokio::spawn(async move {
                // The winner waits for one update, so it stays active through the storm.
                rt.start(process_order, (order, format!("n{i}"), 2))
                    .hook(token)
                    .await
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut conflicts = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(run) => winners.push(run),
            Err(StartError::HookConflict(c)) => conflicts.push(c),
            Err(e) => panic!("{e}"),
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(winners.len(), 1, "exactly one run");
    assert_eq!(conflicts.len(), 199);
    let winner = winners[0].id();
    assert!(conflicts
        .iter()
        .all(|c| c.conflicting_run_id == winner && c.token == token));
    println!(
        "{b:?}: 200 concurrent starts: 1 run, {} conflicts, {elapsed:?}",
        conflicts.len()
    );
    rt.resume_hook(&token, note("update")).await.unwrap();
    assert_eq!(winners[0].return_value().await.unwrap(), 2);
    assert_eq!(
        notes().lock().unwrap()[&order].len(),
        2,
        "only the winner's workflow ran"
    );
}

/// Receives on the start token until it has `expect` payloads; returns them in order.
#[workflow]
async fn collect_payloads(token: String, expect: usize) -> Result<Vec<u64>> {
    let mut hook = create_hook::<u64>(token);
    let mut got = Vec::new();
    while got.len() < expect {
        got.push(hook.recv().await?);
    }
    Ok(got)
}

/// 200 concurrent `.or_resume` calls of one token (the in-process start flight
/// included): one run, which receives the 199 other calls' payloads, each exactly once, and
/// no call sees the token owned without a hook to take its payload.
async fn or_resume_under_contention(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("tally:{}", RunId::new());
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..200u64)
        .map(|i| {
            let (rt, token) = (rt.clone(), token.clone());
            tokio::spawn(async move {
                let outcome = rt
                    .start(collect_payloads, (token.clone(), 199))
                    .hook(token)
                    .or_resume(i)
                    .await;
                (i, outcome)
            })
        })
        .collect();
    let mut started_runs = Vec::new();
    let mut resumed = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (i, Ok(StartOrResume::Started(run))) => started_runs.push((i, run)),
            (i, Ok(StartOrResume::Resumed(hook))) => resumed.push((i, hook)),
            (i, Err(e)) => panic!("call {i}: {e}"),
        }
    }
    assert_eq!(started_runs.len(), 1, "exactly one run");
    let (first, run) = started_runs.pop().unwrap();
    assert_eq!(resumed.len(), 199);
    assert!(resumed
        .iter()
        .all(|(_, h)| h.run_id == run.id() && h.token == token));
    let mut got = tokio::time::timeout(Duration::from_secs(60), run.return_value())
        .await
        .expect("the run received its payloads in time")
        .unwrap();
    let elapsed = started.elapsed();
    got.sort_unstable();
    let want: Vec<u64> = (0..200).filter(|i| *i != first).collect();
    assert_eq!(got, want, "every other call's payload, exactly once");
    println!(
        "{b:?}: 200 concurrent or_resume calls: 1 run, {} payloads delivered once, {elapsed:?}",
        got.len()
    );
}

/// `.or_resume` on a token retained by an ended run is a conflict naming it, and sends
/// nothing; without `.hook(..)` it is refused.
async fn or_resume_conflicts_with_a_retained_token(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("kept:{}", RunId::new());
    let run = rt
        .start(never_opens_the_hook, (7,))
        .hook(&token)
        .min_retention(Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(run.return_value().await.unwrap(), 7);
    match rt
        .start(never_opens_the_hook, (8,))
        .hook(&token)
        .or_resume(1u64)
        .await
    {
        Err(StartError::HookConflict(c)) => assert_eq!(c.conflicting_run_id, run.id()),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(
        rt.start(never_opens_the_hook, (9,)).or_resume(1u64).await,
        Err(StartError::InvalidToken(_))
    ));
}

async fn early_payloads_are_buffered_in_order(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime_with_lease(Duration::from_secs(30)).await;
    // A client-only runtime on the same store admits the run and sends the payloads while
    // no worker has looked at the run yet: stop the worker first.
    rt.shutdown();
    let order = RunId::new().to_string();
    let token = format!("order:{order}");
    let run = rt
        .start(process_order, (order.clone(), "first".into(), 21))
        .hook(&token)
        .await
        .unwrap();
    for i in 0..20 {
        let r = rt.resume_hook(&token, note(format!("u{i}"))).await.unwrap();
        assert_eq!(r.run_id, run.id());
    }
    assert_eq!(
        run.status().await.unwrap(),
        RunStatus::Pending,
        "no worker ran it yet"
    );
    let worker = db.runtime().await;
    assert_eq!(
        worker
            .get_run(&run.id())
            .typed::<u32>()
            .return_value()
            .await
            .unwrap(),
        21
    );
    let got = notes().lock().unwrap()[&order].clone();
    let want: Vec<String> = std::iter::once("first".to_string())
        .chain((0..20).map(|i| format!("u{i}")))
        .collect();
    assert_eq!(got, want);
    let events = worker.store().events(&run.id()).await.unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.event, Event::HookRegistered { .. })),
        "binding to the claimed token records no registration"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e.event, Event::HookReceived { .. }))
            .count(),
        20
    );
}

#[workflow]
async fn never_opens_the_hook(x: u64) -> Result<u64> {
    noop_step().await?;
    Ok(x)
}

async fn retention_refuses_late_duplicates(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("retained:{}", RunId::new());
    let first = rt
        .start(never_opens_the_hook, (7,))
        .hook(&token)
        .min_retention(Duration::from_millis(1500))
        .await
        .unwrap();
    assert_eq!(
        first.return_value().await.unwrap(),
        7,
        "a workflow that never opens its hook completes"
    );
    match rt.start(never_opens_the_hook, (8,)).hook(&token).await {
        Err(StartError::HookConflict(c)) => {
            assert_eq!(c.conflicting_run_id, first.id());
            let original = rt
                .get_run(&c.conflicting_run_id)
                .typed::<u64>()
                .return_value()
                .await
                .unwrap();
            assert_eq!(original, 7);
        }
        other => panic!("a late duplicate inside the window must be refused: {other:?}"),
    }
    assert!(
        rt.resume_hook(&token, note("late")).await.is_err(),
        "a retained token takes no payload"
    );
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let again = rt
        .start(never_opens_the_hook, (9,))
        .hook(&token)
        .await
        .unwrap();
    assert_eq!(again.return_value().await.unwrap(), 9);
}

/// Collects `n` payloads, racing each `recv()` against a short durable sleep.
#[workflow]
async fn races_hook_and_sleep(token: String, n: u32) -> Result<(Vec<String>, u32)> {
    let mut hook = create_hook::<Note>(token);
    let mut got = Vec::new();
    let mut timeouts = 0;
    while got.len() < n as usize {
        let recv = pin!(hook.recv());
        let tick = pin!(sleep(Duration::from_millis(15)));
        match futures::future::select(recv, tick).await {
            Either::Left((note, _)) => got.push(note?.text),
            Either::Right(((), _)) => timeouts += 1,
        }
    }
    Ok((got, timeouts))
}

async fn a_hook_raced_against_sleep_loses_nothing(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("race:{}", RunId::new());
    let run = rt
        .start(races_hook_and_sleep, (token.clone(), 30))
        .await
        .unwrap();
    owner_of(&rt, &token).await;
    for i in 0..30u64 {
        rt.resume_hook(&token, note(format!("p{i}"))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(i % 4 * 7)).await;
    }
    let (got, timeouts) = run.return_value().await.unwrap();
    assert_eq!(got, (0..30).map(|i| format!("p{i}")).collect::<Vec<_>>());
    assert!(timeouts > 0, "the sleep did win some races");
}

#[workflow]
async fn typed_payloads(token: String) -> Result<Vec<String>> {
    let mut hook = create_hook::<Note>(token);
    let mut out = Vec::new();
    for _ in 0..2 {
        match hook.recv().await {
            Ok(n) => out.push(format!("ok:{}", n.text)),
            Err(e) => out.push(format!("err:{e}")),
        }
    }
    Ok(out)
}

async fn a_payload_of_the_wrong_shape_is_an_error_in_the_workflow(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let token = format!("typed:{}", RunId::new());
    let run = rt.start(typed_payloads, (token.clone(),)).await.unwrap();
    owner_of(&rt, &token).await;
    rt.resume_hook(&token, serde_json::json!({"unexpected": 42}))
        .await
        .unwrap();
    rt.resume_hook(&token, note("fine")).await.unwrap();
    let out = run.return_value().await.unwrap();
    assert!(
        out[0].starts_with("err:") && out[0].contains("does not fit"),
        "{out:?}"
    );
    assert_eq!(out[1], "ok:fine");
    let events = rt.store().events(&run.id()).await.unwrap();
    assert!(events.iter().any(
        |e| matches!(&e.event, Event::HookReceived { payload, .. } if payload["unexpected"] == 42)
    ));
}

/// A hook whose payloads arrive while the run is evicted: the payload wakes it.
#[workflow]
async fn waits_long_for_a_note(token: String) -> Result<String> {
    let mut hook = create_hook::<Note>(token);
    Ok(hook.recv().await?.text)
}

async fn a_payload_wakes_an_evicted_run(b: Backend) {
    let db = TestDb::new(b);
    let rt = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .evict_after(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let token = format!("evicted:{}", RunId::new());
    let run = rt
        .start(waits_long_for_a_note, (token.clone(),))
        .await
        .unwrap();
    owner_of(&rt, &token).await;
    while rt.active_runs() > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rt.resume_hook(&token, note("wake up")).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), "wake up");
}

#[workflow]
async fn generated_token() -> Result<(String, String)> {
    let mut hook = create_generated_hook::<Note>();
    let token = hook.token().to_owned();
    assert!(hook.get_conflict().await.is_none());
    let n = hook.recv().await?;
    Ok((token, n.text))
}

async fn generated_tokens_are_unique_and_usable(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let run = rt.start(generated_token, ()).await.unwrap();
    let token = loop {
        let events = rt.store().events(&run.id()).await.unwrap();
        if let Some(t) = events.iter().find_map(|e| match &e.event {
            Event::HookRegistered { token, .. } => Some(token.clone()),
            _ => None,
        }) {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(token.starts_with(&run.id().to_string()));
    rt.resume_hook(&token, note("hi")).await.unwrap();
    assert_eq!(run.return_value().await.unwrap(), (token, "hi".to_string()));
}

/// Payloads survive a takeover: delivered ones are not delivered twice, pending ones arrive.
#[workflow]
async fn counts_notes(token: String, n: u32) -> Result<Vec<String>> {
    let mut hook = create_hook::<Note>(token);
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(hook.recv().await?.text);
        noop_step().await?;
    }
    Ok(got)
}

async fn payloads_are_delivered_once_across_a_takeover(b: Backend) {
    let db = TestDb::new(b);
    let rt1 = db.runtime_with_lease(Duration::from_millis(300)).await;
    let token = format!("takeover:{}", RunId::new());
    let run = rt1.start(counts_notes, (token.clone(), 6)).await.unwrap();
    owner_of(&rt1, &token).await;
    for i in 0..3 {
        rt1.resume_hook(&token, note(format!("n{i}")))
            .await
            .unwrap();
    }
    loop {
        let events = rt1.store().events(&run.id()).await.unwrap();
        if events
            .iter()
            .filter(|e| matches!(e.event, Event::HookReceived { .. }))
            .count()
            == 3
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rt1.shutdown();
    for i in 3..6 {
        rt1.resume_hook(&token, note(format!("n{i}")))
            .await
            .unwrap();
    }
    let rt2 = db.runtime_with_lease(Duration::from_millis(300)).await;
    let got = rt2
        .get_run(&run.id())
        .typed::<Vec<String>>()
        .return_value()
        .await
        .unwrap();
    assert_eq!(got, (0..6).map(|i| format!("n{i}")).collect::<Vec<_>>());
}

// ---------------------------------------------------------------------------------------------
// The usual conflict-handling strategies

#[step]
async fn owner_status(run_id: RunId) -> Result<RunStatus> {
    Ok(workflow_core::api::get_run(&run_id)?.status().await?)
}

#[step]
async fn owner_result(run_id: RunId) -> Result<Outcome> {
    workflow_core::api::get_run(&run_id)?
        .typed::<Outcome>()
        .return_value()
        .await
}

#[step]
async fn cancel_owner(run_id: RunId) -> Result<()> {
    workflow_core::api::get_run(&run_id)?.cancel().await?;
    Ok(())
}

#[step]
async fn forward_to_owner(token: String, payload: Note) -> Result<RunId> {
    Ok(workflow_core::api::resume_hook(token, payload)
        .await?
        .run_id)
}

#[workflow]
async fn adopt_owner_result(token: String) -> Result<Outcome> {
    let mut hook = create_hook::<Note>(token);
    if let Some(conflict) = hook.get_conflict().await {
        return owner_result(conflict.run_id).await;
    }
    Ok(Outcome::Processed(hook.recv().await?.text))
}

#[workflow]
async fn inspect_owner(token: String) -> Result<String> {
    let mut hook = create_hook::<Note>(token);
    if let Some(conflict) = hook.get_conflict().await {
        let status = owner_status(conflict.run_id).await?;
        if status == RunStatus::Running {
            return Ok(format!("duplicate of running {}", conflict.run_id));
        }
        return Ok(format!("owner already {status}"));
    }
    Ok(format!("processed {}", hook.recv().await?.text))
}

#[workflow]
async fn forward_duplicate(token: String, text: String) -> Result<String> {
    let mut hook = create_hook::<Note>(token.clone());
    if let Some(conflict) = hook.get_conflict().await {
        let to = forward_to_owner(token, note(text)).await?;
        assert_eq!(to, conflict.run_id);
        return Ok(format!("forwarded to {to}"));
    }
    Ok(format!("processed {}", hook.recv().await?.text))
}

#[workflow]
async fn newest_wins(token: String) -> Result<String> {
    for _attempt in 0..3 {
        let mut hook = create_hook::<Note>(token.clone());
        match hook.get_conflict().await {
            None => return Ok(format!("processed {}", hook.recv().await?.text)),
            Some(conflict) => cancel_owner(conflict.run_id).await?,
        }
    }
    Err(Error::fatal(format!(
        "could not claim {token} after cancelling the owner"
    )))
}

async fn conflict_strategies(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;

    // Reject the duplicate: `checked` above returns the owner's id (two_runs_one_token).
    // Adopt the owner's result.
    let token = format!("adopt:{}", RunId::new());
    let owner = rt.start(checked, (token.clone(),)).await.unwrap();
    owner_of(&rt, &token).await;
    let dup = rt
        .start(adopt_owner_result, (token.clone(),))
        .await
        .unwrap();
    // Let the duplicate meet the owner before the owner finishes (after, the token is free).
    registered(&rt, dup.id()).await;
    rt.resume_hook(&token, note("shared")).await.unwrap();
    let result = owner.return_value().await.unwrap();
    assert_eq!(dup.return_value().await.unwrap(), result);

    // Inspect the owner's status.
    let token = format!("inspect:{}", RunId::new());
    let owner = rt.start(checked, (token.clone(),)).await.unwrap();
    owner_of(&rt, &token).await;
    let dup = rt.start(inspect_owner, (token.clone(),)).await.unwrap();
    assert_eq!(
        dup.return_value().await.unwrap(),
        format!("duplicate of running {}", owner.id())
    );
    rt.resume_hook(&token, note("done")).await.unwrap();
    owner.return_value().await.unwrap();

    // Forward the payload to the owner.
    let token = format!("forward:{}", RunId::new());
    let owner = rt.start(checked, (token.clone(),)).await.unwrap();
    owner_of(&rt, &token).await;
    let dup = rt
        .start(
            forward_duplicate,
            (token.clone(), "from the duplicate".into()),
        )
        .await
        .unwrap();
    assert_eq!(
        dup.return_value().await.unwrap(),
        format!("forwarded to {}", owner.id())
    );
    assert_eq!(
        owner.return_value().await.unwrap(),
        Outcome::Processed("from the duplicate".into())
    );

    // Supersede the owner: newest wins.
    let token = format!("newest:{}", RunId::new());
    let old = rt.start(checked, (token.clone(),)).await.unwrap();
    owner_of(&rt, &token).await;
    let new = rt.start(newest_wins, (token.clone(),)).await.unwrap();
    assert!(old.return_value().await.unwrap_err().is_cancelled());
    assert_eq!(owner_of(&rt, &token).await, new.id());
    rt.resume_hook(&token, note("mine")).await.unwrap();
    assert_eq!(new.return_value().await.unwrap(), "processed mine");
    let _ = Arc::new(());
    wait_status(&new, RunStatus::Completed).await;
}

/// Duplicate starts in one process follow the start of their token in flight. When that start
/// is dropped before it answers, its admission still completes and answers them (they do not
/// wait forever for a future nobody polls), and the token ends with exactly one run.
async fn a_dropped_start_does_not_strand_its_duplicates(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.runtime().await;
    let order = RunId::new().to_string();
    let token = format!("order:{order}");
    let mut first = rt
        .start(process_order, (order.clone(), "first".to_owned(), 2))
        .hook(&token)
        .into_future();
    // One poll: the first start is now in flight (or, on a store that answers at once, done).
    let early = futures::poll!(first.as_mut());
    let duplicates: Vec<_> = (0..20)
        .map(|i| {
            let rt = rt.clone();
            let (order, token) = (order.clone(), token.clone());
            tokio::spawn(async move {
                rt.start(process_order, (order, format!("d{i}"), 2))
                    .hook(token)
                    .await
            })
        })
        .collect();
    tokio::task::yield_now().await;
    drop(first);
    let mut runs = Vec::new();
    for d in duplicates {
        match tokio::time::timeout(Duration::from_secs(10), d)
            .await
            .expect("a duplicate start was stranded")
            .unwrap()
        {
            Ok(run) => runs.push(run.id()),
            Err(StartError::HookConflict(c)) => runs.push(c.conflicting_run_id),
            Err(e) => panic!("{e}"),
        }
    }
    if let std::task::Poll::Ready(r) = early {
        runs.push(r.map(|run| run.id()).unwrap_or_else(|e| match e {
            StartError::HookConflict(c) => c.conflicting_run_id,
            e => panic!("{e}"),
        }));
    }
    runs.dedup();
    assert_eq!(runs.len(), 1, "one run owns the token: {runs:?}");
    let owner = rt.get_hook_by_token(&token).await.unwrap().run_id;
    assert_eq!(owner, runs[0]);
}

/// Duplicates of a start in flight wait for it instead of going to the store; when the store
/// refuses that start, it fails alone and its duplicates ask the store themselves: one of them
/// becomes the run, the others conflict with it.
async fn a_failed_start_hands_its_duplicates_to_the_store(b: Backend) {
    use std::sync::atomic::Ordering::SeqCst;

    let db = TestDb::new(b);
    let (store, rt) = common::failing_store(&db, 1).await;
    let order = RunId::new().to_string();
    let token = format!("order:{order}");
    let start = |n: String| {
        let rt = rt.clone();
        let (order, token) = (order.clone(), token.clone());
        tokio::spawn(async move { rt.start(process_order, (order, n, 2)).hook(token).await })
    };
    let first = start("first".to_owned());
    tokio::time::timeout(Duration::from_secs(10), async {
        while store.waiting.load(SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the first admission reached the store");
    let duplicates: Vec<_> = (0..20).map(|i| start(format!("d{i}"))).collect();
    // Were they asking the store, they would be answered now (only one admission fails).
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        duplicates.iter().all(|d| !d.is_finished()),
        "the duplicates follow the start in flight"
    );
    store.open_gate();
    match first.await.unwrap() {
        Err(StartError::Store(e)) => assert!(e.to_string().contains("injected"), "{e}"),
        other => panic!("expected the injected failure, got {other:?}"),
    }
    let (mut runs, mut conflicts) = (Vec::new(), Vec::new());
    for d in duplicates {
        match tokio::time::timeout(Duration::from_secs(10), d)
            .await
            .expect("a duplicate was stranded")
            .unwrap()
        {
            Ok(run) => runs.push(run.id()),
            Err(StartError::HookConflict(c)) => conflicts.push(c.conflicting_run_id),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(runs.len(), 1, "one duplicate became the run");
    assert_eq!(conflicts.len(), 19);
    assert!(conflicts.iter().all(|c| *c == runs[0]));
}

/// A payload over `max_payload_bytes` is refused before anything is written: no run, no
/// claimed token.
async fn or_resume_refuses_an_oversized_payload_before_writing(b: Backend) {
    let db = TestDb::new(b);
    let rt = db.builder().max_payload_bytes(256).build().await.unwrap();
    let token = format!("big:{}", RunId::new());
    let big = "x".repeat(300);
    match rt
        .start(never_opens_the_hook, (1,))
        .hook(&token)
        .or_resume(&big)
        .await
    {
        Err(StartError::TooLarge(e)) => assert!(e.what.contains(&token), "{e}"),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(matches!(
        rt.get_hook_by_token(&token).await,
        Err(HookError::NotFound(_))
    ));
    assert!(rt
        .store()
        .list_runs(&workflow_core::store::RunFilter::new())
        .await
        .unwrap()
        .iter()
        .all(|r| r.hook_token.as_deref() != Some(token.as_str())));
}

/// `.or_resume` calls that follow one in flight wait for it; when it fails, they go to the
/// store themselves: one of them starts the run and every other queues its own payload.
async fn or_resume_calls_following_a_failed_one_still_deliver(b: Backend) {
    use std::sync::atomic::Ordering::SeqCst;

    let db = TestDb::new(b);
    let (store, rt) = common::failing_store(&db, 1).await;
    let token = format!("tally:{}", RunId::new());
    let call = |n: u64| {
        let (rt, token) = (rt.clone(), token.clone());
        tokio::spawn(async move {
            rt.start(collect_payloads, (token.clone(), 19))
                .hook(token)
                .or_resume(n)
                .await
        })
    };
    let first = call(1000);
    tokio::time::timeout(Duration::from_secs(10), async {
        while store.waiting.load(SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the first call reached the store");
    let followers: Vec<_> = (0..20).map(call).collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        followers.iter().all(|d| !d.is_finished()),
        "the calls follow the one in flight"
    );
    store.open_gate();
    match first.await.unwrap() {
        Err(StartError::Store(e)) => assert!(e.to_string().contains("injected"), "{e}"),
        other => panic!("expected the injected failure, got {other:?}"),
    }
    let (mut runs, mut resumed) = (Vec::new(), Vec::new());
    for (i, d) in (0..20u64).zip(followers) {
        match tokio::time::timeout(Duration::from_secs(10), d)
            .await
            .expect("a call was stranded")
            .unwrap()
        {
            Ok(StartOrResume::Started(run)) => runs.push((i, run)),
            Ok(StartOrResume::Resumed(hook)) => resumed.push(hook.run_id),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(runs.len(), 1, "one call started the run");
    let (starter, run) = runs.pop().unwrap();
    assert!(resumed.iter().all(|owner| *owner == run.id()));
    let mut got = tokio::time::timeout(Duration::from_secs(30), run.return_value())
        .await
        .expect("the run received its payloads in time")
        .unwrap();
    got.sort_unstable();
    let want: Vec<u64> = (0..20).filter(|i| *i != starter).collect();
    assert_eq!(got, want);
}

on_every_store!(
    two_runs_one_token,
    tokens_are_reused_after_completion_dispose_and_cancel,
    resume_before_registration_and_the_route_pattern,
    tokens_with_control_characters_are_refused,
    atomic_start_under_contention,
    or_resume_under_contention,
    or_resume_conflicts_with_a_retained_token,
    or_resume_calls_following_a_failed_one_still_deliver,
    or_resume_refuses_an_oversized_payload_before_writing,
    a_dropped_start_does_not_strand_its_duplicates,
    a_failed_start_hands_its_duplicates_to_the_store,
    early_payloads_are_buffered_in_order,
    retention_refuses_late_duplicates,
    a_hook_raced_against_sleep_loses_nothing,
    a_payload_of_the_wrong_shape_is_an_error_in_the_workflow,
    a_payload_wakes_an_evicted_run,
    generated_tokens_are_unique_and_usable,
    payloads_are_delivered_once_across_a_takeover,
    conflict_strategies,
);
