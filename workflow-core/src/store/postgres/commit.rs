//! Group commit: the committers that take waiting writes (appends and admissions without a
//! token), commit them together in one transaction per group, and answer each caller after the
//! commit. A write here runs the shared policy on `Pg`; this file decides only how writes are
//! grouped, ordered and retried alone, never what a write means.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sqlx::PgConnection;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::listen::{notifier, Notifier, NOTE_READY};
use super::stash::{Conn, Stash};
use super::statements::Statements;
use super::tx::{FullEnds, Pg};
use super::PostgresStore;
use crate::error::{DatabaseError, StoreError};
use crate::ids::RunId;
use crate::store::sql::policy::{self, NewRunRow};
use crate::store::sql::{sql_epoch, EncodedAppend};
use crate::store::{Admission, Lease};

/// Committers per store, each committing one batch at a time on a pooled connection: while
/// one waits for its commit (the WAL flush), the next takes the writes that arrived meanwhile.
pub(super) const COMMITTERS: usize = 4;
/// Writes per group transaction at most.
pub(super) const MAX_BATCH: usize = 256;

/// A write the committers take: an append, or an admission without a hook token (one
/// insert). Each carries where its answer goes.
pub(super) enum Write {
    Append(Lease, EncodedAppend, Reply<()>),
    Admit(NewRunRow, Reply<(Admission, Option<Lease>)>),
}

pub(super) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A write's outcome, held until its transaction's fate is known.
pub(super) enum Answer {
    Append(Result<(), StoreError>),
    Admit(Result<(Admission, Option<Lease>), StoreError>),
}

impl Answer {
    /// The error, if the write failed.
    pub(super) fn error(&self) -> Option<&StoreError> {
        match self {
            Answer::Append(r) => r.as_ref().err(),
            Answer::Admit(r) => r.as_ref().err(),
        }
    }
}

impl Write {
    /// The run it writes: a group transaction writes its runs in id order, the order
    /// heartbeats lock rows in (see `heartbeat`), so the two never wait for each other both
    /// ways.
    pub(super) fn run_id(&self) -> &RunId {
        match self {
            Write::Append(lease, ..) => &lease.run_id,
            Write::Admit(row, _) => &row.id,
        }
    }

    /// The append, when it only adds events (a step's result and the next step, say).
    pub(super) fn events_only(&self) -> Option<(&Lease, &EncodedAppend)> {
        match self {
            Write::Append(lease, write, _) if write.events_only() => Some((lease, write)),
            _ => None,
        }
    }

    /// Whether the write may take the inbox lock: an append ending its run.
    pub(super) fn ends_run(&self) -> bool {
        matches!(self, Write::Append(_, write, _) if write.end.is_some())
    }

    /// Its policy, on `pg`.
    pub(super) async fn apply(&self, pg: &mut Pg<'_>) -> Answer {
        match self {
            Write::Append(lease, write, _) => {
                Answer::Append(policy::append(pg, lease, write).await)
            }
            Write::Admit(row, _) => Answer::Admit(policy::admit(pg, row).await),
        }
    }

    /// Sends `answer` to the caller, who may have stopped waiting (the write stands either
    /// way). An answer of the other kind cannot happen; it is reported, not panicked on.
    pub(super) fn answer(self, answer: Answer) {
        let mismatch = || StoreError::database("internal error: a write got another's answer");
        match (self, answer) {
            (Write::Append(_, _, reply), Answer::Append(r)) => drop(reply.send(r)),
            (Write::Admit(_, reply), Answer::Admit(r)) => drop(reply.send(r)),
            (Write::Append(_, _, reply), _) => drop(reply.send(Err(mismatch()))),
            (Write::Admit(_, reply), _) => drop(reply.send(Err(mismatch()))),
        }
    }

    /// The answer of this write failing with `e`.
    pub(super) fn failed(&self, e: StoreError) -> Answer {
        match self {
            Write::Append(..) => Answer::Append(Err(e)),
            Write::Admit(..) => Answer::Admit(Err(e)),
        }
    }

