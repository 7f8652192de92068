//! The real `workflow` binary against a database filled by real workflows, on SQLite and on
//! PostgreSQL: tables for people, `--json` for scripts, cancel and resume, and clear errors.

mod common;

use serde_json::{json, Value};
use workflow_core::prelude::{create_hook, step, stream, workflow, workflow_metadata};
use workflow_core::store::Event;
use workflow_core::{RunId, RunStatus};

use common::{blocked_run, cli, deploy, fixture, sqlite_args, until_status, Backend};

on_both_stores!(
    runs_lists_every_state_as_a_table_and_as_json,
    run_shows_steps_attempts_hooks_and_sleeps,
    events_lists_the_history,
    hooks_lists_the_open_ones,
    cancel_and_resume_move_runs_on,
    unknown_ids_and_tokens_are_reported,
    output_escapes_control_characters,
    prune_deletes_old_ended_runs_only,
    blocked_runs_are_listed_shown_and_retried,
    retry_reopens_a_failed_run_and_refuses_others,
    fork_keeps_the_first_steps,
    export_prints_the_versioned_history,
    run_links_parents_and_children,
    stream_prints_and_follows_a_run_s_chunks,
    tz_shows_times_in_a_zone_across_a_dst_change,
    send_delivers_messages_and_events_lists_published_values,
);

/// Waits on a hook, then returns what it received.
#[workflow]
async fn cli_gated(token: String) -> workflow_core::Result<String> {
    let mut gate = workflow_core::create_hook::<String>(token);
    gate.recv().await
}

/// Starts two gated children and returns the first one's result.
#[workflow]
async fn cli_parent(token: String) -> workflow_core::Result<String> {
    let first = workflow_core::start_child(cli_gated, (format!("{token}-1"),)).await?;
    let _second = workflow_core::start_child(cli_gated, (format!("{token}-2"),))
        .detached()
        .await?;
    first.result().await
}

/// Fails with a message that would clear the screen, retitle the terminal and forge a line.
#[workflow]
async fn garbled(label: String) -> workflow_core::Result<()> {
    Err(workflow_core::Error::fatal(format!(
        "\u{1b}[2J\u{1b}]0;pwned\u{7}boom\nFAKE ROW {label}"
    )))
}

/// The rows of a table whose first column is `first`.
fn row<'a>(table: &'a str, first: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.trim_start().starts_with(first))
        .unwrap_or_else(|| panic!("no row starting with {first:?} in:\n{table}"))
}

fn ids(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn runs_lists_every_state_as_a_table_and_as_json(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;

    let table = cli(db, &["runs"]).await.ok();
    let header = table.lines().next().unwrap();
    assert!(
        header.starts_with("RUN") && header.contains("WORKFLOW") && header.contains("STATUS"),
        "{table}"
    );
    for (id, workflow, status) in [
        (f.completed, "welcome", "completed"),
        (f.failed, "billing", "failed"),
        (f.cancelled, "nap", "cancelled"),
        (f.waiting, "approval", "running"),
        (f.sleeping, "nap", "running"),
    ] {
        let line = row(&table, &id.to_string());
        let cols: Vec<&str> = line.split_whitespace().collect();
        // Registered names carry the module path.
        assert_eq!(cols[1], format!("cli::common::{workflow}"), "{line}");
        assert_eq!(cols[2], status, "{line}");
    }
    assert_eq!(table.lines().count(), 6, "a header and five runs:\n{table}");

    let all = cli(db, &["runs", "--json"]).await.json();
    // Newest first.
    let want: Vec<String> = [f.sleeping, f.waiting, f.cancelled, f.failed, f.completed]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(ids(&all), want);
    let completed = &all[4];
    assert_eq!(completed["workflow"], "cli::common::welcome");
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["input"], json!(["ada"]));
    assert_eq!(completed["output"], "hello, ada");
    assert!(completed["duration_ms"].is_u64());
    assert!(completed["created_at"].as_str().unwrap().ends_with('Z'));
    let failed = &all[3];
    assert_eq!(failed["error"]["kind"], "retryable");
    assert_eq!(failed["error"]["message"], "card declined for 4200");
    assert_eq!(
        all[0]["duration_ms"],
        Value::Null,
        "a live run has no duration"
    );

    let failed_only = cli(db, &["runs", "--status", "failed", "--json"])
        .await
        .json();
    assert_eq!(ids(&failed_only), [f.failed.to_string()]);
    let naps = cli(db, &["--json", "runs", "--workflow", "cli::common::nap"])
        .await
        .json();
    assert_eq!(
        ids(&naps),
        [f.sleeping.to_string(), f.cancelled.to_string()]
    );
    let newest = cli(db, &["runs", "--limit", "2", "--json"]).await.json();
    assert_eq!(ids(&newest), want[..2]);
    // Paging: each page starts after the last run of the one before; every run once.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..want.len() {
        let mut args = vec!["runs", "--limit", "2", "--json"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let page = ids(&cli(db, &args).await.json());
        seen.extend(page.iter().cloned());
        match page.last() {
            Some(last) if page.len() == 2 => after = Some(last.clone()),
            _ => break,
        }
    }
    assert_eq!(seen, want, "pages of 2 see each run once, newest first");
    // A full page of the table says how to get the next one, on stderr.
    let full = cli(db, &["runs", "--limit", "2"]).await;
    assert_eq!(full.code, 0, "{full:?}");
    assert_eq!(full.stdout.lines().count(), 3, "{full:?}");
    assert_eq!(
        full.stderr.trim_end(),
        format!(
            "older runs: workflow runs --after {} (with the same filters)",
            want[1]
        )
    );
    let unknown = cli(db, &["runs", "--after", &RunId::new().to_string()]).await;
    assert_ne!(
        unknown.code, 0,
        "an unknown cursor is an error: {unknown:?}"
    );
    let none = cli(db, &["runs", "--workflow", "nope"]).await.ok();
    assert_eq!(none, "no runs\n");
}

