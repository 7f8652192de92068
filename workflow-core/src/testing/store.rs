//! The store conformance suite: every behaviour the [`Store`] contract promises, written once
//! as a generic case, so that every store (the crate's own and yours) runs the same checks.
//!
//! The cases come in groups, by what they need from the store under test:
//!
//! - `contract`: only the [`Store`] API;
//! - `inspect`: the API, and what the store keeps (rows or state), through [`Inspect`];
//! - `compared`: transcripts of scripted operations, compared with [`MemoryStore`]'s (pointless
//!   on the memory store itself);
//! - `damage`: rows the store cannot decode, for stores implementing [`Damage`].
//!
//! Each case is a public function of this module named after what it checks. Those taking
//! `&[S]` race three handles on one database, to check that what must be atomic is; each
//! handle should be a separate connection where the store has connections.
//!
//! Two ways to run them: [`conformance_tests!`] declares one `#[tokio::test]` per case in your
//! test module (each case is then a test of its own, which can fail, be filtered and be
//! rerun alone), and the `run_*` functions run a whole group in one call. Either way every
//! failure names its case, and a case that takes longer than a minute fails instead of
//! hanging.
//!
//! ```
//! use workflow_core::store::memory::MemoryStore;
//! use workflow_core::testing::store;
//!
//! # #[tokio::main]
//! # async fn main() {
//! // Each case gets a fresh, empty database: here three handles on one new memory store,
//! // whose clones share their state.
//! let fresh = || async {
//!     let db = MemoryStore::new();
//!     [db.clone(), db.clone(), db]
//! };
//! store::run_contract(fresh).await;
//! store::run_inspect(fresh).await; // MemoryStore implements `Inspect`
//! store::run_compared(fresh).await;
//! # }
//! ```
//!
//! Cases and helpers panic on failure, as tests do: this module is for test code only.

use std::collections::HashSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use serde_json::json;

use crate::error::{Error, StoreError};
use crate::ids::RunId;
use crate::store::memory::MemoryStore;
use crate::store::*;

/// How long a case may take before it fails instead of hanging.
const WAIT: Duration = Duration::from_secs(60);

/// `f`, or a panic after a minute: for the setup and checks of a store's own tests.
pub async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("the store did not answer in time")
}

/// Runs conformance case `case` (the future `f` of one of this module's case functions) and
/// fails with a panic naming the case and what failed: the case's own panic message, or that
/// it did not finish within a minute.
pub async fn check<F: Future<Output = ()>>(case: &str, f: F) {
    match tokio::time::timeout(WAIT, AssertUnwindSafe(f).catch_unwind()).await {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic without a message");
            panic!("store conformance case `{case}` failed: {what}")
        }
        Err(_) => panic!(
            "store conformance case `{case}` failed: the store did not finish it within {} s",
            WAIT.as_secs()
        ),
    }
}

/// What the `inspect` cases check below the [`Store`] API: what the store keeps. A store's
/// tests implement it by reading the store's tables (or, for a store in memory, its state).
///
/// The methods panic when they cannot answer: they run in tests only.
// The suite awaits these in place and never spawns them, so their futures need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait Inspect {
    /// How many entries of `table` the store holds: `runs`, `events`, `hooks` (active hooks
    /// and released tokens still retained), `hook_inbox` (payloads), `streams` or
    /// `stream_chunks`.
    async fn count(&self, table: &str) -> i64;

    /// The run's wake time as stored (a store keeping milliseconds returns them).
    async fn wake_at(&self, run: RunId) -> SystemTime;

    /// The queryable `kind` of each of the run's events, in order (the serde tag of
    /// [`Event`], as [`Event::kind`] gives it); `None` for a store that keeps events as values
    /// and has no such column.
    async fn event_kinds(&self, run: RunId) -> Option<Vec<String>>;
}

/// Damage to a store's rows that its decoding must report, not skip or paper over. Only a
/// store keeping encoded rows (such as the SQL stores) can hold an undecodable one.
// As for `Inspect`: awaited in place only.
#[allow(async_fn_in_trait)]
pub trait Damage {
    /// Overwrites the run's input with text that is not JSON.
    async fn corrupt_input(&self, run: RunId);

    /// Adds event 1 to the run with kind `x` and empty data.
    async fn add_undecodable_event(&self, run: RunId);
}

/// Declares one `#[tokio::test]` per case of the named groups (`contract`, `inspect`,
/// `compared`, `damage`; see the [module docs](self)) in the calling test module, each named
/// after its case.
///
/// `one` is the setup of a single-store case: statements that bind a fresh store to the named
/// variable (and keep whatever owns it alive to the end of the test). `shared` binds three
/// handles on one fresh database (an array or a slice) to its variable; those cases run on a
/// multi-threaded tokio runtime. The calling crate needs `tokio` with the `macros` and
/// `rt-multi-thread` features, as a dev-dependency.
///
/// ```
/// mod tests {
///     use workflow_core::store::memory::MemoryStore;
///
///     workflow_core::testing::store::conformance_tests! {
///         groups: [contract, inspect, compared],
///         one: {
///             let store = MemoryStore::new();
///         } => store,
///         shared: {
///             let db = MemoryStore::new();
///             let stores = [db.clone(), db.clone(), db];
///         } => stores,
///     }
/// }
/// # fn main() {}
/// ```
#[doc(inline)]
pub use crate::__store_conformance_tests as conformance_tests;

