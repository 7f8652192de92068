//! `Pg`: the shared policies' statements ([`Tx`]) on one PostgreSQL connection, including the
//! fused statements that stand for several policy steps in one round trip. It decides nothing
//! the shared policy decides (when to admit, fence, end or release), and never opens, commits
//! or batches a transaction: its callers do.

use sqlx::PgConnection;

use super::listen::{NOTE_CHUNK, NOTE_ENDED, NOTE_READY, NOTIFY_ALL};
use super::statements::Statements;
use crate::error::StoreError;
use crate::store::sql::owner_of;
use crate::store::sql::policy::{self, Admitted, ChunkAppend, EncodedChunk, NewRunRow, Tx};
use crate::store::sql::rows::{InboxRow, QueueLimits};
use crate::store::sql::{EncodedEnd, EncodedEvents};
use crate::store::{Admission, EndHint, CHILD_NOTICE_TOKEN};

/// The policies' statements on one connection: inside a transaction, or in autocommit when
/// the policy runs a single statement.
pub(super) struct Pg<'a> {
    pub(super) conn: &'a mut PgConnection,
    pub(super) sql: &'a Statements,
    /// The schema's notification channel.
    pub(super) channel: &'a str,
    /// The advisory lock key serializing the schema's inbox inserts.
    pub(super) inbox_lock: i64,
    /// Set by `lock_inbox_for_end(Some(run))`: the next append of that run takes the inbox
    /// lock (if the run has a parent) before its row lock, in the same statement.
    pub(super) lock_with_append: bool,
    /// The transaction took the inbox lock before any row lock (a group transaction with
    /// runs' ends): `lock_inbox_for_end` has nothing left to take.
    pub(super) inbox_held: bool,
    /// Where the hot statements' notices go, to be sent once the transaction committed (see
    /// `Notifier`); without it they are sent in the transaction.
    pub(super) notes: Option<&'a mut Vec<String>>,
}

impl Pg<'_> {
    /// Ends the run; with `release`, gives up its tokens in the same statement.
    pub(super) async fn end(
        &mut self,
        run: &str,
        end: &EncodedEnd,
        now: i64,
        release: bool,
    ) -> Result<(), StoreError> {
        let notes: Vec<String> = sqlx::query_scalar(&self.sql.end_run)
            .bind(run)
            .bind(end.status.as_str())
            .bind(&end.output)
            .bind(&end.error)
            .bind(now)
            .bind(CHILD_NOTICE_TOKEN)
            .bind(self.inbox_lock)
            .bind(release)
            .bind(end.notice(run))
            .fetch_one(&mut *self.conn)
            .await?;
        self.announce(notes).await
    }

    /// Announces `notes` on the schema's channel: once the transaction committed when a
    /// caller collects them, else with a statement of the transaction.
    pub(super) async fn announce(&mut self, notes: Vec<String>) -> Result<(), StoreError> {
        if notes.is_empty() {
            return Ok(());
        }
        match &mut self.notes {
            Some(collected) => collected.extend(notes),
            None => {
                sqlx::query(NOTIFY_ALL)
                    .bind(self.channel)
                    .bind(&notes)
                    .execute(&mut *self.conn)
                    .await?;
            }
        }
        Ok(())
    }
}