async fn run_shows_steps_attempts_hooks_and_sleeps(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;

    // Completed after a retry: one step, two attempts.
    let text = cli(db, &["run", &f.completed.to_string()]).await.ok();
    assert!(row(&text, "status").ends_with("completed"), "{text}");
    assert!(row(&text, "output").ends_with("\"hello, ada\""), "{text}");
    let step = row(&text, "greet #0");
    let cols: Vec<&str> = step.split_whitespace().collect();
    assert_eq!(cols[2..4], ["completed", "2"], "{step}");
    assert!(
        row(&text, "attempt 1").contains("failed") && text.contains("greeting service timed out"),
        "{text}"
    );
    assert!(row(&text, "attempt 2").contains("ok"), "{text}");

    let v = cli(db, &["run", &f.completed.to_string(), "--json"])
        .await
        .json();
    assert_eq!(v["id"], f.completed.to_string());
    assert_eq!(v["status"], "completed");
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0]["name"], "cli::common::greet");
    assert_eq!(steps[0]["status"], "completed");
    assert_eq!(steps[0]["output"], "hello, ada");
    let attempts = steps[0]["attempts"].as_array().unwrap();
    let outcomes: Vec<&str> = attempts
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["failed", "ok"]);
    assert_eq!(
        attempts[0]["error"]["message"],
        "greeting service timed out"
    );
    assert!(attempts[0]["retry_at"].is_string());
    assert!(attempts.iter().all(|a| a["duration_ms"].is_u64()));
    assert_eq!(v["waiting_on"], json!([]));

    // Failed: both attempts failed, and the run's error is the last one.
    let v = cli(db, &["run", &f.failed.to_string(), "--json"])
        .await
        .json();
    assert_eq!(v["status"], "failed");
    assert_eq!(v["steps"][0]["status"], "failed");
    assert_eq!(v["steps"][0]["attempts"].as_array().unwrap().len(), 2);
    let text = cli(db, &["run", &f.failed.to_string()]).await.ok();
    assert!(
        row(&text, "error").contains("card declined for 4200"),
        "{text}"
    );

    // Waiting on a hook: the hook is open and the run says so.
    let v = cli(db, &["run", &f.waiting.to_string(), "--json"])
        .await
        .json();
    assert_eq!(v["status"], "running");
    assert_eq!(v["hooks"][0]["token"], f.token);
    assert_eq!(v["hooks"][0]["active"], true);
    assert_eq!(v["hooks"][0]["hook_key"], "hk_0");
    let waiting = v["waiting_on"].as_array().unwrap();
    assert!(
        waiting.len() == 1 && waiting[0].as_str().unwrap().contains(&f.token),
        "{waiting:?}"
    );
    let text = cli(db, &["run", &f.waiting.to_string()]).await.ok();
    assert!(row(&text, &f.token).contains("open"), "{text}");

    // Sleeping: the timer waits an hour.
    let v = cli(db, &["run", &f.sleeping.to_string(), "--json"])
        .await
        .json();
    assert_eq!(v["timers"][0]["status"], "waiting");
    assert_eq!(v["steps"][0]["status"], "completed");
    assert!(v["waiting_on"][0].as_str().unwrap().starts_with("sleep "));
    let text = cli(db, &["run", &f.sleeping.to_string()]).await.ok();
    assert!(row(&text, "tmr_0").contains("waiting"), "{text}");

    // Cancelled during its sleep: the timer is abandoned.
    let v = cli(db, &["run", &f.cancelled.to_string(), "--json"])
        .await
        .json();
    assert_eq!(v["status"], "cancelled");
    assert_eq!(v["error"]["kind"], "cancelled");
    assert_eq!(v["timers"][0]["status"], "abandoned");
}

async fn events_lists_the_history(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let v = cli(db, &["events", &f.completed.to_string(), "--json"])
        .await
        .json();
    let kinds: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "step_scheduled",
            "step_attempt_failed",
            "step_attempt_started",
            "step_completed",
            "run_completed"
        ]
    );
    assert_eq!(v[0]["seq"], 1);
    assert_eq!(v[2]["event"]["attempt"], 2);

    let text = cli(db, &["events", &f.completed.to_string()]).await.ok();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("SEQ"), "{text}");
    assert_eq!(lines.len(), 6, "{text}");
    assert!(
        lines[2].contains("step_attempt_failed") && lines[2].contains("greeting service timed out"),
        "{text}"
    );
    assert!(row(&text, "5").contains("run_completed"), "{text}");
}