/// The body of [`conformance_tests!`] and of the `run_*` functions: the one list of the cases
/// of each group, with single-store cases after `one` and shared ones after `shared`.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_conformance_tests {
    (
        groups: [$($group:ident),* $(,)?],
        one: $one:tt => $store:ident,
        shared: $shared:tt => $stores:ident $(,)?
    ) => {
        $($crate::__store_conformance_tests!(@$group tests [$one $store $shared $stores]);)*
    };
    (@contract $mode:ident $args:tt) => {
        $crate::__store_conformance_tests!(@$mode $args one [
            a_run_leased_at_admission_is_fenced_like_an_acquired_one,
            failure_outcome_records_the_error,
            a_stale_epoch_cannot_write_after_a_takeover,
            acquire_respects_workflows_wake_time_leases_and_order,
            expired_leases_are_taken_back_in_wake_time_order,
            release_with_a_future_wake_time,
            heartbeat_extends_live_leases_and_reports_lost_ones,
            cancel_running_ended_and_unknown_runs,
            cancel_of_a_completed_run_reports_its_status,
            listing_behaves_like_the_memory_store,
            lists_runs_newest_first_with_filters,
            lists_runs_by_time_range_and_cursor,
            lists_only_active_hooks,
            prune_deletes_old_ended_runs_with_what_they_recorded,
            failed_tries_give_the_run_back_and_the_last_fails_it,
            a_release_starts_the_count_of_failed_tries_again,
            delivered_payloads_leave_the_inbox,
            a_blocked_run_waits_with_its_divergence_until_woken_or_retried,
            retry_reopens_a_failed_run_and_refuses_other_statuses,
            a_run_created_with_a_history_replays_it,
            ended_among_names_the_runs_that_are_not_live,
            a_deadline_is_kept_with_the_run,
            stream_chunks_are_numbered_per_stream_and_fenced,
            a_closed_stream_takes_no_more_chunks,
            a_stream_reads_in_pages_from_any_index,
            a_child_is_started_with_its_record_and_its_end_reaches_the_parent,
            cancelling_a_parent_cancels_its_attached_children_down_the_tree,
            a_queue_s_concurrency_counts_runs_begun_and_not_ended,
            a_queue_s_rate_window_counts_begins,
            a_partition_key_runs_one_at_a_time_in_start_order,
            a_queue_begins_higher_priority_first_then_start_order,
            an_undeclared_queue_begins_nothing,
            a_waiting_run_past_its_deadline_is_handed_out_without_a_slot,
        ] shared [
            concurrent_chunk_writers_get_every_index_once,
            concurrent_acquirers_never_exceed_a_queue_s_concurrency,
            concurrent_acquirers_never_share_a_run,
            concurrent_writes_of_many_runs_each_answer_for_themselves,
            payloads_reach_the_owner_in_commit_order,
            payload_ids_follow_commit_order_under_concurrent_resumes,
        ]);
    };
    (@inspect $mode:ident $args:tt) => {
        $crate::__store_conformance_tests!(@$mode $args one [
            create_acquire_append_complete_round_trip,
            a_start_whose_token_is_taken_writes_nothing,
            claims_releases_and_retention,
            run_end_and_cancel_release_tokens,
            a_resume_before_the_hook_exists_delivers_nothing,
            release_wakes_a_run_with_unseen_payloads,
            prune_leaves_no_rows_of_a_pruned_run,
            prune_takes_a_run_s_streams_with_it,
            admit_or_resume_admits_resumes_or_conflicts,
        ] shared [
            concurrent_starts_with_one_token_admit_exactly_one,
            concurrent_admit_or_resume_calls_admit_one_and_queue_the_rest,
        ]);
    };
    (@compared $mode:ident $args:tt) => {
        $crate::__store_conformance_tests!(@$mode $args one [
            hooks_behave_like_the_memory_store,
        ] shared []);
    };
    (@damage $mode:ident $args:tt) => {
        $crate::__store_conformance_tests!(@$mode $args one [
            undecodable_rows_are_reported_as_corrupt,
            listing_reports_an_undecodable_row,
        ] shared []);
    };
    (@tests [$one:tt $store:ident $shared:tt $stores:ident]
        one [$($case:ident),* $(,)?] shared [$($scase:ident),* $(,)?]) => {
        $($crate::__store_conformance_tests!(@test [#[::tokio::test]] $one [&$store] $case);)*
        $($crate::__store_conformance_tests!(
            @test [#[::tokio::test(flavor = "multi_thread", worker_threads = 2)]]
            $shared [&$stores[..]] $scase
        );)*
    };
    (@test [$($attr:tt)*] { $($setup:tt)* } [$($arg:tt)*] $case:ident) => {
        $($attr)*
        async fn $case() {
            $($setup)*
            $crate::testing::store::check(
                ::core::stringify!($case),
                $crate::testing::store::$case($($arg)*),
            ).await;
        }
    };
    (@run [$fresh:ident] one [$($case:ident),* $(,)?] shared [$($scase:ident),* $(,)?]) => {
        $(
            let stores = $fresh().await;
            $crate::testing::store::check(
                ::core::stringify!($case),
                $crate::testing::store::$case(&stores[0]),
            ).await;
        )*
        $(
            let stores = $fresh().await;
            $crate::testing::store::check(
                ::core::stringify!($scase),
                $crate::testing::store::$scase(&stores[..]),
            ).await;
        )*
    };
}

/// Runs the `contract` cases, each on the stores `fresh` returns: three handles on one fresh,
/// empty database (single-store cases use the first). Panics naming the first case that fails.
pub async fn run_contract<S, F, Fut>(mut fresh: F)
where
    S: Store + Clone,
    F: FnMut() -> Fut,
    Fut: Future<Output = [S; 3]>,
{
    crate::__store_conformance_tests!(@contract run [fresh]);
}

/// Runs the `inspect` cases as [`run_contract`] runs its own.
pub async fn run_inspect<S, F, Fut>(mut fresh: F)
where
    S: Store + Clone + Inspect,
    F: FnMut() -> Fut,
    Fut: Future<Output = [S; 3]>,
{
    crate::__store_conformance_tests!(@inspect run [fresh]);
}

/// Runs the `compared` cases as [`run_contract`] runs its own.
pub async fn run_compared<S, F, Fut>(mut fresh: F)
where
    S: Store + Clone,
    F: FnMut() -> Fut,
    Fut: Future<Output = [S; 3]>,
{
    crate::__store_conformance_tests!(@compared run [fresh]);
}

/// Runs the `damage` cases as [`run_contract`] runs its own.
pub async fn run_damage<S, F, Fut>(mut fresh: F)
where
    S: Store + Clone + Damage,
    F: FnMut() -> Fut,
    Fut: Future<Output = [S; 3]>,
{
    crate::__store_conformance_tests!(@damage run [fresh]);
}

/// A fixed point in time (November 2023), plus `ms`.
pub(crate) fn t(ms: u64) -> SystemTime {
    from_millis(1_700_000_000_000 + ms)
}

/// An append of `events`, ending the run with `outcome` if given.
pub(crate) fn ap(events: Vec<NewEvent>, outcome: Option<RunOutcome>) -> Append {
    Append {
        events,
        release_tokens: Vec::new(),
        outcome,
    }
}

/// Owned workflow names.
pub(crate) fn names(ws: &[&str]) -> Vec<String> {
    ws.iter().map(|w| (*w).to_owned()).collect()
}

/// One script of hook operations; its transcript must be the same on every store.
pub(crate) async fn hook_script<S: Store>(store: &S, ids: &[RunId]) -> Vec<String> {
    let mut log = Vec::new();
    macro_rules! note {
        ($e:expr) => {
            log.push(format!("{:?}", $e))
        };
    }
    let new_run = |i: usize, token: Option<&str>, retain: Option<u64>, at: u64| NewRun {
        parent: None,
        id: ids[i],
        workflow: "hooked".into(),
        input: json!([i]),
        created_at: t(at),
        hook: token.map(|token| StartHook {
            token: token.into(),
            retain_until: retain.map(t),
        }),
        deadline: None,
        queue: None,
    };
    note!(store.create_run(new_run(0, Some("x"), Some(300), 0)).await);
    note!(store.create_run(new_run(1, Some("x"), None, 1)).await);
    note!(store.create_run(new_run(2, None, None, 2)).await);
    note!(store.create_run(new_run(3, Some("y"), None, 3)).await);
    note!(store.create_run(new_run(3, Some("q"), None, 3)).await);
    let leased = store
        .acquire(AcquireRequest {
            worker_id: "w",
            workflows: &names(&["hooked"]),
            lease: Duration::from_secs(60),
            limit: 10,
            now: t(10),
        })
        .await
        .unwrap();
    note!(leased
        .iter()
        .map(|r| (&r.run, &r.lease, &r.events))
        .collect::<Vec<_>>());
    let lease = |i: usize| {
        leased
            .iter()
            .find(|r| r.run.id == ids[i])
            .unwrap()
            .lease
            .clone()
    };
    note!(store.claim_hook(&lease(2), "hk_1", "x", t(11)).await);
    note!(store.claim_hook(&lease(2), "hk_2", "z", t(12)).await);
    note!(store.claim_hook(&lease(2), "hk_3", "z", t(13)).await);
    note!(store.resume_hook("z", json!("p1"), t(20)).await);
    note!(store.resume_hook("y", json!("p2"), t(21)).await);
    note!(store.resume_hook("nope", json!("p3"), t(22)).await);
    note!(store.resume_hook("x", json!("p4"), t(23)).await);
    note!(store.payloads(&ids[2], 0).await);
    note!(store.payloads_since(0, 10).await);
    note!(store.last_payload_id().await);
    note!(store.get_hook("z").await);
    note!(
        store
            .append(
                &lease(2),
                &Append {
                    events: vec![NewEvent {
                        at: t(30),
                        event: Event::HookReleased {
                            hook_key: "hk_2".into(),
                            token: "z".into(),
                        },
                    }],
                    release_tokens: vec!["z".into(), "x".into()],
                    outcome: None,
                }
            )
            .await
    );
    note!(store.get_hook("z").await);
    note!(store.get_hook("x").await);
    note!(store.resume_hook("z", json!("p5"), t(31)).await);
    note!(
        store
            .append(
                &lease(0),
                &ap(
                    vec![NewEvent {
                        at: t(40),
                        event: Event::RunCompleted { output: json!(0) },
                    }],
                    Some(RunOutcome::Completed(json!(0)))
                )
            )
            .await
    );
    note!(store.get_hook("x").await);
    note!(store.create_run(new_run(4, Some("x"), None, 100)).await);
    note!(store.claim_hook(&lease(2), "hk_4", "x", t(299)).await);
    note!(store.claim_hook(&lease(2), "hk_5", "x", t(300)).await);
    note!(store.cancel(&ids[3], t(50)).await);
    note!(store.get_hook("y").await);
    note!(store.create_run(new_run(5, Some("y"), None, 51)).await);
    note!(store.release(&lease(2), t(400), 0).await.is_ok());
    note!(store.claim_hook(&lease(2), "hk_6", "w", t(401)).await);
    for id in ids {
        note!(store.get_run(id).await);
        note!(store.events(id).await);
        note!(store.payloads(id, 0).await);
    }
    log
}

/// Admits runs of two workflows, ends some of them, registers and releases hooks, and lists.
pub(crate) async fn listing_script<S: Store>(store: &S, ids: &[RunId]) -> Vec<String> {
    let mut log = Vec::new();
    macro_rules! note {
        ($e:expr) => {
            log.push(format!("{:?}", $e))
        };
    }
    for (i, id) in ids.iter().enumerate() {
        let workflow = if i % 2 == 0 { "orders" } else { "hooked" };
        let hook = (i % 2 == 1).then(|| StartHook {
            token: format!("tok-{i}"),
            retain_until: None,
        });
        // Two runs share an admission time: the id breaks the tie.
        let at = t(10 * (i as u64 / 2 * 2));
        note!(
            store
                .create_run(NewRun {
                    parent: None,
                    id: *id,
                    workflow: workflow.into(),
                    input: json!([i]),
                    created_at: at,
                    hook,
                    deadline: None,
                    queue: None,
                })
                .await
        );
    }
    note!(store.cancel(&ids[1], t(100)).await);
    let leased = store
        .acquire(AcquireRequest {
            worker_id: "w",
            workflows: &names(&["orders"]),
            lease: Duration::from_secs(60),
            limit: 10,
            now: t(200),
        })
        .await
        .unwrap();
    let lease = leased
        .iter()
        .find(|r| r.run.id == ids[0])
        .unwrap()
        .lease
        .clone();
    note!(store.claim_hook(&lease, "hk_1", "extra", t(210)).await);
    note!(
        store
            .append(
                &lease,
                &ap(
                    vec![NewEvent {
                        at: t(220),
                        event: Event::RunFailed {
                            error: Error::fatal("no"),
                        },
                    }],
                    Some(RunOutcome::Failed(Error::fatal("no")))
                )
            )
            .await
    );
    let filters = [
        RunFilter::new(),
        RunFilter::new().limit(2),
        RunFilter::new().limit(0),
        RunFilter::new().workflow("orders"),
        RunFilter::new()
            .workflow("hooked")
            .status(RunStatus::Pending),
        RunFilter::new().status(RunStatus::Running),
        RunFilter::new().status(RunStatus::Failed),
        RunFilter::new().status(RunStatus::Cancelled),
        RunFilter::new().workflow("nope"),
    ];
    for f in &filters {
        note!(store.list_runs(f).await);
    }
    let hook_filters = [
        HookFilter::new(),
        HookFilter::new().limit(1),
        HookFilter::new().token("tok-3"),
        HookFilter::new().token("tok-1"),
        HookFilter::new().token("extra"),
        HookFilter::new().run_id(ids[5]),
        HookFilter::new().run_id(ids[5]).token("tok-3"),
    ];
    for f in &hook_filters {
        note!(store.list_hooks(f).await);
    }
    log
}

/// A run leased at admission is held like an acquired one: no other worker gets it while the
/// lease lives, its writes are accepted, and after expiry a takeover fences the old lease.
pub async fn a_run_leased_at_admission_is_fenced_like_an_acquired_one<S: Store>(store: &S) {
    let id = RunId::new();
    let run = NewRun {
        parent: None,
        id,
        workflow: "leased".into(),
        input: json!([]),
        created_at: t(0),
        hook: None,
        deadline: None,
        queue: None,
    };
    let (admission, lease) = store
        .create_run_leased(run, std::time::Duration::from_millis(1000))
        .await
        .unwrap();
    assert_eq!(admission, Admission::Admitted);
    let lease = lease.expect("this store leases at admission");
    assert_eq!(lease.epoch, 1);
    assert_eq!(
        store.get_run(&id).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    let acquire = |now: u64| AcquireRequest {
        worker_id: "other",
        workflows: &[],
        lease: std::time::Duration::from_millis(1000),
        limit: 10,
        now: t(now),
    };
    let names = names(&["leased"]);
    let req = |now| AcquireRequest {
        workflows: &names,
        ..acquire(now)
    };
    assert!(
        store.acquire(req(500)).await.unwrap().is_empty(),
        "the lease holds"
    );
    let step = NewEvent {
        at: t(600),
        event: Event::TimerFired {
            timer_id: "tmr_0".into(),
        },
    };
    store
        .append(&lease, &ap(vec![step.clone()], None))
        .await
        .unwrap();
    let taken = store.acquire(req(1500)).await.unwrap();
    assert_eq!(taken.len(), 1, "taken over after expiry");
    assert_eq!(taken[0].lease.epoch, 2);
    assert!(matches!(
        store.append(&lease, &ap(vec![step], None)).await,
        Err(StoreError::LeaseLost(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Child runs

/// A child of `parent` (leased) at `at`, under key `key`.
fn child_of(parent: &Lease, key: &str, at: SystemTime, detached: bool) -> NewRun {
    let _ = key;
    NewRun {
        queue: None,
        id: RunId::new(),
        workflow: "child".into(),
        input: json!([key]),
        created_at: at,
        hook: None,
        deadline: None,
        parent: Some(ParentLink {
            run: parent.run_id,
            detached,
        }),
    }
}

/// `start_child` admits the child and records `ChildStarted` in one act, fenced by the
/// parent's lease; a token taken elsewhere is recorded as the conflict and admits nothing;
/// the child's end, by its own append or a cancellation, puts a `ChildNotice` into the
/// parent's inbox and makes the parent due; the delivery takes the notice out again.
pub async fn a_child_is_started_with_its_record_and_its_end_reaches_the_parent<S: Store>(
    store: &S,
) {
    let parent_id = create(store, "parent", t(0)).await;
    let parent = acquire(store, &names(&["parent"]), t(1), Duration::from_secs(60), 1)
        .await
        .remove(0)
        .lease;
    let child = child_of(&parent, "ch_0", t(2), false);
    let child_id = child.id;
    assert_eq!(
        store.start_child(&parent, "ch_0", child).await.unwrap(),
        Admission::Admitted
    );
    let record = store.get_run(&child_id).await.unwrap().unwrap();
    assert_eq!(record.parent, Some(parent_id));
    assert_eq!(record.status, RunStatus::Pending);
    assert_eq!(
        store.events(&parent_id).await.unwrap(),
        vec![EventRecord {
            seq: 1,
            at: t(2),
            event: Event::ChildStarted {
                refused: None,
                child_key: "ch_0".into(),
                child_id,
                workflow: "child".into(),
                conflict: None,
            },
        }]
    );
    let listed = store
        .list_runs(&RunFilter::new().parent(parent_id))
        .await
        .unwrap();
    assert_eq!(listed.iter().map(|r| r.id).collect::<Vec<_>>(), [child_id]);

    // A token owned by another run: the decision is recorded, no child is admitted.
    let owner = RunId::new();
    store
        .create_run(NewRun {
            queue: None,
            id: owner,
            workflow: "other".into(),
            input: json!([]),
            created_at: t(3),
            hook: Some(StartHook {
                token: "taken".into(),
                retain_until: None,
            }),
            deadline: None,
            parent: None,
        })
        .await
        .unwrap();
    let mut contested = child_of(&parent, "ch_1", t(4), false);
    contested.hook = Some(StartHook {
        token: "taken".into(),
        retain_until: None,
    });
    let contested_id = contested.id;
    assert_eq!(
        store.start_child(&parent, "ch_1", contested).await.unwrap(),
        Admission::Conflict(owner)
    );
    assert!(store.get_run(&contested_id).await.unwrap().is_none());
    let last = store.events(&parent_id).await.unwrap().pop().unwrap();
    assert!(
        matches!(&last.event, Event::ChildStarted { conflict: Some(o), .. } if *o == owner),
        "{last:?}"
    );

    // The parent is given back to sleep; the child completes.
    store.release(&parent, never(), 0).await.unwrap();
    let leased = acquire(store, &names(&["child"]), t(5), Duration::from_secs(60), 1)
        .await
        .remove(0);
    assert_eq!(leased.run.id, child_id);
    assert_eq!(leased.run.parent, Some(parent_id));
    store
        .append(
            &leased.lease,
            &ap(
                vec![NewEvent {
                    at: t(6),
                    event: Event::RunCompleted { output: json!(42) },
                }],
                Some(RunOutcome::Completed(json!(42))),
            ),
        )
        .await
        .unwrap();
    let inbox = store.payloads(&parent_id, 0).await.unwrap();
    assert_eq!(inbox.len(), 1, "{inbox:?}");
    assert_eq!(inbox[0].token, CHILD_NOTICE_TOKEN);
    let notice: ChildNotice = serde_json::from_value(inbox[0].payload.clone()).unwrap();
    assert_eq!(notice.child, child_id);
    assert_eq!(notice.clone().result(), Ok(json!(42)));
    // The sleeping parent is due at the child's end.
    let woken = acquire(store, &names(&["parent"]), t(6), Duration::from_secs(60), 1).await;
    assert_eq!(woken.len(), 1, "the parent is due when its child ends");
    let parent = woken[0].lease.clone();
    store
        .append(
            &parent,
            &ap(
                vec![NewEvent {
                    at: t(7),
                    event: Event::ChildEnded {
                        child_id,
                        payload_id: inbox[0].id,
                        result: Ok(json!(42)),
                    },
                }],
                None,
            ),
        )
        .await
        .unwrap();
    assert!(store.payloads(&parent_id, 0).await.unwrap().is_empty());

    // A second child, cancelled: its parent hears of that too.
    let second = child_of(&parent, "ch_2", t(8), false);
    let second_id = second.id;
    store.start_child(&parent, "ch_2", second).await.unwrap();
    assert_eq!(
        store.cancel(&second_id, t(9)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let inbox = store.payloads(&parent_id, 0).await.unwrap();
    let notice: ChildNotice = serde_json::from_value(inbox[0].payload.clone()).unwrap();
    assert_eq!(notice.child, second_id);
    assert_eq!(notice.status, RunStatus::Cancelled);
    assert!(notice.result().unwrap_err().is_cancelled());

    // A stale lease starts nothing.
    let stale = Lease {
        run_id: parent_id,
        epoch: parent.epoch + 7,
    };
    let refused = child_of(&stale, "ch_3", t(10), false);
    let refused_id = refused.id;
    assert!(matches!(
        store.start_child(&stale, "ch_3", refused).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(store.get_run(&refused_id).await.unwrap().is_none());
}

/// Cancelling a run cancels its unfinished children that are not detached, and theirs, in
/// one act; ended and detached children are left as they are.
pub async fn cancelling_a_parent_cancels_its_attached_children_down_the_tree<S: Store>(store: &S) {
    let wf = names(&["parent", "child"]);
    let root = create(store, "parent", t(0)).await;
    let root_lease = acquire(store, &wf, t(1), Duration::from_secs(60), 1)
        .await
        .remove(0)
        .lease;
    let attached = child_of(&root_lease, "ch_0", t(2), false);
    let detached = child_of(&root_lease, "ch_1", t(2), true);
    let done = child_of(&root_lease, "ch_2", t(2), false);
    let (attached_id, detached_id, done_id) = (attached.id, detached.id, done.id);
    for (key, child) in [("ch_0", attached), ("ch_1", detached), ("ch_2", done)] {
        store.start_child(&root_lease, key, child).await.unwrap();
    }
    // `done` ends before the cancel; `attached` has a child of its own.
    let leased = acquire(store, &wf, t(3), Duration::from_secs(60), 10).await;
    let lease_of = |id: RunId| {
        leased
            .iter()
            .find(|r| r.run.id == id)
            .map(|r| r.lease.clone())
            .unwrap()
    };
    store
        .append(
            &lease_of(done_id),
            &ap(
                vec![NewEvent {
                    at: t(4),
                    event: Event::RunCompleted { output: json!(1) },
                }],
                Some(RunOutcome::Completed(json!(1))),
            ),
        )
        .await
        .unwrap();
    let grandchild = child_of(&lease_of(attached_id), "ch_0", t(5), false);
    let grandchild_id = grandchild.id;
    store
        .start_child(&lease_of(attached_id), "ch_0", grandchild)
        .await
        .unwrap();

    assert_eq!(
        store.cancel(&root, t(6)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    for id in [attached_id, grandchild_id] {
        let run = store.get_run(&id).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Cancelled, "{id}");
        assert!(run.error.unwrap().is_cancelled());
        assert_eq!(
            store.events(&id).await.unwrap().last().unwrap().event,
            Event::RunCancelled
        );
    }
    let status = |id| async move { store.get_run(&id).await.unwrap().unwrap().status };
    assert_eq!(status(done_id).await, RunStatus::Completed);
    assert_eq!(status(detached_id).await, RunStatus::Running);
    // The cancelled child's worker is fenced off.
    assert!(matches!(
        store
            .append(&lease_of(attached_id), &ap(vec![step_done(t(7), 1)], None))
            .await,
        Err(StoreError::LeaseLost(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// Admits a run of `workflow` at `at` (input `[1, "two"]`, no hook).
pub(crate) async fn create<S: Store>(store: &S, workflow: &str, at: SystemTime) -> RunId {
    let id = RunId::new();
    store
        .create_run(NewRun {
            parent: None,
            id,
            workflow: workflow.to_owned(),
            input: json!([1, "two"]),
            created_at: at,
            hook: None,
            deadline: None,
            queue: None,
        })
        .await
        .unwrap();
    id
}

/// Leases up to `limit` runs of `workflows` for worker `w`.
pub(crate) async fn acquire<S: Store>(
    store: &S,
    workflows: &[String],
    now: SystemTime,
    lease: Duration,
    limit: usize,
) -> Vec<LeasedRun> {
    store
        .acquire(AcquireRequest {
            worker_id: "w",
            workflows,
            lease,
            limit,
            now,
        })
        .await
        .unwrap()
}

/// The completion of step `s<n>` with result `n`.
pub(crate) fn step_done(at: SystemTime, n: u32) -> NewEvent {
    NewEvent {
        at,
        event: Event::StepCompleted {
            step_id: format!("s{n}"),
            result: Ok(json!(n)),
        },
    }
}

pub(crate) fn start_hook(token: &str, retain_until: Option<SystemTime>) -> Option<StartHook> {
    Some(StartHook {
        token: token.to_owned(),
        retain_until,
    })
}

/// Starts a run of `hooked` claiming `token`.
pub(crate) async fn start<S: Store>(
    store: &S,
    token: &str,
    retain_until: Option<SystemTime>,
    at: SystemTime,
) -> (RunId, Admission) {
    let id = RunId::new();
    let admission = store
        .create_run(NewRun {
            parent: None,
            id,
            workflow: "hooked".to_owned(),
            input: json!([]),
            created_at: at,
            hook: start_hook(token, retain_until),
            deadline: None,
            queue: None,
        })
        .await
        .unwrap();
    (id, admission)
}

/// Leases run `id` (of `hooked` or `orders`) at `now`; panics if it is not acquirable.
pub(crate) async fn lease_one<S: Store>(store: &S, id: RunId, now: SystemTime) -> Lease {
    let got = acquire(
        store,
        &names(&["hooked", "orders"]),
        now,
        Duration::from_secs(600),
        100,
    )
    .await;
    got.into_iter()
        .find(|r| r.run.id == id)
        .unwrap_or_else(|| panic!("run {id} was not acquirable at {now:?}"))
        .lease
}

/// The run owning `token`, if an active hook does.
pub(crate) async fn owner<S: Store>(store: &S, token: &str) -> Option<RunId> {
    store.get_hook(token).await.unwrap().map(|h| h.run_id)
}

/// The sequence numbers of run `id`'s events, in order.
pub(crate) async fn event_seqs<S: Store>(store: &S, id: RunId) -> Vec<u64> {
    let events = within(store.events(&id)).await.unwrap();
    events.iter().map(|e| e.seq).collect()
}

/// What a SQL store migrated from the previous release's layout must still hold: the fixture
/// both dialects' migration tests write (run `done` completed with output 7 and token
/// `tok-completed`; run `live` running, owning `tok-running` with the payload "early"; two
/// events each), and `live`'s history continuing after its last event. Returns the lease
/// taken on `live`.
#[cfg(test)]
pub(crate) async fn previous_release_is_kept<S: Store>(
    store: &S,
    done: RunId,
    live: RunId,
) -> Lease {
    let run = within(store.get_run(&done)).await.unwrap().unwrap();
    assert_eq!(
        (run.status, run.output, run.hook_token.as_deref()),
        (RunStatus::Completed, Some(json!(7)), Some("tok-completed"))
    );
    for id in [done, live] {
        assert_eq!(event_seqs(store, id).await, [1, 2]);
    }
    assert_eq!(within(owner(store, "tok-running")).await, Some(live));
    let inbox = within(store.payloads(&live, 0)).await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].payload, json!("early"));
    let lease = within(lease_one(store, live, t(3))).await;
    within(store.append(&lease, &ap(vec![step_done(t(4), 3)], None)))
        .await
        .unwrap();
    let last = within(store.events(&live)).await.unwrap().pop().unwrap();
    assert_eq!((last.seq, last.at), (3, t(4)));
    lease
}

/// Starts `n` runs claiming `token` at once, spread over `stores` (handles on one database);
/// checks that exactly one was admitted and every other start names it and wrote no run;
/// returns the winner.
pub(crate) async fn storm<S: Store + Clone>(stores: &[S], token: &str, n: usize) -> RunId {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let token = token.to_owned();
            tokio::spawn(async move {
                let id = RunId::new();
                let admission = store
                    .create_run(NewRun {
                        parent: None,
                        id,
                        workflow: "hooked".to_owned(),
                        input: json!([i]),
                        created_at: t(0),
                        hook: start_hook(&token, None),
                        deadline: None,
                        queue: None,
                    })
                    .await
                    .unwrap();
                (id, admission)
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let winners: Vec<RunId> = results
        .iter()
        .filter(|(_, a)| *a == Admission::Admitted)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = winners[0];
    for (id, admission) in &results {
        if *id != winner {
            assert_eq!(*admission, Admission::Conflict(winner));
            assert!(stores[0].get_run(id).await.unwrap().is_none());
        }
    }
    assert_eq!(owner(&stores[0], token).await, Some(winner));
    winner
}

/// The ids of `runs`, in order.
fn run_ids(runs: &[RunRecord]) -> Vec<RunId> {
    runs.iter().map(|r| r.id).collect()
}

// ---------------------------------------------------------------------------------------------
// Runs and leases

/// A run goes from admission through a lease and appended events to completion; its input,
/// events and output come back exactly as written.
pub async fn create_acquire_append_complete_round_trip<S: Store + Inspect>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    assert!(matches!(
        store
            .create_run(NewRun { parent: None,
                id,
                workflow: "orders".into(),
                input: json!(null),
                created_at: t(0),
                hook: None,
                deadline: None,
                queue: None,
            })
            .await,
        Err(StoreError::Database(m)) if m.message().contains("already exists")
    ));
    assert!(store.events(&id).await.unwrap().is_empty());
    assert!(store.get_run(&RunId::new()).await.unwrap().is_none());
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(
        (run.status, &run.input, run.created_at, run.updated_at),
        (RunStatus::Pending, &json!([1, "two"]), t(0), t(0))
    );

    let wf = names(&["orders"]);
    let got = acquire(store, &wf, t(10), Duration::from_secs(30), 10).await;
    assert_eq!(got.len(), 1);
    let leased = &got[0];
    assert_eq!(
        leased.lease,
        Lease {
            run_id: id,
            epoch: 1
        }
    );
    assert_eq!(leased.run.status, RunStatus::Running);
    assert!(leased.events.is_empty());

    // Exact JSON round trip, including what PostgreSQL's JSONB would have rewritten.
    let input = json!({"z": 1, "a": "\u{0}", "n": 1.5e300, "big": u64::MAX});
    let scheduled = NewEvent {
        at: t(11),
        event: Event::StepScheduled {
            step_id: "s1".into(),
            name: "charge".into(),
            input,
        },
    };
    store
        .append(
            &leased.lease,
            &ap(vec![scheduled.clone(), step_done(t(12), 1)], None),
        )
        .await
        .unwrap();
    let done = NewEvent {
        at: t(13),
        event: Event::RunCompleted {
            output: json!("ok"),
        },
    };
    store
        .append(
            &leased.lease,
            &ap(vec![done.clone()], Some(RunOutcome::Completed(json!("ok")))),
        )
        .await
        .unwrap();

    let events = store.events(&id).await.unwrap();
    let expect: Vec<EventRecord> = [scheduled, step_done(t(12), 1), done]
        .into_iter()
        .zip(1..)
        .map(|(e, seq)| EventRecord {
            seq,
            at: e.at,
            event: e.event,
        })
        .collect();
    assert_eq!(events, expect);

    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.output, Some(json!("ok")));
    assert_eq!(run.error, None);
    assert_eq!(run.updated_at, t(13));

    // Ended: no more writes, not acquirable, and `kind` is queryable.
    assert!(matches!(
        store.append(&leased.lease, &ap(vec![step_done(t(14), 2)], None)).await,
        Err(StoreError::LeaseLost(r)) if r == id
    ));
    assert!(acquire(store, &wf, t(100_000), Duration::from_secs(30), 10)
        .await
        .is_empty());
    if let Some(kinds) = store.event_kinds(id).await {
        assert_eq!(kinds, ["step_scheduled", "step_completed", "run_completed"]);
    }
}

/// A run ended with a failure outcome keeps the error and has no output.
pub async fn failure_outcome_records_the_error<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let got = acquire(store, &names(&["orders"]), t(0), Duration::from_secs(30), 1).await;
    let error = Error::fatal("card declined");
    store
        .append(
            &got[0].lease,
            &ap(
                vec![NewEvent {
                    at: t(5),
                    event: Event::RunFailed {
                        error: error.clone(),
                    },
                }],
                Some(RunOutcome::Failed(error.clone())),
            ),
        )
        .await
        .unwrap();
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error, Some(error));
    assert_eq!(run.output, None);
}

/// After another worker takes an expired lease over, the old lease's writes are refused with
/// `LeaseLost` and leave no event.
pub async fn a_stale_epoch_cannot_write_after_a_takeover<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let wf = names(&["orders"]);
    let lease = Duration::from_secs(10);

    let first = acquire(store, &wf, t(0), lease, 1).await.remove(0);
    store
        .append(&first.lease, &ap(vec![step_done(t(1), 1)], None))
        .await
        .unwrap();
    // Still live: nobody else gets it.
    assert!(acquire(store, &wf, t(9_999), lease, 1).await.is_empty());
    // Expired: the next worker takes over with a new epoch and the history so far.
    let second = acquire(store, &wf, t(10_000), lease, 1).await.remove(0);
    assert_eq!(second.lease.epoch, first.lease.epoch + 1);
    assert_eq!(second.events.len(), 1);

    let stale = store
        .append(
            &first.lease,
            &ap(
                vec![step_done(t(10_001), 2)],
                Some(RunOutcome::Completed(json!(1))),
            ),
        )
        .await;
    assert!(
        matches!(stale, Err(StoreError::LeaseLost(r)) if r == id),
        "{stale:?}"
    );
    assert!(matches!(
        store.release(&first.lease, t(0), 0).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(matches!(
        store.claim_hook(&first.lease, "hk_1", "tok", t(2)).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert_eq!(owner(store, "tok").await, None);
    assert_eq!(store.events(&id).await.unwrap().len(), 1);
    assert_eq!(
        store.get_run(&id).await.unwrap().unwrap().status,
        RunStatus::Running
    );

    store
        .append(&second.lease, &ap(vec![step_done(t(10_002), 2)], None))
        .await
        .unwrap();
    assert_eq!(event_seqs(store, id).await, [1, 2]);
}

/// `acquire` hands out only due runs of the named workflows that nobody holds, oldest wake time
/// first, at most `limit`.
pub async fn acquire_respects_workflows_wake_time_leases_and_order<S: Store>(store: &S) {
    let late = create(store, "orders", t(500)).await;
    let early = create(store, "orders", t(100)).await;
    let other = create(store, "emails", t(0)).await;
    let future = create(store, "orders", t(10_000)).await;
    let lease = Duration::from_secs(60);

    assert!(acquire(store, &names(&["nothing"]), t(1_000), lease, 10)
        .await
        .is_empty());
    assert!(acquire(store, &[], t(1_000), lease, 10).await.is_empty());
    assert!(acquire(store, &names(&["orders"]), t(1_000), lease, 0)
        .await
        .is_empty());

    let got = acquire(store, &names(&["orders"]), t(1_000), lease, 1).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, [early]);
    let got = acquire(store, &names(&["orders", "emails"]), t(1_000), lease, 10).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(
        ids,
        [other, late],
        "earliest wake time first; live leases and future runs skipped"
    );

    assert!(
        acquire(store, &names(&["orders", "emails"]), t(9_999), lease, 10)
            .await
            .is_empty()
    );
    let got = acquire(store, &names(&["orders"]), t(10_000), lease, 10).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, [future]);
}

/// A run whose lease expired is handed out by its wake time like any other, not by the end
/// of that lease.
pub async fn expired_leases_are_taken_back_in_wake_time_order<S: Store>(store: &S) {
    let orders = names(&["orders"]);
    let abandoned = create(store, "orders", t(0)).await;
    let got = acquire(store, &orders, t(0), Duration::from_millis(100), 1).await;
    assert_eq!(got[0].run.id, abandoned);
    let waiting = create(store, "orders", t(50)).await;
    // At 200 both are due: `abandoned` woke at 0 (its lease ended at 100), `waiting` at 50.
    let got = acquire(store, &orders, t(200), Duration::from_secs(60), 1).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, [abandoned], "earliest wake time first");
    let got = acquire(store, &orders, t(200), Duration::from_secs(60), 1).await;
    let ids: Vec<RunId> = got.iter().map(|r| r.run.id).collect();
    assert_eq!(ids, [waiting]);
}

/// `stores` are handles on one database (separate connections where the store has them).
pub async fn concurrent_acquirers_never_share_a_run<S: Store + Clone>(stores: &[S]) {
    let creates: Vec<_> = (0..200)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move { create(&store, "shared", t(i as u64)).await })
        })
        .collect();
    let mut all = HashSet::new();
    for c in creates {
        all.insert(c.await.unwrap());
    }

    let workers: Vec<_> = (0..4)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move {
                let wf = names(&["shared"]);
                let mut mine = Vec::new();
                loop {
                    let got = acquire(&store, &wf, t(1_000), Duration::from_secs(600), 3).await;
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got.into_iter().map(|r| (r.run.id, r.lease.epoch)));
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut per_worker = Vec::new();
    for w in workers {
        let mine = w.await.unwrap();
        per_worker.push(mine.len());
        for (id, epoch) in mine {
            assert_eq!(epoch, 1, "run {id} was leased twice");
            assert!(seen.insert(id), "run {id} was handed out twice");
        }
    }
    assert_eq!(seen, all, "shares per worker: {per_worker:?}");
}

/// Many runs written at once, from every handle (a store committing writes together, as
/// PostgreSQL's committers do, puts them in one transaction): each write answers for itself.
/// The writes of runs whose lease is gone (cancelled) are refused and write nothing; every
/// other run gets its step and, for half of them, its end, numbered after its own events.
pub async fn concurrent_writes_of_many_runs_each_answer_for_themselves<S: Store + Clone>(
    stores: &[S],
) {
    const RUNS: usize = 60;
    let store = &stores[0];
    for i in 0..RUNS {
        create(store, "many", t(i as u64)).await;
    }
    let leased = acquire(
        store,
        &names(&["many"]),
        t(100),
        Duration::from_secs(600),
        RUNS,
    )
    .await;
    assert_eq!(leased.len(), RUNS);
    // Every fifth run loses its lease.
    let lost: HashSet<RunId> = leased.iter().step_by(5).map(|r| r.run.id).collect();
    for id in &lost {
        store.cancel(id, t(200)).await.unwrap();
    }
    let writes: Vec<_> = leased
        .iter()
        .enumerate()
        .map(|(i, run)| {
            let store = stores[i % stores.len()].clone();
            let lease = run.lease.clone();
            tokio::spawn(async move {
                let step = store
                    .append(&lease, &ap(vec![step_done(t(300), 1)], None))
                    .await;
                if step.is_err() || i % 2 == 1 {
                    return (lease.run_id, step, None);
                }
                let end = NewEvent {
                    at: t(301),
                    event: Event::RunCompleted { output: json!(i) },
                };
                let outcome = Some(RunOutcome::Completed(json!(i)));
                let ended = store.append(&lease, &ap(vec![end], outcome)).await;
                (lease.run_id, step, Some(ended))
            })
        })
        .collect();
    for write in writes {
        let (id, step, ended) = write.await.unwrap();
        let run = store.get_run(&id).await.unwrap().unwrap();
        let kinds: Vec<&str> = store
            .events(&id)
            .await
            .unwrap()
            .iter()
            .map(|e| e.event.kind())
            .collect();
        if lost.contains(&id) {
            assert!(
                matches!(step, Err(StoreError::LeaseLost(r)) if r == id),
                "{id}: {step:?}"
            );
            assert_eq!(run.status, RunStatus::Cancelled);
            assert_eq!(kinds, ["run_cancelled"], "{id}");
            continue;
        }
        assert!(step.is_ok(), "{id}: {step:?}");
        match ended {
            Some(ended) => {
                assert!(ended.is_ok(), "{id}: {ended:?}");
                assert_eq!(run.status, RunStatus::Completed);
                assert_eq!(kinds, ["step_completed", "run_completed"], "{id}");
            }
            None => {
                assert_eq!(run.status, RunStatus::Running);
                assert_eq!(kinds, ["step_completed"], "{id}");
            }
        }
    }
}

/// A released run is not handed out before its wake time, and is handed out again after it.
pub async fn release_with_a_future_wake_time<S: Store>(store: &S) {
    let id = create(store, "timers", t(0)).await;
    let wf = names(&["timers"]);
    let lease = Duration::from_secs(60);
    let first = acquire(store, &wf, t(0), lease, 1).await.remove(0);
    store.release(&first.lease, t(5_000), 0).await.unwrap();

    assert!(acquire(store, &wf, t(4_999), lease, 1).await.is_empty());
    // Released means no lease holds it: heartbeat and writes under the old lease fail.
    assert_eq!(
        store
            .heartbeat(std::slice::from_ref(&first.lease), lease, t(1))
            .await
            .unwrap(),
        [id]
    );
    assert!(matches!(
        store.append(&first.lease, &ap(vec![], None)).await,
        Err(StoreError::LeaseLost(_))
    ));
    let again = acquire(store, &wf, t(5_000), lease, 1).await.remove(0);
    assert_eq!(
        again.lease,
        Lease {
            run_id: id,
            epoch: 2
        }
    );
    assert_eq!(again.run.status, RunStatus::Running);
}

/// A heartbeat extends the leases still held and reports the runs that were cancelled, ended or
/// taken over.
pub async fn heartbeat_extends_live_leases_and_reports_lost_ones<S: Store>(store: &S) {
    let wf = names(&["orders"]);
    let lease = Duration::from_secs(10);
    let kept = create(store, "orders", t(0)).await;
    let taken = create(store, "orders", t(1)).await;
    let cancelled = create(store, "orders", t(2)).await;
    let ended = create(store, "orders", t(3)).await;
    let mine = acquire(store, &wf, t(0), lease, 10).await;
    assert_eq!(mine.len(), 1);
    let mine: Vec<Lease> = [mine, acquire(store, &wf, t(3), lease, 10).await]
        .concat()
        .into_iter()
        .map(|r| r.lease)
        .collect();
    assert_eq!(
        mine.iter().map(|l| l.run_id).collect::<Vec<_>>(),
        [kept, taken, cancelled, ended]
    );

    // Extended until t(19_000): a takeover at t(15_000) must fail for `kept`.
    assert!(store
        .heartbeat(&mine, lease, t(9_000))
        .await
        .unwrap()
        .is_empty());
    store.cancel(&cancelled, t(9_500)).await.unwrap();
    store
        .append(
            &mine[3],
            &ap(vec![], Some(RunOutcome::Completed(json!(null)))),
        )
        .await
        .unwrap();
    // `taken` was extended too: release it so that the next acquire takes it over.
    store.release(&mine[1], t(0), 0).await.unwrap();
    let over = acquire(store, &wf, t(15_000), lease, 10).await;
    assert_eq!(over.iter().map(|r| r.run.id).collect::<Vec<_>>(), [taken]);

    let lost = store.heartbeat(&mine, lease, t(16_000)).await.unwrap();
    assert_eq!(lost, [taken, cancelled, ended]);
    // The new holder's lease is live; a lease with a made-up epoch is not.
    let fake = Lease {
        run_id: kept,
        epoch: 99,
    };
    assert_eq!(
        store
            .heartbeat(&[over[0].lease.clone(), fake], lease, t(16_000))
            .await
            .unwrap(),
        [kept]
    );
    assert!(store
        .heartbeat(&[], lease, t(16_000))
        .await
        .unwrap()
        .is_empty());
}

/// Cancelling a pending or running run records it as cancelled and fences its lease; an ended
/// or unknown run is reported as such and left alone.
pub async fn cancel_running_ended_and_unknown_runs<S: Store>(store: &S) {
    let wf = names(&["orders"]);
    let running = create(store, "orders", t(0)).await;
    let pending = create(store, "orders", t(50_000)).await;
    let leased = acquire(store, &wf, t(0), Duration::from_secs(60), 1)
        .await
        .remove(0);
    store
        .append(&leased.lease, &ap(vec![step_done(t(1), 1)], None))
        .await
        .unwrap();

    assert_eq!(
        store.cancel(&running, t(2)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let run = store.get_run(&running).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Cancelled);
    assert_eq!(run.updated_at, t(2));
    let error = run.error.unwrap();
    assert!(error.is_cancelled(), "{error:?}");
    assert_eq!(error, Error::cancelled(&running));
    let events = store.events(&running).await.unwrap();
    assert_eq!(
        events.last().unwrap(),
        &EventRecord {
            seq: 2,
            at: t(2),
            event: Event::RunCancelled
        }
    );
    // The worker's lease is gone, and the run is never handed out again.
    assert!(matches!(
        store
            .append(&leased.lease, &ap(vec![step_done(t(3), 2)], None))
            .await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(acquire(store, &wf, t(100_000), Duration::from_secs(60), 10)
        .await
        .iter()
        .all(|r| r.run.id != running));

    assert_eq!(
        store.cancel(&running, t(3)).await.unwrap(),
        CancelOutcome::AlreadyEnded(RunStatus::Cancelled)
    );
    assert_eq!(store.events(&running).await.unwrap().len(), 2);

    assert_eq!(
        store.cancel(&pending, t(4)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let unknown = RunId::new();
    assert!(matches!(
        store.cancel(&unknown, t(5)).await,
        Err(StoreError::RunNotFound(r)) if r == unknown
    ));
}

/// Cancelling a completed run reports it as already ended and changes nothing.
pub async fn cancel_of_a_completed_run_reports_its_status<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let lease = lease_one(store, id, t(0)).await;
    store
        .append(&lease, &ap(vec![], Some(RunOutcome::Completed(json!(7)))))
        .await
        .unwrap();
    assert_eq!(
        store.cancel(&id, t(9)).await.unwrap(),
        CancelOutcome::AlreadyEnded(RunStatus::Completed)
    );
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!((run.status, run.error), (RunStatus::Completed, None));
}

/// A row the store cannot decode is an error naming the run, and does not stall the others;
/// `acquire` does not hand such a run out, and fails it after [`MAX_FAILED_TRIES`] tries.
pub async fn undecodable_rows_are_reported_as_corrupt<S: Store + Damage>(store: &S) {
    let bad_input = create(store, "orders", t(0)).await;
    let bad_history = create(store, "orders", t(1)).await;
    let good = create(store, "orders", t(2)).await;
    store.corrupt_input(bad_input).await;
    store.add_undecodable_event(bad_history).await;

    let err = store.get_run(&bad_input).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt(m) if m.contains(&bad_input.to_string()) && m.contains("input")),
        "{err:?}"
    );
    let err = store.events(&bad_history).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt(m) if m.contains(&bad_history.to_string()) && m.contains("event 1")),
        "{err:?}"
    );
    // One bad run does not stall the others, and neither comes back forever: each acquire
    // counts a failed try, and the store fails the run on the last. (100 s apart: every
    // backoff and the good run's lease are over by the next.)
    let lease = Duration::from_secs(60);
    let mut handed_out = Vec::new();
    for i in 0..2 * u64::from(MAX_FAILED_TRIES) {
        let got = acquire(
            store,
            &names(&["orders"]),
            t(10_000 + i * 100_000),
            lease,
            10,
        )
        .await;
        handed_out.extend(got.iter().map(|r| r.run.id));
    }
    assert!(handed_out.iter().all(|id| *id == good), "{handed_out:?}");
    let run = store.get_run(&bad_history).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert!(
        error.message().contains("gave up") && error.message().contains("event 1"),
        "{error:?}"
    );
}

/// A failed try gives the run back, due after [`failure_backoff`]; try
/// [`MAX_FAILED_TRIES`] fails it with the cause, records `RunFailed`, releases its tokens, and
/// the run is never handed out again. A stale lease cannot record a failure.
pub async fn failed_tries_give_the_run_back_and_the_last_fails_it<S: Store>(store: &S) {
    let (id, _) = start(store, "poison", None, t(0)).await;
    let cause = Error::fatal("the database refused a value");
    let mut now = t(10);
    for tries in 1..MAX_FAILED_TRIES {
        let lease = lease_one(store, id, now).await;
        let outcome = store.record_failure(&lease, &cause, now).await.unwrap();
        let due = now + failure_backoff(tries);
        assert_eq!(outcome, FailureOutcome::Retrying { tries, at: due });
        assert!(
            store
                .record_failure(&lease, &cause, now)
                .await
                .is_err_and(|e| matches!(e, StoreError::LeaseLost(r) if r == id)),
            "a lease given back cannot record another failure"
        );
        let early = acquire(
            store,
            &names(&["hooked"]),
            due - Duration::from_millis(1),
            Duration::from_secs(60),
            10,
        )
        .await;
        assert!(early.is_empty(), "handed out before its backoff ended");
        now = due;
    }
    let lease = lease_one(store, id, now).await;
    let before = event_seqs(store, id).await.len();
    assert_eq!(
        store.record_failure(&lease, &cause, now).await.unwrap(),
        FailureOutcome::Failed
    );
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert!(
        error.message().contains("gave up") && error.message().contains("refused a value"),
        "{error:?}"
    );
    let events = store.events(&id).await.unwrap();
    assert_eq!(events.len(), before + 1);
    assert!(matches!(&events[before].event, Event::RunFailed { error: e } if *e == error));
    assert_eq!(
        owner(store, "poison").await,
        None,
        "the token was not released"
    );
    let later = acquire(
        store,
        &names(&["hooked"]),
        t(10_000_000),
        Duration::from_secs(60),
        10,
    )
    .await;
    assert!(later.is_empty());
    assert!(matches!(
        store.record_failure(&lease, &cause, now).await,
        Err(StoreError::LeaseLost(_))
    ));
}

/// Failed tries count in a row: a try that ends well (the run given back with `release`)
/// starts the count again.
pub async fn a_release_starts_the_count_of_failed_tries_again<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let cause = Error::fatal("refused");
    let mut now = t(10);
    for tries in 1..=2 {
        let lease = lease_one(store, id, now).await;
        let outcome = store.record_failure(&lease, &cause, now).await.unwrap();
        assert!(matches!(outcome, FailureOutcome::Retrying { tries: n, .. } if n == tries));
        now += Duration::from_secs(100);
    }
    let lease = lease_one(store, id, now).await;
    store.release(&lease, now, 0).await.unwrap();
    now += Duration::from_secs(100);
    let lease = lease_one(store, id, now).await;
    let outcome = store.record_failure(&lease, &cause, now).await.unwrap();
    assert!(
        matches!(outcome, FailureOutcome::Retrying { tries: 1, .. }),
        "{outcome:?}"
    );
}

/// An append recording a payload's delivery takes it out of the run's inbox, so a run picked
/// up again reads only what it has not received; the others stay, in order.
pub async fn delivered_payloads_leave_the_inbox<S: Store>(store: &S) {
    let (id, _) = start(store, "inbox", None, t(0)).await;
    let lease = lease_one(store, id, t(1)).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let (run, payload) = store
            .resume_hook("inbox", json!(n), t(2 + n))
            .await
            .unwrap()
            .expect("the token has an owner");
        assert_eq!(run, id);
        ids.push(payload);
    }
    let received = |n: usize| NewEvent {
        at: t(10),
        event: Event::HookReceived {
            token: "inbox".to_owned(),
            payload_id: ids[n],
            payload: json!(n),
        },
    };
    store
        .append(&lease, &ap(vec![received(0), received(2)], None))
        .await
        .unwrap();
    let left = store.payloads(&id, 0).await.unwrap();
    assert_eq!(
        left.iter()
            .map(|p| (p.id, p.payload.clone()))
            .collect::<Vec<_>>(),
        [(ids[1], json!(1))]
    );
    // Ids are never reused, even once the newest payload left the inbox.
    let (_, next) = store
        .resume_hook("inbox", json!(3), t(11))
        .await
        .unwrap()
        .unwrap();
    assert!(next > ids[2], "{next} reuses an id at or below {}", ids[2]);
}

/// `block` (fenced) makes the run blocked with the divergence as its error and nothing added
/// to its history, due after [`block_backoff`] (doubling per block in a row); payloads do not
/// wake it; `wake_blocked` and `retry` make it due at once; acquiring it clears the error.
pub async fn a_blocked_run_waits_with_its_divergence_until_woken_or_retried<S: Store>(store: &S) {
    let (id, _) = start(store, "blocked", None, t(0)).await;
    let divergence = Error::diverged("at event 1 its history expects A next, but B");
    let lease = lease_one(store, id, t(10)).await;
    let before = event_seqs(store, id).await;
    let due = store.block(&lease, &divergence, t(10)).await.unwrap();
    assert_eq!(due, t(10) + block_backoff(1));
    assert!(matches!(
        store.block(&lease, &divergence, t(10)).await,
        Err(StoreError::LeaseLost(r)) if r == id
    ));
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(
        (run.status, run.error),
        (RunStatus::Blocked, Some(divergence.clone()))
    );
    assert_eq!(event_seqs(store, id).await, before, "nothing written");
    assert!(!run.status.is_terminal());

    // A payload does not wake it.
    store.resume_hook("blocked", json!(1), t(11)).await.unwrap();
    let hooked = names(&["hooked"]);
    let lease_for = Duration::from_secs(60);
    assert!(acquire(
        store,
        &hooked,
        due - Duration::from_millis(1),
        lease_for,
        10
    )
    .await
    .is_empty());
    // Due after its backoff; acquiring clears the divergence.
    let got = acquire(store, &hooked, due, lease_for, 10).await;
    assert_eq!(got.len(), 1);
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!((run.status, run.error), (RunStatus::Running, None));

    // Blocked again: the backoff doubles; wake_blocked makes it due at once.
    let due = store.block(&got[0].lease, &divergence, due).await.unwrap();
    let now = t(10) + block_backoff(1);
    assert_eq!(due, now + block_backoff(2));
    assert_eq!(store.wake_blocked(now).await.unwrap(), 1);
    let got = acquire(store, &hooked, now, lease_for, 10).await;
    assert_eq!(got.len(), 1);

    // And retry, too, without waiting for the backoff.
    store.block(&got[0].lease, &divergence, now).await.unwrap();
    assert_eq!(
        store.retry(&id, now).await.unwrap(),
        RetryOutcome::Unblocked
    );
    assert_eq!(acquire(store, &hooked, now, lease_for, 10).await.len(), 1);
    assert_eq!(store.wake_blocked(now).await.unwrap(), 0);
}

/// `retry` re-opens a failed run (a `RunRetried` event, pending, error cleared, due now) and
/// refuses, changing nothing, a completed, cancelled or live run; an unknown run is an error.
pub async fn retry_reopens_a_failed_run_and_refuses_other_statuses<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let lease = lease_one(store, id, t(1)).await;
    let error = Error::fatal("out of stock");
    store
        .append(
            &lease,
            &ap(vec![step_done(t(2), 1)], Some(RunOutcome::Failed(error))),
        )
        .await
        .unwrap();
    assert_eq!(
        store.retry(&id, t(5)).await.unwrap(),
        RetryOutcome::Reopened
    );
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!((run.status, run.error), (RunStatus::Pending, None));
    let events = store.events(&id).await.unwrap();
    assert!(
        matches!(events.last().map(|e| &e.event), Some(Event::RunRetried)),
        "{events:?}"
    );
    let got = acquire(
        store,
        &names(&["orders"]),
        t(5),
        Duration::from_secs(60),
        10,
    )
    .await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [id]);
    assert_eq!(got[0].events.len(), events.len());
    assert_eq!(
        store.retry(&id, t(6)).await.unwrap(),
        RetryOutcome::NotRetryable(RunStatus::Running)
    );
    store
        .append(
            &got[0].lease,
            &ap(vec![], Some(RunOutcome::Completed(json!(1)))),
        )
        .await
        .unwrap();
    let before = store.events(&id).await.unwrap();
    assert_eq!(
        store.retry(&id, t(7)).await.unwrap(),
        RetryOutcome::NotRetryable(RunStatus::Completed)
    );
    assert_eq!(store.events(&id).await.unwrap(), before);
    let cancelled = create(store, "orders", t(8)).await;
    store.cancel(&cancelled, t(9)).await.unwrap();
    assert_eq!(
        store.retry(&cancelled, t(9)).await.unwrap(),
        RetryOutcome::NotRetryable(RunStatus::Cancelled)
    );
    let unknown = RunId::new();
    assert!(matches!(
        store.retry(&unknown, t(9)).await,
        Err(StoreError::RunNotFound(r)) if r == unknown
    ));
}

/// A run created with a history (`fork`) is pending, holds that history numbered from 1, and
/// is handed out with it; an existing id or a token is refused.
pub async fn a_run_created_with_a_history_replays_it<S: Store>(store: &S) {
    let id = RunId::new();
    let new = |id, hook| NewRun {
        parent: None,
        id,
        workflow: "orders".to_owned(),
        input: json!([1]),
        created_at: t(0),
        hook,
        deadline: None,
        queue: None,
    };
    let history = [step_done(t(1), 1), step_done(t(2), 2)];
    store
        .create_run_with_history(new(id, None), &history)
        .await
        .unwrap();
    let run = store.get_run(&id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Pending);
    assert_eq!(event_seqs(store, id).await, [1, 2]);
    let got = acquire(
        store,
        &names(&["orders"]),
        t(3),
        Duration::from_secs(60),
        10,
    )
    .await;
    assert_eq!(got.len(), 1);
    let events: Vec<NewEvent> = got[0]
        .events
        .iter()
        .map(|e| NewEvent {
            at: e.at,
            event: e.event.clone(),
        })
        .collect();
    assert_eq!(events, history);
    assert!(store
        .create_run_with_history(new(id, None), &history)
        .await
        .is_err());
    let other = RunId::new();
    assert!(store
        .create_run_with_history(new(other, start_hook("fork", None)), &history)
        .await
        .is_err());
    assert!(store.get_run(&other).await.unwrap().is_none());
    assert_eq!(owner(store, "fork").await, None);
}

/// A run's deadline is kept with it: read back by `get_run`, handed out by `acquire` and by
/// an admission that leases.
pub async fn a_deadline_is_kept_with_the_run<S: Store>(store: &S) {
    let run = |deadline| NewRun {
        parent: None,
        id: RunId::new(),
        workflow: "orders".to_owned(),
        input: json!([]),
        created_at: t(0),
        hook: None,
        deadline,
        queue: None,
    };
    let (with, without) = (run(Some(t(5_000))), run(None));
    let (with_id, without_id) = (with.id, without.id);
    store.create_run(with).await.unwrap();
    store.create_run(without).await.unwrap();
    let read = |id| async move { store.get_run(&id).await.unwrap().unwrap().deadline };
    assert_eq!(read(with_id).await, Some(t(5_000)));
    assert_eq!(read(without_id).await, None);
    let got = acquire(
        store,
        &names(&["orders"]),
        t(1),
        Duration::from_secs(60),
        10,
    )
    .await;
    let deadline = |id| got.iter().find(|r| r.run.id == id).map(|r| r.run.deadline);
    assert_eq!(deadline(with_id), Some(Some(t(5_000))));
    assert_eq!(deadline(without_id), Some(None));
    let leased = run(Some(t(9_000)));
    let leased_id = leased.id;
    store
        .create_run_leased(leased, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(read(leased_id).await, Some(t(9_000)));
}

/// `ended_among` answers, of the given runs, those that ended or do not exist, in order.
pub async fn ended_among_names_the_runs_that_are_not_live<S: Store>(store: &S) {
    let pending = create(store, "orders", t(0)).await;
    let running = create(store, "orders", t(0)).await;
    let lease = lease_one(store, running, t(1)).await;
    let done = create(store, "orders", t(0)).await;
    let done_lease = lease_one(store, done, t(1)).await;
    store
        .append(
            &done_lease,
            &ap(vec![], Some(RunOutcome::Completed(json!(1)))),
        )
        .await
        .unwrap();
    let cancelled = create(store, "orders", t(0)).await;
    store.cancel(&cancelled, t(2)).await.unwrap();
    let gone = RunId::new();
    let asked = [pending, running, done, cancelled, gone];
    assert_eq!(
        store.ended_among(&asked).await.unwrap(),
        [done, cancelled, gone]
    );
    assert_eq!(store.ended_among(&[]).await.unwrap(), []);
    store
        .block(&lease, &Error::diverged("x"), t(3))
        .await
        .unwrap();
    assert_eq!(store.ended_among(&[running]).await.unwrap(), []);
}

// ---------------------------------------------------------------------------------------------
// Hooks and idempotent starts

/// A start whose hook token is taken is refused naming the owner, and writes no run, event or
/// hook.
pub async fn a_start_whose_token_is_taken_writes_nothing<S: Store + Inspect>(store: &S) {
    let (first, admitted) = start(store, "order:1", None, t(0)).await;
    assert_eq!(admitted, Admission::Admitted);
    let run = store.get_run(&first).await.unwrap().unwrap();
    assert_eq!(run.hook_token.as_deref(), Some("order:1"));
    assert_eq!(run.status, RunStatus::Pending);
    assert_eq!(
        store.get_hook("order:1").await.unwrap(),
        Some(HookRecord {
            token: "order:1".to_owned(),
            run_id: first,
            created_at: t(0),
        })
    );
    let tables = ["runs", "events", "hooks", "hook_inbox"];
    let mut before = Vec::new();
    for table in tables {
        before.push(store.count(table).await);
    }

    let (second, conflict) = start(store, "order:1", None, t(5)).await;
    assert_eq!(conflict, Admission::Conflict(first));
    assert!(store.get_run(&second).await.unwrap().is_none());
    let mut after = Vec::new();
    for table in tables {
        after.push(store.count(table).await);
    }
    assert_eq!(after, before);
    assert_eq!(before, [1, 0, 1, 0]);
    assert_eq!(owner(store, "order:1").await, Some(first));

    // An existing id is an error before any claim.
    let again = store
        .create_run(NewRun {
            parent: None,
            id: first,
            workflow: "hooked".into(),
            input: json!([]),
            created_at: t(6),
            hook: start_hook("order:2", None),
            deadline: None,
            queue: None,
        })
        .await;
    assert!(
        matches!(&again, Err(StoreError::Database(m)) if m.message().contains("already exists")),
        "{again:?}"
    );
    assert_eq!(owner(store, "order:2").await, None);
    // A run without a token has none.
    let plain = create(store, "orders", t(7)).await;
    let run = store.get_run(&plain).await.unwrap().unwrap();
    assert_eq!(run.hook_token, None);
}

/// Two storms of starts on one token: from tasks on one handle, then spread over all of
/// `stores` (handles on one database).
pub async fn concurrent_starts_with_one_token_admit_exactly_one<S: Store + Clone + Inspect>(
    stores: &[S],
) {
    storm(&stores[..1], "solo", 200).await;
    storm(stores, "shared", 200).await;
    let store = &stores[0];
    assert_eq!(store.count("runs").await, 2);
    assert_eq!(store.count("hooks").await, 2);
    assert_eq!(store.count("events").await, 0);
}

/// A run of `hooked` claiming `token` at `at`, for `admit_or_resume`.
fn hooked_run(token: &str, retain_until: Option<SystemTime>, at: SystemTime) -> NewRun {
    NewRun {
        parent: None,
        id: RunId::new(),
        workflow: "hooked".to_owned(),
        input: json!([]),
        created_at: at,
        hook: start_hook(token, retain_until),
        deadline: None,
        queue: None,
    }
}

/// `admit_or_resume`: a free token admits the run (leased when asked) and queues nothing; a
/// token an active hook owns queues the payload to its run, which becomes due, and admits
/// nothing; a token only retained by an ended run writes nothing at all.
pub async fn admit_or_resume_admits_resumes_or_conflicts<S: Store + Inspect>(store: &S) {
    let minute = Some(Duration::from_secs(60));
    let first = hooked_run("a", None, t(0));
    let owner_a = first.id;
    let admitted = store
        .admit_or_resume(first, minute, json!("not sent"))
        .await
        .unwrap();
    let lease = match admitted {
        AdmitOrResume::Admitted(lease) => lease,
        other => panic!("a free token admits: {other:?}"),
    };
    if let Some(lease) = lease {
        assert_eq!(
            lease,
            Lease {
                run_id: owner_a,
                epoch: 1
            }
        );
        let run = store.get_run(&owner_a).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Running);
    }
    assert_eq!(owner(store, "a").await, Some(owner_a));
    assert_eq!(store.count("hook_inbox").await, 0);

    let second = hooked_run("a", None, t(10));
    let duplicate = second.id;
    assert_eq!(
        store
            .admit_or_resume(second, minute, json!({"n": 1}))
            .await
            .unwrap(),
        AdmitOrResume::Resumed {
            run: owner_a,
            payload_id: 1
        }
    );
    assert!(store.get_run(&duplicate).await.unwrap().is_none());
    assert_eq!(
        store.payloads(&owner_a, 0).await.unwrap(),
        [Payload {
            id: 1,
            token: "a".to_owned(),
            payload: json!({"n": 1}),
        }]
    );

    // A pending owner due far ahead becomes due at the payload's time.
    let (owner_b, _) = start(store, "b", None, t(50_000)).await;
    let hooked = names(&["hooked"]);
    assert!(acquire(store, &hooked, t(100), Duration::from_secs(60), 10)
        .await
        .is_empty());
    assert_eq!(
        store
            .admit_or_resume(hooked_run("b", None, t(100)), None, json!(2))
            .await
            .unwrap(),
        AdmitOrResume::Resumed {
            run: owner_b,
            payload_id: 2
        }
    );
    let got = acquire(store, &hooked, t(100), Duration::from_secs(60), 10).await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [owner_b]);

    // Retained by an ended run: a conflict naming it, and nothing written.
    let (owner_c, _) = start(store, "c", Some(t(10_000)), t(200)).await;
    store.cancel(&owner_c, t(300)).await.unwrap();
    let tables = ["runs", "events", "hooks", "hook_inbox"];
    let mut before = Vec::new();
    for table in tables {
        before.push(store.count(table).await);
    }
    let late = hooked_run("c", None, t(400));
    let late_id = late.id;
    assert_eq!(
        store.admit_or_resume(late, minute, json!(3)).await.unwrap(),
        AdmitOrResume::Conflict(owner_c)
    );
    let mut after = Vec::new();
    for table in tables {
        after.push(store.count(table).await);
    }
    assert_eq!(after, before);
    assert!(store.get_run(&late_id).await.unwrap().is_none());
    assert_eq!(store.last_payload_id().await.unwrap(), 2);

    // Once the retention is over, the token is free again.
    let fresh = hooked_run("c", None, t(10_000));
    let fresh_id = fresh.id;
    assert!(matches!(
        store.admit_or_resume(fresh, None, json!(4)).await.unwrap(),
        AdmitOrResume::Admitted(None)
    ));
    assert_eq!(owner(store, "c").await, Some(fresh_id));
    assert_eq!(store.last_payload_id().await.unwrap(), 2);

    // A run without a token is refused.
    let mut tokenless = hooked_run("d", None, t(0));
    tokenless.hook = None;
    assert!(store
        .admit_or_resume(tokenless, None, json!(5))
        .await
        .is_err());
}

/// 200 `admit_or_resume` calls with one token at once, spread over `stores`, and 50 plain
/// starts of the token among them (which may take it between a call's resume and its
/// claim): one run is admitted, each plain start that lost names it, and every call that did
/// not admit queued its own payload to it, once.
pub async fn concurrent_admit_or_resume_calls_admit_one_and_queue_the_rest<
    S: Store + Clone + Inspect,
>(
    stores: &[S],
) {
    let tasks: Vec<_> = (0..250)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move {
                let run = hooked_run("storm", None, t(0));
                let id = run.id;
                let outcome = if i % 5 == 4 {
                    match store.create_run(run).await.unwrap() {
                        Admission::Admitted => AdmitOrResume::Admitted(None),
                        Admission::Conflict(owner) => AdmitOrResume::Conflict(owner),
                    }
                } else {
                    store.admit_or_resume(run, None, json!(i)).await.unwrap()
                };
                (i, id, outcome)
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut resumed = Vec::new();
    let mut refused = Vec::new();
    for task in tasks {
        let (i, id, outcome) = within(task).await.unwrap();
        match outcome {
            AdmitOrResume::Admitted(_) => admitted.push(id),
            AdmitOrResume::Resumed { run, payload_id } => resumed.push((i, run, payload_id)),
            AdmitOrResume::Conflict(owner) if i % 5 == 4 => refused.push(owner),
            AdmitOrResume::Conflict(owner) => panic!("call {i} conflicted with {owner}"),
        }
    }
    assert_eq!(admitted.len(), 1, "exactly one call admits");
    let winner = admitted[0];
    assert_eq!(resumed.len() + refused.len(), 249);
    assert!(refused.iter().all(|owner| *owner == winner));
    assert!(resumed.iter().all(|(_, run, _)| *run == winner));
    let inbox = store_payloads(&stores[0], winner).await;
    let mut sent: Vec<_> = resumed.iter().map(|(i, _, id)| (*id, json!(i))).collect();
    sent.sort_by_key(|(id, _)| *id);
    assert_eq!(
        inbox, sent,
        "each resumed call's payload, once, under its id"
    );
    assert_eq!(stores[0].count("runs").await, 1);
}

async fn store_payloads<S: Store>(store: &S, run: RunId) -> Vec<(u64, serde_json::Value)> {
    let inbox = within(store.payloads(&run, 0)).await.unwrap();
    inbox.into_iter().map(|p| (p.id, p.payload)).collect()
}

/// Hook claims: one active owner per token, release on request, and retained tokens refused
/// until their retention ends.
pub async fn claims_releases_and_retention<S: Store + Inspect>(store: &S) {
    let (keeper, _) = start(store, "keep", Some(t(1_000)), t(0)).await;
    let claimer = create(store, "orders", t(1)).await;
    let keeper_lease = lease_one(store, keeper, t(0)).await;
    let lease = lease_one(store, claimer, t(1)).await;

    // Taken by an active start hook.
    assert_eq!(
        store
            .claim_hook(&lease, "hk_1", "keep", t(10))
            .await
            .unwrap(),
        ClaimOutcome::Conflict(keeper)
    );
    // The owner claiming its own token again is a conflict naming itself.
    assert_eq!(
        store
            .claim_hook(&keeper_lease, "hk_1", "keep", t(11))
            .await
            .unwrap(),
        ClaimOutcome::Conflict(keeper)
    );
    assert_eq!(
        store.events(&claimer).await.unwrap(),
        [EventRecord {
            seq: 1,
            at: t(10),
            event: Event::HookRegistered {
                hook_key: "hk_1".into(),
                token: "keep".into(),
                conflict: Some(keeper),
            },
        }]
    );

    // Ended with retention: released (no owner, unresumable) but not free until t(1_000).
    store
        .append(
            &keeper_lease,
            &ap(
                vec![NewEvent {
                    at: t(20),
                    event: Event::RunCompleted { output: json!(1) },
                }],
                Some(RunOutcome::Completed(json!(1))),
            ),
        )
        .await
        .unwrap();
    assert_eq!(owner(store, "keep").await, None);
    assert_eq!(
        store
            .resume_hook("keep", json!("late"), t(21))
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.count("hook_inbox").await, 0);
    assert_eq!(
        start(store, "keep", None, t(500)).await.1,
        Admission::Conflict(keeper)
    );
    assert_eq!(
        store
            .claim_hook(&lease, "hk_2", "keep", t(999))
            .await
            .unwrap(),
        ClaimOutcome::Conflict(keeper)
    );
    // Retention over: the next claim replaces the row.
    assert_eq!(
        store
            .claim_hook(&lease, "hk_3", "keep", t(1_000))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store.get_hook("keep").await.unwrap(),
        Some(HookRecord {
            token: "keep".into(),
            run_id: claimer,
            created_at: t(1_000),
        })
    );
    let seqs: Vec<(u64, Option<RunId>)> = store
        .events(&claimer)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e.event {
            Event::HookRegistered { conflict, .. } => (e.seq, conflict),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        seqs,
        [(1, Some(keeper)), (2, Some(keeper)), (3, None)],
        "one HookRegistered per claim, at the next seq"
    );

    // A stale lease claims nothing and records nothing.
    let stale = Lease {
        run_id: claimer,
        epoch: lease.epoch + 1,
    };
    assert!(matches!(
        store.claim_hook(&stale, "hk_4", "fresh", t(1_000)).await,
        Err(StoreError::LeaseLost(r)) if r == claimer
    ));
    assert_eq!(owner(store, "fresh").await, None);
    assert_eq!(store.events(&claimer).await.unwrap().len(), 3);

    // Released without retention: free at once, its row gone.
    let released = NewEvent {
        at: t(1_001),
        event: Event::HookReleased {
            hook_key: "hk_3".into(),
            token: "keep".into(),
        },
    };
    let release_keep = |events: Vec<NewEvent>| Append {
        events,
        release_tokens: vec!["keep".into()],
        outcome: None,
    };
    store
        .append(&lease, &release_keep(vec![released.clone()]))
        .await
        .unwrap();
    assert_eq!(owner(store, "keep").await, None);
    assert_eq!(store.count("hooks").await, 0);
    let (next, admitted) = start(store, "keep", None, t(1_002)).await;
    assert_eq!(admitted, Admission::Admitted);
    // Releasing a token one does not own changes nothing.
    store.append(&lease, &release_keep(vec![])).await.unwrap();
    assert_eq!(owner(store, "keep").await, Some(next));
    // A fenced-off release releases nothing either.
    assert!(matches!(
        store.append(&stale, &release_keep(vec![])).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert_eq!(owner(store, "keep").await, Some(next));
    let last = store.events(&claimer).await.unwrap();
    assert_eq!(last.last().unwrap().event, released.event);
}

/// A run's end and its cancellation release its tokens in the same operation, except retained
/// ones.
pub async fn run_end_and_cancel_release_tokens<S: Store + Inspect>(store: &S) {
    let (failing, _) = start(store, "a", None, t(0)).await;
    let lease = lease_one(store, failing, t(0)).await;
    assert_eq!(
        store.claim_hook(&lease, "hk_1", "b", t(1)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(owner(store, "b").await, Some(failing));
    let error = Error::fatal("boom");
    store
        .append(
            &lease,
            &ap(
                vec![NewEvent {
                    at: t(2),
                    event: Event::RunFailed {
                        error: error.clone(),
                    },
                }],
                Some(RunOutcome::Failed(error)),
            ),
        )
        .await
        .unwrap();
    assert_eq!(owner(store, "a").await, None);
    assert_eq!(owner(store, "b").await, None);
    assert_eq!(store.count("hooks").await, 0);
    assert_eq!(start(store, "a", None, t(3)).await.1, Admission::Admitted);

    // Cancelled while pending.
    let (cancelled, _) = start(store, "c", None, t(0)).await;
    assert_eq!(
        store.cancel(&cancelled, t(4)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(owner(store, "c").await, None);
    assert_eq!(start(store, "c", None, t(5)).await.1, Admission::Admitted);

    // Cancelled with retention: unavailable until it ends.
    let (retained, _) = start(store, "d", Some(t(5_000)), t(0)).await;
    store.cancel(&retained, t(10)).await.unwrap();
    assert_eq!(owner(store, "d").await, None);
    assert_eq!(
        start(store, "d", None, t(4_999)).await.1,
        Admission::Conflict(retained)
    );
    let (late, admitted) = start(store, "d", None, t(5_000)).await;
    assert_eq!(admitted, Admission::Admitted);
    assert_eq!(owner(store, "d").await, Some(late));
    // Cancelling an ended run releases nothing more.
    assert_eq!(
        store.cancel(&retained, t(6_000)).await.unwrap(),
        CancelOutcome::AlreadyEnded(RunStatus::Cancelled)
    );
    assert_eq!(owner(store, "d").await, Some(late));
}

/// A payload for a token no active hook owns is refused and stored nowhere; once a run claims
/// the token, a payload makes that run due at once.
pub async fn a_resume_before_the_hook_exists_delivers_nothing<S: Store + Inspect>(store: &S) {
    assert_eq!(
        store.resume_hook("later", json!(1), t(0)).await.unwrap(),
        None
    );
    assert_eq!(store.last_payload_id().await.unwrap(), 0);
    assert!(store.payloads_since(0, 10).await.unwrap().is_empty());
    assert_eq!(store.count("hook_inbox").await, 0);
    // Admitted to wake far ahead; a payload makes it acquirable at the payload's time.
    let (run, _) = start(store, "later", None, t(50_000)).await;
    let hooked = names(&["hooked"]);
    assert!(acquire(store, &hooked, t(100), Duration::from_secs(60), 10)
        .await
        .is_empty());
    assert_eq!(
        store
            .resume_hook("later", json!({"n": 1}), t(100))
            .await
            .unwrap(),
        Some((run, 1))
    );
    let got = acquire(store, &hooked, t(100), Duration::from_secs(60), 10).await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [run]);
    assert_eq!(
        store.payloads(&run, 0).await.unwrap(),
        [Payload {
            id: 1,
            token: "later".into(),
            payload: json!({"n": 1}),
        }]
    );
    assert!(store.payloads(&run, 1).await.unwrap().is_empty());
    assert_eq!(store.count("hook_inbox").await, 1);
}

/// Payloads sent one after the other and at once, through two handles on one database
/// (`stores[0]` and `stores[1]`): each id is above the last, all are delivered to their
/// owner, and the listings agree.
pub async fn payloads_reach_the_owner_in_commit_order<S: Store + Clone>(stores: &[S]) {
    let (a, b) = (&stores[0], &stores[1]);
    // Admitted to wake far ahead; a payload makes it acquirable at the payload's time.
    let (run, _) = start(a, "inbox", None, t(50_000)).await;
    let (other, _) = start(a, "other", None, t(50_000)).await;
    let hooked = names(&["hooked"]);
    assert!(acquire(a, &hooked, t(100), Duration::from_secs(60), 10)
        .await
        .is_empty());
    let first = a
        .resume_hook("inbox", json!({"n": 0}), t(100))
        .await
        .unwrap();
    assert_eq!(first, Some((run, 1)));
    let got = acquire(a, &hooked, t(100), Duration::from_secs(60), 10).await;
    assert_eq!(got.iter().map(|r| r.run.id).collect::<Vec<_>>(), [run]);

    // One after the other, from either handle: each id above the last.
    let mut last = 1;
    let mut expect = vec![(1, run)];
    for i in 1..20u64 {
        let store = if i % 2 == 0 { a } else { b };
        let token = if i % 3 == 0 { "other" } else { "inbox" };
        let (owner, id) = store
            .resume_hook(token, json!({"n": i}), t(200 + i))
            .await
            .unwrap()
            .unwrap();
        assert!(id > last, "payload id {id} after {last}");
        last = id;
        expect.push((id, owner));
    }
    // At once: distinct ids, all delivered.
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                store
                    .resume_hook("inbox", json!({"burst": i}), t(300))
                    .await
                    .unwrap()
                    .unwrap()
            })
        })
        .collect();
    for task in tasks {
        let (owner, id) = task.await.unwrap();
        expect.push((id, owner));
    }
    expect.sort();
    let since = a.payloads_since(0, 1_000).await.unwrap();
    assert_eq!(since, expect);
    assert_eq!(
        since.iter().map(|p| p.0).collect::<HashSet<_>>().len(),
        60,
        "ids are unique"
    );
    assert_eq!(a.last_payload_id().await.unwrap(), since[59].0);
    assert_eq!(a.payloads_since(5, 3).await.unwrap(), since[5..8]);
    assert!(a.payloads_since(since[59].0, 10).await.unwrap().is_empty());

    let mine = a.payloads(&run, 0).await.unwrap();
    let theirs = b.payloads(&other, 0).await.unwrap();
    assert_eq!(mine.len() + theirs.len(), 60);
    assert_eq!(
        mine.iter().map(|p| (p.id, run)).collect::<Vec<_>>(),
        expect
            .iter()
            .copied()
            .filter(|(_, r)| *r == run)
            .collect::<Vec<_>>()
    );
    assert!(theirs.iter().all(|p| p.token == "other"));
    assert_eq!(
        mine[0],
        Payload {
            id: 1,
            token: "inbox".into(),
            payload: json!({"n": 0}),
        }
    );
    assert_eq!(
        a.payloads(&run, 1).await.unwrap(),
        mine[1..],
        "`after` is exclusive"
    );
    assert!(a.payloads(&RunId::new(), 0).await.unwrap().is_empty());
}

/// Senders on `stores[0]` and `stores[1]` while a cursor reader like the runtime's polls
/// `stores[2]` (handles on one database): an id committed below the reader's cursor would be
/// lost to it, so ids must follow commit order.
pub async fn payload_ids_follow_commit_order_under_concurrent_resumes<S: Store + Clone>(
    stores: &[S],
) {
    let (a, b, reader) = (&stores[0], &stores[1], stores[2].clone());
    const TOKENS: usize = 8;
    const EACH: usize = 25;
    let mut runs = Vec::new();
    for i in 0..TOKENS {
        runs.push(start(a, &format!("tk{i}"), None, t(0)).await.0);
    }

    let (done_tx, done) = tokio::sync::watch::channel(false);
    let cursor = tokio::spawn(async move {
        let mut cursor = 0u64;
        let mut seen = Vec::new();
        loop {
            let finished = *done.borrow();
            let news = reader.payloads_since(cursor, 1_000).await.unwrap();
            for (id, run) in news {
                assert!(id > cursor, "id {id} at cursor {cursor}");
                cursor = id;
                seen.push((id, run));
            }
            if finished {
                return seen;
            }
            tokio::task::yield_now().await;
        }
    });
    let writers: Vec<_> = (0..TOKENS)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for n in 0..EACH {
                    let (_, id) = store
                        .resume_hook(&format!("tk{i}"), json!({"n": n}), t(1))
                        .await
                        .unwrap()
                        .unwrap();
                    ids.push(id);
                }
                ids
            })
        })
        .collect();
    let mut all = Vec::new();
    for (i, w) in writers.into_iter().enumerate() {
        let ids = w.await.unwrap();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "one sender's ids grow: {ids:?}"
        );
        // Each run's inbox holds its payloads in the order they were sent.
        let inbox = a.payloads(&runs[i], 0).await.unwrap();
        assert_eq!(inbox.iter().map(|p| p.id).collect::<Vec<_>>(), ids);
        assert_eq!(
            inbox.iter().map(|p| p.payload.clone()).collect::<Vec<_>>(),
            (0..EACH).map(|n| json!({"n": n})).collect::<Vec<_>>()
        );
        all.extend(ids.into_iter().map(|id| (id, runs[i])));
    }
    done_tx.send(true).unwrap();
    let seen = cursor.await.unwrap();
    all.sort();
    assert_eq!(seen.len(), TOKENS * EACH, "the cursor skipped payloads");
    assert_eq!(seen, all);
    assert_eq!(a.last_payload_id().await.unwrap(), all.last().unwrap().0);
    assert_eq!(a.payloads_since(all[4].0, 3).await.unwrap(), all[5..8]);
}

/// Releasing a run with payloads it has not seen makes it due at once, not at its wake time.
pub async fn release_wakes_a_run_with_unseen_payloads<S: Store + Inspect>(store: &S) {
    let (run, _) = start(store, "w", None, t(0)).await;
    let wf = names(&["hooked"]);
    let lease = Duration::from_secs(600);

    let held = lease_one(store, run, t(0)).await;
    let (_, p1) = store
        .resume_hook("w", json!(1), t(1))
        .await
        .unwrap()
        .unwrap();
    // Everything seen: it sleeps until woken.
    store.release(&held, never(), p1).await.unwrap();
    assert_eq!(store.wake_at(run).await, never());
    let far = SystemTime::now() + Duration::from_secs(86_400);
    assert!(acquire(store, &wf, far, lease, 10).await.is_empty());

    // A payload wakes it (at the payload's time).
    let (_, p2) = store
        .resume_hook("w", json!(2), t(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.wake_at(run).await, t(10));
    let held = lease_one(store, run, t(10)).await;

    // Released having seen only p1: p2 is waiting, so it is due now, not never. (Compared in
    // milliseconds, what the SQL stores keep.)
    let before = to_millis(SystemTime::now());
    store.release(&held, never(), p1).await.unwrap();
    let woken = to_millis(store.wake_at(run).await);
    assert!(
        woken >= before && woken <= to_millis(SystemTime::now()),
        "{woken}"
    );
    let held = lease_one(store, run, SystemTime::now() + Duration::from_secs(1)).await;
    assert!(matches!(
        store
            .release(
                &Lease {
                    epoch: 0,
                    ..held.clone()
                },
                never(),
                0
            )
            .await,
        Err(StoreError::LeaseLost(_))
    ));
    store.release(&held, t(99), p2).await.unwrap();
    assert_eq!(store.wake_at(run).await, t(99));
}

/// A script of hook operations has the same transcript on `store` as on the memory store.
pub async fn hooks_behave_like_the_memory_store<S: Store>(store: &S) {
    let ids: Vec<RunId> = (0..6).map(|_| RunId::new()).collect();
    let memory = MemoryStore::new();
    let expected = hook_script(&memory, &ids).await;
    let got = hook_script(store, &ids).await;
    for (n, (want, have)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(have, want, "step {n} differs from the memory store");
    }
    assert_eq!(got.len(), expected.len());
}

// ---------------------------------------------------------------------------------------------
// Listing (inspection tools)

/// A script of admissions, ends, hooks and listings has the same transcript on `store` as on
/// the memory store, and what they agree on is right.
pub async fn listing_behaves_like_the_memory_store<S: Store>(store: &S) {
    let ids: Vec<RunId> = (0..6).map(|_| RunId::new()).collect();
    let memory = MemoryStore::new();
    let expected = listing_script(&memory, &ids).await;
    let got = listing_script(store, &ids).await;
    for (n, (want, have)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(have, want, "step {n} differs from the memory store");
    }
    assert_eq!(got.len(), expected.len());

    let listed = |f: RunFilter| async move { run_ids(&store.list_runs(&f).await.unwrap()) };
    // Newest first; equal admission times (0 and 1, 2 and 3, 4 and 5) by id, descending.
    let mut newest_first = ids.clone();
    newest_first.sort_by_key(|id| {
        let i = ids.iter().position(|x| x == id).unwrap();
        std::cmp::Reverse((i / 2, *id))
    });
    assert_eq!(listed(RunFilter::new()).await, newest_first);
    assert_eq!(listed(RunFilter::new().limit(2)).await, newest_first[..2]);
    assert_eq!(
        listed(RunFilter::new().status(RunStatus::Failed)).await,
        [ids[0]]
    );
    assert_eq!(
        listed(RunFilter::new().status(RunStatus::Cancelled)).await,
        [ids[1]]
    );
    // Runs 2 and 4 were leased; 3 and 5 are `hooked` runs never acquired.
    let mut running = listed(RunFilter::new().status(RunStatus::Running)).await;
    running.sort();
    let mut want = vec![ids[2], ids[4]];
    want.sort();
    assert_eq!(running, want);

    let hooks = store.list_hooks(&HookFilter::new()).await.unwrap();
    let tokens: Vec<&str> = hooks.iter().map(|h| h.token.as_str()).collect();
    // tok-1 went with the cancellation, `extra` with run 0's end.
    assert_eq!(tokens, ["tok-5", "tok-3"]);
    assert_eq!(hooks[0].run_id, ids[5]);
    assert_eq!(hooks[0].created_at, t(40));
}

/// A row that cannot be decoded is reported by a listing, not skipped.
pub async fn listing_reports_an_undecodable_row<S: Store + Damage>(store: &S) {
    create(store, "orders", t(0)).await;
    let bad = create(store, "orders", t(1)).await;
    store.corrupt_input(bad).await;
    let err = store.list_runs(&RunFilter::new()).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt(m) if m.contains(&bad.to_string())),
        "{err:?}"
    );
}

/// Admits a run of `workflow` at `at`, claiming `token` if given.
async fn admit<S: Store>(store: &S, workflow: &str, at: u64, token: Option<&str>) -> RunId {
    let id = RunId::new();
    let admission = store
        .create_run(NewRun {
            parent: None,
            id,
            workflow: workflow.into(),
            input: json!([]),
            created_at: t(at),
            hook: token.map(|token| StartHook {
                token: token.into(),
                retain_until: None,
            }),
            deadline: None,
            queue: None,
        })
        .await
        .unwrap();
    assert_eq!(admission, Admission::Admitted);
    id
}

/// `list_runs` returns the newest runs first and applies each filter.
pub async fn lists_runs_newest_first_with_filters<S: Store>(store: &S) {
    let a = admit(store, "orders", 1, None).await;
    let b = admit(store, "billing", 2, None).await;
    let c = admit(store, "orders", 3, None).await;
    store.cancel(&a, t(4)).await.unwrap();

    let listed = |f: RunFilter| async move { run_ids(&store.list_runs(&f).await.unwrap()) };
    assert_eq!(listed(RunFilter::new()).await, [c, b, a]);
    assert_eq!(listed(RunFilter::new().workflow("orders")).await, [c, a]);
    assert_eq!(
        listed(RunFilter::new().status(RunStatus::Cancelled)).await,
        [a]
    );
    assert_eq!(
        listed(
            RunFilter::new()
                .workflow("orders")
                .status(RunStatus::Pending)
        )
        .await,
        [c]
    );
    assert_eq!(listed(RunFilter::new().limit(2)).await, [c, b]);
    assert!(listed(RunFilter::new().workflow("nope")).await.is_empty());
}

/// `list_runs` pages through a time range: `created_after` is inclusive, `created_before`
/// exclusive, and `after(run)` continues the newest-first order after that run, also among
/// runs admitted at the same time; a cursor the store does not hold is `RunNotFound`.
pub async fn lists_runs_by_time_range_and_cursor<S: Store>(store: &S) {
    let a = admit(store, "orders", 1, None).await;
    let b = admit(store, "orders", 2, None).await;
    let c = admit(store, "orders", 2, None).await;
    let d = admit(store, "billing", 3, None).await;
    // b and c share an admission time: the id breaks the tie, the higher first.
    let (hi, lo) = if b > c { (b, c) } else { (c, b) };

    let listed = |f: RunFilter| async move { run_ids(&store.list_runs(&f).await.unwrap()) };
    assert_eq!(
        listed(RunFilter::new().created_after(t(2))).await,
        [d, hi, lo]
    );
    assert_eq!(listed(RunFilter::new().created_before(t(2))).await, [a]);
    assert_eq!(
        listed(RunFilter::new().created_after(t(2)).created_before(t(3))).await,
        [hi, lo]
    );
    // Pages of two, each after the last run of the one before.
    let first = listed(RunFilter::new().limit(2)).await;
    assert_eq!(first, [d, hi]);
    let second = listed(RunFilter::new().limit(2).after(&hi)).await;
    assert_eq!(second, [lo, a]);
    assert!(listed(RunFilter::new().limit(2).after(&a)).await.is_empty());
    // The cursor combines with the other filters.
    assert_eq!(
        listed(RunFilter::new().workflow("orders").after(&d)).await,
        [hi, lo, a]
    );
    let unknown = RunId::new();
    let err = store
        .list_runs(&RunFilter::new().after(&unknown))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::RunNotFound(id) if id == unknown),
        "{err:?}"
    );
}

/// `list_hooks` returns the active hooks, newest first, and applies each filter; a cancelled
/// run's hooks are not listed.
pub async fn lists_only_active_hooks<S: Store>(store: &S) {
    let a = admit(store, "hooked", 1, Some("order:1")).await;
    let b = admit(store, "hooked", 2, Some("order:2")).await;
    let c = admit(store, "hooked", 3, Some("order:3")).await;
    store.cancel(&b, t(4)).await.unwrap();

    let listed = |f: HookFilter| async move {
        store
            .list_hooks(&f)
            .await
            .unwrap()
            .into_iter()
            .map(|h| (h.token, h.run_id))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        listed(HookFilter::new()).await,
        [("order:3".to_owned(), c), ("order:1".to_owned(), a)]
    );
    let one = store
        .list_hooks(&HookFilter::new().token("order:1"))
        .await
        .unwrap();
    assert_eq!(one[0].created_at, t(1));
    assert_eq!(
        listed(HookFilter::new().token("order:1")).await,
        [("order:1".to_owned(), a)]
    );
    assert!(listed(HookFilter::new().token("order:2")).await.is_empty());
    assert_eq!(
        listed(HookFilter::new().run_id(c)).await,
        [("order:3".to_owned(), c)]
    );
    assert_eq!(
        listed(HookFilter::new().limit(1)).await,
        [("order:3".to_owned(), c)]
    );
}

/// `prune` deletes the runs that ended before the cutoff, with their events, payloads and
/// hooks, and counts exactly what it deleted; it keeps runs that have not ended, runs that
/// ended after the cutoff, and an ended run whose token retention is in force (the token
/// still refuses duplicates and names it) until that retention is over. Pruning again
/// deletes nothing more.
pub async fn prune_deletes_old_ended_runs_with_what_they_recorded<S: Store>(store: &S) {
    // Old and ended: a completed run that received a payload, a failed run, and a cancelled
    // run whose token is retained only until before the prune.
    let (completed, _) = start(store, "pa", None, t(0)).await;
    store
        .resume_hook("pa", json!("hi"), t(10))
        .await
        .unwrap()
        .unwrap();
    let failed = create(store, "orders", t(0)).await;
    let running = create(store, "orders", t(0)).await;
    let leased = acquire(
        store,
        &names(&["hooked", "orders"]),
        t(20),
        Duration::from_secs(600),
        10,
    )
    .await;
    let lease = |id: RunId| {
        leased
            .iter()
            .find(|r| r.run.id == id)
            .unwrap()
            .lease
            .clone()
    };
    let done = Some(RunOutcome::Completed(json!(1)));
    let write = ap(vec![step_done(t(100), 1)], done);
    store.append(&lease(completed), &write).await.unwrap();
    let boom = Some(RunOutcome::Failed(Error::fatal("boom")));
    let write = ap(vec![step_done(t(150), 1), step_done(t(200), 2)], boom);
    store.append(&lease(failed), &write).await.unwrap();
    let write = ap(vec![step_done(t(200), 1)], None);
    store.append(&lease(running), &write).await.unwrap();
    let (expired, _) = start(store, "c", Some(t(400)), t(0)).await;
    store.cancel(&expired, t(300)).await.unwrap();
    // Kept: ended before the cutoff but retaining its token past `now`; pending; ended
    // after the cutoff.
    let (retained, _) = start(store, "d", Some(t(5_000)), t(0)).await;
    store.cancel(&retained, t(300)).await.unwrap();
    let pending = create(store, "orders", t(0)).await;
    let recent = create(store, "orders", t(0)).await;
    store.cancel(&recent, t(900)).await.unwrap();

    let events = |id: RunId| async move { store.events(&id).await.unwrap() };
    let pruned = [completed, failed, expired];
    let kept = [retained, running, pending, recent];
    let mut doomed_events = 0;
    for id in pruned {
        doomed_events += events(id).await.len() as u64;
    }
    assert_eq!(doomed_events, 4, "one step, two steps, a cancellation");
    let mut before = Vec::new();
    for id in kept {
        let run = store.get_run(&id).await.unwrap().unwrap();
        before.push((run, events(id).await));
    }
    let inbox = store.payloads_since(0, 100).await.unwrap();
    assert_eq!(inbox.iter().filter(|(_, r)| *r == completed).count(), 1);

    let (cutoff, now) = (t(500), t(1_000));
    assert_eq!(
        store.prune(cutoff, now).await.unwrap(),
        PruneStats {
            runs: 3,
            events: doomed_events
        }
    );
    for id in pruned {
        assert_eq!(store.get_run(&id).await.unwrap(), None, "run {id}");
        assert!(events(id).await.is_empty(), "events of run {id}");
        assert!(store.payloads(&id, 0).await.unwrap().is_empty());
    }
    let inbox = store.payloads_since(0, 100).await.unwrap();
    assert!(inbox.iter().all(|(_, r)| *r != completed), "{inbox:?}");
    for (id, (run, history)) in kept.iter().zip(&before) {
        assert_eq!(store.get_run(id).await.unwrap().as_ref(), Some(run));
        assert_eq!(&events(*id).await, history, "events of run {id}");
    }
    // The retained token still refuses a duplicate and names its run; the expired one is free.
    assert_eq!(
        start(store, "d", None, t(1_001)).await.1,
        Admission::Conflict(retained)
    );
    assert_eq!(
        start(store, "c", None, t(1_001)).await.1,
        Admission::Admitted
    );

    assert_eq!(
        store.prune(cutoff, now).await.unwrap(),
        PruneStats::default()
    );
    // Once the retention is over, the run goes too.
    let retained_events = before[0].1.len() as u64;
    assert_eq!(
        store.prune(cutoff, t(5_000)).await.unwrap(),
        PruneStats {
            runs: 1,
            events: retained_events
        }
    );
    assert_eq!(store.get_run(&retained).await.unwrap(), None);
    assert_eq!(
        start(store, "d", None, t(5_001)).await.1,
        Admission::Admitted
    );
    for id in [running, pending, recent] {
        assert!(store.get_run(&id).await.unwrap().is_some(), "run {id}");
    }
}

/// A pruned run leaves no row behind: not its events, its payloads, nor the row of its
/// retained token, once that retention is over (until then, nothing of it goes).
pub async fn prune_leaves_no_rows_of_a_pruned_run<S: Store + Inspect>(store: &S) {
    let (run, _) = start(store, "x", Some(t(100)), t(0)).await;
    store
        .resume_hook("x", json!(1), t(5))
        .await
        .unwrap()
        .unwrap();
    store.cancel(&run, t(10)).await.unwrap();
    let tables = ["runs", "events", "hooks", "hook_inbox"];
    for table in tables {
        assert_eq!(store.count(table).await, 1, "{table}");
    }
    assert_eq!(
        store.prune(t(50), t(99)).await.unwrap(),
        PruneStats::default()
    );
    for table in tables {
        assert_eq!(store.count(table).await, 1, "{table} while retained");
    }
    assert_eq!(
        store.prune(t(50), t(100)).await.unwrap(),
        PruneStats { runs: 1, events: 1 }
    );
    for table in tables {
        assert_eq!(store.count(table).await, 0, "{table}");
    }
}

// ---------------------------------------------------------------------------------------------
// Streams (SPEC 12)

/// The values of `page`'s chunks, with their index and attempt.
fn chunk_values(page: &StreamPage) -> Vec<(u64, u32, serde_json::Value)> {
    page.chunks
        .iter()
        .map(|c| (c.index, c.attempt, c.value.clone()))
        .collect()
}

/// Leases runs `ids` (of `orders`) at `now`, in that order.
async fn lease_each<S: Store>(store: &S, ids: &[RunId], now: SystemTime) -> Vec<Lease> {
    let got = acquire(
        store,
        &names(&["orders"]),
        now,
        Duration::from_secs(600),
        100,
    )
    .await;
    ids.iter()
        .map(|id| {
            got.iter()
                .find(|r| r.run.id == *id)
                .unwrap_or_else(|| panic!("run {id} was not acquirable"))
                .lease
                .clone()
        })
        .collect()
}

/// Chunks get their index from the store, from 0 per run and stream, in write order, each
/// with its attempt and time; only the lease's holder writes, and not after the run's end.
pub async fn stream_chunks_are_numbered_per_stream_and_fenced<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let other = create(store, "orders", t(0)).await;
    let [lease, other_lease] =
        <[Lease; 2]>::try_from(lease_each(store, &[id, other], t(1)).await).unwrap();
    let put = |lease: Lease, name: &'static str, attempt: u32, v: serde_json::Value| async move {
        store
            .append_chunk(&lease, name, attempt, v, t(10))
            .await
            .unwrap()
    };
    assert_eq!(put(lease.clone(), "tokens", 1, json!("a")).await, Some(0));
    assert_eq!(put(lease.clone(), "tokens", 1, json!("b")).await, Some(1));
    assert_eq!(put(lease.clone(), "progress", 1, json!(50)).await, Some(0));
    assert_eq!(
        put(lease.clone(), "tokens", 2, json!({"c": [1]})).await,
        Some(2)
    );
    assert_eq!(
        put(other_lease.clone(), "tokens", 1, json!("z")).await,
        Some(0)
    );

    let page = store.read_stream(&id, "tokens", 0, 100).await.unwrap();
    assert_eq!(
        chunk_values(&page),
        [
            (0, 1, json!("a")),
            (1, 1, json!("b")),
            (2, 2, json!({"c": [1]}))
        ]
    );
    assert!(page.chunks.iter().all(|c| c.at == t(10)));
    assert_eq!(
        (page.run, page.closed, page.len),
        (Some(RunStatus::Running), false, 3)
    );
    let page = store.read_stream(&other, "tokens", 0, 100).await.unwrap();
    assert_eq!(chunk_values(&page), [(0, 1, json!("z"))]);
    // An unknown stream reads as empty and open; an unknown run has no status.
    let page = store.read_stream(&id, "nothing", 0, 100).await.unwrap();
    assert_eq!(
        (page.run, page.closed, page.len, page.chunks.len()),
        (Some(RunStatus::Running), false, 0, 0)
    );
    let page = store
        .read_stream(&RunId::new(), "tokens", 0, 100)
        .await
        .unwrap();
    assert_eq!(page, StreamPage::default());

    // A stale epoch writes nothing.
    let stale = Lease {
        run_id: id,
        epoch: lease.epoch + 1,
    };
    let refused = store
        .append_chunk(&stale, "tokens", 1, json!("x"), t(11))
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(r)) if r == id),
        "{refused:?}"
    );
    let refused = store.close_stream(&stale, "tokens", t(11)).await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(_))),
        "{refused:?}"
    );
    // Nor does anyone after the run's end.
    let done = Some(RunOutcome::Completed(json!(1)));
    store.append(&lease, &ap(vec![], done)).await.unwrap();
    let refused = store
        .append_chunk(&lease, "tokens", 1, json!("x"), t(12))
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(_))),
        "{refused:?}"
    );
    store.cancel(&other, t(12)).await.unwrap();
    let refused = store
        .append_chunk(&other_lease, "tokens", 1, json!("x"), t(12))
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost(_))),
        "{refused:?}"
    );
    let page = store.read_stream(&id, "tokens", 0, 100).await.unwrap();
    assert_eq!((page.run, page.len), (Some(RunStatus::Completed), 3));
    assert_eq!(page.chunks.len(), 3);
}

