use serde_json::json;

use super::super::{from_millis, RunOutcome};
use super::commit::{GroupRecord, COMMITTERS};
use super::listen::parse_notice;
use super::schema::MIGRATIONS;
use super::statements::CLOCK;
use super::*;
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sqlx::{Connection, Executor, PgConnection};
use tokio::sync::broadcast;

use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::sql::EncodedEvents;
use crate::store::{
    Admission, AdmittedWith, Append, ClaimOutcome, EndHint, Event, HookStore, Lease, NewEvent,
    NewRun, Notice, RunStatus, RunStore,
};
use crate::testing::store::{
    acquire, ap, conformance_tests, create, event_seqs, lease_one, names, new_run,
    previous_release_is_kept, start, step_done, t, within, Damage, Inspect,
};

/// How long a notice may take to arrive.
const NOTICE_WAIT: Duration = Duration::from_secs(10);

/// The test database, or `None` (the test is skipped) when none is configured; under
/// `CI=true` a missing database fails the test instead.
fn test_url() -> Option<String> {
    match std::env::var("WORKFLOW_TEST_DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "WORKFLOW_TEST_DATABASE_URL is not set, but CI=true requires the PostgreSQL \
                 store tests to run"
            );
            // Straight to stderr: libtest shows a passing test's `eprintln!` to no one.
            let test = std::thread::current().name().unwrap_or("a test").to_owned();
            let _ = writeln!(
                std::io::stderr(),
                "skipped {test}: WORKFLOW_TEST_DATABASE_URL is not set"
            );
            None
        }
    }
}

/// A schema of the test's own, dropped when this goes out of scope (also when the test
/// panics), after the stores using it.
struct TestSchema {
    url: String,
    name: String,
}

impl TestSchema {
    fn new() -> Option<TestSchema> {
        Some(TestSchema {
            url: test_url()?,
            name: format!("wf_t_{:016x}", rand::random::<u64>()),
        })
    }

    async fn connect(&self) -> PostgresStore {
        within(PostgresStore::connect(&self.url, &self.name))
            .await
            .unwrap()
    }

    /// A plain connection for inspecting and damaging tables.
    async fn raw(&self) -> PgConnection {
        within(PgConnection::connect(&self.url)).await.unwrap()
    }

    fn table(&self, table: &str) -> String {
        format!("{}.{table}", quote_ident(&self.name))
    }

    async fn count(&self, table: &str) -> i64 {
        let mut conn = self.raw().await;
        sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.table(table)))
            .fetch_one(&mut conn)
            .await
            .unwrap()
    }

    /// Makes each of `runs`' leases stale, as a later lease taken by another worker would.
    async fn take_over(&self, runs: &[RunId]) {
        let mut sql = self.raw().await;
        for id in runs {
            sqlx::query(&format!(
                "UPDATE {} SET epoch = epoch + 1 WHERE id = $1",
                self.table("runs")
            ))
            .bind(id.to_string())
            .execute(&mut sql)
            .await
            .unwrap();
        }
    }

    async fn exec(&self, sql: &str) {
        let mut conn = self.raw().await;
        conn.execute(sql).await.unwrap();
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        // Drop cannot await, and may run on a runtime thread: use a thread of its own.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let mut conn = PgConnection::connect(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                // This thread blocks the test's runtime, so connections its stores left
                // inside a transaction (sqlx rolls back on the next use) would hold their
                // locks against the DROP forever: end them first.
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE application_name = $1 AND pid <> pg_backend_pid()",
                )
                .bind(application_name(&name))
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
                conn.execute("SET lock_timeout = '10s'")
                    .await
                    .map_err(|e| e.to_string())?;
                conn.execute(
                    format!("DROP SCHEMA IF EXISTS {} CASCADE", quote_ident(&name)).as_str(),
                )
                .await
                .map_err(|e| e.to_string())?;
                conn.close().await.map_err(|e| e.to_string())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}: {dropped:?}", self.name);
        }
    }
}

/// A fresh schema and a store on it, or return (skipping the test).
macro_rules! fresh {
    () => {{
        let Some(schema) = TestSchema::new() else {
            return;
        };
        let store = schema.connect().await;
        (schema, store)
    }};
}

impl PostgresStore {
    /// `table` of this store's schema, quoted.
    fn table(&self, table: &str) -> String {
        format!("{}.{table}", quote_ident(self.schema()))
    }
}

impl Inspect for PostgresStore {
    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.table(table)))
            .fetch_one(&self.inner.pool)
            .await
            .unwrap()
    }

    async fn wake_at(&self, run: RunId) -> SystemTime {
        let ms: i64 = sqlx::query_scalar(&format!(
            "SELECT wake_at FROM {} WHERE id = $1",
            self.table("runs")
        ))
        .bind(run.to_string())
        .fetch_one(&self.inner.pool)
        .await
        .unwrap();
        from_millis(u64::try_from(ms).unwrap())
    }

    async fn event_kinds(&self, run: RunId) -> Option<Vec<String>> {
        let kinds = sqlx::query_scalar(&format!(
            "SELECT kind FROM {} WHERE run_id = $1 ORDER BY seq",
            self.table("events")
        ))
        .bind(run.to_string())
        .fetch_all(&self.inner.pool)
        .await
        .unwrap();
        Some(kinds)
    }
}

impl Damage for PostgresStore {
    async fn corrupt_input(&self, run: RunId) {
        sqlx::query(&format!(
            "UPDATE {} SET input = 'not json' WHERE id = $1",
            self.table("runs")
        ))
        .bind(run.to_string())
        .execute(&self.inner.pool)
        .await
        .unwrap();
    }

