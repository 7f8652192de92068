//! The write policies of the SQL stores, written once over the statements each dialect
//! supplies ([`Tx`]): admission with its token claim, the claim of a token for a hook, fenced
//! appends (event numbering after the run's last event, delivered payloads leaving the inbox,
//! token releases, the run's end), failed tries, cancellation and pruning. Each policy runs
//! inside one transaction the dialect opened; the decisions that must be atomic across
//! processes are single statements (the claim's upsert, the fence's `UPDATE` on PostgreSQL)
//! or made under SQLite's write lock, so the database, not this code, decides between
//! contenders.
//!
//! A dialect's fused statement (one round trip doing what several policy steps do) is an
//! optional [`Tx`] method declared next to the statements it stands for, whose default body
//! composes them; the policies decide when to call it, so the decision is written once.
//!
//! One file per concern: `admit` (admission and claims), `write` (a leased run's writes),
//! `queues`, `streams`, `admin` (cancellation, pruning, listing).

use std::future::Future;

use crate::error::StoreError;
use crate::store::{EndHint, Lease};

use super::rows::{InboxRow, QueueLimits};
use super::{sql_epoch, EncodedEnd, EncodedEvents};

mod admin;
mod admit;
mod chain;
// Only dialects that batch typed writes use it (PostgreSQL).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
mod group;
mod queues;
mod streams;
mod write;

pub(in crate::store) use admin::*;
pub(in crate::store) use admit::*;
pub(in crate::store) use chain::*;
#[cfg_attr(not(feature = "postgres"), allow(unused_imports))]
pub(in crate::store) use group::*;
pub(in crate::store) use queues::*;
pub(in crate::store) use streams::*;
pub(in crate::store) use write::*;

/// The statements the policies run, inside one transaction of the dialect (SQLite's run
/// synchronously and are ready at once). Runs are named by their id as stored.
pub(in crate::store) trait Tx: Sized {
    /// True when a run has id `id`.
    fn run_exists(&mut self, id: &str) -> impl Future<Output = Result<bool, StoreError>>;

    /// Inserts `run` (status `pending`, or `running` with epoch 1 when it has a lease) unless
    /// its id exists; false then. A run nobody leased is announced as ready.
    fn insert_run(&mut self, run: &NewRunRow) -> impl Future<Output = Result<bool, StoreError>>;

    /// Inserts `runs` (none claiming a token) as [`Tx::insert_run`] inserts each, in order,
    /// each leased one with `first[i]`'s events as its first (numbered from 1); whether each
    /// was inserted (of an id given twice, the first, with its own events). A dialect may
    /// insert them all in one statement.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn insert_many(
        &mut self,
        runs: &[&NewRunRow],
        first: &[Option<&EncodedEvents>],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> {
        async move {
            let mut inserted = Vec::with_capacity(runs.len());
            for (i, run) in runs.iter().enumerate() {
                let new = self.insert_run(run).await?;
                let events = first.get(i).copied().flatten();
                if let (true, Some(events)) = (new && run.lease_until.is_some(), events) {
                    // Leased at epoch 1 by this very insert: the fence holds.
                    if !events.is_empty() && !self.append_events(&run.key, Some(1), events).await? {
                        return Err(StoreError::database(
                            "internal error: a run just admitted refused its first events",
                        ));
                    }
                }
                inserted.push(new);
            }
            Ok(inserted)
        }
    }

