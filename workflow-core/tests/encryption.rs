//! Payload encryption, on every store: a marker written into a run's arguments, step
//! results, step and run errors, hook payloads and stream chunks is nowhere in what the store
//! keeps (the SQLite files, database and WAL, read as raw bytes; a `pg_dump` of the test's
//! PostgreSQL schema; every record the memory store hands out), while the runs return it
//! intact; a payload moved to another run does not decrypt; rotation; builder errors.

mod common;

use std::time::Duration;

use common::stored::{sealed_coded, sealed_key, stored_text};
use common::{until_status, Backend, TestDb};
use futures::TryStreamExt;
use workflow_core::prelude::*;
use workflow_core::{Codec, PayloadContext};

/// Written into every kind of payload; must never reach the store in the clear.
const MARKER: &str = "Zq7-confidential-marker";

const KEY_A: [u8; 32] = [0xa1; 32];
const KEY_B: [u8; 32] = [0xb2; 32];

#[step]
async fn sealed_echo(s: String) -> Result<String> {
    stream::<String>("chunks")
        .write(format!("{s}-chunk"))
        .await?;
    Ok(format!("{s}-result"))
}

#[step(max_retries = 1)]
async fn sealed_flaky(s: String) -> Result<String> {
    if step_metadata().attempt == 1 {
        return Err(Error::retryable(format!("{s}-retry")));
    }
    Ok("ok".to_owned())
}

#[step(max_retries = 0)]
async fn sealed_fails(s: String) -> Result<()> {
    Err(Error::fatal(format!("{s}-step-error")))
}

/// Every kind of payload, carrying `s`; returns what came back of each, opened.
#[workflow]
async fn sealed_all(s: String, token: String) -> Result<String> {
    let r = sealed_echo(s.clone()).await?;
    let f = sealed_flaky(s.clone()).await?;
    let e = sealed_fails(s.clone()).await.unwrap_err().to_string();
    let mut hook = create_hook::<String>(token);
    let p = hook.recv().await?;
    Ok(format!("{r}|{f}|{e}|{p}"))
}

/// A published value, a received message and a request with its reply, all carrying `s`.
#[workflow]
async fn sealed_talk(s: String) -> Result<String> {
    set_event("status", &format!("{s}-event"))?;
    let message: String = recv("note").await?;
    let mut asks = requests::<String, String>("ask");
    let Some(req) = asks.next().await else {
        return Err(Error::fatal("no request"));
    };
    req.reply(format!("{}-reply", req.body()))?;
    Ok(message)
}

/// Waits for one hook payload; returns it after `s`.
#[workflow]
async fn sealed_waits(s: String, token: String) -> Result<String> {
    let mut hook = create_hook::<String>(token);
    let p = hook.recv().await?;
    Ok(format!("{s}|{p}"))
}

#[workflow]
async fn sealed_failing(s: String) -> Result<()> {
    Err(Error::fatal(format!("{s}-run-error")))
}

#[workflow]
async fn sealed_child(s: String) -> Result<String> {
    if s.ends_with("fail") {
        return Err(Error::fatal(format!("{s}-child-error")));
    }
    Ok(format!("{s}-child"))
}

/// A child that completes and one that fails, both carrying `s` both ways.
#[workflow]
async fn sealed_parent(s: String) -> Result<String> {
    let done = start_child(sealed_child, (format!("{s}-arg"),)).await?;
    let done = done.result().await?;
    let failed = start_child(sealed_child, (format!("{s}-fail"),)).await?;
    let failed = failed.result().await.unwrap_err().to_string();
    let again = sealed_echo(s).await?;
    Ok(format!("{done}|{failed}|{again}"))
}

fn keys_a() -> Keys {
    Keys::new().current("key-A", KEY_A)
}

