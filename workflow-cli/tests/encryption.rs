//! `workflow` on an encrypted store (SPEC 18), on SQLite and PostgreSQL: without keys every
//! encrypted payload shows as "encrypted (key <id>)"; `--keys FILE` shows it decrypted;
//! `workflow export` keeps the ciphertext unless `--decrypt` (which needs the keys).

mod common;

use std::time::Duration;

use workflow_core::prelude::{step, workflow};
use workflow_core::{Keys, RunId};

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

on_both_stores!(encrypted_payloads_show_as_such_unless_the_keys_are_given);

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