    async fn add_undecodable_event(&self, run: RunId) {
        sqlx::query(&format!(
            "INSERT INTO {} (run_id, seq, at, kind, data) VALUES ($1, 1, 0, 'x', '{{}}')",
            self.table("events")
        ))
        .bind(run.to_string())
        .execute(&self.inner.pool)
        .await
        .unwrap();
        sqlx::query(&format!(
            "UPDATE {} SET last_seq = 1 WHERE id = $1",
            self.table("runs")
        ))
        .bind(run.to_string())
        .execute(&self.inner.pool)
        .await
        .unwrap();
    }

    async fn rewrite_inbox(&self, run: RunId, json: &str) {
        sqlx::query(&format!(
            "UPDATE {} SET payload = $2 WHERE run_id = $1",
            self.table("hook_inbox")
        ))
        .bind(run.to_string())
        .bind(json)
        .execute(&self.inner.pool)
        .await
        .unwrap();
    }
}

conformance_tests! {
    groups: [contract, inspect, compared, damage],
    // Each on a schema of its own; skipped without a test database.
    one: {
        let (_schema, store) = fresh!();
    } => store,
    shared: {
        let (schema, a) = fresh!();
        // Three stores, three pools, one schema.
        let stores = [a, schema.connect().await, schema.connect().await];
    } => stores,
}

// -----------------------------------------------------------------------------------------
// Connecting and migrating

#[tokio::test]
async fn rejects_invalid_schema_names_before_connecting() {
    let long = "a".repeat(64);
    for bad in [
        "", "1abc", "bad-name", "a\"b", "a b", "pg_temp", "PG_x", "ünï", &long,
    ] {
        let err = PostgresStore::connect("postgres://nobody@127.0.0.1:1/none", bad)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Database(m) if m.message().contains("invalid PostgreSQL schema name")),
            "{bad:?}: {err:?}"
        );
    }
    assert!(check_schema_name(&"a".repeat(63)).is_ok());
    assert!(check_schema_name("_Workflow_2").is_ok());
}

#[tokio::test]
async fn an_unreachable_database_is_an_error_naming_it_without_the_password() {
    let err = within(PostgresStore::connect(
        "postgres://alice:s3cret@127.0.0.1:1/orders",
        "workflow",
    ))
    .await
    .unwrap_err();
    let StoreError::Database(msg) = &err else {
        panic!("expected Database, got {err:?}");
    };
    assert!(err.is_transient(), "a refused connection may succeed later");
    let msg = msg.message();
    assert!(
        msg.contains("cannot connect to PostgreSQL at alice@127.0.0.1:1/orders"),
        "{msg}"
    );
    assert!(!msg.contains("s3cret"), "{msg}");

    let err = within(PostgresStore::connect("not a url", "workflow"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Database(m) if m.message().contains("invalid PostgreSQL URL")),
        "{err:?}"
    );
}

/// Writes arriving together are committed by the committers in batches, where neighbouring
/// appends of events and all admissions go in one statement each: every write still
/// answers for itself (a stale lease is refused alone, an id admitted twice is admitted
/// once) and each run's events are numbered without gaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_appends_and_admissions_each_answer_for_themselves() {
    let Some(schema) = TestSchema::new() else {
        return;
    };
    let store = schema.connect().await;
    let run = |id: RunId| new_run(id, "orders");
    let ids: Vec<RunId> = (0..40).map(|_| RunId::new()).collect();
    // Each id twice, all at once.
    let admissions = ids
        .iter()
        .chain(&ids)
        .map(|id| store.create_run_leased(run(*id), Duration::from_secs(600)));
    let admitted = within(futures::future::join_all(admissions)).await;
    let mut leases = std::collections::HashMap::new();
    let mut refused = 0;
    for admission in admitted {
        match admission {
            Ok((Admission::Admitted, Some(lease))) => {
                assert!(
                    leases.insert(lease.run_id, lease).is_none(),
                    "admitted twice"
                );
            }
            Err(StoreError::Database(e)) if e.to_string().contains("exists") => refused += 1,
            other => panic!("unexpected admission: {other:?}"),
        }
    }
    assert_eq!((leases.len(), refused), (40, 40));
    // Three rounds of appends to every run at once; every fourth run is taken over by a
    // later lease first, so its appends under the first lease are refused.
    let stale: Vec<RunId> = ids.iter().step_by(4).copied().collect();
    schema.take_over(&stale).await;
    for round in 0..3u32 {
        let appends = ids.iter().map(|id| {
            let lease = leases[id].clone();
            let store = &store;
            async move {
                let write = ap(
                    vec![step_done(t(10), round), step_done(t(10), round + 100)],
                    None,
                );
                (lease.run_id, store.append(&lease, &write).await)
            }
        });
        for (id, appended) in within(futures::future::join_all(appends)).await {
            match appended {
                Ok(()) => assert!(!stale.contains(&id), "a stale lease's append was taken"),
                Err(StoreError::LeaseLost(run)) => {
                    assert_eq!(run, id);
                    assert!(stale.contains(&id), "a live lease's append was refused");
                }
                Err(e) => panic!("append failed: {e}"),
            }
        }
    }
    for id in &ids {
        let expected: Vec<u64> = if stale.contains(id) {
            vec![]
        } else {
            (1..=6).collect()
        };
        assert_eq!(event_seqs(&store, *id).await, expected, "run {id}");
    }
}

/// The lease of a run the tests below lease on admission.
const LEASE: Duration = Duration::from_secs(600);

/// A new run of `workflow`, leased to the test.
async fn leased(store: &PostgresStore, workflow: &str) -> Lease {
    let admitted = within(store.create_run_leased(new_run(RunId::new(), workflow), LEASE)).await;
    match admitted {
        Ok((Admission::Admitted, Some(lease))) => lease,
        other => panic!("unexpected admission: {other:?}"),
    }
}

