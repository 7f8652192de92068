//! What the SQL stores ([`super::sqlite`], [`super::postgres`]) share, written once in plain
//! Rust: how values become columns and back ([`values`]), the rows both dialects read and
//! their decoding, including what `acquire` does with the rows it leased ([`rows`]), the
//! bookkeeping of schema migrations ([`migrations`]), and the write policies — admission,
//! token claims, fenced appends, cancellation, pruning — over the statements each dialect supplies
//! ([`policy`]), and group commit, one transaction per group of requests with answers after
//! the commit ([`batch`]).
//!
//! Each dialect keeps its SQL in one `Statements` table and its connection handling; the
//! tables and the `workflow_migrations` layout are the same in both. Both number a run's
//! events after its last one, read in the fenced append: PostgreSQL from the count its run's
//! row keeps (`runs.last_seq`, advanced by the append, which row-locks the run), SQLite from
//! the last event itself (its one writer holds the file's write lock).

pub(super) mod batch;
pub(super) mod messages;
pub(super) mod migrations;
pub(super) mod policy;
pub(super) mod rekey;
pub(super) mod rows;
pub(super) mod schedules;
mod values;

pub(super) use values::*;

/// The `hook_inbox.token` of a child's end: its row holds the [`ChildNotice`] as its
/// payload, and reads back as [`Inbound::ChildEnded`]. Hook tokens with control characters
/// are refused, so no hook can own or send to it.
///
/// [`ChildNotice`]: crate::store::ChildNotice
/// [`Inbound::ChildEnded`]: crate::store::Inbound::ChildEnded
pub(crate) const CHILD_NOTICE_TOKEN: &str = "\u{1}child-ended";

/// The `hook_inbox.token` of a message sent with `run.send`. Hook tokens with control
/// characters are refused, so no hook can own or send to it.
pub(in crate::store) const MESSAGE_TOKEN: &str = "\u{1}message";

/// The `hook_inbox.token` of a request sent with `run.request`, its name in the `topic`
/// column (see [`MESSAGE_TOKEN`]).
pub(in crate::store) const REQUEST_TOKEN: &str = "\u{1}request";

/// Every statement the shared layer and the stores run, one field per statement, so that
/// each dialect's table (SQLite's `&'static str`s, PostgreSQL's strings with the schema
/// spelled in) has the same entries and the two read side by side. `X` holds the
/// statements only one dialect needs.
pub(super) struct Statements<S, X> {
    pub run_exists: S,
    pub insert_run: S,
    pub insert_leased_run: S,
    pub claim: S,
    pub hook_owner: S,
    pub get_run: S,
    pub events: S,
    /// The histories of several runs, each in order.
    pub events_of: S,
    pub acquire: S,
    /// Fences, numbers and (PostgreSQL) inserts the events of an append.
    pub append: S,
    pub run_status: S,
    /// Ends a run, returning its parent (PostgreSQL: and queues the child's end to it).
    pub end_run: S,
    /// The children of a run that a cancellation of it reaches: not detached, not ended.
    pub children_to_cancel: S,
    /// Deletes the rows of given-up tokens that are not retained, then deactivates the rest.
    pub release_tokens: [S; 2],
    pub release: S,
    /// Counts a failed try at a leased run (fenced) and takes its lease; the new count.
    pub count_failure: S,
    /// Sets when a run given back after a failed try is due again.
    pub retry_at: S,
    /// Takes the payloads an append delivered out of the run's inbox.
    pub forget_payloads: S,
    /// Blocks a leased run (fenced) with the divergence as its error; its count of blocks.
    pub block: S,
    /// Makes a failed run pending again, or a blocked one due, at once.
    pub retry: S,
    /// Makes every blocked run due.
    pub wake_blocked: S,
    pub resume: S,
    pub payloads: S,
    pub payloads_since: S,
    pub last_payload_id: S,
    pub get_hook: S,
    pub heartbeat: S,
    pub list_runs: S,
    /// The runs by workflow and status: workflow, status, count.
    pub run_counts: S,
    pub list_hooks: S,
    /// Deletes the ended runs old enough to prune, returning their ids.
    pub prune_runs: S,
    /// Deletes the events, inbox payloads, hook rows, streams, stream chunks and message keys
    /// of the runs given as ids.
    pub prune_records: [S; 8],
    /// Draws the next index of an open stream (creating the stream); no row when closed.
    /// PostgreSQL's also fences the write, inserts the chunk and announces it: one statement.
    pub append_chunk: S,
    /// Closes a stream, creating it if needed (and, PostgreSQL, announces it).
    pub close_stream: S,
    /// The run's status and the stream's length and state: one row, NULLs for what is absent.
    pub stream_state: S,
    /// A stream's chunks from an index on, in order, at most a limit.
    pub stream_chunks: S,
    /// A run's streams by name.
    pub list_streams: S,
    /// Declares a queue, replacing its limits.
    pub define_queue: S,
    /// Every queue with its occupancy.
    pub list_queues: S,
    /// See [`crate::store::Store::queue_opening`].
    pub queue_opening: S,
    /// See [`crate::store::QueueStore::has_waiting_runs`].
    pub has_waiting: S,
    /// See [`policy::Tx::waiting_queues`].
    pub waiting_queues: S,
    /// See [`policy::Tx::lock_queue`].
    pub lock_queue: S,
    /// See [`policy::Tx::queue_counts`].
    pub queue_counts: S,
    /// See [`policy::Tx::queue_candidates`].
    pub queue_candidates: S,
    /// Leases the queued runs [`policy::queued_to_begin`] picked, marking them begun.
    pub begin_queued: S,
    /// The statements only one dialect runs.
    pub dialect: X,
}