/// A closed stream refuses later chunks (writing nothing); closing is idempotent and works
/// on a stream never written; the run's streams are listed by name.
pub async fn a_closed_stream_takes_no_more_chunks<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let lease = lease_one(store, id, t(1)).await;
    for v in 0..3 {
        store
            .append_chunk(&lease, "out", 1, json!(v), t(2))
            .await
            .unwrap();
    }
    store
        .append_chunk(&lease, "log", 1, json!("x"), t(2))
        .await
        .unwrap();
    store.close_stream(&lease, "out", t(3)).await.unwrap();
    store.close_stream(&lease, "out", t(3)).await.unwrap();
    assert_eq!(
        store
            .append_chunk(&lease, "out", 1, json!(9), t(4))
            .await
            .unwrap(),
        None
    );
    store.close_stream(&lease, "empty", t(5)).await.unwrap();
    let page = store.read_stream(&id, "out", 0, 100).await.unwrap();
    assert_eq!((page.closed, page.len, page.chunks.len()), (true, 3, 3));
    let page = store.read_stream(&id, "empty", 0, 100).await.unwrap();
    assert_eq!((page.closed, page.len, page.chunks.len()), (true, 0, 0));
    // Other streams stay open.
    assert_eq!(
        store
            .append_chunk(&lease, "log", 1, json!("y"), t(6))
            .await
            .unwrap(),
        Some(1)
    );
    let info = |name: &str, len: u64, closed: bool| StreamInfo {
        name: name.to_owned(),
        len,
        closed,
    };
    assert_eq!(
        store.list_streams(&id).await.unwrap(),
        [
            info("empty", 0, true),
            info("log", 2, false),
            info("out", 3, true)
        ]
    );
    assert!(store.list_streams(&RunId::new()).await.unwrap().is_empty());
}

