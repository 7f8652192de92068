//! Bounded histories, on every store: `workflow_metadata()`'s `history_events` and
//! `history_bytes` grow as the run goes on and read the same at the same point on replay (a new
//! runtime replays the first half of a run and compares, from inside the body, with what the
//! live run recorded); `continue_as_new_suggested()` turns true past the soft limit set with
//! `history_limits`; a run past the hard limit fails, recorded like any failure, with an error
//! naming the limit; the bytes are the same with encryption and a codec as without.

mod common;

use std::time::Duration;

use common::{resume_when_ready, Backend, TestDb};
use workflow_core::prelude::*;
use workflow_core::store::{Event, EventRecord};
use workflow_core::{BuildError, Codec, PayloadContext};

// ---------------------------------------------------------------------------------------------
// Workflows

/// Echoes the history size it was called with (`pad` makes each call's payloads larger).
#[step]
async fn note(events: u64, bytes: u64, pad: String) -> Result<(u64, u64)> {
    let _ = pad;
    Ok((events, bytes))
}

/// The history size at this point of the body.
fn here() -> (u64, u64) {
    let m = workflow_metadata();
    (m.history_events, m.history_bytes)
}

/// Notes the history size `2 * rounds` times, waiting for a message on "go" halfway. Each
/// note's recorded result is the size the live run saw there: a replay that sees another size
/// at the same point fails the run, naming both.
#[workflow]
async fn measured(rounds: u32) -> Result<Vec<(u64, u64)>> {
    let mut seen = Vec::new();
    for i in 0..rounds * 2 {
        if i == rounds {
            recv::<u32>("go").await?;
        }
        let now = here();
        let recorded = note(now.0, now.1, "x".repeat(i as usize)).await?;
        if recorded != now {
            return Err(Error::fatal(format!(
                "call {i}: this execution sees {now:?}, the live run saw {recorded:?}"
            )));
        }
        seen.push(recorded);
    }
    seen.push(here());
    Ok(seen)
}

/// Whether the soft limit is past, and the history size, after each of `rounds` notes.
#[workflow]
async fn suggests(rounds: u32, pad: u32) -> Result<Vec<(u64, u64, bool)>> {
    let mut seen = Vec::new();
    for _ in 0..rounds {
        let (events, bytes) = here();
        seen.push((events, bytes, continue_as_new_suggested()));
        note(events, bytes, "p".repeat(pad as usize)).await?;
    }
    let (events, bytes) = here();
    seen.push((events, bytes, continue_as_new_suggested()));
    Ok(seen)
}

/// Holds a hook token, then notes for ever: only the hard limit ends it.
#[workflow]
async fn forever(token: String, pad: u32) -> Result<()> {
    let mut hook = create_hook::<u32>(token);
    if let Some(c) = hook.get_conflict().await {
        return Err(Error::fatal(format!("token taken by {}", c.run_id)));
    }
    loop {
        let (events, bytes) = here();
        note(events, bytes, "p".repeat(pad as usize)).await?;
    }
}

/// Fails its first attempt (a recorded error message), then succeeds.
#[step(max_retries = 2)]
async fn flaky_once(what: String) -> Result<String> {
    if step_metadata().attempt == 1 {
        return Err(Error::retryable(format!("first attempt at {what} fails"))
            .retry_after(Duration::from_millis(5)));
    }
    Ok(format!("{what} done"))
}

/// Always fails for good: its error message is its recorded result.
#[step]
async fn refuses(what: String) -> Result<()> {
    Err(Error::fatal(format!("{what} is refused")))
}

/// Goes through every kind of recorded payload, noting the history size after each.
#[workflow]
async fn many_kinds(token: String) -> Result<Vec<(u64, u64)>> {
    let mut seen = vec![here()];
    note(1, 2, "three".into()).await?;
    seen.push(here());
    flaky_once("the flaky step".into()).await?;
    seen.push(here());
    set_event("progress", &"half way".to_owned())?;
    let msg = recv::<String>("topic").await?;
    seen.push(here());
    let mut hook = create_hook::<String>(token);
    let payload = hook.recv().await?;
    seen.push(here());
    let _ = refuses(format!("{msg} and {payload}")).await;
    seen.push(here());
    Ok(seen)
}

// ---------------------------------------------------------------------------------------------
// Helpers

async fn runtime(db: &TestDb, soft: Option<(u64, u64)>) -> Runtime {
    let b = db
        .builder()
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Duration::from_millis(10))
        .lease(Duration::from_millis(500));
    let b = match soft {
        Some((events, bytes)) => b.history_limits(events, bytes),
        None => b,
    };
    b.build().await.expect("runtime builds")
}

async fn history(rt: &Runtime, run: RunId) -> Vec<EventRecord> {
    rt.store().events(&run).await.unwrap()
}