/// A write for a test to send: an admission of a workflow, or an append (ending the run
/// when it has an outcome).
enum ToSend {
    Admit(RunId, String),
    /// A start leased at admission with its first events (two steps done, numbered `n`).
    AdmitWith(RunId, u32),
    Append(Lease, Append),
}

/// What a test's write was, and what it answered.
enum Sent {
    Admit(RunId, Result<Admission, StoreError>),
    AdmitWith(RunId, u32, Result<AdmittedWith, StoreError>),
    Append(RunId, Result<(), StoreError>),
    End(RunId, Result<(), StoreError>),
}

/// The lone write and every committer, each writing one run whose row the test holds
/// locked: writes sent meanwhile wait in the committers' queue, and the first committer
/// freed takes them all as one group.
struct Held {
    /// In a transaction holding the runs' rows.
    locks: PgConnection,
    /// The held writes: each run's lease and its append's answer.
    writes: Vec<(Lease, tokio::task::JoinHandle<Result<(), StoreError>>)>,
}

impl Held {
    /// Holds the committers of `store`: one write at a time, each sent once the one before
    /// it waits on its row lock, so each waits in its own committer (or as the lone write).
    async fn new(schema: &TestSchema, store: &PostgresStore) -> Held {
        // On a machine of few cores the stash lets fewer connections out than the committers
        // and the lone write: enough more for each of them to wait at the database, holding
        // one.
        let short = (COMMITTERS + 1).saturating_sub(stash_size());
        store.inner.writer.stash.permits.add_permits(short);
        let mut runs = Vec::new();
        for _ in 0..=COMMITTERS {
            runs.push(leased(store, "held").await);
        }
        let mut locks = schema.raw().await;
        within(locks.execute("BEGIN")).await.unwrap();
        let ids: Vec<String> = runs.iter().map(|l| l.run_id.to_string()).collect();
        within(
            sqlx::query(&format!(
                "SELECT id FROM {} WHERE id = ANY($1) FOR UPDATE",
                schema.table("runs")
            ))
            .bind(&ids)
            .fetch_all(&mut locks),
        )
        .await
        .unwrap();
        let mut watch = schema.raw().await;
        let mut writes = Vec::new();
        for lease in runs {
            let (s, l) = (store.clone(), lease.clone());
            let write =
                tokio::spawn(
                    async move { s.append(&l, &ap(vec![step_done(t(1), 1)], None)).await },
                );
            writes.push((lease, write));
            let waiting = writes.len() as i64;
            within(async {
                while lock_waits(&mut watch, &schema.name).await < waiting {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
        }
        Held { locks, writes }
    }

    /// Lets the held writes go on, and checks each committed its step.
    async fn release(mut self, store: &PostgresStore) {
        within(self.locks.execute("ROLLBACK")).await.unwrap();
        for (lease, write) in self.writes {
            within(write).await.unwrap().unwrap();
            assert_eq!(
                kinds(store, lease.run_id).await,
                ["step_completed"],
                "{}",
                lease.run_id
            );
        }
    }
}

/// How many of the store's connections wait for a lock.
async fn lock_waits(conn: &mut PgConnection, schema: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = $1 AND wait_event_type = 'Lock'",
    )
    .bind(application_name(schema))
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Run `id`'s events, by kind.
async fn kinds(store: &PostgresStore, id: RunId) -> Vec<&'static str> {
    within(store.events(&id))
        .await
        .unwrap()
        .iter()
        .map(|e| e.event.kind())
        .collect()
}

/// Waits until `n` writes are under way (the held ones and those queued behind them).
async fn under_way(store: &PostgresStore, n: usize) {
    within(async {
        while store.inner.writer.writing.load(Ordering::Acquire) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Sends `writes` at once, from tasks of their own started together, the committers held
/// meanwhile; once all are queued, lets the committers go and returns every answer.
async fn behind_held_committers(
    schema: &TestSchema,
    store: &PostgresStore,
    writes: Vec<ToSend>,
) -> Vec<Sent> {
    let held = Held::new(schema, store).await;
    let start = Arc::new(tokio::sync::Barrier::new(writes.len()));
    let n = writes.len();
    let tasks: Vec<_> = writes
        .into_iter()
        .map(|write| {
            let (store, start) = (store.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                match write {
                    ToSend::Admit(id, workflow) => {
                        Sent::Admit(id, store.create_run(new_run(id, &workflow)).await)
                    }
                    ToSend::AdmitWith(id, n) => {
                        let first = ap(vec![step_done(t(1), n), step_done(t(2), n)], None);
                        let admitted = store
                            .create_run_leased_with(new_run(id, "with"), LEASE, &first)
                            .await;
                        Sent::AdmitWith(id, n, admitted)
                    }
                    ToSend::Append(lease, append) if append.outcome.is_some() => {
                        Sent::End(lease.run_id, store.append(&lease, &append).await)
                    }
                    ToSend::Append(lease, append) => {
                        Sent::Append(lease.run_id, store.append(&lease, &append).await)
                    }
                }
            })
        })
        .collect();
    under_way(store, COMMITTERS + 1 + n).await;
    held.release(store).await;
    let mut sent = Vec::new();
    for task in tasks {
        sent.push(within(task).await.unwrap());
    }
    sent
}

/// `admits` admissions (of `workflow`), `appends` appends of a step and `ends` appends ending
/// runs, the runs of the appends leased first: each write as `behind_held_committers` sends
/// it.
async fn mixed_writes(
    store: &PostgresStore,
    admits: usize,
    appends: usize,
    ends: usize,
) -> Vec<ToSend> {
    let mut writes = Vec::new();
    for _ in 0..admits {
        writes.push(ToSend::Admit(RunId::new(), "mixed".to_owned()));
    }
    for _ in 0..appends {
        let lease = leased(store, "mixed").await;
        let append = ap(vec![step_done(t(10), 1)], None);
        writes.push(ToSend::Append(lease, append));
    }
    for i in 0..ends {
        let lease = leased(store, "mixed").await;
        let end = NewEvent {
            at: t(20),
            event: Event::RunCompleted { output: json!(i) },
        };
        let append = ap(vec![end], Some(RunOutcome::Completed(json!(i))));
        writes.push(ToSend::Append(lease, append));
    }
    writes
}

/// Checks `sent`'s writes are in the store as written, every answer `Ok` but the admission
/// of `bad`'s.
async fn written_as_sent(store: &PostgresStore, sent: &[Sent], bad: Option<RunId>) {
    for s in sent {
        match s {
            Sent::Admit(id, answer) if Some(*id) == bad => {
                assert!(
                    matches!(answer, Err(StoreError::Database(_))),
                    "the bad admission {id}: {answer:?}"
                );
                assert!(within(store.get_run(id)).await.unwrap().is_none(), "{id}");
            }
            Sent::Admit(id, answer) => {
                assert!(
                    matches!(answer, Ok(Admission::Admitted)),
                    "admission {id}: {answer:?}"
                );
                let run = within(store.get_run(id)).await.unwrap().unwrap();
                assert_eq!(
                    (run.workflow.as_str(), run.status),
                    ("mixed", RunStatus::Pending)
                );
                assert!(kinds(store, *id).await.is_empty(), "{id}");
            }
            Sent::Append(id, answer) => {
                assert!(answer.is_ok(), "append {id}: {answer:?}");
                let run = within(store.get_run(id)).await.unwrap().unwrap();
                assert_eq!(run.status, RunStatus::Running, "{id}");
                assert_eq!(kinds(store, *id).await, ["step_completed"], "{id}");
            }
            Sent::End(id, answer) => {
                assert!(answer.is_ok(), "end {id}: {answer:?}");
                let run = within(store.get_run(id)).await.unwrap().unwrap();
                assert_eq!(run.status, RunStatus::Completed, "{id}");
                assert_eq!(kinds(store, *id).await, ["run_completed"], "{id}");
            }
            Sent::AdmitWith(id, _, answer) => {
                assert!(
                    matches!(answer, Ok(AdmittedWith::Done(Admission::Admitted, Some(_)))),
                    "start {id}: {answer:?}"
                );
                let run = within(store.get_run(id)).await.unwrap().unwrap();
                assert_eq!(run.status, RunStatus::Running, "{id}");
                let expected = ["step_completed", "step_completed"];
                assert_eq!(kinds(store, *id).await, expected, "{id}");
            }
        }
    }
}

/// Many writes of different runs at once (admissions, appends of a step, appends ending
/// runs) share group transactions: fewer transactions commit than writes, one group mixes
/// all three kinds, and every write answers and lands as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_share_group_transactions_and_each_land() {
    let (schema, store) = fresh!();
    let writes = mixed_writes(&store, 30, 30, 30).await;
    // With the held runs' admissions and appends.
    let n = writes.len() + 2 * (COMMITTERS + 1);
    let before = store.inner.writer.commits.load(Ordering::Relaxed);
    let sent = behind_held_committers(&schema, &store, writes).await;
    let transactions = store.inner.writer.commits.load(Ordering::Relaxed) - before;
    let groups = crate::sync::lock(&store.inner.writer.groups).clone();
    let _ = writeln!(
        std::io::stderr(),
        "{n} writes took {transactions} transactions; groups written together: {:?}",
        groups
            .iter()
            .map(|g| (g.kinds.len(), g.committed))
            .collect::<Vec<_>>()
    );
    assert!(
        transactions < n as u64,
        "{n} writes took {transactions} transactions: no group commit"
    );
    let mixed = |g: &GroupRecord| {
        g.committed
            && ["admit", "append", "end"]
                .iter()
                .all(|k| g.kinds.contains(k))
    };
    assert!(
        groups.iter().any(mixed),
        "no committed group held admissions, appends and ends: {groups:?}"
    );
    written_as_sent(&store, &sent, None).await;
    assert_eq!(schema.count("runs").await, (COMMITTERS + 1 + 90) as i64);
}

/// Ends of runs their writers hint have no ties (`EndHint::Alone`), arriving together, are
/// written by one statement for many; each still answers for itself, and those the
/// statement may not take are written alone: a stale lease is refused, and a run holding an
/// active hook or having a parent (a wrong hint) ends with its hook given up and its parent
/// told, as any end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ends_hinted_alone_end_together_and_the_others_alone() {
    let (schema, store) = fresh!();
    let parent = leased(&store, "parent").await;
    let mut writes = Vec::new();
    let (mut plain, mut stale, mut hooked, mut children) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..24u32 {
        let lease = if i % 6 == 5 {
            let mut child = new_run(RunId::new(), "child");
            child.parent = Some(crate::model::ParentLink {
                run: parent.run_id,
                detached: false,
            });
            let admitted = within(store.create_run_leased(child, LEASE)).await;
            let Ok((Admission::Admitted, Some(lease))) = admitted else {
                panic!("the child was not admitted leased: {admitted:?}");
            };
            children.push(lease.run_id);
            lease
        } else {
            leased(&store, "alone").await
        };
        match i % 6 {
            1 => stale.push(lease.run_id),
            3 => {
                let token = format!("ends-alone-{i}");
                let claimed = within(store.claim_hook(&lease, "k", &token, t(5))).await;
                assert!(matches!(claimed, Ok(ClaimOutcome::Claimed)), "{claimed:?}");
                hooked.push((lease.run_id, token));
            }
            5 => {}
            _ => plain.push(lease.run_id),
        }
        let end = NewEvent {
            at: t(20),
            event: Event::RunCompleted { output: json!(i) },
        };
        let append = Append {
            end_hint: EndHint::Alone,
            ..ap(vec![end], Some(RunOutcome::Completed(json!(i))))
        };
        writes.push(ToSend::Append(lease, append));
    }
    schema.take_over(&stale).await;
    let sent = behind_held_committers(&schema, &store, writes).await;
    for s in &sent {
        let Sent::End(id, answer) = s else {
            panic!("a write sent as an end answered as something else");
        };
        let run = within(store.get_run(id)).await.unwrap().unwrap();
        if stale.contains(id) {
            assert!(
                matches!(answer, Err(StoreError::LeaseLost(r)) if r == id),
                "stale {id}: {answer:?}"
            );
            assert_eq!(run.status, RunStatus::Running, "{id}");
            assert!(kinds(&store, *id).await.is_empty(), "{id}");
            continue;
        }
        assert!(answer.is_ok(), "end {id}: {answer:?}");
        assert_eq!(run.status, RunStatus::Completed, "{id}");
        assert!(run.output.is_some(), "{id}");
        let expected: &[&str] = if hooked.iter().any(|(r, _)| r == id) {
            &["hook_registered", "run_completed"]
        } else {
            &["run_completed"]
        };
        assert_eq!(kinds(&store, *id).await, expected, "{id}");
    }
    for (id, token) in &hooked {
        let hook = within(store.get_hook(token)).await.unwrap();
        assert!(hook.is_none(), "{id} still holds {token}: {hook:?}");
    }
    let told = within(store.payloads(&parent.run_id, 0)).await.unwrap();
    assert_eq!(told.len(), children.len(), "the parent's inbox: {told:?}");
    assert_eq!(
        plain.len() + stale.len() + hooked.len() + children.len(),
        24
    );
}

/// Starts leased at admission with their first events, sent while other writes are under
/// way, go to the committers as one write each and are admitted together, events included,
/// in one statement: each run admitted has exactly its start's events, numbered from 1. Of
/// an id started twice at once, one start is admitted (with its own events) and the other
/// refused (such a group is redone write by write).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn starts_with_first_events_are_admitted_together_with_them() {
    let (schema, store) = fresh!();
    let distinct: Vec<RunId> = (0..12).map(|_| RunId::new()).collect();
    let writes = (0u32..)
        .zip(&distinct)
        .map(|(i, id)| ToSend::AdmitWith(*id, i));
    let sent = behind_held_committers(&schema, &store, writes.collect()).await;
    let groups = crate::sync::lock(&store.inner.writer.groups).clone();
    assert!(
        groups
            .iter()
            .any(|g| g.committed && g.kinds.iter().filter(|k| **k == "admit").count() >= 2),
        "no group admitted several starts together: {groups:?}"
    );
    let twice: Vec<RunId> = (0..3).map(|_| RunId::new()).collect();
    let writes = (0u32..).zip(&twice).flat_map(|(i, id)| {
        [
            ToSend::AdmitWith(*id, 20 + i),
            ToSend::AdmitWith(*id, 30 + i),
        ]
    });
    let sent_twice = behind_held_committers(&schema, &store, writes.collect()).await;
    let mut won = std::collections::HashMap::new();
    let mut refused = 0;
    for s in sent.iter().chain(&sent_twice) {
        let Sent::AdmitWith(id, n, answer) = s else {
            panic!("a start answered as another write");
        };
        match answer {
            Ok(AdmittedWith::Done(Admission::Admitted, Some(lease))) => {
                assert_eq!((lease.run_id, lease.epoch), (*id, 1));
                assert!(won.insert(*id, *n).is_none(), "{id} admitted twice");
            }
            Err(StoreError::Database(e)) if e.to_string().contains("exists") => refused += 1,
            other => panic!("start {id}: {other:?}"),
        }
    }
    assert_eq!(
        (won.len(), refused),
        (distinct.len() + twice.len(), twice.len())
    );
    for id in distinct.iter().chain(&twice) {
        let run = within(store.get_run(id)).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Running, "{id}");
        let events = within(store.events(id)).await.unwrap();
        let seen: Vec<(u64, Event)> = events.into_iter().map(|e| (e.seq, e.event)).collect();
        let n = won[id];
        let expected: Vec<(u64, Event)> =
            vec![(1, step_done(t(1), n).event), (2, step_done(t(2), n).event)];
        assert_eq!(seen, expected, "{id}");
        // Numbered on from its first events.
        let lease = Lease {
            run_id: *id,
            epoch: 1,
        };
        within(store.append(&lease, &ap(vec![step_done(t(3), 7)], None)))
            .await
            .unwrap();
        assert_eq!(event_seqs(&store, *id).await, [1, 2, 3], "{id}");
    }
}