    /// Admits queued run `run` (no token) holding a slot of its queue, begun and leased to
    /// the admitting worker (epoch 1) until `until`, if the queue has room for it now: a slot
    /// and the rate window free, no run of its partition key holding one, and no run of the
    /// queue waiting to begin (nobody is overtaken). True when it was inserted so; false
    /// when nothing was written (no room, or its id exists: the caller admits it waiting,
    /// which tells the two apart). A dialect decides it in one statement after whatever lock
    /// its queue's row needs; one that cannot leaves every queued run to `acquire` (the
    /// default).
    fn admit_begun(
        &mut self,
        run: &NewRunRow,
        until: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> {
        let _ = (run, until);
        async { Ok(false) }
    }

    /// Claims `token` for `run` at `at` if it is free: no row, or a row neither active nor
    /// retained past `at` (one upsert on the token's primary key). True when claimed.
    fn claim(
        &mut self,
        token: &str,
        run: &str,
        at: i64,
        retain_until: Option<i64>,
    ) -> impl Future<Output = Result<bool, StoreError>>;

    /// Binds `token` to `run`'s hook if `run` inherited it (`continue_as_new`) and has not
    /// claimed it since: the mark is cleared, so a second claim by the run conflicts as any
    /// claim of a token it owns does. True when bound.
    fn bind_inherited(
        &mut self,
        token: &str,
        run: &str,
    ) -> impl Future<Output = Result<bool, StoreError>>;

    /// The run recorded as the owner of `token` (which has a row), and whether its hook is
    /// active (not only retained).
    fn hook_owner(
        &mut self,
        token: &str,
    ) -> impl Future<Output = Result<(String, bool), StoreError>>;

    /// Admits `run`, which claims a token ([`NewRunRow::hook`]), as [`admit`] does: the
    /// claim first, the insert only when it won, and when it lost the owner as the conflict.
    /// `None` when undecided, having written nothing (then [`admit`] decides with the plain
    /// statements). A dialect may decide in one statement, which then commits by itself
    /// outside a transaction; the default runs the plain statements and always decides.
    fn admit_claiming(
        &mut self,
        run: &NewRunRow,
    ) -> impl Future<Output = Result<Option<Admitted>, StoreError>> {
        async move { claim_and_insert(self, run).await.map(Some) }
    }

    /// Queues `payload` (JSON) to the run whose active hook owns `token`, lowers that run's
    /// wake time to `at` (unless blocked) and announces it as `resume_hook` does; the payload
    /// row, or `None` (nothing written) when no active hook owns the token.
    fn resume(
        &mut self,
        token: &str,
        payload: &str,
        at: i64,
    ) -> impl Future<Output = Result<Option<InboxRow>, StoreError>>;

    /// Appends `events` numbered after the run's last, only while `fence` (an epoch) holds
    /// the lease and the run may still be written, when given; false, writing nothing, when
    /// it does not. No takeover, cancel or other write to the run may interleave until the
    /// transaction ends: PostgreSQL's statement updates the run's row (`runs.last_seq`), which
    /// stays row-locked; SQLite's one writer holds the file's write lock.
    fn append_events(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
    ) -> impl Future<Output = Result<bool, StoreError>>;

    /// Appends `events[i]` to run `runs[i]` fenced by epoch `fences[i]`, for each `i`, as
    /// [`Tx::append_events`] appends each (the runs distinct, in id order, the order their
    /// rows are locked in); whether each was written. A dialect may write them all in one
    /// statement.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn append_many(
        &mut self,
        runs: &[String],
        fences: &[i64],
        events: &[&EncodedEvents],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> {
        async move {
            let mut written = Vec::with_capacity(runs.len());
            for ((run, fence), events) in runs.iter().zip(fences).zip(events) {
                written.push(self.append_events(run, Some(*fence), events).await?);
            }
            Ok(written)
        }
    }

    /// Ends each of `runs` (distinct, in id order, the order their rows are locked in) with
    /// `ends[i]` (the end and its time) after appending `events[i]`, fenced by epoch
    /// `fences[i]`, as
    /// [`Tx::append_and_end`] does with [`EndHint::Alone`]: whether each was ended. A dialect
    /// may end them all in one statement taking only runs without ties (no parent, queue,
    /// start token or active hook) and answer false, writing nothing of it, for any other;
    /// the caller then writes that one alone, which also finds out a lost lease.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn end_many_alone(
        &mut self,
        runs: &[String],
        fences: &[i64],
        events: &[&EncodedEvents],
        ends: &[(&EncodedEnd, i64)],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> {
        async move {
            let mut ended = Vec::with_capacity(runs.len());
            for (((run, fence), events), (end, now)) in
                runs.iter().zip(fences).zip(events).zip(ends)
            {
                let hint = EndHint::Alone;
                let done = self
                    .append_and_end(run, Some(*fence), events, end, *now, hint)
                    .await?;
                ended.push(done);
            }
            Ok(ended)
        }
    }

    /// Gives up `tokens` if `run` owns them: a row retained past `now` stays, inactive; the
    /// others go, freeing their tokens at once. `None`: every token the run owns.
    fn release_tokens(
        &mut self,
        run: &str,
        tokens: Option<&[String]>,
        now: i64,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// Sets `value` (JSON) as run `run`'s latest value of `key` (`run_events`), and announces
    /// it to readers where the dialect can (see `store::sql::messages`).
    fn publish_event(
        &mut self,
        run: &str,
        key: &str,
        value: &str,
        at: i64,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// Records `reply` (JSON) as run `run`'s reply to its request `id` (`run_requests`),
    /// unless one is recorded, and announces it to callers where the dialect can.
    fn record_reply(
        &mut self,
        run: &str,
        id: i64,
        reply: &str,
        at: i64,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// Takes payloads `ids`, which an append delivered, out of the run's inbox.
    fn forget_payloads(
        &mut self,
        run: &str,
        ids: &[i64],
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// Counts a failed try at `run` if `epoch` holds its lease, and takes the lease; the
    /// run's count of failed tries in a row, or `None` when the lease is lost.
    fn count_failure(
        &mut self,
        run: &str,
        epoch: i64,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>>;

    /// Blocks `run` if `epoch` holds its lease: status `blocked`, `error` (JSON) as its error,
    /// the lease taken, at `now`; its count of blocks in a row, or `None` when the lease is
    /// lost.
    fn block(
        &mut self,
        run: &str,
        epoch: i64,
        error: &str,
        now: i64,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>>;

    /// Makes `run`, failed or blocked, due at `now`: a failed one becomes pending with its
    /// error cleared.
    fn retry(&mut self, run: &str, now: i64) -> impl Future<Output = Result<(), StoreError>>;

    /// Makes the run (given back) due at `at`.
    fn retry_at(&mut self, run: &str, at: i64) -> impl Future<Output = Result<(), StoreError>>;

    /// The run's status, the row locked against other writes where the dialect can.
    fn run_status(&mut self, run: &str)
        -> impl Future<Output = Result<Option<String>, StoreError>>;

    /// Deletes the runs that ended before `before` and own no hook row retained past `now`;
    /// their ids.
    fn prune_runs(
        &mut self,
        before: i64,
        now: i64,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// Deletes what was recorded for `runs`, one statement per table (events first); the
    /// number of rows each deleted.
    fn prune_records(
        &mut self,
        runs: &[String],
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>>;

    /// The queues with runs of `workflows` waiting to begin that are due at `now` and not
    /// leased, by name.
    fn waiting_queues(
        &mut self,
        now: i64,
        workflows: &[String],
    ) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// The limits of queue `name`, its row locked until the transaction ends where the
    /// dialect can (so one acquirer at a time begins runs of the queue); `None` for a queue
    /// nobody declared.
    fn lock_queue(
        &mut self,
        name: &str,
    ) -> impl Future<Output = Result<Option<QueueLimits>, StoreError>>;

    /// Of queue `name`: the runs holding a slot (begun, not ended), and the runs begun after
    /// `since`.
    fn queue_counts(
        &mut self,
        name: &str,
        since: i64,
    ) -> impl Future<Output = Result<(i64, i64), StoreError>>;

    /// Up to `limit` waiting runs of queue `name` that may begin at `now`: of `workflows`,
    /// due, not leased, and, with a partition key, the key's earliest started waiting run
    /// while no run of the key holds a slot. Higher priority first, then start order.
    fn queue_candidates(
        &mut self,
        name: &str,
        now: i64,
        workflows: &[String],
        limit: i64,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// Appends `chunk` to its stream of `run` while `fence` (an epoch) holds the run's lease:
    /// the run's row is locked until the transaction ends (no end or cancel of the run
    /// interleaves), the chunk's index is the stream's length (the stream's row, created if
    /// needed, is the counter, locked too), and the chunk is announced where the dialect can.
    /// Nothing is written when the lease is lost or the stream is closed.
    fn append_chunk(
        &mut self,
        run: &str,
        fence: i64,
        chunk: &EncodedChunk,
    ) -> impl Future<Output = Result<ChunkAppend, StoreError>>;

    /// Closes stream `stream` of `run`, creating it (empty) if needed, and announces it
    /// where the dialect can.
    fn close_stream(
        &mut self,
        run: &str,
        stream: &str,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// Takes, before any run row is locked, the lock a child's end needs to queue its notice
    /// to the parent (PostgreSQL's inbox lock; SQLite's writer holds every lock already):
    /// for `Some(run)` only when that run has a parent (then the dialect may take it with
    /// the run's next statement, its fenced append), for `None` always. Taken in this order
    /// (inbox, then run rows) by every writer that queues payloads, so none waits for
    /// another in a cycle.
    fn lock_inbox_for_end(
        &mut self,
        run: Option<&str>,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// Takes, before any run row is locked, the lock the ends of `runs` need to queue their
    /// notices (see [`Tx::lock_inbox_for_end`]), for the rest of the transaction: what a
    /// transaction ending several runs does first. The default takes it whatever the runs; a
    /// dialect may take it only when one of them has a parent.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn lock_inbox_for_ends(
        &mut self,
        runs: &[String],
    ) -> impl Future<Output = Result<(), StoreError>> {
        let _ = runs;
        self.lock_inbox_for_end(None)
    }

    /// The children of `run` a cancellation of it reaches: not detached, not ended.
    fn children_to_cancel(
        &mut self,
        run: &str,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// Ends the run as `end` says, at `now`, without a lease; announces the end. A child's
    /// end goes to its parent's inbox too ([`EncodedEnd::notice`]), making the parent due.
    fn end_run(
        &mut self,
        run: &str,
        end: &EncodedEnd,
        now: i64,
    ) -> impl Future<Output = Result<(), StoreError>>;

    /// A run's last write: appends `events` as [`Tx::append_events`] does (false, writing
    /// nothing, when `fence` no longer holds) and then ends the run as
    /// [`Tx::end_run_releasing`] does. A dialect may do both in one statement, and choose a
    /// cheaper one from `hint` (what the writer knows of the run's ties; a wrong hint must
    /// cost at most a round trip or a retry of the transaction, never a wrong write).
    fn append_and_end(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
        end: &EncodedEnd,
        now: i64,
        hint: EndHint,
    ) -> impl Future<Output = Result<bool, StoreError>> {
        let _ = hint;
        async move {
            if !self.append_events(run, fence, events).await? {
                return Ok(false);
            }
            self.end_run_releasing(run, end, now).await?;
            Ok(true)
        }
    }

    /// Ends the run ([`Tx::end_run`]) and gives up every token it owns
    /// ([`Tx::release_tokens`] with `None`), both at `now`: how every end is written. A
    /// dialect may do both in one statement (one round trip).
    fn end_run_releasing(
        &mut self,
        run: &str,
        end: &EncodedEnd,
        now: i64,
    ) -> impl Future<Output = Result<(), StoreError>> {
        async move {
            self.end_run(run, end, now).await?;
            self.release_tokens(run, None, now).await
        }
    }
}

/// Holds `lease` for the rest of the transaction (the run's row stays locked where the
/// dialect locks rows: a chunk and the run's end or a cancel do not interleave), or
/// [`StoreError::LeaseLost`].
pub(super) async fn fence(tx: &mut impl Tx, lease: &Lease) -> Result<String, StoreError> {
    let run = lease.run_id.to_string();
    let fence = Some(sql_epoch(lease.epoch));
    if !tx
        .append_events(&run, fence, &EncodedEvents::default())
        .await?
    {
        return Err(StoreError::LeaseLost(lease.run_id));
    }
    Ok(run)
}