/// Reads start at any index and return at most the limit, in index order.
pub async fn a_stream_reads_in_pages_from_any_index<S: Store>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let lease = lease_one(store, id, t(1)).await;
    for v in 0..10u64 {
        let index = store
            .append_chunk(&lease, "n", 1, json!(v * 10), t(2 + v))
            .await
            .unwrap();
        assert_eq!(index, Some(v));
    }
    let page = store.read_stream(&id, "n", 4, 3).await.unwrap();
    assert_eq!(
        chunk_values(&page),
        [(4, 1, json!(40)), (5, 1, json!(50)), (6, 1, json!(60))]
    );
    assert_eq!(page.chunks[0].at, t(6));
    assert_eq!(page.len, 10);
    let page = store.read_stream(&id, "n", 9, 3).await.unwrap();
    assert_eq!(chunk_values(&page), [(9, 1, json!(90))]);
    let page = store.read_stream(&id, "n", 10, 3).await.unwrap();
    assert!(page.chunks.is_empty());
    let page = store.read_stream(&id, "n", u64::MAX, 3).await.unwrap();
    assert!(page.chunks.is_empty());
    let page = store.read_stream(&id, "n", 0, 0).await.unwrap();
    assert_eq!((page.len, page.chunks.len()), (10, 0));
}