/// The bytes of payloads an unencrypted event holds, counted here from the stored event, as
/// `history_bytes` documents them: each value's JSON, each error's message.
fn payload_bytes(e: &Event) -> u64 {
    let json = |v: &serde_json::Value| serde_json::to_string(v).unwrap().len();
    let result = |r: &std::result::Result<serde_json::Value, Error>| match r {
        Ok(v) => json(v),
        Err(e) => e.message().len(),
    };
    (match e {
        Event::StepScheduled { input, .. } => json(input),
        Event::StepCompleted { result: r, .. } => result(r),
        Event::StepAttemptFailed { error, .. } => error.message().len(),
        Event::MessageReceived { payload, .. } | Event::HookReceived { payload, .. } => {
            json(payload)
        }
        Event::EventSet { value, .. } => json(value),
        Event::RunCompleted { output } => json(output),
        Event::RunFailed { error } => error.message().len(),
        _ => 0,
    }) as u64
}

/// (events, bytes) of `events` up to and including sequence number `seq`.
fn prefix(events: &[EventRecord], seq: u64) -> (u64, u64) {
    let upto = events.iter().filter(|e| e.seq <= seq);
    (
        upto.clone().count() as u64,
        upto.map(|e| payload_bytes(&e.event)).sum(),
    )
}