    /// Answers with `why` (its group transaction did not commit).
    pub(super) fn fail(self, why: &DatabaseError) {
        let e = || StoreError::Database(why.clone());
        match self {
            Write::Append(_, _, reply) => drop(reply.send(Err(e()))),
            Write::Admit(_, reply) => drop(reply.send(Err(e()))),
        }
    }
}

/// The error a caller gets when its write's committer ended before answering (its tokio
/// runtime shut down): whether the write committed is unknown.
pub(super) fn writer_gone() -> StoreError {
    StoreError::Database(
        DatabaseError::new("the store's committer stopped before answering; the write may or may not have committed")
            .transient(true),
    )
}

/// `e` as the error of a whole group transaction.
pub(super) fn database_of(e: StoreError) -> DatabaseError {
    match e {
        StoreError::Database(why) => why,
        other => DatabaseError::new(other.to_string()),
    }
}

/// What the committers write with: the store's pool and statements (not the store itself:
/// the committers end when the last clone of it is dropped, which closes their queue).
#[derive(Clone)]
pub(super) struct Writer {
    pub(super) stash: Arc<Stash>,
    pub(super) sql: Arc<Statements>,
    pub(super) channel: Arc<str>,
    pub(super) inbox_lock: i64,
    /// Writes under way: taken by a caller alone, or handed to the committers and not yet
    /// answered.
    pub(super) writing: Arc<AtomicUsize>,
    pub(super) notifier: Arc<Notifier>,
    pub(super) full_ends: Arc<FullEnds>,
}

/// One write counted in [`Writer::writing`] while its caller commits it; uncounted when
/// dropped, also when the caller stops waiting halfway.
pub(super) struct Writing<'a> {
    pub(super) count: &'a AtomicUsize,
    /// The writes under way before this one.
    pub(super) before: usize,
}

impl<'a> Writing<'a> {
    pub(super) fn count(count: &'a AtomicUsize) -> Self {
        let before = count.fetch_add(1, Ordering::AcqRel);
        Writing { count, before }
    }

    /// Leaves the write counted: a committer uncounts it when it answers.
    pub(super) fn hand_over(self) {
        std::mem::forget(self);
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Takes the writes waiting in `writes` (at least one: a lone write goes out at once) and
/// commits them together, until every store clone is gone.
pub(super) async fn committer(writer: Writer, writes: Arc<Mutex<mpsc::UnboundedReceiver<Write>>>) {
    loop {
        let mut batch = Vec::new();
        {
            // Held only while taking writes, never while committing them.
            let mut queue = writes.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(write) => batch.push(write),
                    Err(_) => break,
                }
            }
        }
        let n = batch.len();
        writer.commit_batch(batch).await;
        writer.writing.fetch_sub(n, Ordering::AcqRel);
    }
}

/// How a group transaction ended.
pub(super) enum Group {
    /// Committed: each write's own answer holds.
    Committed(Vec<Answer>),
    /// A write failed in a way that may have aborted the transaction, which was rolled
    /// back: every write is committed again, alone.
    Redo,
    /// The transaction did not commit.
    Failed(DatabaseError),
}