fn keys_ba() -> Keys {
    Keys::new().current("key-B", KEY_B).old("key-A", KEY_A)
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

/// Admits run `id` of `workflow` with `input` as its stored arguments, straight into the
/// store (as another run's payload or another build's envelope would reach it).
async fn admit_stored(rt: &Runtime, id: RunId, workflow: String, input: serde_json::Value) {
    let admitted = rt
        .store()
        .create_run(workflow_core::store::NewRun::new(
            id,
            workflow,
            input,
            std::time::SystemTime::now(),
        ))
        .await
        .unwrap();
    assert_eq!(admitted, workflow_core::store::Admission::Admitted);
}

/// Sends `payload` to `token` once a hook owns it.
async fn resume(rt: &Runtime, token: &str, payload: String) {
    loop {
        match rt.resume_hook(token, payload.clone()).await {
            Ok(_) => return,
            Err(HookError::NotFound(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("resume_hook({token}): {e}"),
        }
    }
}

async fn a_marker_in_every_payload_is_nowhere_in_the_store(backend: Backend) {
    every_payload_is_sealed(backend, false).await;
}

/// The same with `Keys::compact_envelopes`: every payload sealed in a string, and read by a
/// runtime without the option as well.
async fn compact_envelopes_seal_every_payload_as_well(backend: Backend) {
    every_payload_is_sealed(backend, true).await;
}

/// Every kind of payload carries the marker; it is stored nowhere in the clear. `compact`: the
/// runtime that runs them seals in the compact form (a client without it reads them).
async fn every_payload_is_sealed(backend: Backend, compact: bool) {
    let db = TestDb::new(backend);
    let keys = if compact {
        keys_a().compact_envelopes()
    } else {
        keys_a()
    };
    let rt = runtime(&db, keys, true).await;
    let token = format!("seal-{}", RunId::new());
    let run = rt
        .start(sealed_all, (MARKER.to_owned(), token.clone()))
        .await
        .unwrap();
    resume(&rt, &token, format!("{MARKER}-hook")).await;
    let out = run.return_value().await.unwrap();
    assert_eq!(
        out,
        format!("{MARKER}-result|ok|{MARKER}-step-error|{MARKER}-hook")
    );
    let chunks: Vec<Chunk<String>> = run.stream("chunks").try_collect().await.unwrap();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].value, format!("{MARKER}-chunk"));
    // The run's record opens for a runtime with the keys.
    let info = run.info().await.unwrap();
    assert_eq!(info.input, serde_json::json!([MARKER, token]));
    let stored = rt.store().get_run(&run.id()).await.unwrap().unwrap();
    assert_eq!(stored.input.is_string(), compact, "{}", stored.input);
    assert_eq!(sealed_key(&stored.input), Some("key-A"), "{}", stored.input);

    let failing = rt
        .start(sealed_failing, (MARKER.to_owned(),))
        .await
        .unwrap();
    let err = failing.return_value().await.unwrap_err();
    assert_eq!(err.to_string(), format!("{MARKER}-run-error"));
    let err = failing.info().await.unwrap().error.unwrap();
    assert_eq!(err.to_string(), format!("{MARKER}-run-error"));
    assert!(!err.is_encrypted());

    // Children: arguments, results and errors both ways.
    let parent = rt.start(sealed_parent, (MARKER.to_owned(),)).await.unwrap();
    let family = format!("{MARKER}-arg-child|{MARKER}-fail-child-error|{MARKER}-result");
    assert_eq!(parent.return_value().await.unwrap(), family);
    // A fork's copy reads its original's recorded results, sealed again for it.
    let fork = parent.fork(1).await.unwrap();
    assert_eq!(fork.return_value().await.unwrap(), family);
    let fork_events = rt.store().events(&fork.id()).await.unwrap();
    assert!(fork_events
        .iter()
        .any(|e| matches!(e.event, workflow_core::store::Event::StepCompleted { .. })));
    // An export keeps the ciphertext.
    let exported = parent.export().await.unwrap().to_string();
    assert!(exported.contains("$wf_sealed") && !exported.contains(MARKER));

    // Runs of other processes are read from the store.
    let client = runtime(&db, keys_a(), false).await;
    let remote = client.get_run(&failing.id()).info().await.unwrap();
    assert_eq!(
        remote.error.unwrap().to_string(),
        format!("{MARKER}-run-error")
    );

    // Messages, published values, requests and replies are sealed like every
    // other payload.
    let talk = rt.start(sealed_talk, (MARKER.to_owned(),)).await.unwrap();
    let status: String = talk.event::<String>("status").await.unwrap();
    assert_eq!(status, format!("{MARKER}-event"));
    talk.send("note", format!("{MARKER}-message"))
        .await
        .unwrap();
    let reply = talk
        .request::<String, String>("ask", format!("{MARKER}-request"))
        .await
        .unwrap();
    assert_eq!(reply, format!("{MARKER}-request-reply"));
    assert_eq!(
        talk.return_value().await.unwrap(),
        format!("{MARKER}-message")
    );

    let text = stored_text(&db, &rt).await;
    // What is meant to stay plaintext is found: the reading itself works.
    assert!(
        text.contains(&token),
        "the hook token is stored in the clear"
    );
    assert!(
        text.contains("sealed_all"),
        "workflow names are stored in the clear"
    );
    assert!(text.contains("key-A"), "key ids are stored");
    assert!(
        !text.contains(MARKER),
        "the marker is in the {backend:?} store in the clear"
    );

    // Without keys, the same records show only that they are encrypted.
    let blind = db
        .builder()
        .worker(false)
        .build()
        .await
        .expect("a client without keys builds");
    let seen = blind.get_run(&failing.id()).info().await.unwrap();
    assert_eq!(seen.error.unwrap().to_string(), "encrypted (key key-A)");
    let err = blind
        .get_run(&run.id())
        .typed::<String>()
        .return_value()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"key-A\""), "{err}");
    assert!(!err.to_string().contains(MARKER), "{err}");
}