/// A group whose admission fails at the database (a NUL byte in its workflow name, which
/// PostgreSQL's TEXT refuses) is redone write by write: that admission answers its error,
/// and its neighbours of every kind commit and answer `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_write_of_a_group_fails_alone_and_its_neighbours_commit() {
    let (schema, store) = fresh!();
    let mut writes = mixed_writes(&store, 3, 3, 3).await;
    let bad = RunId::new();
    writes.push(ToSend::Admit(bad, "bad\0name".to_owned()));
    let n = writes.len();
    let sent = behind_held_committers(&schema, &store, writes).await;
    let groups = crate::sync::lock(&store.inner.writer.groups).clone();
    for s in &sent {
        if let Sent::Admit(id, answer) = s {
            if *id == bad {
                let _ = writeln!(std::io::stderr(), "the bad admission answered {answer:?}");
            }
        }
    }
    let _ = writeln!(std::io::stderr(), "groups written together: {groups:?}");
    assert!(
        groups.iter().any(|g| !g.committed && g.kinds.len() == n),
        "the {n} writes were not written as one group first: {groups:?}"
    );
    written_as_sent(&store, &sent, Some(bad)).await;
    assert_eq!(schema.count("runs").await, (COMMITTERS + 1 + 9) as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connects_of_a_new_schema_migrate_once() {
    let Some(schema) = TestSchema::new() else {
        return;
    };
    let connects: Vec<_> = (0..4)
        .map(|_| {
            let (url, name) = (schema.url.clone(), schema.name.clone());
            tokio::spawn(async move { PostgresStore::connect(&url, &name).await })
        })
        .collect();
    let mut stores = Vec::new();
    for c in connects {
        stores.push(within(c).await.unwrap().unwrap());
    }
    let id = within(create(&stores[0], "orders", t(0))).await;
    for store in &stores {
        assert!(within(store.get_run(&id)).await.unwrap().is_some());
    }

    let versions = || async {
        let mut conn = schema.raw().await;
        sqlx::query_as::<_, (i32, String)>(&format!(
            "SELECT version, name FROM {} ORDER BY version",
            schema.table("workflow_migrations")
        ))
        .fetch_all(&mut conn)
        .await
        .unwrap()
    };
    let expected: Vec<(i32, String)> = MIGRATIONS
        .iter()
        .map(|m| (m.version as i32, m.name.to_owned()))
        .collect();
    assert_eq!(versions().await, expected);

    // Connecting again migrates nothing and keeps the data.
    let again = schema.connect().await;
    assert_eq!(versions().await, expected);
    assert!(within(again.get_run(&id)).await.unwrap().is_some());

    let mut conn = schema.raw().await;
    let objects: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'i') ORDER BY 1",
    )
    .bind(&schema.name)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        objects,
        [
            "events",
            "events_pkey",
            "hook_inbox",
            "hook_inbox_pkey",
            "hook_inbox_run",
            "hooks",
            "hooks_pkey",
            "hooks_run",
            "message_keys",
            "message_keys_pkey",
            "queues",
            "queues_pkey",
            "run_events",
            "run_events_pkey",
            "run_requests",
            "run_requests_key",
            "run_requests_pkey",
            "runs",
            "runs_created",
            "runs_parent",
            "runs_pkey",
            "runs_queue_begun",
            "runs_queue_holding",
            "runs_queue_keyed",
            "runs_queue_waiting",
            "runs_ready",
            "schedule_ticks",
            "schedule_ticks_buffered",
            "schedule_ticks_pkey",
            "schedule_ticks_started",
            "schedules",
            "schedules_pkey",
            "stream_chunks",
            "stream_chunks_pkey",
            "streams",
            "streams_pkey",
            "workflow_migrations",
            "workflow_migrations_pkey"
        ]
    );
}