impl Tx for Pg<'_> {
    async fn run_exists(&mut self, id: &str) -> Result<bool, StoreError> {
        let row = sqlx::query(&self.sql.run_exists)
            .bind(id)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(row.is_some())
    }

    async fn insert_run(&mut self, run: &NewRunRow) -> Result<bool, StoreError> {
        let token = run.hook.as_ref().map(|h| h.0.as_str());
        let sql = match run.lease_until {
            None => &self.sql.insert_run,
            Some(_) => &self.sql.insert_leased_run,
        };
        let insert = sqlx::query(sql)
            .bind(&run.key)
            .bind(&run.workflow)
            .bind(&run.input)
            .bind(run.created_at)
            .bind(token);
        // `$6`: until when it is leased.
        let insert = match run.lease_until {
            None => insert,
            Some(until) => insert.bind(until),
        };
        let (parent, detached) = run.parent_cols();
        let insert = insert.bind(run.deadline).bind(parent).bind(detached);
        let insert = match run.lease_until {
            None => insert
                .bind(&run.queue)
                .bind(&run.partition_key)
                .bind(run.priority),
            Some(_) => insert,
        };
        let insert = insert
            .bind(run.start_at)
            .bind(&run.version)
            .bind(&run.trace_context);
        let inserted = insert.fetch_optional(&mut *self.conn).await?.is_some();
        // A run nobody leased: any worker may take it (a delayed one only later).
        if inserted && run.lease_until.is_none() && !run.delayed() {
            self.announce(vec![NOTE_READY.to_owned()]).await?;
        }
        Ok(inserted)
    }

    /// All in one statement (`admit_many`): the rows are new, so no other writer waits for
    /// them. The notice that runs nobody leased are ready goes out once.
    async fn insert_many(
        &mut self,
        runs: &[&NewRunRow],
        first: &[Option<&EncodedEvents>],
    ) -> Result<Vec<bool>, StoreError> {
        let ids: Vec<&str> = runs.iter().map(|r| r.key.as_str()).collect();
        let workflows: Vec<&str> = runs.iter().map(|r| r.workflow.as_str()).collect();
        let inputs: Vec<&str> = runs.iter().map(|r| r.input.as_str()).collect();
        let at: Vec<i64> = runs.iter().map(|r| r.created_at).collect();
        let leases: Vec<Option<i64>> = runs.iter().map(|r| r.lease_until).collect();
        let deadlines: Vec<Option<i64>> = runs.iter().map(|r| r.deadline).collect();
        let parents: Vec<Option<&str>> = runs
            .iter()
            .map(|r| r.parent.as_ref().map(|(p, _)| p.as_str()))
            .collect();
        let detached: Vec<bool> = runs
            .iter()
            .map(|r| r.parent.as_ref().is_some_and(|(_, d)| *d))
            .collect();
        let queues: Vec<Option<&str>> = runs.iter().map(|r| r.queue.as_deref()).collect();
        let keys: Vec<Option<&str>> = runs.iter().map(|r| r.partition_key.as_deref()).collect();
        let priorities: Vec<i32> = runs.iter().map(|r| r.priority).collect();
        let starts: Vec<Option<i64>> = runs.iter().map(|r| r.start_at).collect();
        let versions: Vec<Option<&str>> = runs.iter().map(|r| r.version.as_deref()).collect();
        let traces: Vec<Option<&str>> = runs.iter().map(|r| r.trace_context.as_deref()).collect();
        // The first events of each leased run, of an id given twice only the first one's
        // (the one inserted).
        let mut seen = std::collections::HashSet::new();
        let flat = FlatEvents::of(runs.iter().enumerate().map(|(i, run)| {
            let first_time = seen.insert(&run.key);
            let events = first.get(i).copied().flatten();
            let events = events.filter(|_| run.lease_until.is_some() && first_time);
            (run.key.as_str(), events)
        }));
        let inserted: Vec<String> = sqlx::query_scalar(&self.sql.dialect.admit_many)
            .bind(&ids)
            .bind(&workflows)
            .bind(&inputs)
            .bind(&at)
            .bind(&leases)
            .bind(&deadlines)
            .bind(&parents)
            .bind(&detached)
            .bind(&queues)
            .bind(&keys)
            .bind(&priorities)
            .bind(&starts)
            .bind(&versions)
            .bind(&traces)
            .bind(&flat.counts)
            .bind(&flat.runs)
            .bind(&flat.seq)
            .bind(&flat.at)
            .bind(&flat.kinds)
            .bind(&flat.data)
            .fetch_all(&mut *self.conn)
            .await?;
        // An id twice among them was inserted once: the first has it.
        let mut inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
        let mut ready = false;
        let inserted = runs
            .iter()
            .map(|run| {
                let new = inserted.remove(&run.key);
                ready |= new && run.lease_until.is_none() && !run.delayed();
                new
            })
            .collect();
        if ready {
            self.announce(vec![NOTE_READY.to_owned()]).await?;
        }
        Ok(inserted)
    }

    async fn claim(
        &mut self,
        token: &str,
        run: &str,
        at: i64,
        retain_until: Option<i64>,
    ) -> Result<bool, StoreError> {
        let claimed = sqlx::query(&self.sql.claim)
            .bind(token)
            .bind(run)
            .bind(at)
            .bind(retain_until)
            .execute(&mut *self.conn)
            .await?;
        Ok(claimed.rows_affected() > 0)
    }

    async fn bind_inherited(&mut self, token: &str, run: &str) -> Result<bool, StoreError> {
        let bound = sqlx::query(&self.sql.dialect.chain.bind_inherited)
            .bind(token)
            .bind(run)
            .execute(&mut *self.conn)
            .await?;
        Ok(bound.rows_affected() > 0)
    }

    async fn hook_owner(&mut self, token: &str) -> Result<(String, bool), StoreError> {
        Ok(sqlx::query_as(&self.sql.hook_owner)
            .bind(token)
            .fetch_one(&mut *self.conn)
            .await?)
    }

    /// One statement: the claim is the upsert's WHERE on the token's primary key, and the run
    /// is inserted only when it won. A token the statement's snapshot already shows taken is
    /// not claimed at all: the upsert would lock its row (a WAL record, so a flushed commit,
    /// for a start that writes nothing), and the answer is the same as if the start had come
    /// at that snapshot. A claim that lost reads the owner from the snapshot; undecided when
    /// the snapshot shows no owner, because the winning claim committed while this one waited
    /// for the token's row.
    async fn admit_claiming(&mut self, row: &NewRunRow) -> Result<Option<Admitted>, StoreError> {
        let Some((token, retain_until)) = &row.hook else {
            return Err(crate::store::no_token());
        };
        let sql = &self.sql.dialect.admit_claiming[usize::from(row.lease_until.is_some())];
        let (parent, detached) = row.parent_cols();
        let query = sqlx::query_as::<_, (bool, bool, Option<String>, bool)>(sql)
            .bind(&row.key)
            .bind(&row.workflow)
            .bind(&row.input)
            .bind(row.created_at)
            .bind(token)
            .bind(retain_until)
            .bind(row.deadline)
            .bind(parent)
            .bind(detached);
        let query = match row.lease_until {
            Some(until) => query.bind(until),
            None => query
                .bind(&row.queue)
                .bind(&row.partition_key)
                .bind(row.priority),
        };
        let query = query
            .bind(row.start_at)
            .bind(&row.version)
            .bind(&row.trace_context);
        let (new, admitted, owner, taken) = query.fetch_one(&mut *self.conn).await?;
        if !new {
            return Err(policy::exists(&row.id));
        }
        if admitted {
            if row.lease_until.is_none() && !row.delayed() {
                // Nobody leased it: any worker may take it.
                self.announce(vec![NOTE_READY.to_owned()]).await?;
            }
            return Ok(Some(policy::admitted(row)));
        }
        match owner {
            Some(owner) if taken => Ok(Some((Admission::Conflict(owner_of(&owner, token)?), None))),
            _ => Ok(None),
        }
    }

    async fn resume(
        &mut self,
        token: &str,
        payload: &str,
        at: i64,
    ) -> Result<Option<InboxRow>, StoreError> {
        // The inbox lock it takes is held until this transaction ends (see
        // `PostgresStore::resume_hook`).
        let queued: Option<(i64, String, i64)> = sqlx::query_as(&self.sql.resume)
            .bind(token)
            .bind(payload)
            .bind(at)
            .bind(self.inbox_lock)
            .bind(self.channel)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(queued.map(|(id, run_id, _notes)| InboxRow { id, run_id }))
    }

    async fn append_events(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
    ) -> Result<bool, StoreError> {
        let ending = std::mem::take(&mut self.lock_with_append);
        let sql = if ending {
            &self.sql.dialect.append_ending
        } else {
            &self.sql.append
        };
        let mut query = sqlx::query_scalar(sql)
            .bind(run)
            .bind(&events.at)
            .bind(&events.kind)
            .bind(&events.data)
            .bind(fence);
        if ending {
            query = query.bind(self.inbox_lock);
        }
        let base: Option<i64> = query.fetch_optional(&mut *self.conn).await?;
        Ok(base.is_some())
    }

    /// One statement (`append_many`), which locks the rows in the order given, each fenced
    /// as `append` fences it.
    async fn append_many(
        &mut self,
        runs: &[String],
        fences: &[i64],
        events: &[&EncodedEvents],
    ) -> Result<Vec<bool>, StoreError> {
        let flat = FlatEvents::of(
            runs.iter()
                .map(String::as_str)
                .zip(events.iter().copied().map(Some)),
        );
        let written: Vec<String> = sqlx::query_scalar(&self.sql.dialect.append_many)
            .bind(runs)
            .bind(fences)
            .bind(&flat.counts)
            .bind(&flat.runs)
            .bind(&flat.seq)
            .bind(&flat.at)
            .bind(&flat.kinds)
            .bind(&flat.data)
            .fetch_all(&mut *self.conn)
            .await?;
        Ok(answered(runs, written))
    }

    async fn end_many_alone(
        &mut self,
        runs: &[String],
        fences: &[i64],
        events: &[&EncodedEvents],
        ends: &[(&EncodedEnd, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        let (mut statuses, mut outputs, mut errors, mut times) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (end, now) in ends {
            statuses.push(end.status.as_str());
            outputs.push(end.output.as_deref());
            errors.push(end.error.as_deref());
            times.push(*now);
        }
        let flat = FlatEvents::of(
            runs.iter()
                .map(String::as_str)
                .zip(events.iter().copied().map(Some)),
        );
        let ended: Vec<String> = sqlx::query_scalar(&self.sql.dialect.end_many_alone)
            .bind(runs)
            .bind(fences)
            .bind(&flat.counts)
            .bind(&statuses)
            .bind(&outputs)
            .bind(&errors)
            .bind(&times)
            .bind(&flat.runs)
            .bind(&flat.seq)
            .bind(&flat.at)
            .bind(&flat.kinds)
            .bind(&flat.data)
            .fetch_all(&mut *self.conn)
            .await?;
        self.announce(
            ended
                .iter()
                .map(|run| format!("{NOTE_ENDED}{run}"))
                .collect(),
        )
        .await?;
        Ok(answered(runs, ended))
    }

    async fn release_tokens(
        &mut self,
        run: &str,
        tokens: Option<&[String]>,
        now: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.sql.release_tokens[0])
            .bind(run)
            .bind(now)
            .bind(tokens)
            .execute(&mut *self.conn)
            .await?;
        sqlx::query(&self.sql.release_tokens[1])
            .bind(run)
            .bind(tokens)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn prune_runs(&mut self, before: i64, now: i64) -> Result<Vec<String>, StoreError> {
        let query = sqlx::query_scalar(&self.sql.prune_runs).bind(before);
        Ok(query.bind(now).fetch_all(&mut *self.conn).await?)
    }

    async fn prune_records(&mut self, runs: &[String]) -> Result<Vec<u64>, StoreError> {
        let mut deleted = Vec::new();
        for sql in &self.sql.prune_records {
            let done = sqlx::query(sql).bind(runs).execute(&mut *self.conn).await?;
            deleted.push(done.rows_affected());
        }
        Ok(deleted)
    }

    async fn publish_event(
        &mut self,
        run: &str,
        key: &str,
        value: &str,
        at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.sql.dialect.publish_event)
            .bind(run)
            .bind(key)
            .bind(value)
            .bind(at)
            .execute(&mut *self.conn)
            .await?;
        // Readers in every process wait on the run's stream notices.
        self.announce(vec![format!("{NOTE_CHUNK}{run}")]).await
    }

    async fn record_reply(
        &mut self,
        run: &str,
        id: i64,
        reply: &str,
        at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.sql.dialect.record_reply)
            .bind(run)
            .bind(id)
            .bind(reply)
            .bind(at)
            .execute(&mut *self.conn)
            .await?;
        // Callers in every process wait on the run's stream notices, as event readers do.
        self.announce(vec![format!("{NOTE_CHUNK}{run}")]).await
    }

    async fn forget_payloads(&mut self, run: &str, ids: &[i64]) -> Result<(), StoreError> {
        let query = sqlx::query(&self.sql.forget_payloads).bind(run).bind(ids);
        query.execute(&mut *self.conn).await?;
        Ok(())
    }

    async fn count_failure(&mut self, run: &str, epoch: i64) -> Result<Option<i64>, StoreError> {
        let query = sqlx::query_scalar(&self.sql.count_failure).bind(run);
        Ok(query.bind(epoch).fetch_optional(&mut *self.conn).await?)
    }

    async fn block(
        &mut self,
        run: &str,
        epoch: i64,
        error: &str,
        now: i64,
    ) -> Result<Option<i64>, StoreError> {
        let query = sqlx::query_scalar(&self.sql.block).bind(run).bind(epoch);
        let query = query.bind(error).bind(now);
        Ok(query.fetch_optional(&mut *self.conn).await?)
    }

    async fn retry(&mut self, run: &str, now: i64) -> Result<(), StoreError> {
        let query = sqlx::query(&self.sql.retry).bind(run).bind(now);
        query.bind(self.channel).execute(&mut *self.conn).await?;
        Ok(())
    }

    async fn retry_at(&mut self, run: &str, at: i64) -> Result<(), StoreError> {
        let query = sqlx::query(&self.sql.retry_at).bind(run).bind(at);
        query.execute(&mut *self.conn).await?;
        Ok(())
    }

    async fn run_status(&mut self, run: &str) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(&self.sql.run_status)
            .bind(run)
            .fetch_optional(&mut *self.conn)
            .await?)
    }

    async fn append_chunk(
        &mut self,
        run: &str,
        fence: i64,
        chunk: &EncodedChunk,
    ) -> Result<ChunkAppend, StoreError> {
        let (fenced, idx): (i64, Option<i64>) = sqlx::query_as(&self.sql.append_chunk)
            .bind(run)
            .bind(fence)
            .bind(&chunk.stream)
            .bind(chunk.attempt)
            .bind(chunk.at)
            .bind(&chunk.value)
            .fetch_one(&mut *self.conn)
            .await?;
        if fenced != 0 && idx.is_some() {
            self.announce(vec![format!("{NOTE_CHUNK}{run}")]).await?;
        }
        Ok(match (fenced, idx) {
            (0, _) => ChunkAppend::LeaseLost,
            (_, None) => ChunkAppend::Closed,
            (_, Some(idx)) => ChunkAppend::Appended(idx),
        })
    }

    async fn close_stream(&mut self, run: &str, stream: &str) -> Result<(), StoreError> {
        sqlx::query(&self.sql.close_stream)
            .bind(run)
            .bind(stream)
            .bind(self.channel)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn waiting_queues(
        &mut self,
        now: i64,
        workflows: &[String],
    ) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(&self.sql.waiting_queues)
            .bind(now)
            .bind(workflows)
            .fetch_all(&mut *self.conn)
            .await?)
    }

    /// The queue's row is locked first (the same lock `acquire` takes), so the insert's
    /// counts come after every other begin of the queue: two statements. Only when nobody
    /// holds that lock and no run of the queue waits: while another admission or acquire of
    /// the queue holds it (until its commit), or runs wait, this run is inserted waiting
    /// without taking it, and the next `acquire` begins it with the others that waited.
    /// Waiting for the lock made the admissions into one queue commit one at a time
    /// (PostgreSQL W3q: 891-1,172 runs/s, against 2,162-2,986 since).
    async fn admit_begun(&mut self, run: &NewRunRow, until: i64) -> Result<bool, StoreError> {
        let Some(queue) = &run.queue else {
            return Ok(false);
        };
        let locked = sqlx::query(&self.sql.dialect.try_lock_queue)
            .bind(queue)
            .fetch_optional(&mut *self.conn)
            .await?;
        if locked.is_none() {
            return Ok(false);
        }
        let (parent, detached) = run.parent_cols();
        let inserted = sqlx::query(&self.sql.dialect.insert_begun)
            .bind(&run.key)
            .bind(&run.workflow)
            .bind(&run.input)
            .bind(run.created_at)
            .bind(until)
            .bind(run.deadline)
            .bind(parent)
            .bind(detached)
            .bind(queue)
            .bind(&run.partition_key)
            .bind(run.priority)
            .bind(&run.version)
            .bind(&run.trace_context)
            .execute(&mut *self.conn)
            .await?;
        Ok(inserted.rows_affected() > 0)
    }

    async fn lock_queue(&mut self, name: &str) -> Result<Option<QueueLimits>, StoreError> {
        Ok(sqlx::query_as(&self.sql.lock_queue)
            .bind(name)
            .fetch_optional(&mut *self.conn)
            .await?)
    }

    async fn queue_counts(&mut self, name: &str, since: i64) -> Result<(i64, i64), StoreError> {
        Ok(sqlx::query_as(&self.sql.queue_counts)
            .bind(name)
            .bind(since)
            .fetch_one(&mut *self.conn)
            .await?)
    }

    async fn queue_candidates(
        &mut self,
        name: &str,
        now: i64,
        workflows: &[String],
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(&self.sql.queue_candidates)
            .bind(name)
            .bind(now)
            .bind(workflows)
            .bind(limit)
            .fetch_all(&mut *self.conn)
            .await?)
    }

    async fn end_run(&mut self, run: &str, end: &EncodedEnd, now: i64) -> Result<(), StoreError> {
        self.end(run, end, now, false).await
    }

    /// A run that stands alone ([`EndHint::Alone`]) is first ended with the plain statement,
    /// which has nothing to set up for a parent, a queue or tokens; it refuses any other run
    /// (and a lost lease), and then the whole statement decides: a wrong hint costs that
    /// round trip. The whole statement gets the child's notice only when the run may have a
    /// parent: without it ([`EndHint::NoParent`]) it refuses a run that has one, and then
    /// runs again with the notice.
    async fn append_and_end(
        &mut self,
        run: &str,
        fence: Option<i64>,
        events: &EncodedEvents,
        end: &EncodedEnd,
        now: i64,
        hint: EndHint,
    ) -> Result<bool, StoreError> {
        // The statement takes the inbox lock itself (for a child), before the row lock.
        self.lock_with_append = false;
        // `$1` .. `$9`, the same in both statements.
        let ending = |sql| {
            sqlx::query(sql)
                .bind(run)
                .bind(&events.at)
                .bind(&events.kind)
                .bind(&events.data)
                .bind(fence)
                .bind(end.status.as_str())
                .bind(&end.output)
                .bind(&end.error)
                .bind(now)
        };
        if hint == EndHint::Alone {
            let plain = ending(&self.sql.dialect.append_and_end_plain)
                .fetch_optional(&mut *self.conn)
                .await?;
            if plain.is_some() {
                self.announce(vec![format!("{NOTE_ENDED}{run}")]).await?;
                return Ok(true);
            }
        }
        let notice = (hint != EndHint::NoParent).then(|| end.notice(run));
        let whole = &self.sql.dialect.append_and_end;
        let mut ended = ending(whole)
            .bind(CHILD_NOTICE_TOKEN)
            .bind(self.inbox_lock)
            .bind(&notice)
            .fetch_optional(&mut *self.conn)
            .await?;
        let late;
        if ended.is_none() && notice.is_none() {
            // Refused for want of the notice (or the lease is lost): once more with it.
            late = Some(end.notice(run));
            ended = ending(whole)
                .bind(CHILD_NOTICE_TOKEN)
                .bind(self.inbox_lock)
                .bind(&late)
                .fetch_optional(&mut *self.conn)
                .await?;
        }
        let Some(ended) = ended else {
            return Ok(false);
        };
        let notes: Vec<String> = sqlx::Row::try_get(&ended, 1)?;
        self.announce(notes).await?;
        Ok(true)
    }

    async fn end_run_releasing(
        &mut self,
        run: &str,
        end: &EncodedEnd,
        now: i64,
    ) -> Result<(), StoreError> {
        self.end(run, end, now, true).await
    }

    async fn lock_inbox_for_end(&mut self, run: Option<&str>) -> Result<(), StoreError> {
        if self.inbox_held {
            return Ok(());
        }
        match run {
            // Taken by the run's next statement, its fenced append: no round trip of its own.
            Some(_) => self.lock_with_append = true,
            None => {
                sqlx::query(&self.sql.dialect.lock_inbox)
                    .bind(self.inbox_lock)
                    .execute(&mut *self.conn)
                    .await?;
            }
        }
        Ok(())
    }

    /// Only when one of `runs` has a parent (`lock_inbox_for_children`): ends of runs
    /// without a parent need no inbox lock, so a group of them holds none (holding it would
    /// make every committer's group wait for the others').
    async fn lock_inbox_for_ends(&mut self, runs: &[String]) -> Result<(), StoreError> {
        if !self.inbox_held {
            sqlx::query(&self.sql.dialect.lock_inbox_for_children)
                .bind(self.inbox_lock)
                .bind(runs)
                .execute(&mut *self.conn)
                .await?;
            self.inbox_held = true;
        }
        Ok(())
    }

    async fn children_to_cancel(&mut self, run: &str) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(&self.sql.children_to_cancel)
            .bind(run)
            .fetch_all(&mut *self.conn)
            .await?)
    }
}