/// A sealed payload is bound to its run: admitted as another run's arguments, it does not
/// decrypt, and the run fails saying so instead of reading the other run's data.
async fn a_payload_moved_to_another_run_does_not_decrypt(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime(&db, keys_a(), true).await;
    let original = rt
        .start(sealed_failing, (MARKER.to_owned(),))
        .await
        .unwrap();
    let _ = original.return_value().await;
    let stored = rt.store().get_run(&original.id()).await.unwrap().unwrap();
    let (sealed, workflow) = (stored.input, stored.workflow);
    assert!(sealed_key(&sealed).is_some(), "{sealed}");

    let copy = RunId::new();
    admit_stored(&rt, copy, workflow, sealed).await;
    let err = rt
        .get_run(&copy)
        .typed::<()>()
        .return_value()
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("does not decrypt"), "{msg}");
    assert!(!msg.contains(MARKER), "{msg}");
    assert_eq!(rt.get_run(&copy).status().await.unwrap(), RunStatus::Failed);
}

/// Arguments sealed in a form this build does not read (as a newer build would write them:
/// another cipher's name, another envelope version) block the run, unchanged, saying so;
/// they neither fail it nor reach the workflow.
async fn a_payload_in_a_newer_form_blocks_its_run(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = runtime(&db, keys_a(), true).await;
    let done = rt.start(sealed_failing, ("x".to_owned(),)).await.unwrap();
    let _ = done.return_value().await;
    let workflow = rt
        .store()
        .get_run(&done.id())
        .await
        .unwrap()
        .unwrap()
        .workflow;
    for (input, form) in [
        (
            serde_json::json!({"$wf_sealed": "zz9:AAAAAAAAAAAAAAAAAAAAAAAA", "key": "key-A"}),
            "cipher `zz9`",
        ),
        (
            serde_json::json!({"$wf_sealed": 4, "key": "key-A", "data": "AAAA"}),
            "envelope version 4",
        ),
    ] {
        let id = RunId::new();
        admit_stored(&rt, id, workflow.clone(), input).await;
        let blocked = until_status(&rt, id, RunStatus::Blocked).await;
        let why = blocked.error.expect("a blocked run says why").to_string();
        assert!(why.contains(form) && why.contains("newer build"), "{why}");
        assert!(rt.store().events(&id).await.unwrap().is_empty());
    }
}