/// Processes time everything by the store's clock: it must be the server's, read when
/// asked (not the time its transaction or connection began).
#[tokio::test]
async fn its_clock_is_the_servers() {
    async fn server(conn: &mut PgConnection) -> SystemTime {
        let us: i64 = sqlx::query_scalar(CLOCK).fetch_one(conn).await.unwrap();
        SystemTime::UNIX_EPOCH + Duration::from_micros(us as u64)
    }
    let (schema, store) = fresh!();
    let mut conn = schema.raw().await;
    for _ in 0..3 {
        let before = server(&mut conn).await;
        let now = within(store.now())
            .await
            .unwrap()
            .expect("a clock of its own");
        let after = server(&mut conn).await;
        assert!(
            before <= now && now <= after,
            "{before:?} <= {now:?} <= {after:?}"
        );
    }
}

#[tokio::test]
async fn refuses_a_schema_of_a_newer_version() {
    let (schema, store) = fresh!();
    drop(store);
    let newest = MIGRATIONS.last().map_or(0, |m| m.version);
    let future = newest + 1;
    schema
        .exec(&format!(
            "INSERT INTO {} (version, name, applied_at) VALUES ({future}, 'from the future', 0)",
            schema.table("workflow_migrations")
        ))
        .await;
    let err = within(PostgresStore::connect(&schema.url, &schema.name))
        .await
        .unwrap_err();
    let StoreError::Incompatible(msg) = &err else {
        panic!("expected Incompatible, got {err:?}");
    };
    assert!(msg.contains(&format!("schema `{}`", schema.name)), "{msg}");
    assert!(msg.contains(&format!("schema version {future}")), "{msg}");
    assert!(msg.contains(&format!("versions up to {newest}")), "{msg}");
    assert_eq!(
        schema.count("workflow_migrations").await,
        MIGRATIONS.len() as i64 + 1
    );
}