async fn hooks_lists_the_open_ones(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let text = cli(db, &["hooks"]).await.ok();
    assert!(text.starts_with("TOKEN"), "{text}");
    assert!(row(&text, &f.token).contains(&f.waiting.to_string()));
    assert_eq!(text.lines().count(), 2, "{text}");

    let v = cli(db, &["hooks", "--token", &f.token, "--json"])
        .await
        .json();
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["token"], f.token);
    assert_eq!(v[0]["run_id"], f.waiting.to_string());
    let by_run = cli(db, &["hooks", "--run", &f.waiting.to_string(), "--json"])
        .await
        .json();
    assert_eq!(by_run, v);
    let none = cli(db, &["hooks", "--token", "approval:nope", "--json"])
        .await
        .json();
    assert_eq!(none, json!([]));
    assert_eq!(
        cli(db, &["hooks", "--token", "approval:nope"]).await.ok(),
        "no open hooks\n"
    );
}

async fn cancel_and_resume_move_runs_on(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;

    let out = cli(db, &["cancel", &f.sleeping.to_string()]).await.ok();
    assert_eq!(out, format!("cancelled run {}\n", f.sleeping));
    until_status(&f.rt, f.sleeping, RunStatus::Cancelled).await;
    let again = cli(db, &["cancel", &f.sleeping.to_string(), "--json"])
        .await
        .json();
    assert_eq!(
        again,
        json!({"run_id": f.sleeping.to_string(), "cancelled": false, "status": "cancelled"})
    );
    let done = cli(db, &["cancel", &f.completed.to_string()]).await.ok();
    assert!(done.contains("already ended (completed)"), "{done}");

    let out = cli(db, &["resume", &f.token, r#"{"approved": true}"#, "--json"])
        .await
        .json();
    assert_eq!(
        out,
        json!({"token": f.token, "run_id": f.waiting.to_string()})
    );
    until_status(&f.rt, f.waiting, RunStatus::Completed).await;
    let v = cli(db, &["run", &f.waiting.to_string(), "--json"])
        .await
        .json();
    assert_eq!(
        v["output"],
        "order approved=true".replace("order", &format!("order {}", &f.token["approval:".len()..]))
    );
    assert_eq!(
        v["hooks"][0]["payloads"][0]["payload"],
        json!({"approved": true})
    );
    assert_eq!(v["hooks"][0]["active"], false);

    // The hook was disposed: the token reaches nobody now.
    cli(db, &["resume", &f.token, "{}"])
        .await
        .fails(1, "no active hook owns token");
}

async fn unknown_ids_and_tokens_are_reported(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let absent = workflow_core::RunId::new().to_string();

    cli(db, &["run", &absent])
        .await
        .fails(1, &format!("run {absent} not found"));
    cli(db, &["events", &absent])
        .await
        .fails(1, &format!("run {absent} not found"));
    cli(db, &["cancel", &absent])
        .await
        .fails(1, &format!("run {absent} not found"));
    cli(db, &["run", "not-a-run-id"])
        .await
        .fails(2, "invalid run id: `not-a-run-id` is not a run id");
    cli(db, &["resume", &f.token, "{approved: true}"])
        .await
        .fails(2, "malformed JSON payload: key must be a string");
    cli(db, &["resume", &f.token, "yes"])
        .await
        .fails(2, "malformed JSON payload");
    cli(db, &["resume", &f.token, " "])
        .await
        .fails(2, "empty payload");
    cli(db, &["resume", "approval:nobody", "true"])
        .await
        .fails(1, "no active hook owns token \"approval:nobody\"");
    // Nothing reached the waiting run.
    assert_eq!(f.rt.store().payloads(&f.waiting, 0).await.unwrap(), []);

    // A status is one of clap's choices: a usage error that lists them, and `--help` lists
    // them too.
    let statuses = "pending, running, blocked, completed, failed, cancelled, continued_as_new";
    cli(db, &["runs", "--status", "sleeping"]).await.fails(
        2,
        &format!(
            "invalid value 'sleeping' for '--status <STATUS>'\n  [possible values: {statuses}]"
        ),
    );
    let help = cli(db, &["runs", "--help"]).await.ok();
    for status in statuses.split(", ") {
        assert!(help.contains(&format!("- {status}: ")), "{status}: {help}");
    }
    let help = cli(db, &["runs", "-h"]).await.ok();
    assert!(
        help.contains(&format!("[possible values: {statuses}]")),
        "{help}"
    );
}

async fn prune_deletes_old_ended_runs_only(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let ended = [f.completed, f.failed, f.cancelled];
    let mut events = 0;
    for id in ended {
        events += f.rt.store().events(&id).await.unwrap().len();
    }

    // Everything ended moments ago.
    let out = cli(db, &["prune", "--older-than", "30d"]).await.ok();
    assert_eq!(
        out,
        "deleted 0 runs and 0 events (ended more than 30d ago)\n"
    );
    assert_eq!(ids(&cli(db, &["runs", "--json"]).await.json()).len(), 5);

    let out = cli(db, &["prune", "--older-than", "0s", "--json"])
        .await
        .json();
    assert_eq!(out, json!({"runs": 3, "events": events}));
    let left = cli(db, &["runs", "--json"]).await.json();
    assert_eq!(
        ids(&left),
        [f.sleeping.to_string(), f.waiting.to_string()],
        "the live runs stay"
    );
    for id in ended {
        cli(db, &["run", &id.to_string()])
            .await
            .fails(1, &format!("run {id} not found"));
    }
    // The waiting run's hook still takes payloads.
    let hooks = cli(db, &["hooks", "--json"]).await.json();
    assert_eq!(hooks[0]["token"], f.token.as_str());
    let out = cli(db, &["prune", "--older-than", "0s"]).await.ok();
    assert_eq!(
        out,
        "deleted 0 runs and 0 events (ended more than 0s ago)\n"
    );

    // The grammar of `#[step(timeout)]`, jiff's: the reason is jiff's unless it is ours.
    for (age, why) in [
        ("30", "the unit is missing"),
        ("30x", "expected to find unit designator suffix"),
        ("d", "expected duration to start with a unit value"),
        ("1s1m", "found value with unit minute after unit second"),
        ("1mo", "months and years have no fixed length"),
        ("1d ago", "an age cannot be negative"),
        ("99999999999999999999d", "number too big"),
    ] {
        // Refused by clap, before the database is opened, naming the flag.
        cli(db, &["prune", "--older-than", age]).await.fails(
            2,
            &format!("invalid value '{age}' for '--older-than <AGE>': invalid age `{age}`: {why}"),
        );
    }
    // The age is said back as typed.
    let out = cli(db, &["prune", "--older-than", " 1h30m "]).await.ok();
    assert_eq!(
        out,
        "deleted 0 runs and 0 events (ended more than 1h30m ago)\n"
    );
    let out = cli(db, &["prune"]).await;
    assert_eq!(out.code, 2, "--older-than is required: {out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_databases_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    cli(&sqlite_args(&missing), &["runs"])
        .await
        .fails(3, "the file does not exist");
    assert!(!missing.exists(), "a missing database must not be created");

    let not_a_db = dir.path().join("notes.txt");
    let text = "these are not the runs you are looking for\n".repeat(100);
    std::fs::write(&not_a_db, &text).unwrap();
    cli(&sqlite_args(&not_a_db), &["runs"])
        .await
        .fails(3, "cannot open the database at");
    assert_eq!(
        std::fs::read_to_string(&not_a_db).unwrap(),
        text,
        "left untouched"
    );

    // Nothing listens on port 1. The password stays out of the message, however it is written.
    for (url, shown) in [
        (
            "postgres://nobody:secret@127.0.0.1:1/none",
            "postgres://nobody:***@127.0.0.1:1/none",
        ),
        (
            "postgres://nobody:se@cret@127.0.0.1:1/none",
            "postgres://nobody:***@127.0.0.1:1/none",
        ),
        (
            "postgres://nobody@127.0.0.1:1/none?password=secret&connect_timeout=5",
            "postgres://nobody@127.0.0.1:1/none?password=***&connect_timeout=5",
        ),
        (
            "host=127.0.0.1 port=1 user=nobody password='se cret' dbname=none",
            "host=127.0.0.1 port=1 user=nobody password=*** dbname=none",
        ),
    ] {
        let out = cli(&[], &["--database-url", url, "runs"]).await;
        assert!(!out.stderr.contains("cret"), "{out:?}");
        if cfg!(feature = "postgres") {
            out.fails(3, &format!("cannot open the database at {shown}"));
        } else {
            out.fails(2, "built without PostgreSQL support");
        }
    }
}

/// What a terminal would act on: C0 but the line break, DEL, C1, the bidi controls.
fn assert_inert(out: &str) {
    let bad = out.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    });
    assert_eq!(bad, None, "printed raw: {out:?}");
}

async fn output_escapes_control_characters(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    // C1's CSI and a right-to-left override in the input.
    let label = "\u{9b}31m\u{202e}lab";
    let run = f.rt.start(garbled, (label.to_owned(),)).await.unwrap();
    tokio::time::timeout(common::WAIT, run.return_value())
        .await
        .expect("the run did not end in time")
        .unwrap_err();
    let id = run.id().to_string();

    let text = cli(db, &["run", &id]).await.ok();
    assert_inert(&text);
    assert!(
        row(&text, "error")
            .contains("\\u001b[2J\\u001b]0;pwned\\u0007boom\\u000aFAKE ROW \\u009b31m\\u202elab"),
        "{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("FAKE")), "{text}");
    assert!(
        row(&text, "input").contains("\\u009b31m\\u202elab"),
        "{text}"
    );
    assert_inert(&cli(db, &["runs"]).await.ok());
    let events = cli(db, &["events", &id]).await.ok();
    assert_inert(&events);
    assert!(events.contains("\\u000aFAKE ROW"), "{events}");
    assert!(!events.lines().any(|l| l.starts_with("FAKE")), "{events}");

    // JSON stays JSON, and decodes to what the store holds.
    let out = cli(db, &["run", &id, "--json"]).await.ok();
    assert_inert(&out);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["input"], json!([label]));
    assert_eq!(
        v["error"]["message"],
        format!("\u{1b}[2J\u{1b}]0;pwned\u{7}boom\nFAKE ROW {label}")
    );
    let out = cli(db, &["runs", "--json"]).await.ok();
    assert_inert(&out);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()[0]["input"],
        json!([label])
    );

    // Errors too: the token is echoed back.
    let out = cli(db, &["resume", "\u{1b}]0;pwned\u{7}\u{202e}", "true"]).await;
    assert_ne!(out.code, 0, "{out:?}");
    assert!(out.stderr.starts_with("error: "), "{out:?}");
    assert_inert(&out.stderr);
}