/// Runs in flight under key A: a worker with only key B leaves them blocked and unchanged,
/// naming A; a worker with current key B and old key A completes them, sealing what it adds
/// with B.
async fn runs_under_an_old_key_wait_for_a_worker_with_it(backend: Backend) {
    let db = TestDb::new(backend);
    let token = format!("rot-{}", RunId::new());
    let rt_a = runtime(&db, keys_a(), true).await;
    let run = rt_a
        .start(sealed_all, (MARKER.to_owned(), token.clone()))
        .await
        .unwrap();
    let id = run.id();
    // In flight: its steps recorded under A, waiting on its hook.
    loop {
        let events = rt_a.store().events(&id).await.unwrap();
        if events
            .iter()
            .any(|e| matches!(e.event, workflow_core::store::Event::HookRegistered { .. }))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rt_a.shutdown();
    let before = rt_a.store().events(&id).await.unwrap();

    // Only key B: the run is taken once A's lease expires, and blocked unchanged.
    let rt_b = runtime(&db, Keys::new().current("key-B", KEY_B), true).await;
    let blocked = until_status(&rt_b, id, RunStatus::Blocked).await;
    let why = blocked.error.expect("a blocked run says why").to_string();
    assert!(why.contains("key \"key-A\""), "{why}");
    assert_eq!(rt_b.store().events(&id).await.unwrap(), before);
    rt_b.shutdown();

    // Current B, old A: the run goes on and completes.
    let rt_ba = runtime(&db, keys_ba(), true).await;
    resume(&rt_ba, &token, format!("{MARKER}-hook")).await;
    let out = rt_ba
        .get_run(&id)
        .typed::<String>()
        .return_value()
        .await
        .unwrap();
    assert_eq!(
        out,
        format!("{MARKER}-result|ok|{MARKER}-step-error|{MARKER}-hook")
    );
    let events = rt_ba.store().events(&id).await.unwrap();
    let Some(workflow_core::store::Event::RunCompleted { output }) =
        events.last().map(|e| &e.event)
    else {
        panic!("the run ends completed: {events:?}")
    };
    assert_eq!(
        sealed_key(output),
        Some("key-B"),
        "new payloads are sealed with the current key: {output}"
    );
    assert_eq!(
        before.iter().find_map(|e| match &e.event {
            workflow_core::store::Event::StepScheduled { input, .. } => sealed_key(input),
            _ => None,
        }),
        Some("key-A")
    );
    assert!(!stored_text(&db, &rt_ba).await.contains(MARKER));
}

/// XORs every byte (as easy to check as compression, and it hides the marker too), and notes
/// the kinds of payload it was given.
struct Xor;

fn kinds_seen() -> &'static std::sync::Mutex<std::collections::BTreeSet<String>> {
    static SEEN: std::sync::OnceLock<std::sync::Mutex<std::collections::BTreeSet<String>>> =
        std::sync::OnceLock::new();
    SEEN.get_or_init(Default::default)
}

impl Codec for Xor {
    fn encode(&self, bytes: &[u8], cx: &PayloadContext<'_>) -> Vec<u8> {
        kinds_seen().lock().unwrap().insert(cx.kind().to_owned());
        assert!(cx.run().is_some() != cx.hook_token().is_some(), "{cx:?}");
        bytes.iter().map(|b| b ^ 0x5a).collect()
    }
    fn decode(&self, bytes: &[u8], _: &PayloadContext<'_>) -> Result<Vec<u8>, String> {
        Ok(bytes.iter().map(|b| b ^ 0x5a).collect())
    }
}

/// XORs as [`Xor`] does, but refuses to decode a run's arguments and output: a runtime with
/// it reads those only where it does not open them.
struct Refusing;