/// A store of schema version 1 (before `runs.last_seq`) is migrated with its histories
/// numbered on: appends after the migration continue each run's sequence.
#[tokio::test]
async fn migrates_a_version_1_store_and_keeps_numbering_its_events() {
    let (schema, store) = fresh!();
    let id = RunId::new();
    within(store.create_run(NewRun::new(id, "orders".to_owned(), json!(null), t(0))))
        .await
        .unwrap();
    let leased = within(acquire(
        &store,
        &names(&["orders"]),
        t(1),
        Duration::from_secs(60),
        1,
    ))
    .await;
    let lease = leased[0].lease.clone();
    within(store.append(
        &lease,
        &ap(vec![step_done(t(2), 1), step_done(t(3), 2)], None),
    ))
    .await
    .unwrap();
    drop(store);
    // Back to version 1, as an older build left it.
    schema
        .exec(&format!(
            "ALTER TABLE {runs} DROP COLUMN last_seq; ALTER TABLE {runs} RESET (fillfactor);
             ALTER TABLE {runs} DROP COLUMN failed_tries, DROP COLUMN blocked_tries,
                 DROP COLUMN deadline, DROP COLUMN parent_id, DROP COLUMN detached;
             ALTER TABLE {runs} DROP COLUMN queue, DROP COLUMN partition_key,
                 DROP COLUMN priority, DROP COLUMN began_at;
             ALTER TABLE {runs} DROP COLUMN start_at, DROP COLUMN version;
             ALTER TABLE {runs} DROP COLUMN previous_run, DROP COLUMN next_run,
                 DROP COLUMN origin, DROP COLUMN trace_context;
             ALTER TABLE {hooks} DROP COLUMN inherited;
             DROP TABLE {streams}, {chunks}, {queues}, {schedules}, {ticks}, {keys},
                 {published}, {requests};
             ALTER TABLE {inbox} DROP COLUMN topic;
             DELETE FROM {migrations} WHERE version > 1",
            runs = schema.table("runs"),
            streams = schema.table("streams"),
            chunks = schema.table("stream_chunks"),
            queues = schema.table("queues"),
            schedules = schema.table("schedules"),
            ticks = schema.table("schedule_ticks"),
            keys = schema.table("message_keys"),
            published = schema.table("run_events"),
            requests = schema.table("run_requests"),
            inbox = schema.table("hook_inbox"),
            hooks = schema.table("hooks"),
            migrations = schema.table("workflow_migrations"),
        ))
        .await;
    let store = schema.connect().await;
    assert_eq!(
        schema.count("workflow_migrations").await,
        MIGRATIONS.len() as i64
    );
    within(store.append(&lease, &ap(vec![step_done(t(4), 3)], None)))
        .await
        .unwrap();
    assert_eq!(event_seqs(&store, id).await, [1, 2, 3]);
}