impl Writer {
    pub(super) fn pg<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        inbox_held: bool,
        notes: &'a mut Vec<String>,
    ) -> Pg<'a> {
        Pg {
            conn,
            sql: &self.sql,
            channel: &self.channel,
            inbox_lock: self.inbox_lock,
            lock_with_append: false,
            inbox_held,
            notes: Some(notes),
            full_ends: &self.full_ends,
        }
    }

    pub(super) async fn commit_batch(&self, mut batch: Vec<Write>) {
        if batch.len() == 1 {
            if let Some(write) = batch.pop() {
                let answer = self.alone(&write).await;
                write.answer(answer);
            }
            return;
        }
        batch.sort_by(|a, b| a.run_id().cmp(b.run_id()));
        match self.together(&batch).await {
            Group::Committed(answers) => {
                for (write, answer) in batch.into_iter().zip(answers) {
                    write.answer(answer);
                }
            }
            Group::Redo => {
                for write in batch {
                    let answer = self.alone(&write).await;
                    write.answer(answer);
                }
            }
            Group::Failed(why) => {
                tracing::error!(requests = batch.len(), error = %why, "store write failed");
                for write in batch {
                    write.fail(&why);
                }
            }
        }
    }

    /// One write in its own transaction, as if no other were waiting: a write of one
    /// statement (a step's events, a run's usual end, an admission) commits by itself,
    /// without BEGIN and COMMIT.
    pub(super) async fn alone(&self, write: &Write) -> Answer {
        let single = match write {
            // Both are one statement (see `policy::append`).
            Write::Append(_, append, _) => append.events_only() || append.plain_end(),
            Write::Admit(..) => true,
        };
        let conn = match self.stash.conn().await {
            Ok(conn) => conn,
            Err(e) => return write.failed(e),
        };
        let mut notes = Vec::new();
        let answer = if single {
            let mut conn = conn;
            let answer = write
                .apply(&mut self.pg(&mut conn, false, &mut notes))
                .await;
            conn.keep = !matches!(answer.error(), Some(StoreError::Database(_)));
            answer
        } else {
            self.in_transaction(conn, write, &mut notes).await
        };
        if answer.error().is_none() {
            self.announce(notes);
        }
        answer
    }

    /// `write` in a transaction of its own on `conn`.
    pub(super) async fn in_transaction(
        &self,
        conn: Conn<'_>,
        write: &Write,
        notes: &mut Vec<String>,
    ) -> Answer {
        let mut tx = match conn.begin().await {
            Ok(tx) => tx,
            Err(e) => return write.failed(e),
        };
        let answer = write.apply(&mut self.pg(&mut tx, false, notes)).await;
        let settled = match answer.error() {
            None => tx.commit().await,
            Some(_) => tx.rollback().await,
        };
        match (settled, answer.error()) {
            (Err(e), None) => write.failed(e),
            // Rolled back or not, the write's own error is its answer.
            _ => answer,
        }
    }

    /// The writes in one transaction. A write refused without writing (lease lost) answers
    /// only its caller; any other error may have aborted the transaction (PostgreSQL aborts
    /// it on a failed statement), so all are redone alone. No savepoints: a refusal of the
    /// policies batched here (`append`: the fenced first statement; `admit` without a token:
    /// its one insert) writes nothing, so the round trip a savepoint costs per write buys
    /// nothing.
    ///
    /// Lock order: a transaction ending child runs takes the inbox lock before any run row
    /// lock, as every writer does (see `lock_inbox_for_end`), since a later write in the
    /// batch could otherwise wait for it while holding a row a resume or another end waits
    /// for; ends of runs without a parent need no inbox lock, so a batch of them holds none
    /// (holding it would make every committer's batch wait for the others'). A deadlock
    /// left (PostgreSQL detects it and aborts one transaction) costs its batch a redo, not
    /// an error.
    pub(super) async fn together(&self, batch: &[Write]) -> Group {
        let begun = match self.stash.conn().await {
            Ok(conn) => conn.begin().await,
            Err(e) => Err(e),
        };
        let mut tx = match begun {
            Ok(tx) => tx,
            Err(e) => return Group::Failed(database_of(e)),
        };
        let mut notes = Vec::new();
        match self.together_on(&mut tx, batch, &mut notes).await {
            Ok(answers) => match tx.commit().await {
                Ok(()) => {
                    self.announce(notes);
                    Group::Committed(answers)
                }
                Err(e) => Group::Failed(database_of(e)),
            },
            Err(group) => {
                if let Err(why) = tx.rollback().await {
                    tracing::debug!(error = %why, "rolling back after an error failed");
                }
                group
            }
        }
    }

    /// The events of `writes` (appends that only add events, of distinct runs, in id order) in
    /// one statement: each write's answer, `LeaseLost` for a run whose lease is gone.
    pub(super) async fn append_many(
        &self,
        conn: &mut PgConnection,
        writes: &[Write],
    ) -> Result<Vec<Answer>, sqlx::Error> {
        let (mut runs, mut epochs, mut counts) = (Vec::new(), Vec::new(), Vec::new());
        let (mut ev_runs, mut ev_index, mut ev_at, mut ev_kinds, mut ev_data) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (lease, write) in writes.iter().filter_map(Write::events_only) {
            let run = lease.run_id.to_string();
            let events = &write.events;
            for (k, ((at, kind), data)) in
                (1i64..).zip(events.at.iter().zip(&events.kind).zip(&events.data))
            {
                ev_runs.push(run.clone());
                ev_index.push(k);
                ev_at.push(*at);
                ev_kinds.push(kind.as_str());
                ev_data.push(data.as_str());
            }
            runs.push(run);
            epochs.push(sql_epoch(lease.epoch));
            counts.push(i64::try_from(events.at.len()).unwrap_or(i64::MAX));
        }
        let written: Vec<String> = sqlx::query_scalar(&self.sql.dialect.append_many)
            .bind(&runs)
            .bind(&epochs)
            .bind(&counts)
            .bind(&ev_runs)
            .bind(&ev_index)
            .bind(&ev_at)
            .bind(&ev_kinds)
            .bind(&ev_data)
            .fetch_all(&mut *conn)
            .await?;
        let written: std::collections::HashSet<String> = written.into_iter().collect();
        Ok(runs
            .iter()
            .zip(writes)
            .map(|(run, write)| {
                Answer::Append(if written.contains(run) {
                    Ok(())
                } else {
                    Err(StoreError::LeaseLost(*write.run_id()))
                })
            })
            .collect())
    }

    /// The admissions among `batch` (none with a token) in one statement: their answers, in
    /// order. The notice that runs nobody leased are ready goes to `notes`.
    pub(super) async fn admit_many(
        &self,
        conn: &mut PgConnection,
        batch: &[Write],
        notes: &mut Vec<String>,
    ) -> Result<Vec<Answer>, sqlx::Error> {
        let rows: Vec<&NewRunRow> = batch
            .iter()
            .filter_map(|w| match w {
                Write::Admit(row, _) => Some(row),
                Write::Append(..) => None,
            })
            .collect();
        let ids: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        let workflows: Vec<&str> = rows.iter().map(|r| r.workflow.as_str()).collect();
        let inputs: Vec<&str> = rows.iter().map(|r| r.input.as_str()).collect();
        let at: Vec<i64> = rows.iter().map(|r| r.created_at).collect();
        let leases: Vec<Option<i64>> = rows.iter().map(|r| r.lease_until).collect();
        let deadlines: Vec<Option<i64>> = rows.iter().map(|r| r.deadline).collect();
        let parents: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.parent.as_ref().map(|(p, _)| p.as_str()))
            .collect();
        let detached: Vec<bool> = rows
            .iter()
            .map(|r| r.parent.as_ref().is_some_and(|(_, d)| *d))
            .collect();
        let queues: Vec<Option<&str>> = rows.iter().map(|r| r.queue.as_deref()).collect();
        let keys: Vec<Option<&str>> = rows.iter().map(|r| r.partition_key.as_deref()).collect();
        let priorities: Vec<i32> = rows.iter().map(|r| r.priority).collect();
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
            .fetch_all(&mut *conn)
            .await?;
        // An id twice in the batch was inserted once: the first admission has it.
        let mut inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
        let mut ready = false;
        let answers = rows
            .iter()
            .map(|row| {
                if !inserted.remove(&row.key) {
                    return Answer::Admit(Err(policy::exists(&row.id)));
                }
                if row.parent.is_some() || row.queue.is_some() {
                    self.full_ends.note(&row.key);
                }
                let lease = row.lease_until.map(|_| Lease {
                    run_id: row.id,
                    epoch: 1,
                });
                ready |= lease.is_none();
                Answer::Admit(Ok((Admission::Admitted, lease)))
            })
            .collect();
        if ready {
            notes.push(NOTE_READY.to_owned());
        }
        Ok(answers)
    }

    /// Sends `notes`, the notices of writes that committed, through the store's notifier
    /// (started on first use).
    pub(super) fn announce(&self, notes: Vec<String>) {
        if notes.is_empty() {
            return;
        }
        let queue = self.notifier.queue.get_or_init(|| {
            let (queue, notes) = mpsc::unbounded_channel();
            self.notifier
                .runtime
                .spawn(notifier(self.stash.clone(), self.channel.clone(), notes));
            queue
        });
        // The notifier stops only when every sender is gone.
        let _ = queue.send(notes);
    }

    /// The writes of `batch` on `tx`, a transaction: their answers, or how the transaction
    /// must end instead (rolled back, then redone alone or failed).
    pub(super) async fn together_on(
        &self,
        tx: &mut PgConnection,
        batch: &[Write],
        notes: &mut Vec<String>,
    ) -> Result<Vec<Answer>, Group> {
        let redo = |why: sqlx::Error| {
            tracing::debug!(error = %why, "a batch's statement failed; its writes are redone alone");
            Group::Redo
        };
        let ending: Vec<String> = batch
            .iter()
            .filter(|w| w.ends_run())
            .filter_map(|w| match w {
                Write::Append(lease, ..) => Some(lease.run_id.to_string()),
                Write::Admit(..) => None,
            })
            .collect();
        if !ending.is_empty() {
            sqlx::query(&self.sql.dialect.lock_inbox_for_children)
                .bind(self.inbox_lock)
                .bind(&ending)
                .execute(&mut *tx)
                .await
                .map_err(|e| Group::Failed(database_of(e.into())))?;
        }
        let ending = !ending.is_empty();
        // Admissions insert new rows, which no other writer waits for: first, together.
        let admitting = batch
            .iter()
            .filter(|w| matches!(w, Write::Admit(..)))
            .count();
        let mut admitted = if admitting >= 2 {
            self.admit_many(tx, batch, notes).await.map_err(redo)?
        } else {
            Vec::new()
        }
        .into_iter();
        let mut answers = Vec::with_capacity(batch.len());
        let mut rest = batch;
        while let Some(write) = rest.first() {
            // Neighbours in id order that only add events: one statement for all of them,
            // which locks their rows in the same order.
            let plain = rest
                .iter()
                .take_while(|w| w.events_only().is_some())
                .count();
            if plain >= 2 {
                let (these, after) = rest.split_at(plain);
                rest = after;
                answers.extend(self.append_many(tx, these).await.map_err(redo)?);
                continue;
            }
            rest = &rest[1..];
            if admitting >= 2 && matches!(write, Write::Admit(..)) {
                // Answered by `admit_many`, an id that existed included (that statement wrote
                // the others).
                answers.push(admitted.next().ok_or(Group::Redo)?);
                continue;
            }
            let answer = write.apply(&mut self.pg(tx, ending, notes)).await;
            if matches!(answer.error(), Some(StoreError::Database(_))) {
                return Err(Group::Redo);
            }
            answers.push(answer);
        }
        Ok(answers)
    }
}

impl PostgresStore {
    /// Commits `write`: at once from the caller's task when no other write is under way (a
    /// committer would only add two task wake-ups, with nothing to batch it with), else
    /// through the committers (starting them on first use, where the listener runs: in the
    /// runtime the store was connected in), which answer on the write's own reply channel.
    /// When that runtime is gone, the write is committed here, alone.
    pub(super) async fn commit(&self, write: Write) {
        let writer = &self.inner.writer;
        let under_way = Writing::count(&writer.writing);
        if under_way.before == 0 {
            let answer = writer.alone(&write).await;
            drop(under_way);
            write.answer(answer);
            return;
        }
        // Counted until a committer answers it.
        under_way.hand_over();
        let queue = self.inner.committers.get_or_init(|| {
            let (queue, writes) = mpsc::unbounded_channel();
            let writes = Arc::new(Mutex::new(writes));
            for _ in 0..COMMITTERS {
                self.inner
                    .runtime
                    .spawn(committer(writer.clone(), writes.clone()));
            }
            queue
        });
        if let Err(mpsc::error::SendError(write)) = queue.send(write) {
            let answer = writer.alone(&write).await;
            writer.writing.fetch_sub(1, Ordering::AcqRel);
            write.answer(answer);
        }
    }
}