/// Writers racing on one stream through three handles get every index exactly once, and
/// the stream holds each value at the index its write returned.
pub async fn concurrent_chunk_writers_get_every_index_once<S: Store + Clone>(stores: &[S]) {
    let id = create(&stores[0], "orders", t(0)).await;
    let lease = lease_one(&stores[0], id, t(1)).await;
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(w, store)| {
            let (store, lease) = (store.clone(), lease.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..20 {
                    let v = json!(format!("{w}-{i}"));
                    let index = store
                        .append_chunk(&lease, "race", 1, v.clone(), t(2))
                        .await
                        .unwrap()
                        .unwrap();
                    got.push((index, v));
                }
                got
            })
        })
        .collect();
    let mut written = Vec::new();
    for task in tasks {
        written.extend(task.await.unwrap());
    }
    written.sort_by_key(|(i, _)| *i);
    let indexes: Vec<u64> = written.iter().map(|(i, _)| *i).collect();
    assert_eq!(indexes, (0..60).collect::<Vec<u64>>());
    let page = stores[1].read_stream(&id, "race", 0, 100).await.unwrap();
    let stored: Vec<(u64, serde_json::Value)> = page
        .chunks
        .into_iter()
        .map(|c| (c.index, c.value))
        .collect();
    assert_eq!(stored, written);
}