/// The schema as the release before the shared SQL layer created it (do not edit).
const RELEASED_DDL: &str = r#"
    CREATE SCHEMA {s};
    CREATE TABLE {s}.workflow_migrations (
        version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL
    );
    CREATE TABLE {s}.runs (
        id TEXT COLLATE "C" PRIMARY KEY, workflow TEXT NOT NULL, status TEXT NOT NULL
            CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
        input TEXT NOT NULL, output TEXT, error TEXT, created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL, wake_at BIGINT NOT NULL,
        epoch BIGINT NOT NULL DEFAULT 0, lease_until BIGINT, hook_token TEXT
    );
    CREATE INDEX runs_ready ON {s}.runs (wake_at, id) WHERE status IN ('pending', 'running');
    CREATE INDEX runs_created ON {s}.runs (created_at, id);
    CREATE TABLE {s}.events (
        run_id TEXT NOT NULL, seq BIGINT NOT NULL, at BIGINT NOT NULL, kind TEXT NOT NULL,
        data TEXT NOT NULL, PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE {s}.hooks (
        token TEXT PRIMARY KEY, run_id TEXT NOT NULL, created_at BIGINT NOT NULL,
        active BOOLEAN NOT NULL, retain_until BIGINT
    );
    CREATE INDEX hooks_run ON {s}.hooks (run_id);
    CREATE TABLE {s}.hook_inbox (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run_id TEXT NOT NULL,
        token TEXT NOT NULL, payload TEXT NOT NULL, at BIGINT NOT NULL
    );
    CREATE INDEX hook_inbox_run ON {s}.hook_inbox (run_id, id);
    ALTER TABLE {s}.runs ADD COLUMN last_seq BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE {s}.runs SET (fillfactor = 80);
    INSERT INTO {s}.workflow_migrations (version, name, applied_at) VALUES
        (1, 'runs, events, hooks and the hook inbox', 0),
        (2, 'each run keeps the number of its last event', 0);
"#;

/// A schema written by the previous release opens as it is: its migrations table already
/// has the shared layout, and its runs, events, hooks and payloads are kept, each run's
/// events numbered on from its last.
#[tokio::test]
async fn opens_a_schema_of_the_previous_release_and_keeps_its_data() {
    let Some(schema) = TestSchema::new() else {
        return;
    };
    let (done, live) = (RunId::new(), RunId::new());
    let events = EncodedEvents::new(&[step_done(t(1), 1), step_done(t(2), 2)]).unwrap();
    let mut sql = RELEASED_DDL.replace("{s}", &quote_ident(&schema.name));
    for (run, status) in [(done, "completed"), (live, "running")] {
        sql.push_str(&format!(
            "INSERT INTO {runs} (id, workflow, status, input, output, created_at,
                 updated_at, wake_at, epoch, hook_token, last_seq)
             VALUES ('{run}', 'orders', '{status}', '[1]', '7', 0, 0, 0, 1, 'tok-{status}', 2);",
            runs = schema.table("runs")
        ));
        for i in 0..2 {
            sql.push_str(&format!(
                "INSERT INTO {} (run_id, seq, at, kind, data) VALUES ('{run}', {}, {}, '{}', '{}');",
                schema.table("events"),
                i + 1,
                events.at[i],
                events.kind[i],
                events.data[i].replace('\'', "''"),
            ));
        }
    }
    sql.push_str(&format!(
        "INSERT INTO {} (token, run_id, created_at, active) VALUES ('tok-running', '{live}', 0, TRUE);
         INSERT INTO {} (run_id, token, payload, at) VALUES ('{live}', 'tok-running', '\"early\"', 0);",
        schema.table("hooks"),
        schema.table("hook_inbox"),
    ));
    schema.exec(&sql).await;

    let store = schema.connect().await;
    assert_eq!(
        schema.count("workflow_migrations").await,
        MIGRATIONS.len() as i64
    );
    previous_release_is_kept(&store, done, live).await;
}

