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
//!
//! [`MemoryStore`]: crate::store::memory::MemoryStore

// One file of cases per capability of the store, as the store's traits are split: a new
// capability brings one file here and its cases in the macro's lists below. Cases that race
// handles on one database and those about undecodable rows have a file of their own.
mod admin;
mod chains;
mod children;
mod concurrency;
mod damage;
mod hooks;
mod messages;
#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
mod migrations;
mod queues;
mod rekey;
mod requests;
mod runs;
mod schedules;
mod starts;
mod streams;
mod support;
mod telemetry;
mod transactional;

pub use admin::{
    listing_behaves_like_the_memory_store, lists_only_active_hooks,
    lists_runs_by_time_range_and_cursor, lists_runs_newest_first_with_filters,
    prune_deletes_old_ended_runs_with_what_they_recorded, prune_leaves_no_rows_of_a_pruned_run,
    run_counts_group_runs_by_workflow_and_status,
};
pub use chains::{
    a_continuation_carries_what_the_run_received_and_did_not_take,
    a_continued_child_s_end_reaches_the_parent_under_its_first_id,
    a_continued_run_keeps_its_queue_slot, a_continued_run_keeps_its_trace_context,
    a_continued_run_stays_its_schedule_tick_s_run,
    a_run_continued_under_a_lease_is_leased_to_the_same_worker,
    continue_as_new_ends_the_run_and_admits_the_next_with_what_it_inherits,
    continue_as_new_under_a_lost_lease_or_on_an_ended_run_writes_nothing,
};
pub use children::{
    a_child_is_started_with_its_record_and_its_end_reaches_the_parent,
    an_end_writes_the_same_whatever_its_hint,
    cancelling_a_parent_cancels_its_attached_children_down_the_tree,
};
pub use concurrency::{
    concurrent_acquirers_never_exceed_a_queue_s_concurrency,
    concurrent_acquirers_never_share_a_run,
    concurrent_admit_or_resume_calls_admit_one_and_queue_the_rest,
    concurrent_chunk_writers_get_every_index_once,
    concurrent_leased_admissions_never_exceed_a_queue_s_concurrency,
    concurrent_starts_with_one_token_admit_exactly_one,
    concurrent_writes_of_many_runs_each_answer_for_themselves,
    payload_ids_follow_commit_order_under_concurrent_resumes,
    payloads_reach_the_owner_in_commit_order,
};
pub use damage::{
    an_undecodable_child_end_is_reported_as_corrupt, listing_reports_an_undecodable_row,
    undecodable_rows_are_reported_as_corrupt,
};
pub use hooks::{
    a_resume_before_the_hook_exists_delivers_nothing, a_start_whose_token_is_taken_writes_nothing,
    admit_or_resume_admits_resumes_or_conflicts, claims_releases_and_retention,
    delivered_payloads_leave_the_inbox, hooks_behave_like_the_memory_store,
    release_wakes_a_run_with_unseen_payloads, run_end_and_cancel_release_tokens,
};
pub use messages::{
    a_message_to_an_unknown_or_ended_run_writes_nothing,
    an_idempotency_key_stores_one_message_per_run, concurrent_sends_with_one_key_store_one,
    messages_are_queued_in_order_and_wake_the_run, published_values_keep_the_latest_per_key,
};
pub use queues::{
    a_partition_key_runs_one_at_a_time_in_start_order,
    a_queue_begins_higher_priority_first_then_start_order,
    a_queue_s_concurrency_counts_runs_begun_and_not_ended, a_queue_s_rate_window_counts_begins,
    a_queue_s_slots_follow_every_begin_and_end,
    a_queued_run_begins_at_admission_only_with_room_and_nobody_waiting,
    a_queued_run_s_updated_at_follows_its_changes_of_state,
    a_waiting_run_past_its_deadline_is_handed_out_without_a_slot,
    an_undeclared_queue_begins_nothing, whether_a_run_waits_for_a_slot_is_known,
};
pub use rekey::sealed_rows_are_paged_and_replaced_only_while_unchanged;
pub use requests::{
    a_request_is_refused_or_deduplicated_without_writing,
    concurrent_requests_with_one_key_store_one, requests_are_queued_and_keep_their_first_reply,
};
pub use runs::{
    a_blocked_run_waits_with_its_divergence_until_woken_or_retried,
    a_deadline_is_kept_with_the_run, a_release_starts_the_count_of_failed_tries_again,
    a_run_admitted_with_its_first_events_holds_them_under_its_lease,
    a_run_created_with_a_history_replays_it,
    a_run_leased_at_admission_is_fenced_like_an_acquired_one,
    a_stale_epoch_cannot_write_after_a_takeover,
    acquire_respects_workflows_wake_time_leases_and_order,
    cancel_of_a_completed_run_reports_its_status, cancel_running_ended_and_unknown_runs,
    create_acquire_append_complete_round_trip, ended_among_names_the_runs_that_are_not_live,
    expired_leases_are_taken_back_in_wake_time_order,
    failed_tries_give_the_run_back_and_the_last_fails_it, failure_outcome_records_the_error,
    heartbeat_extends_live_leases_and_reports_lost_ones, release_with_a_future_wake_time,
    retry_reopens_a_failed_run_and_refuses_other_statuses,
};
pub use schedules::{
    a_backfill_replaces_a_run_less_record_once, a_batch_of_ticks_is_answered_in_order,
    a_schedule_keeps_its_latest_1000_ticks,
    a_ticks_run_leased_at_its_admission_holds_its_first_events,
    concurrent_batches_of_the_same_ticks_admit_exactly_one_run_each,
    concurrent_firings_of_one_tick_admit_exactly_one_run,
    delete_removes_the_schedule_and_its_ticks, pause_and_resume,
    the_next_nominal_time_is_kept_and_a_redefinition_keeps_the_state,
    ticks_handed_over_early_are_written_only_when_ready,
};
pub use starts::{a_delayed_run_waits_for_its_start, lists_runs_by_version};
pub use streams::{
    a_closed_stream_takes_no_more_chunks, a_stream_reads_in_pages_from_any_index,
    prune_takes_a_run_s_streams_with_it, stream_chunks_are_numbered_per_stream_and_fenced,
};
pub use telemetry::{
    a_run_keeps_its_trace_context, an_acquire_says_whether_it_took_over_an_expired_lease,
};
pub use transactional::{
    a_step_transaction_commits_its_append_or_nothing,
    a_step_transaction_under_a_lost_lease_commits_nothing,
};