impl Codec for Refusing {
    fn encode(&self, bytes: &[u8], _: &PayloadContext<'_>) -> Vec<u8> {
        bytes.iter().map(|b| b ^ 0x5a).collect()
    }
    fn decode(&self, bytes: &[u8], cx: &PayloadContext<'_>) -> Result<Vec<u8>, String> {
        match cx.kind() {
            kind @ ("input" | "output") => Err(format!("refused to decode the {kind}")),
            _ => Ok(bytes.iter().map(|b| b ^ 0x5a).collect()),
        }
    }
}

/// A run started and driven here reads its arguments as its start sealed them, and a caller
/// waiting here reads its return value as its driver sealed it: neither is opened again (a
/// codec that refuses to decode them does not stop the run). Another process opens them
/// from the store.
async fn what_this_process_sealed_is_read_without_opening(backend: Backend) {
    let db = TestDb::new(backend);
    // A waiter also polls the store, and one poll may find the end committed before the
    // driver tells it: polling waits beyond the test here, so the end is told.
    let build = |codec_refuses: bool, worker: bool| {
        let b = db
            .builder()
            .encryption(keys_a())
            .worker(worker)
            .poll_interval(Duration::from_secs(120));
        async move {
            let b = if codec_refuses {
                b.codec(Refusing)
            } else {
                b.codec(Xor)
            };
            b.build().await.unwrap()
        }
    };
    let rt = build(true, true).await;
    let token = format!("known-{}", RunId::new());
    let run = rt
        .start(sealed_waits, (MARKER.to_owned(), token.clone()))
        .await
        .unwrap();
    // The wait is registered at its first poll, before the payload is sent: the end is told.
    let (out, ()) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(
            run.return_value(),
            resume(&rt, &token, format!("{MARKER}-hook"))
        )
    })
    .await
    .expect("the run ends");
    let expected = format!("{MARKER}|{MARKER}-hook");
    assert_eq!(out.unwrap(), expected, "{backend:?}");
    let stored = rt.store().get_run(&run.id()).await.unwrap().unwrap();
    assert_eq!(sealed_key(&stored.input), Some("key-A"), "{}", stored.input);
    assert!(sealed_coded(&stored.input), "{}", stored.input);

    // Read from the store, the output is decoded: by another process's codec, and by a
    // refusing one, which says so.
    let other = build(false, false).await;
    let read = other.get_run(&run.id()).typed::<String>();
    assert_eq!(read.return_value().await.unwrap(), expected);
    let refusing = build(true, false).await;
    let err = refusing
        .get_run(&run.id())
        .typed::<String>()
        .return_value()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("refused to decode the output"),
        "{err}"
    );
}

