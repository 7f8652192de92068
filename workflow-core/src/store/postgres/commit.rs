//! Group commit: the committers that take waiting writes (appends and admissions without a
//! token), commit them together in one transaction per group, and answer each caller after the
//! commit. A write here runs the shared policy on `Pg`; this file decides only how writes are
//! grouped, ordered and retried alone, never what a write means.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sqlx::PgConnection;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::listen::{notifier, Notifier};
use super::stash::{Conn, Stash};
use super::statements::Statements;
use super::tx::Pg;
use super::PostgresStore;
use crate::error::{DatabaseError, StoreError};
use crate::ids::RunId;
use crate::store::sql::policy::{self, Answer, GroupError, GroupWrite, NewRunRow};
use crate::store::sql::EncodedAppend;
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

    /// The write as the group policy sees it.
    pub(super) fn as_group(&self) -> GroupWrite<'_> {
        match self {
            Write::Append(lease, write, _) => GroupWrite::Append(lease, write),
            Write::Admit(row, _) => GroupWrite::Admit(row),
        }
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

    /// The writes in one transaction, as `policy::group` writes them: each write's own
    /// answer once committed, or a redo of each alone when a statement may have aborted the
    /// transaction (PostgreSQL aborts it on any failed statement). A deadlock left
    /// (PostgreSQL detects it and aborts one transaction) costs its batch a redo, not an
    /// error.
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

    /// The writes of `batch` on `tx`, a transaction, as the group policy writes them: their
    /// answers, or how the transaction must end instead (rolled back, then redone alone or
    /// failed).
    pub(super) async fn together_on(
        &self,
        tx: &mut PgConnection,
        batch: &[Write],
        notes: &mut Vec<String>,
    ) -> Result<Vec<Answer>, Group> {
        let writes: Vec<GroupWrite<'_>> = batch.iter().map(Write::as_group).collect();
        policy::group(&mut self.pg(tx, false, notes), &writes)
            .await
            .map_err(|e| match e {
                GroupError::Redo(why) => {
                    tracing::debug!(error = %why, "a group's statement failed; its writes are redone alone");
                    Group::Redo
                }
                GroupError::Failed(why) => Group::Failed(database_of(why)),
            })
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