/// The event kinds of run `id`'s history once `done` holds for them, or a panic after the wait.
async fn history_until(
    rt: &workflow_core::Runtime,
    id: RunId,
    done: impl Fn(&[&str]) -> bool,
) -> Vec<&'static str> {
    tokio::time::timeout(common::WAIT, async {
        loop {
            let events = rt.store().events(&id).await.unwrap();
            let kinds: Vec<&'static str> = events.iter().map(|e| e.event.kind()).collect();
            if done(&kinds) {
                return kinds;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the history of run {id} did not get there in time"))
}

async fn blocked_runs_are_listed_shown_and_retried(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let key = format!("key-{}", RunId::new());
    let id = blocked_run(&f, &key).await;
    let sid = id.to_string();

    let listed = cli(db, &["runs", "--status", "blocked", "--json"])
        .await
        .json();
    assert_eq!(ids(&listed), std::slice::from_ref(&sid));
    assert_eq!(listed[0]["error"]["kind"], "diverged");
    let table = cli(db, &["runs", "--status", "blocked"]).await.ok();
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(row(&table, &sid).contains(" blocked "), "{table}");

    let text = cli(db, &["run", &sid]).await.ok();
    eprintln!("workflow run {sid}:\n{text}");
    assert!(row(&text, "status").ends_with("blocked"), "{text}");
    assert!(
        row(&text, "blocked").contains("diverged from its recorded history"),
        "{text}"
    );
    assert!(row(&text, "event").ends_with(" 1"), "{text}");
    assert!(
        row(&text, "expected").contains("step `cli::common::greet`"),
        "{text}"
    );
    assert!(
        row(&text, "found").contains("step `cli::common::note`"),
        "{text}"
    );
    assert!(
        row(&text, "then").contains(&format!("workflow retry {sid}")),
        "{text}"
    );
    let v = cli(db, &["run", &sid, "--json"]).await.json();
    assert_eq!(v["divergence"]["event"], 1);
    assert!(v["divergence"]["expected"]
        .as_str()
        .unwrap()
        .contains("cli::common::greet"));
    assert!(v["divergence"]["found"]
        .as_str()
        .unwrap()
        .contains("cli::common::note"));
    assert!(
        v["waiting_on"][0]
            .as_str()
            .unwrap()
            .contains("fits its recorded history"),
        "{v}"
    );

    // The code that fits is deployed; blocked runs wait a minute before a worker tries them
    // again, so what moves it now is the retry.
    deploy(&key);
    let out = cli(db, &["retry", &sid]).await.ok();
    assert_eq!(
        out,
        format!("retrying run {sid} (it was blocked); a worker picks it up now\n")
    );
    until_status(&f.rt, id, RunStatus::Completed).await;
    let v = cli(db, &["run", &sid, "--json"]).await.json();
    assert_eq!(v["output"], format!("hello, {key}"));
    assert_eq!(v["divergence"], Value::Null);
    let kinds = history_until(&f.rt, id, |_| true).await;
    assert!(!kinds.contains(&"run_retried"), "{kinds:?}");
    assert!(
        cli(db, &["runs", "--status", "blocked"]).await.ok() == "no runs\n",
        "nothing is blocked any more"
    );
}

async fn retry_reopens_a_failed_run_and_refuses_others(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let failed = f.failed.to_string();

    let out = cli(db, &["retry", &failed]).await.ok();
    assert_eq!(
        out,
        format!(
            "re-opened run {failed} (it had failed); its failed step gets a fresh set of attempts\n"
        )
    );
    // `charge` always declines: a fresh set of attempts, then failed again.
    let kinds = history_until(&f.rt, f.failed, |k| {
        k.iter()
            .position(|&e| e == "run_retried")
            .is_some_and(|at| k[at..].contains(&"run_failed"))
    })
    .await;
    eprintln!("history after the retry: {kinds:?}");
    until_status(&f.rt, f.failed, RunStatus::Failed).await;
    let events = cli(db, &["events", &failed]).await.ok();
    assert!(
        row(
            &events,
            &(kinds.iter().position(|&k| k == "run_retried").unwrap() + 1).to_string()
        )
        .contains("failed run re-opened by retry"),
        "{events}"
    );
    // The step shows both sets of attempts, the second one after the retry.
    let v = cli(db, &["run", &failed, "--json"]).await.json();
    let attempts: Vec<(u64, &str)> = v["steps"][0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [(1, "failed"), (2, "failed"), (1, "failed"), (2, "failed")]
    );
    assert_eq!(v["steps"][0]["status"], "failed");
    let v = cli(db, &["retry", &failed, "--json"]).await.json();
    assert_eq!(v, json!({"run_id": failed, "was": "failed"}));

    // Completed, cancelled or live runs: refused, nothing changed.
    for (id, status) in [
        (f.completed, "completed"),
        (f.cancelled, "cancelled"),
        (f.sleeping, "running"),
    ] {
        let before = f.rt.store().events(&id).await.unwrap();
        cli(db, &["retry", &id.to_string()]).await.fails(
            4,
            &format!("run {id} is {status}: only a failed or blocked run can be retried"),
        );
        assert_eq!(f.rt.store().events(&id).await.unwrap(), before);
    }
    let absent = RunId::new().to_string();
    cli(db, &["retry", &absent])
        .await
        .fails(1, &format!("run {absent} not found"));
    cli(db, &["retry", "nope"]).await.fails(2, "invalid run id");
}

async fn fork_keeps_the_first_steps(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let sleeping = f.sleeping.to_string();

    let out = cli(db, &["fork", &sleeping, "--from-step", "1"]).await.ok();
    eprintln!("workflow fork {sleeping} --from-step 1:\n{out}");
    let new: RunId = out
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(out, format!("{new}\n"), "the new id alone");
    assert_ne!(new, f.sleeping);
    // The copy holds the first step's result and goes on to its sleep.
    let kinds = history_until(&f.rt, new, |k| k.contains(&"timer_scheduled")).await;
    assert_eq!(
        kinds,
        ["step_scheduled", "step_completed", "timer_scheduled"]
    );
    let v = cli(db, &["run", &new.to_string(), "--json"]).await.json();
    assert_eq!(v["workflow"], "cli::common::nap");
    assert_eq!(v["input"], json!(["cyd"]));
    assert_eq!(v["steps"][0]["output"], "cyd goes to sleep");

    let v = cli(db, &["fork", &sleeping, "--from-step", "0", "--json"])
        .await
        .json();
    assert_eq!(v["forked_from"], sleeping);
    assert_eq!(v["from_step"], 0);
    let forked: RunId = v["run_id"].as_str().unwrap().parse().unwrap();
    assert_ne!(forked.to_string(), sleeping, "a new run");
    let v = cli(db, &["run", &forked.to_string(), "--json"])
        .await
        .json();
    assert_eq!(
        (&v["workflow"], &v["input"]),
        (&json!("cli::common::nap"), &json!(["cyd"]))
    );

    let runs = ids(&cli(db, &["runs", "--json"]).await.json()).len();
    cli(db, &["fork", &sleeping, "--from-step", "7"])
        .await
        .fails(4, &format!("cannot fork run {sleeping}"));
    assert_eq!(
        ids(&cli(db, &["runs", "--json"]).await.json()).len(),
        runs,
        "nothing created"
    );
    let absent = RunId::new().to_string();
    cli(db, &["fork", &absent, "--from-step", "1"])
        .await
        .fails(1, &format!("run {absent} not found"));
    let out = cli(db, &["fork", &sleeping]).await;
    assert_eq!(out.code, 2, "--from-step is required: {out:?}");
}

async fn export_prints_the_versioned_history(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let completed = f.completed.to_string();

    let out = cli(db, &["export", &completed]).await.ok();
    eprintln!("workflow export {completed}:\n{out}");
    assert!(
        out.starts_with(
            "{\n  \"format\": \"workflow-rs/history\",\n  \"version\": 2,\n  \"run\": {\n"
        ),
        "pretty, in the documented order: {out}"
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["format"], "workflow-rs/history");
    assert_eq!(v["version"], 2);
    assert_eq!(v["run"]["id"], completed);
    assert_eq!(v["run"]["workflow"], "cli::common::welcome");
    assert_eq!(v["run"]["input"], json!(["ada"]));
    assert_eq!(v["events"].as_array().unwrap().len(), 5);
    assert_eq!(v["events"][0]["event"]["type"], "step_scheduled");
    assert_eq!(v, f.rt.get_run(&f.completed).export().await.unwrap());

    let file = f.db.dir.path().join("history.json");
    let path = file.display().to_string();
    let out = cli(db, &["export", &completed, "-o", &path]).await.ok();
    assert_eq!(
        out,
        format!("wrote the history of run {completed} (5 events) to {path}\n")
    );
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written, v);

    let absent = RunId::new().to_string();
    cli(db, &["export", &absent])
        .await
        .fails(1, &format!("run {absent} not found"));
    // A run's history lists retries and patches like any other event.
    assert!(matches!(
        f.rt.store().events(&f.completed).await.unwrap()[0].event,
        Event::StepScheduled { .. }
    ));
}

async fn run_links_parents_and_children(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let token = format!("kids-{}", RunId::new());
    let parent = f.rt.start(cli_parent, (token.clone(),)).await.unwrap();
    let children = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let c =
                f.rt.store()
                    .list_runs(&workflow_core::store::RunFilter::new().parent(parent.id()))
                    .await
                    .unwrap();
            if c.len() == 2 {
                return c;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("two children in time");
    let first = children
        .iter()
        .find(|c| c.input == json!([format!("{token}-1")]))
        .unwrap()
        .id;
    loop {
        match f.rt.resume_hook(format!("{token}-1"), "done").await {
            Ok(_) => break,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    until_status(&f.rt, parent.id(), RunStatus::Completed).await;

    let out = cli(db, &["run", &parent.id().to_string()]).await.ok();
    assert!(out.contains("\nchildren\n"), "{out}");
    let line = row(&out, &first.to_string());
    assert!(
        line.contains("cli_gated") && line.contains("completed") && line.contains("\"done\""),
        "{line}"
    );
    for c in &children {
        assert!(out.contains(&c.id.to_string()), "{out}");
    }
    let v = cli(db, &["run", &parent.id().to_string(), "--json"])
        .await
        .json();
    let listed: Vec<&str> = v["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["child_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 2, "{v}");
    assert_eq!(v["children"][0]["status"], "completed");
    assert_eq!(v["children"][1]["status"], "running");

    let out = cli(db, &["run", &first.to_string()]).await.ok();
    assert!(
        row(&out, "parent").contains(&parent.id().to_string()),
        "{out}"
    );
    let v = cli(db, &["run", &first.to_string(), "--json"]).await.json();
    assert_eq!(v["parent"], json!(parent.id().to_string()));
    let events = cli(db, &["events", &parent.id().to_string()]).await.ok();
    assert!(
        events.contains("child_started") && events.contains("child_ended"),
        "{events}"
    );
}

#[step]
async fn say(words: Vec<String>, close: bool) -> workflow_core::Result<()> {
    let out = stream::<String>("words");
    for w in words {
        out.write(w).await?;
    }
    if close {
        out.close().await?;
    }
    Ok(())
}

/// Writes three words, waits for its hook `chatter:<run id>`, writes two more and closes.
#[workflow]
async fn chatter() -> workflow_core::Result<()> {
    say(vec!["w0".into(), "w1".into(), "w2\u{1b}[2J".into()], false).await?;
    let mut go = create_hook::<bool>(format!("chatter:{}", workflow_metadata().run_id));
    go.recv().await?;
    say(vec!["w3".into(), "w4".into()], true).await
}

async fn stream_prints_and_follows_a_run_s_chunks(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let run = f.rt.start(chatter, ()).await.unwrap();
    let id = run.id().to_string();
    let token = format!("chatter:{id}");
    while f.rt.get_hook_by_token(&token).await.is_err() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let out = cli(db, &["stream", &id, "words"]).await.ok();
    assert_eq!(
        out,
        "0  attempt 1  \"w0\"\n1  attempt 1  \"w1\"\n2  attempt 1  \"w2\\u001b[2J\"\n"
    );
    let out = cli(db, &["--json", "stream", &id, "words", "--from", "1"])
        .await
        .ok();
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            json!({"index": 1, "attempt": 1, "value": "w1"}),
            json!({"index": 2, "attempt": 1, "value": "w2\u{1b}[2J"}),
        ]
    );
    assert_eq!(cli(db, &["stream", &id, "nothing"]).await.ok(), "");

    // `--follow` prints what is there, waits for the rest, and ends with the close.
    let follow = tokio::spawn({
        let (db, id) = (db.clone(), id.clone());
        async move { cli(&db, &["stream", &id, "words", "--from", "2", "--follow"]).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!follow.is_finished(), "--follow waits for the close");
    f.rt.resume_hook(&token, true).await.unwrap();
    let out = follow.await.unwrap().ok();
    assert_eq!(
        out,
        "2  attempt 1  \"w2\\u001b[2J\"\n3  attempt 1  \"w3\"\n4  attempt 1  \"w4\"\n"
    );
    run.return_value().await.unwrap();

    let shown = cli(db, &["run", &id]).await.ok();
    let streams = shown.split("\nstreams\n").nth(1).expect(&shown);
    assert!(row(streams, "STREAM").contains("CHUNKS"), "{shown}");
    assert!(row(streams, "words").contains("closed"), "{shown}");
    assert!(row(streams, "words").contains("\"w4\""), "{shown}");
    let detail = cli(db, &["--json", "run", &id]).await.json();
    assert_eq!(detail["streams"][0]["name"], "words");
    assert_eq!(detail["streams"][0]["chunks"], 5);
    assert_eq!(detail["streams"][0]["closed"], true);
    assert_eq!(detail["streams"][0]["recent"][4]["value"], "w4");

    let absent = RunId::new().to_string();
    cli(db, &["stream", &absent, "words"])
        .await
        .fails(1, &format!("run {absent} not found"));
    cli(db, &["stream", &absent, "words", "--follow"])
        .await
        .fails(1, &format!("run {absent} not found"));
    cli(db, &["stream", "nope", "words"]).await.fails(2, "nope");
}

/// `--tz` shows every time in the zone, the offset changing with DST (Paris moved from +01:00
/// to +02:00 at 2026-03-29T01:00:00Z); JSON keeps UTC; an unknown zone is refused.
async fn tz_shows_times_in_a_zone_across_a_dst_change(b: Backend) {
    use std::time::{Duration, UNIX_EPOCH};
    use workflow_core::store::{NewEvent, NewRun};

    let f = fixture(b).await;
    let db = &f.store;
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    let id = RunId::new();
    f.rt.store()
        .create_run_with_history(
            NewRun::new(id, "cli::tz".to_owned(), json!([]), at(1_774_744_200_000)),
            &[NewEvent {
                // 2026-03-29T00:59:59.500Z, half a second before the change.
                at: at(1_774_745_999_500),
                event: Event::TimerScheduled {
                    timer_id: "tmr_0".to_owned(),
                    // 2026-03-29T01:30:00Z, after it.
                    fire_at_ms: 1_774_747_800_000,
                },
            }],
        )
        .await
        .unwrap();
    let id = id.to_string();

    let utc = cli(db, &["events", &id]).await.ok();
    assert!(
        row(&utc, "1").contains("2026-03-29T00:59:59.500Z")
            && row(&utc, "1").contains("tmr_0 until 2026-03-29T01:30:00.000Z"),
        "{utc}"
    );
    let paris = cli(db, &["--tz", "Europe/Paris", "events", &id]).await.ok();
    assert!(
        row(&paris, "1").contains("2026-03-29T01:59:59.500+01:00")
            && row(&paris, "1").contains("tmr_0 until 2026-03-29T03:30:00.000+02:00"),
        "{paris}"
    );
    let shown = cli(db, &["run", &id, "--tz", "Europe/Paris"]).await.ok();
    assert!(
        row(&shown, "created").ends_with("2026-03-29T01:30:00.000+01:00"),
        "{shown}"
    );
    assert!(
        row(&shown, "tmr_0").contains("2026-03-29T03:30:00.000+02:00"),
        "{shown}"
    );
    let runs = cli(
        db,
        &["--tz", "Europe/Paris", "runs", "--workflow", "cli::tz"],
    )
    .await
    .ok();
    assert!(
        row(&runs, &id).contains("2026-03-29T01:30:00.000+01:00"),
        "{runs}"
    );
    let json = cli(db, &["--tz", "Europe/Paris", "--json", "events", &id])
        .await
        .json();
    assert_eq!(json[0]["at"], "2026-03-29T00:59:59.500Z");

    cli(db, &["--tz", "Mars/Olympus", "runs"])
        .await
        .fails(2, "unknown time zone `Mars/Olympus`");
}

/// Publishes what it receives on "say", waits for "end", then ends with what it heard.
#[workflow]
async fn cli_listener() -> workflow_core::Result<String> {
    let said: String = workflow_core::recv("say").await?;
    workflow_core::set_event("heard", &said)?;
    workflow_core::recv::<()>("end").await?;
    Ok(said)
}

async fn send_delivers_messages_and_events_lists_published_values(b: Backend) {
    let f = fixture(b).await;
    let db = &f.store;
    let run = f.rt.start(cli_listener, ()).await.unwrap();
    let id = run.id().to_string();
    let out = cli(db, &["send", &id, "say", r#""hello""#, "--key", "k1"])
        .await
        .ok();
    assert_eq!(out, format!("sent to run {id} on topic \"say\"\n"));
    // A repeat of the key stores nothing, and says so by succeeding.
    let again = cli(
        db,
        &["send", &id, "say", r#""again""#, "--key", "k1", "--json"],
    )
    .await
    .json();
    assert_eq!(again, json!({"run_id": id, "topic": "say"}));
    cli(db, &["send", &id, "end", "null"]).await.ok();
    until_status(&f.rt, run.id(), RunStatus::Completed).await;
    assert_eq!(run.return_value().await.unwrap(), "hello");

    let v = cli(db, &["events", &id, "--published", "--json"])
        .await
        .json();
    assert_eq!(v, json!({"heard": "hello"}));
    let table = cli(db, &["events", &id, "--published"]).await.ok();
    assert!(row(&table, "heard").contains("\"hello\""), "{table}");
    let quiet = cli(db, &["events", &f.completed.to_string(), "--published"])
        .await
        .ok();
    assert!(quiet.contains("published no events"), "{quiet}");

    cli(db, &["send", &id, "say", r#""late""#])
        .await
        .fails(4, "has ended (completed)");
    let absent = RunId::new().to_string();
    cli(db, &["send", &absent, "say", "1"])
        .await
        .fails(1, &format!("run {absent} not found"));
    cli(db, &["send", &id, "say", "not json"])
        .await
        .fails(2, "JSON");
    cli(db, &["send", &id, "", "1"]).await.fails(2, "topic");
}