/// Pruning a run deletes its streams and their chunks.
pub async fn prune_takes_a_run_s_streams_with_it<S: Store + Inspect>(store: &S) {
    let id = create(store, "orders", t(0)).await;
    let kept = create(store, "orders", t(0)).await;
    for lease in lease_each(store, &[id, kept], t(1)).await {
        store
            .append_chunk(&lease, "a", 1, json!(1), t(2))
            .await
            .unwrap();
        store
            .append_chunk(&lease, "a", 1, json!(2), t(2))
            .await
            .unwrap();
        store.close_stream(&lease, "b", t(2)).await.unwrap();
    }
    store.cancel(&id, t(10)).await.unwrap();
    assert_eq!(store.count("streams").await, 4);
    assert_eq!(store.count("stream_chunks").await, 4);
    assert_eq!(store.prune(t(50), t(100)).await.unwrap().runs, 1);
    assert_eq!(store.count("streams").await, 2);
    assert_eq!(store.count("stream_chunks").await, 2);
    assert!(store.list_streams(&id).await.unwrap().is_empty());
    let page = store.read_stream(&kept, "a", 0, 10).await.unwrap();
    assert_eq!(page.chunks.len(), 2);
}

// ---------------------------------------------------------------------------------------------
// Queues (SPEC 11)