/// Waits until the run's history records `n` completed steps.
async fn until_completed_steps(rt: &Runtime, run: RunId, n: usize) {
    loop {
        let done = history(rt, run)
            .await
            .iter()
            .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
            .count();
        if done >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Cases

/// The sizes grow with every recorded step, match the stored history's prefix up to each
/// delivered result, and read the same when a new runtime replays the first half of the run
/// (the body compares them with the live run's, recorded in the steps' results).
async fn metadata_grows_and_replays_the_same(backend: Backend) {
    const ROUNDS: u32 = 8;
    let db = TestDb::new(backend);
    let first = runtime(&db, None).await;
    let id = first.start(measured, (ROUNDS,)).await.unwrap().id();
    until_completed_steps(&first, id, ROUNDS as usize).await;
    first.shutdown();
    drop(first);

    let second = runtime(&db, None).await;
    let run = second.get_run(&id).typed::<Vec<(u64, u64)>>();
    run.send("go", 1u32).await.expect("the message is stored");
    // A replay that reads another size returns early, which diverges from the history: the
    // run blocks instead of ending.
    let info = loop {
        let info = run.info().await.unwrap();
        if info.status.is_terminal() || info.status == RunStatus::Blocked {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        info.status,
        RunStatus::Completed,
        "every replayed point reads the size the live run saw: {:?}",
        info.error
    );
    let seen = run.return_value().await.unwrap();
    assert_eq!(seen.len(), ROUNDS as usize * 2 + 1);
    assert_eq!(
        seen[0],
        (0, 0),
        "nothing is delivered before the first line"
    );
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1),
        "{seen:?}"
    );

    // Each point stands at the prefix of the stored history up to the last result delivered
    // before it: a step's, or the message's (which comes right after a step's).
    let events = history(&second, run.id()).await;
    let is_message = |seq: u64| {
        matches!(
            events[seq as usize - 1].event,
            Event::MessageReceived { .. }
        )
    };
    let delivered: Vec<u64> = events
        .iter()
        .filter(|e| {
            matches!(
                e.event,
                Event::StepCompleted { .. } | Event::MessageReceived { .. }
            )
        })
        .map(|e| e.seq)
        .collect();
    let mut expected = vec![(0, 0)];
    for (k, seq) in delivered.iter().enumerate() {
        if !delivered.get(k + 1).is_some_and(|next| is_message(*next)) {
            expected.push(prefix(&events, *seq));
        }
    }
    assert_eq!(seen, expected);
}

/// `continue_as_new_suggested()` is false up to the soft limit and true past it, for events
/// and for bytes, the same on every store.
async fn suggested_past_the_soft_limit(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime(&db, Some((10, 1 << 20))).await;
    let seen = rt
        .start(suggests, (8, 0))
        .await
        .unwrap()
        .return_value()
        .await
        .unwrap();
    for (events, _, suggested) in &seen {
        assert_eq!(*suggested, *events > 10, "{seen:?}");
    }
    assert!(
        seen.iter().any(|s| !s.2) && seen.iter().any(|s| s.2),
        "{seen:?}"
    );
    rt.shutdown();
    drop(rt);

    let rt = runtime(&db, Some((1000, 200))).await;
    let seen = rt
        .start(suggests, (8, 30))
        .await
        .unwrap()
        .return_value()
        .await
        .unwrap();
    for (events, bytes, suggested) in &seen {
        assert!(*events <= 1000);
        assert_eq!(*suggested, *bytes > 200, "{seen:?}");
    }
    assert!(
        seen.iter().any(|s| !s.2) && seen.iter().any(|s| s.2),
        "{seen:?}"
    );
}

/// A run past the hard limit (5 times the soft one) fails, with an error naming the limit,
/// its figure and `continue_as_new`; the failure is recorded like any other (the history ends
/// with it, the token the run held is free again), and nothing before it is lost.
async fn a_run_past_the_hard_limit_fails(backend: Backend) {
    let db = TestDb::new(backend);
    // Soft: 4 events, so hard: 20.
    let rt = runtime(&db, Some((4, 1 << 20))).await;
    let token = format!("bounded-{}", RunId::new());
    let run = rt.start(forever, (token.clone(), 0)).await.unwrap();
    let err = run
        .return_value()
        .await
        .expect_err("the hard limit ends it");
    let msg = err.to_string();
    for part in [
        "past the hard limit of 20 events",
        "continue_as_new",
        "history_limits",
    ] {
        assert!(msg.contains(part), "{part:?} in {msg}");
    }
    assert!(err.is_fatal());
    let info = run.info().await.unwrap();
    assert_eq!(info.status, RunStatus::Failed);
    assert_eq!(info.error.map(|e| e.to_string()), Some(msg.clone()));
    let failed = rt
        .runs(RunFilter::new().status(RunStatus::Failed))
        .await
        .unwrap();
    assert!(failed.iter().any(|r| r.id == run.id()));

    let events = history(&rt, run.id()).await;
    assert!(
        matches!(&events.last().unwrap().event, Event::RunFailed { error } if error.to_string() == msg)
    );
    // Just past the limit: the last delivered result, the next call's scheduling, the end.
    assert!((21..=23).contains(&events.len()), "{} events", events.len());
    // Every step that ran has its result: those scheduled before the last one completed.
    let scheduled = events
        .iter()
        .filter(|e| matches!(e.event, Event::StepScheduled { .. }))
        .count();
    let completed = events
        .iter()
        .filter(|e| matches!(e.event, Event::StepCompleted { .. }))
        .count();
    assert_eq!(scheduled, completed + 1, "{events:#?}");
    // Released with the failure, like any end.
    rt.start(forever, (token.clone(), 0))
        .hook(&token)
        .await
        .expect("the failed run's token is free")
        .cancel()
        .await
        .unwrap();

    rt.shutdown();
    drop(rt);

    // The bytes' limit: soft 40 bytes, hard 200.
    let rt = runtime(&db, Some((1000, 40))).await;
    let run = rt
        .start(forever, (format!("{token}-bytes"), 20))
        .await
        .unwrap();
    let err = run
        .return_value()
        .await
        .expect_err("the hard limit ends it");
    let msg = err.to_string();
    assert!(
        msg.contains("bytes of payloads, past the hard limit of 200 bytes (200 B)")
            && msg.contains("continue_as_new"),
        "{msg}"
    );
}

/// `history_bytes` counts plaintext: with encryption, and with encryption and a codec that
/// changes the stored bytes' length, every point reads what it reads without either.
async fn history_bytes_ignore_encryption_and_codecs(backend: Backend) {
    let mut runs = Vec::new();
    for (keys, codec) in [(false, false), (true, false), (true, true)] {
        let db = TestDb::new(backend);
        let mut b = db
            .builder()
            .poll_interval(Duration::from_millis(20))
            .retry_backoff(Duration::from_millis(10));
        if keys {
            b = b.encryption(Keys::new().current("k1", [7u8; 32]));
        }
        if codec {
            b = b.codec(Lengthening);
        }
        let rt = b.build().await.unwrap();
        let token = format!("kinds-{}", RunId::new());
        let run = rt.start(many_kinds, (token.clone(),)).await.unwrap();
        run.send("topic", "a message".to_owned()).await.unwrap();
        resume_when_ready(&rt, &token, "a hook payload").await;
        let seen = run.return_value().await.unwrap();
        rt.shutdown();
        runs.push(seen);
    }
    assert!(
        runs[0].windows(2).all(|w| w[0].1 < w[1].1),
        "every point adds payloads: {:?}",
        runs[0]
    );
    assert_eq!(runs[0], runs[1], "with encryption");
    assert_eq!(runs[0], runs[2], "with encryption and a codec");
}

/// A codec whose stored bytes are longer than the plaintext.
struct Lengthening;

impl Codec for Lengthening {
    fn encode(&self, bytes: &[u8], _: &PayloadContext<'_>) -> Vec<u8> {
        [b"padding:".as_slice(), bytes].concat()
    }
    fn decode(&self, bytes: &[u8], _: &PayloadContext<'_>) -> std::result::Result<Vec<u8>, String> {
        bytes
            .strip_prefix(b"padding:".as_slice())
            .map(<[u8]>::to_vec)
            .ok_or_else(|| "not padded".to_owned())
    }
}

on_every_store!(
    metadata_grows_and_replays_the_same,
    suggested_past_the_soft_limit,
    a_run_past_the_hard_limit_fails,
    history_bytes_ignore_encryption_and_codecs,
);

/// `history_limits` refuses limits no history can have, naming them.
#[tokio::test]
async fn bad_history_limits_are_build_errors() {
    for (events, bytes, says) in [
        (0, 1 << 20, "the soft limit of events is 0"),
        (10, 0, "the soft limit of bytes is 0"),
        (u64::MAX, 1, "too large"),
        (1, u64::MAX / 2, "too large"),
    ] {
        let err = Runtime::builder()
            .in_memory()
            .history_limits(events, bytes)
            .build()
            .await
            .expect_err("refused");
        assert!(
            matches!(err, BuildError::HistoryLimits { events: e, bytes: b, .. } if (e, b) == (events, bytes)),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("history_limits({events}, {bytes})")) && msg.contains(says),
            "{msg}"
        );
    }
}