/// A codec composed with encryption: applied before sealing, undone after opening, on every
/// kind of payload; a runtime without the codec says so instead of misreading; a codec alone
/// stores its bytes in a keyless envelope.
async fn a_codec_composes_with_encryption(backend: Backend) {
    let db = TestDb::new(backend);
    let rt = db
        .builder()
        .encryption(keys_a())
        .codec(Xor)
        .poll_interval(Duration::from_millis(20))
        .retry_backoff(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let token = format!("codec-{}", RunId::new());
    let run = rt
        .start(sealed_all, (MARKER.to_owned(), token.clone()))
        .await
        .unwrap();
    resume(&rt, &token, format!("{MARKER}-hook")).await;
    assert_eq!(
        run.return_value().await.unwrap(),
        format!("{MARKER}-result|ok|{MARKER}-step-error|{MARKER}-hook")
    );
    let chunks: Vec<Chunk<String>> = run.stream("chunks").try_collect().await.unwrap();
    assert_eq!(chunks[0].value, format!("{MARKER}-chunk"));
    let seen = kinds_seen().lock().unwrap().clone();
    for kind in [
        "input",
        "output",
        "step_input",
        "step_result",
        "step_error",
        "hook_payload",
        "stream_chunk",
    ] {
        assert!(seen.contains(kind), "the codec saw no {kind}: {seen:?}");
    }
    let stored = rt.store().get_run(&run.id()).await.unwrap().unwrap();
    assert!(sealed_coded(&stored.input), "{}", stored.input);
    assert_eq!(sealed_key(&stored.input), Some("key-A"), "{}", stored.input);
    assert!(!stored_text(&db, &rt).await.contains(MARKER));

    let without_codec = runtime(&db, keys_a(), false).await;
    let err = without_codec
        .get_run(&run.id())
        .typed::<String>()
        .return_value()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`Codec`"), "{err}");

    // A codec alone: a keyless envelope, read back through the codec.
    let plain = TestDb::new(backend);
    let rt = plain
        .builder()
        .codec(Xor)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let failing = rt
        .start(sealed_failing, (MARKER.to_owned(),))
        .await
        .unwrap();
    let err = failing.return_value().await.unwrap_err();
    assert_eq!(err.to_string(), format!("{MARKER}-run-error"));
    let stored = rt.store().get_run(&failing.id()).await.unwrap().unwrap();
    assert_eq!(stored.input["coded"], 1, "{}", stored.input);
    assert!(stored.input.get("key").is_none(), "{}", stored.input);
    assert!(!stored.input.to_string().contains(MARKER));
}

/// A payload sent by a client whose current key the worker lacks: the run is blocked (its
/// history unchanged, the payload undelivered) with an error naming the key, and a worker
/// with that key completes it.
async fn a_hook_payload_under_an_unknown_key_blocks_its_run(backend: Backend) {
    let db = TestDb::new(backend);
    let token = format!("inbox-{}", RunId::new());
    let rt_a = runtime(&db, keys_a(), true).await;
    let run = rt_a
        .start(sealed_all, (MARKER.to_owned(), token.clone()))
        .await
        .unwrap();
    let id = run.id();
    let client_c = runtime(
        &db,
        Keys::new().current("key-C", [0xc3; 32]).old("key-A", KEY_A),
        false,
    )
    .await;
    resume(&client_c, &token, format!("{MARKER}-hook")).await;
    let blocked = until_status(&rt_a, id, RunStatus::Blocked).await;
    let why = blocked.error.expect("a blocked run says why").to_string();
    assert!(why.contains("key \"key-C\""), "{why}");
    let events = rt_a.store().events(&id).await.unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.event, workflow_core::store::Event::HookReceived { .. })),
        "the payload was not delivered: {events:?}"
    );
    rt_a.shutdown();

    let rt_c = runtime(
        &db,
        Keys::new().current("key-C", [0xc3; 32]).old("key-A", KEY_A),
        true,
    )
    .await;
    let out = rt_c
        .get_run(&id)
        .typed::<String>()
        .return_value()
        .await
        .unwrap();
    assert!(out.ends_with(&format!("|{MARKER}-hook")), "{out}");
}

on_every_store!(
    a_hook_payload_under_an_unknown_key_blocks_its_run,
    a_payload_in_a_newer_form_blocks_its_run,
    a_codec_composes_with_encryption,
    a_marker_in_every_payload_is_nowhere_in_the_store,
    compact_envelopes_seal_every_payload_as_well,
    a_payload_moved_to_another_run_does_not_decrypt,
    runs_under_an_old_key_wait_for_a_worker_with_it,
    what_this_process_sealed_is_read_without_opening,
);

#[tokio::test]
async fn build_refuses_unusable_keys_naming_them() {
    let cases = [
        (
            Keys::new().current("k16", vec![0u8; 16]),
            "\"k16\" is 16 bytes",
        ),
        (
            Keys::new().current("k", KEY_A).old("k", KEY_B),
            "\"k\" is given twice",
        ),
        (
            Keys::new().current("k", KEY_A).old("old", vec![1u8; 40]),
            "\"old\" is 40 bytes",
        ),
        (Keys::new(), "no current encryption key"),
    ];
    for (keys, says) in cases {
        for worker in [true, false] {
            let err = Runtime::builder()
                .in_memory()
                .encryption(keys.clone())
                .worker(worker)
                .build()
                .await
                .unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
    }
}