/// Admits a run of `orders` at `at` in `queue` with partition key `key` and `priority`.
pub(crate) async fn create_queued<S: Store>(
    store: &S,
    queue: &str,
    key: Option<&str>,
    priority: i32,
    at: SystemTime,
) -> RunId {
    let id = RunId::new();
    let admission = store
        .create_run_leased(
            NewRun {
                parent: None,
                id,
                workflow: "orders".to_owned(),
                input: json!([]),
                created_at: at,
                hook: None,
                deadline: None,
                queue: Some(QueueEntry {
                    name: queue.to_owned(),
                    partition_key: key.map(str::to_owned),
                    priority,
                }),
            },
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    // A queued run waits for its slot: never leased at admission.
    assert_eq!(
        admission,
        (Admission::Admitted, None),
        "a queued run was leased at admission"
    );
    id
}

/// Declares queue `name` with the given limits.
pub(crate) async fn declare<S: Store>(
    store: &S,
    name: &str,
    concurrency: Option<u32>,
    rate_limit: Option<(u32, Duration)>,
) {
    store
        .define_queues(&[QueueDef {
            name: name.to_owned(),
            concurrency,
            rate_limit,
        }])
        .await
        .unwrap();
}

/// The runs `acquire` leases of `orders` at `now` (limit 100), in the order handed out.
async fn acquire_orders<S: Store>(store: &S, now: SystemTime) -> Vec<LeasedRun> {
    acquire(
        store,
        &names(&["orders"]),
        now,
        Duration::from_secs(600),
        100,
    )
    .await
}

fn ids_of(runs: &[LeasedRun]) -> Vec<RunId> {
    runs.iter().map(|r| r.run.id).collect()
}

/// Ends the leased run as completed at `at`.
async fn complete<S: Store>(store: &S, lease: &Lease, at: SystemTime) {
    let end = ap(
        vec![NewEvent {
            at,
            event: Event::RunCompleted {
                output: json!(null),
            },
        }],
        Some(RunOutcome::Completed(json!(null))),
    );
    store.append(lease, &end).await.unwrap();
}

/// At most `concurrency` runs begun and not ended: a sleeping run keeps its slot, an expired
/// lease is taken back with its slot, and an end frees one for the next run in start order.
pub async fn a_queue_s_concurrency_counts_runs_begun_and_not_ended<S: Store>(store: &S) {
    declare(store, "q", Some(2), None).await;
    let mut runs = Vec::new();
    for i in 0..4 {
        runs.push(create_queued(store, "q", None, 0, t(i)).await);
    }
    let first = acquire_orders(store, t(10)).await;
    assert_eq!(ids_of(&first), runs[..2], "the two first started begin");
    for r in &first {
        let q = r
            .run
            .queue
            .as_ref()
            .expect("a leased queued run names its queue");
        assert_eq!(q.name, "q");
    }
    assert!(
        acquire_orders(store, t(20)).await.is_empty(),
        "the queue is full"
    );

    // Run 0 sleeps until t(100): it holds its slot meanwhile.
    store.release(&first[0].lease, t(100), 0).await.unwrap();
    assert!(
        acquire_orders(store, t(30)).await.is_empty(),
        "a sleeping run holds its slot"
    );
    let woken = acquire_orders(store, t(100)).await;
    assert_eq!(
        ids_of(&woken),
        [runs[0]],
        "the sleeper wakes, the waiting runs still wait"
    );

    // Run 1's worker died: after its lease expired, it is taken back, still within the limit.
    let later = t(1000) + Duration::from_secs(600);
    let taken_back = acquire_orders(store, later).await;
    assert_eq!(taken_back.len(), 2, "both expired leases are taken back");
    assert!(ids_of(&taken_back).iter().all(|id| runs[..2].contains(id)));

    let lease_of = |id: RunId| {
        taken_back
            .iter()
            .find(|r| r.run.id == id)
            .unwrap()
            .lease
            .clone()
    };
    complete(store, &lease_of(runs[1]), later).await;
    assert_eq!(
        ids_of(&acquire_orders(store, later).await),
        [runs[2]],
        "one slot freed"
    );
    assert!(acquire_orders(store, later).await.is_empty());
    // A cancelled run frees its slot too.
    store.cancel(&runs[0], later).await.unwrap();
    assert_eq!(ids_of(&acquire_orders(store, later).await), [runs[3]]);
}

/// At most `n` runs begin in any window of `period`, however soon the earlier ones ended.
pub async fn a_queue_s_rate_window_counts_begins<S: Store>(store: &S) {
    declare(store, "r", None, Some((2, Duration::from_millis(1000)))).await;
    let mut runs = Vec::new();
    for i in 0..5 {
        runs.push(create_queued(store, "r", None, 0, t(i)).await);
    }
    assert_eq!(
        store.queue_opening(t(0)).await.unwrap(),
        None,
        "none began yet"
    );
    let first = acquire_orders(store, t(10)).await;
    assert_eq!(ids_of(&first), runs[..2]);
    for r in &first {
        complete(store, &r.lease, t(20)).await;
    }
    assert!(
        acquire_orders(store, t(500)).await.is_empty(),
        "two began within the last second, though both ended"
    );
    assert!(acquire_orders(store, t(1009)).await.is_empty());
    assert_eq!(
        store.queue_opening(t(500)).await.unwrap(),
        Some(t(1010)),
        "the window reopens when its oldest begin leaves it"
    );
    let second = acquire_orders(store, t(1010)).await;
    assert_eq!(
        ids_of(&second),
        runs[2..4],
        "the window moved past the first begins"
    );
    assert_eq!(store.queue_opening(t(1010)).await.unwrap(), Some(t(2010)));
    let info = store.list_queues(t(1010)).await.unwrap();
    let r = info
        .iter()
        .find(|q| q.def.name == "r")
        .expect("queue r is listed");
    assert_eq!(
        (r.occupied, r.waiting, r.begun_in_window),
        (2, 1, 2),
        "{r:?}"
    );
    assert_eq!(r.def.rate_limit, Some((2, Duration::from_millis(1000))));
}

/// Runs of one partition key begin one at a time, in start order; other keys and runs
/// without a key are not held up.
pub async fn a_partition_key_runs_one_at_a_time_in_start_order<S: Store>(store: &S) {
    declare(store, "k", Some(10), None).await;
    // The later run of key `a` has the higher priority: start order still wins within a key.
    let a1 = create_queued(store, "k", Some("a"), 0, t(0)).await;
    let a2 = create_queued(store, "k", Some("a"), 9, t(1)).await;
    let b1 = create_queued(store, "k", Some("b"), 0, t(2)).await;
    let free = create_queued(store, "k", None, 0, t(3)).await;
    let first = acquire_orders(store, t(10)).await;
    let mut got = ids_of(&first);
    got.sort();
    let mut want = vec![a1, b1, free];
    want.sort();
    assert_eq!(got, want, "one run per key, and the run without a key");
    assert!(
        acquire_orders(store, t(20)).await.is_empty(),
        "a2 waits for a1"
    );
    let a1_lease = first.iter().find(|r| r.run.id == a1).unwrap().lease.clone();
    // A sleeping a1 still holds its key.
    store.release(&a1_lease, t(100), 0).await.unwrap();
    assert!(
        acquire_orders(store, t(30)).await.is_empty(),
        "a2 waits for a sleeping a1"
    );
    let a1_again = acquire_orders(store, t(100)).await;
    assert_eq!(ids_of(&a1_again), [a1]);
    complete(store, &a1_again[0].lease, t(110)).await;
    assert_eq!(ids_of(&acquire_orders(store, t(120)).await), [a2]);
}

/// Among waiting runs of a queue, higher priority begins first; equal priority in start
/// order.
pub async fn a_queue_begins_higher_priority_first_then_start_order<S: Store>(store: &S) {
    declare(store, "p", Some(1), None).await;
    let low = create_queued(store, "p", None, 0, t(0)).await;
    let high = create_queued(store, "p", None, 5, t(1)).await;
    let high_later = create_queued(store, "p", None, 5, t(2)).await;
    let negative = create_queued(store, "p", None, -3, t(3)).await;
    let mut order = Vec::new();
    for i in 0..4 {
        let got = acquire_orders(store, t(10 + i * 10)).await;
        assert_eq!(got.len(), 1, "one at a time");
        order.push(got[0].run.id);
        complete(store, &got[0].lease, t(15 + i * 10)).await;
    }
    assert_eq!(order, [high, high_later, low, negative]);
}

/// A queue nobody declared begins none of its runs; other runs are not held up, and listing
/// shows only declared queues.
pub async fn an_undeclared_queue_begins_nothing<S: Store>(store: &S) {
    let queued = create_queued(store, "nobody", None, 0, t(0)).await;
    let plain = create(store, "orders", t(1)).await;
    assert_eq!(ids_of(&acquire_orders(store, t(10)).await), [plain]);
    assert!(store.list_queues(t(10)).await.unwrap().is_empty());
    declare(store, "nobody", Some(1), None).await;
    assert_eq!(ids_of(&acquire_orders(store, t(20)).await), [queued]);
    let listed = store
        .list_runs(&RunFilter::new().queue("nobody"))
        .await
        .unwrap();
    assert_eq!(listed.iter().map(|r| r.id).collect::<Vec<_>>(), [queued]);
    assert_eq!(listed[0].queue, Some(QueueEntry::new("nobody")));
}

/// Three handles acquiring at once never begin more runs of a queue than its concurrency.
pub async fn concurrent_acquirers_never_exceed_a_queue_s_concurrency<S: Store + Clone>(
    stores: &[S],
) {
    declare(&stores[0], "c", Some(3), None).await;
    for i in 0..30 {
        create_queued(&stores[0], "c", None, 0, t(i)).await;
    }
    let mut tasks = Vec::new();
    for store in stores {
        for _ in 0..3 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let got = acquire(
                    &store,
                    &names(&["orders"]),
                    t(100),
                    Duration::from_secs(600),
                    2,
                )
                .await;
                got.len()
            }));
        }
    }
    let mut leased = 0;
    for task in tasks {
        leased += task.await.unwrap();
    }
    assert_eq!(leased, 3, "exactly the queue's concurrency began");
    let info = stores[0].list_queues(t(100)).await.unwrap();
    assert_eq!((info[0].occupied, info[0].waiting), (3, 27));
}