// The helpers the SQL stores' tests use, at the paths they always had; a build with one SQL
// store uses only some of them.
#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
#[allow(unused_imports)]
pub(crate) use {
    concurrency::storm,
    migrations::previous_release_is_kept,
    schedules::{def as schedule_def, tick},
    support::{
        acquire, ap, create, event_seqs, lease_one, names, new_run, owner, start, step_done, t,
    },
};

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use crate::ids::RunId;
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

pub use crate::store::Inspect;

/// Damage to a store's rows that its decoding must report, not skip or paper over. Only a
/// store keeping encoded rows (such as the SQL stores) can hold an undecodable one.
// As for [`Inspect`]: awaited in place only.
#[allow(async_fn_in_trait)]
pub trait Damage {
    /// Overwrites the run's input with text that is not JSON.
    async fn corrupt_input(&self, run: RunId);

    /// Adds event 1 to the run with kind `x` and empty data.
    async fn add_undecodable_event(&self, run: RunId);

    /// Overwrites the stored payload of every entry in the run's inbox with `json` (JSON text).
    async fn rewrite_inbox(&self, run: RunId, json: &str);
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
            a_run_admitted_with_its_first_events_holds_them_under_its_lease,
            a_run_leased_at_admission_is_fenced_like_an_acquired_one,
            failure_outcome_records_the_error,
            a_stale_epoch_cannot_write_after_a_takeover,
            an_acquire_says_whether_it_took_over_an_expired_lease,
            a_run_keeps_its_trace_context,
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
            a_delayed_run_waits_for_its_start,
            lists_runs_by_version,
            stream_chunks_are_numbered_per_stream_and_fenced,
            a_closed_stream_takes_no_more_chunks,
            a_stream_reads_in_pages_from_any_index,
            a_child_is_started_with_its_record_and_its_end_reaches_the_parent,
            an_end_writes_the_same_whatever_its_hint,
            cancelling_a_parent_cancels_its_attached_children_down_the_tree,
            a_queue_s_concurrency_counts_runs_begun_and_not_ended,
            a_queue_s_rate_window_counts_begins,
            a_partition_key_runs_one_at_a_time_in_start_order,
            a_queue_begins_higher_priority_first_then_start_order,
            an_undeclared_queue_begins_nothing,
            a_waiting_run_past_its_deadline_is_handed_out_without_a_slot,
            a_queued_run_s_updated_at_follows_its_changes_of_state,
            a_queued_run_begins_at_admission_only_with_room_and_nobody_waiting,
            a_queue_s_slots_follow_every_begin_and_end,
            whether_a_run_waits_for_a_slot_is_known,
            run_counts_group_runs_by_workflow_and_status,
            a_schedule_keeps_its_latest_1000_ticks,
            a_batch_of_ticks_is_answered_in_order,
            a_ticks_run_leased_at_its_admission_holds_its_first_events,
            ticks_handed_over_early_are_written_only_when_ready,
            the_next_nominal_time_is_kept_and_a_redefinition_keeps_the_state,
            pause_and_resume,
            a_backfill_replaces_a_run_less_record_once,
            delete_removes_the_schedule_and_its_ticks,
            messages_are_queued_in_order_and_wake_the_run,
            a_message_to_an_unknown_or_ended_run_writes_nothing,
            an_idempotency_key_stores_one_message_per_run,
            published_values_keep_the_latest_per_key,
            sealed_rows_are_paged_and_replaced_only_while_unchanged,
            requests_are_queued_and_keep_their_first_reply,
            a_request_is_refused_or_deduplicated_without_writing,
            a_step_transaction_commits_its_append_or_nothing,
            a_step_transaction_under_a_lost_lease_commits_nothing,
            continue_as_new_ends_the_run_and_admits_the_next_with_what_it_inherits,
            continue_as_new_under_a_lost_lease_or_on_an_ended_run_writes_nothing,
            a_continued_run_keeps_its_queue_slot,
            a_continued_child_s_end_reaches_the_parent_under_its_first_id,
            a_continued_run_stays_its_schedule_tick_s_run,
            a_continued_run_keeps_its_trace_context,
            a_run_continued_under_a_lease_is_leased_to_the_same_worker,
            a_continuation_carries_what_the_run_received_and_did_not_take,
        ] shared [
            concurrent_firings_of_one_tick_admit_exactly_one_run,
            concurrent_batches_of_the_same_ticks_admit_exactly_one_run_each,
            concurrent_sends_with_one_key_store_one,
            concurrent_requests_with_one_key_store_one,
            concurrent_chunk_writers_get_every_index_once,
            concurrent_acquirers_never_exceed_a_queue_s_concurrency,
            concurrent_leased_admissions_never_exceed_a_queue_s_concurrency,
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
            an_undecodable_child_end_is_reported_as_corrupt,
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