#[tokio::test]
async fn a_database_error_keeps_sqlx_s_error_as_its_source() {
    use std::error::Error as _;
    let err = within(PostgresStore::connect(
        "postgres://nobody@127.0.0.1:1/none",
        "wf",
    ))
    .await
    .unwrap_err();
    let source = err.source().expect("a source");
    assert!(source.downcast_ref::<sqlx::Error>().is_some(), "{source:?}");
}

#[tokio::test]
async fn refuses_a_schema_holding_other_tables() {
    let Some(schema) = TestSchema::new() else {
        return;
    };
    schema
        .exec(&format!(
            "CREATE SCHEMA {0}; CREATE TABLE {0}.users (id INT); CREATE TABLE {0}.orders (id INT);",
            quote_ident(&schema.name)
        ))
        .await;
    let err = within(PostgresStore::connect(&schema.url, &schema.name))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Incompatible(m)
            if m.contains("is not a workflow-rs store (it has tables `orders`, `users`)")),
        "{err:?}"
    );
    assert_eq!(schema.count("users").await, 0);

    // An empty schema made by someone else is fine.
    let Some(empty) = TestSchema::new() else {
        return;
    };
    empty
        .exec(&format!("CREATE SCHEMA {}", quote_ident(&empty.name)))
        .await;
    let store = empty.connect().await;
    within(create(&store, "orders", t(0))).await;
}

#[tokio::test]
async fn drop_schema_removes_everything() {
    let Some(schema) = TestSchema::new() else {
        return;
    };
    let store = schema.connect().await;
    assert_eq!(store.schema(), schema.name);
    within(create(&store, "orders", t(0))).await;
    within(store.drop_schema()).await.unwrap();
    let mut conn = schema.raw().await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
        .bind(&schema.name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

// -----------------------------------------------------------------------------------------
// Notices

/// The next notice matching `want`, skipping others; fails after `NOTICE_WAIT`.
async fn expect_notice(
    rx: &mut broadcast::Receiver<Notice>,
    what: &str,
    want: impl Fn(&Notice) -> bool,
) -> Notice {
    tokio::time::timeout(NOTICE_WAIT, async {
        loop {
            match rx.recv().await {
                Ok(n) if want(&n) => return n,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    panic!("notices closed while waiting for {what}")
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {what} notice within {NOTICE_WAIT:?}"))
}

fn ready(n: &Notice) -> bool {
    *n == Notice::RunsReady
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_reach_every_process_of_the_schema() {
    let (schema, a) = fresh!();
    let b = schema.connect().await;
    let mut rx_a = a.notices().unwrap();
    let mut rx_b = b.notices().unwrap();
    // Each listener announces its subscription with a RunsReady: from then on, nothing
    // committed is missed.
    expect_notice(&mut rx_a, "subscribed", ready).await;
    expect_notice(&mut rx_b, "subscribed", ready).await;

    // Admission, seen by both processes.
    let (run, _) = within(start(&a, "tok", None, t(0))).await;
    expect_notice(&mut rx_a, "RunsReady on create", ready).await;
    expect_notice(&mut rx_b, "RunsReady on create", ready).await;

    // A payload for a run nobody drives: Payload and RunsReady.
    within(b.resume_hook("tok", json!(1), t(1))).await.unwrap();
    let want = Notice::Payload(run);
    expect_notice(&mut rx_a, "Payload on resume", |n| *n == want).await;
    expect_notice(&mut rx_a, "RunsReady on resume", ready).await;

    // Cancelled by the other process: RunEnded.
    within(b.cancel(&run, t(2))).await.unwrap();
    let want = Notice::RunEnded(run);
    expect_notice(&mut rx_a, "RunEnded on cancel", |n| *n == want).await;

    // Completed: RunEnded too.
    let id = within(create(&b, "orders", t(0))).await;
    let lease = within(lease_one(&b, id, t(10))).await;
    within(b.append(&lease, &ap(vec![], Some(RunOutcome::Completed(json!(1))))))
        .await
        .unwrap();
    let want = Notice::RunEnded(id);
    expect_notice(&mut rx_a, "RunEnded on completion", |n| *n == want).await;

    // Other schemas are other channels.
    let (_other_schema, other) = fresh!();
    let mut rx_other = other.notices().unwrap();
    expect_notice(&mut rx_other, "subscribed", ready).await;
    within(create(&a, "orders", t(0))).await;
    expect_notice(&mut rx_a, "RunsReady on create", ready).await;
    let stray = tokio::time::timeout(Duration::from_millis(300), rx_other.recv()).await;
    assert!(stray.is_err(), "a notice crossed schemas: {stray:?}");
}

#[tokio::test]
async fn the_listener_ends_with_the_last_clone() {
    let (_schema, store) = fresh!();
    let clone = store.clone();
    let mut rx = store.notices().unwrap();
    expect_notice(&mut rx, "subscribed", ready).await;
    drop(store);
    within(create(&clone, "orders", t(0))).await;
    expect_notice(&mut rx, "RunsReady while a clone lives", ready).await;
    drop(clone);
    within(async {
        loop {
            match rx.recv().await {
                Err(broadcast::error::RecvError::Closed) => break,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            }
        }
    })
    .await;
}

#[test]
fn notice_payloads_round_trip() {
    let id = RunId::new();
    assert_eq!(parse_notice("r"), Some(Notice::RunsReady));
    assert_eq!(parse_notice(&format!("p:{id}")), Some(Notice::Payload(id)));
    assert_eq!(parse_notice(&format!("e:{id}")), Some(Notice::RunEnded(id)));
    assert_eq!(parse_notice(&format!("c:{id}")), Some(Notice::Chunk(id)));
    assert_eq!(parse_notice("s"), Some(Notice::SchedulesChanged));
    assert_eq!(parse_notice("p:nope"), None);
    assert_eq!(parse_notice("x"), None);
}