/// A run waiting for a slot whose deadline passed is handed out anyway (its driver fails it at
/// once), without taking a slot: the queue's waiting runs still begin within its limit.
pub async fn a_waiting_run_past_its_deadline_is_handed_out_without_a_slot<S: Store>(store: &S) {
    declare(store, "d", Some(1), None).await;
    let holder = create_queued(store, "d", None, 0, t(0)).await;
    assert_eq!(ids_of(&acquire_orders(store, t(1)).await), [holder]);
    let late = RunId::new();
    store
        .create_run(NewRun {
            parent: None,
            id: late,
            workflow: "orders".to_owned(),
            input: json!([]),
            created_at: t(2),
            hook: None,
            deadline: Some(t(50)),
            queue: Some(QueueEntry::new("d")),
        })
        .await
        .unwrap();
    let next = create_queued(store, "d", None, 0, t(3)).await;
    assert!(
        acquire_orders(store, t(10)).await.is_empty(),
        "both wait for the slot"
    );
    let got = acquire_orders(store, t(50)).await;
    assert_eq!(ids_of(&got), [late], "past its deadline, it is handed out");
    assert_eq!(got[0].run.deadline, Some(t(50)));
    let info = store.list_queues(t(50)).await.unwrap();
    assert_eq!(info[0].occupied, 1, "without taking a slot: {info:?}");
    let failed = ap(
        vec![NewEvent {
            at: t(51),
            event: Event::RunFailed {
                error: Error::fatal("timed out"),
            },
        }],
        Some(RunOutcome::Failed(Error::fatal("timed out"))),
    );
    store.append(&got[0].lease, &failed).await.unwrap();
    assert!(
        acquire_orders(store, t(60)).await.is_empty(),
        "the holder still holds"
    );
    let holder_again = acquire_orders(store, t(1) + Duration::from_secs(601)).await;
    assert_eq!(ids_of(&holder_again), [holder]);
    complete(
        store,
        &holder_again[0].lease,
        t(1) + Duration::from_secs(601),
    )
    .await;
    assert_eq!(
        ids_of(&acquire_orders(store, t(1) + Duration::from_secs(601)).await),
        [next]
    );
}

#[cfg(test)]
mod tests {
    use super::check;

    #[tokio::test]
    #[should_panic(expected = "store conformance case `some_case` failed: the row is missing")]
    async fn a_failing_case_is_reported_with_its_name_and_what_failed() {
        check("some_case", async { panic!("the row is missing") }).await;
    }

    #[tokio::test]
    async fn a_passing_case_passes() {
        check("some_case", async {}).await;
    }
}
