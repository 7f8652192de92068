//! `workflow` on an encrypted store, on SQLite and PostgreSQL: without keys every
//! encrypted payload shows as "encrypted (key <id>)"; `--keys FILE` shows it decrypted;
//! `workflow export` keeps the ciphertext unless `--decrypt` (which needs the keys); the
//! dashboard's run page does the same; `workflow rekey` moves every payload to the current
//! key.

mod common;

use std::time::Duration;

use workflow_core::prelude::{step, workflow};
use workflow_core::{Keys, RunId};

use common::http::{dashboard, get};
use common::{cli, Backend, TestDb};

const MARKER: &str = "Qx9-cli-secret";

#[step]
async fn cli_sealed_step(s: String) -> workflow_core::Result<String> {
    Ok(format!("{s}-result"))
}

#[workflow]
async fn cli_sealed(s: String) -> workflow_core::Result<String> {
    cli_sealed_step(s).await
}

on_both_stores!(
    encrypted_payloads_show_as_such_unless_the_keys_are_given,
    the_run_page_shows_encrypted_payloads_unless_given_the_keys,
    rekey_moves_every_payload_to_the_current_key,
);

const OLD_KEY: &str = "current k-old AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n";
const NEW_KEY: &str = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";

/// A completed run of `cli_sealed` carrying [`MARKER`], sealed with the keys of `keys_text`
/// (written to `file`); its id.
async fn sealed_run(db: &TestDb, file: &std::path::Path, keys_text: &str) -> String {
    std::fs::write(file, keys_text).unwrap();
    let rt = db
        .builder()
        .encryption(Keys::parse(keys_text).unwrap())
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let run = rt.start(cli_sealed, (MARKER.to_owned(),)).await.unwrap();
    assert_eq!(
        run.return_value().await.unwrap(),
        format!("{MARKER}-result")
    );
    rt.shutdown();
    run.id().to_string()
}

/// The dashboard's run page: "encrypted (key <id>)" for every payload without keys; the
/// values with `--keys`.
async fn the_run_page_shows_encrypted_payloads_unless_given_the_keys(b: Backend) {
    let db = TestDb::new(b);
    let file = db.dir.path().join("keys");
    let id = sealed_run(&db, &file, OLD_KEY).await;
    let store = db.args();
    let blind = dashboard(&store, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", blind.addr.port());
    let page = get(blind.addr, &format!("/runs/{id}"), &host);
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("encrypted (key k-old)"), "{}", page.body);
    assert!(!page.body.contains(MARKER), "{}", page.body);

    let mut with_keys = store.clone();
    with_keys.extend(["--keys".to_owned(), file.display().to_string()]);
    let seeing = dashboard(&with_keys, &["--port", "0"], &[]);
    let host = format!("127.0.0.1:{}", seeing.addr.port());
    let page = get(seeing.addr, &format!("/runs/{id}"), &host);
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.body.contains(&format!("{MARKER}-result")),
        "{}",
        page.body
    );
    assert!(!page.body.contains("encrypted (key"), "{}", page.body);
}

/// `workflow rekey`: refused without keys, and naming a missing old key; with the new key
/// current and the old one kept it rewrites every payload and prints the counts per kind; a
/// rerun rewrites nothing; the new key alone then reads the run.
async fn rekey_moves_every_payload_to_the_current_key(b: Backend) {
    let db = TestDb::new(b);
    let file = db.dir.path().join("keys");
    let id = sealed_run(&db, &file, OLD_KEY).await;
    let store = db.args();
    let keys = file.display().to_string();
    cli(&store, &["rekey"])
        .await
        .fails(2, "rekey needs the keys");
    let new_only = db.dir.path().join("new-only");
    std::fs::write(&new_only, format!("current k-new {NEW_KEY}\n")).unwrap();
    let new_only = new_only.display().to_string();
    cli(&store, &["--keys", &new_only, "rekey"])
        .await
        .fails(4, "key \"k-old\"");

    std::fs::write(
        &file,
        format!(
            "current k-new {NEW_KEY}\nold k-old AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n"
        ),
    )
    .unwrap();
    let out = cli(&store, &["--keys", &keys, "rekey", "--batch", "2"])
        .await
        .ok();
    println!("workflow rekey ({b:?}):\n{out}");
    assert!(out.contains("under key k-new; 0 already current"), "{out}");
    for kind in ["input", "output", "step_input", "step_result"] {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().next() == Some(kind)),
            "no line for {kind}: {out}"
        );
    }
    let again = cli(&store, &["--json", "--keys", &keys, "rekey"])
        .await
        .json();
    assert_eq!(again["rewritten"], 0, "{again}");
    assert!(again["already_current"].as_u64().unwrap() >= 4, "{again}");
    assert_eq!(again["key"], "k-new");

    let exported = cli(&store, &["export", &id]).await.ok();
    assert!(
        exported.contains("k-new") && !exported.contains("k-old"),
        "{exported}"
    );
    let seen = cli(&store, &["--keys", &new_only, "run", &id]).await.ok();
    assert!(seen.contains(&format!("{MARKER}-result")), "{seen}");
}

async fn encrypted_payloads_show_as_such_unless_the_keys_are_given(b: Backend) {
    let db = TestDb::new(b);
    let key_file = db.dir.path().join("keys");
    std::fs::write(
        &key_file,
        "# test keys\ncurrent k-2026 AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n",
    )
    .unwrap();
    let keys = Keys::parse(&std::fs::read_to_string(&key_file).unwrap()).unwrap();
    let rt = db
        .builder()
        .encryption(keys)
        .poll_interval(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    let run = rt.start(cli_sealed, (MARKER.to_owned(),)).await.unwrap();
    assert_eq!(
        run.return_value().await.unwrap(),
        format!("{MARKER}-result")
    );
    let id: RunId = run.id();
    let (id, store) = (id.to_string(), db.args());
    let keys = key_file.display().to_string();

    for args in [
        vec!["run", &id],
        vec!["events", &id],
        vec!["runs", "--json"],
    ] {
        let blind = cli(&store, &args).await.ok();
        assert!(!blind.contains(MARKER), "{args:?} without keys: {blind}");
        assert!(
            blind.contains("encrypted (key k-2026)"),
            "{args:?}: {blind}"
        );
        let mut with_keys = vec!["--keys", &keys];
        with_keys.extend(&args);
        let seen = cli(&store, &with_keys).await.ok();
        assert!(seen.contains(MARKER), "{args:?} with keys: {seen}");
        assert!(
            !seen.contains("encrypted (key"),
            "{args:?} with keys: {seen}"
        );
    }

    // Export: the ciphertext as stored, even with the keys, unless --decrypt.
    let sealed = cli(&store, &["--keys", &keys, "export", &id]).await.ok();
    assert!(
        sealed.contains("$wf_sealed") && !sealed.contains(MARKER),
        "{sealed}"
    );
    let opened = cli(&store, &["--keys", &keys, "export", &id, "--decrypt"])
        .await
        .ok();
    assert!(
        opened.contains(MARKER) && !opened.contains("$wf_sealed"),
        "{opened}"
    );
    let v: serde_json::Value = serde_json::from_str(&opened).unwrap();
    assert_eq!(v["run"]["input"], serde_json::json!([MARKER]));
    cli(&store, &["export", &id, "--decrypt"])
        .await
        .fails(2, "--decrypt needs the keys");

    // A keys file that is not one is refused, naming the line.
    std::fs::write(&key_file, "current k-short c2hvcnQ=\n").unwrap();
    cli(&store, &["--keys", &keys, "runs"])
        .await
        .fails(2, "\"k-short\" is 5 bytes");
}