/// The events of several runs as the parallel arrays the many-run statements unnest: each
/// event's run, its number within the run from 1, time, kind and data; and each run's count
/// (0 for a run given none).
struct FlatEvents<'a> {
    counts: Vec<i64>,
    runs: Vec<&'a str>,
    seq: Vec<i64>,
    at: Vec<i64>,
    kinds: Vec<&'a str>,
    data: Vec<&'a str>,
}

impl<'a> FlatEvents<'a> {
    fn of(runs: impl Iterator<Item = (&'a str, Option<&'a EncodedEvents>)>) -> Self {
        let mut flat = FlatEvents {
            counts: Vec::new(),
            runs: Vec::new(),
            seq: Vec::new(),
            at: Vec::new(),
            kinds: Vec::new(),
            data: Vec::new(),
        };
        for (run, events) in runs {
            let Some(events) = events else {
                flat.counts.push(0);
                continue;
            };
            flat.counts
                .push(i64::try_from(events.at.len()).unwrap_or(i64::MAX));
            for (k, ((at, kind), data)) in
                (1i64..).zip(events.at.iter().zip(&events.kind).zip(&events.data))
            {
                flat.runs.push(run);
                flat.seq.push(k);
                flat.at.push(*at);
                flat.kinds.push(kind.as_str());
                flat.data.push(data.as_str());
            }
        }
        flat
    }
}

/// For each of `runs`, whether a many-run statement answered its id among `returned`.
fn answered(runs: &[String], returned: Vec<String>) -> Vec<bool> {
    let returned: std::collections::HashSet<String> = returned.into_iter().collect();
    runs.iter().map(|run| returned.contains(run)).collect()
}
