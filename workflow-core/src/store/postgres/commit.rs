//! Group commit: the committers that take waiting writes (appends and admissions without a
//! token), commit them together in one transaction per group, and answer each caller after the
//! commit. A write here runs the shared policy on `Pg`; this file decides only how writes are
//! grouped, ordered and retried alone, never what a write means.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
use crate::store::sql::batch::{self, Committer, Finish, Group, Request};
use crate::store::sql::policy::{self, Admitted, Answer, GroupError, GroupWrite, NewRunRow};
use crate::store::sql::{EncodedAppend, EncodedEvents};
use crate::store::Lease;

/// Committers per store, each committing one batch at a time on a pooled connection: while
/// one waits for its commit (the WAL flush), the next takes the writes that arrived meanwhile.
pub(super) const COMMITTERS: usize = 4;
/// Writes per group transaction at most.
pub(super) const MAX_BATCH: usize = 256;

/// A write the committers take: an append, or an admission without a hook token (one
/// insert), each a request carrying where its answer goes.
pub(super) enum Write {
    Append(Request<(Lease, EncodedAppend), ()>),
    /// With the first events of a run leased at admission, written with it (boxed: most
    /// admissions have none).
    Admit(Request<(NewRunRow, Option<Box<EncodedEvents>>), Admitted>),
}

impl Write {
    /// An append and where its caller waits for the answer.
    pub(super) fn append(lease: Lease, write: EncodedAppend) -> (Self, Waiting<()>) {
        let (request, answer) = Request::new((lease, write));
        (Write::Append(request), answer)
    }

    /// An admission (with the first events of a run leased at admission) and where its
    /// caller waits for the answer.
    pub(super) fn admit(row: NewRunRow, first: Option<EncodedEvents>) -> (Self, Waiting<Admitted>) {
        let (request, answer) = Request::new((row, first.map(Box::new)));
        (Write::Admit(request), answer)
    }

    /// The run it writes: a group transaction writes its runs in id order, the order
    /// heartbeats lock rows in (see `heartbeat`), so the two never wait for each other both
    /// ways.
    pub(super) fn run_id(&self) -> &RunId {
        match self {
            Write::Append(r) => &r.write.0.run_id,
            Write::Admit(r) => &r.write.0.id,
        }
    }

    /// The write as the group policy sees it.
    pub(super) fn as_group(&self) -> GroupWrite<'_> {
        match self {
            Write::Append(r) => GroupWrite::Append(&r.write.0, &r.write.1),
            Write::Admit(r) => GroupWrite::Admit(&r.write.0, r.write.1.as_deref()),
        }
    }

    /// Its policy, on `pg`.
    pub(super) async fn apply(&self, pg: &mut Pg<'_>) -> Answer {
        match self {
            Write::Append(r) => Answer::Append(policy::append(pg, &r.write.0, &r.write.1).await),
            Write::Admit(r) => match &r.write {
                (row, None) => Answer::Admit(policy::admit(pg, row).await),
                // One statement with its events (see `Tx::insert_many`).
                (row, Some(first)) => Answer::Admit(
                    policy::admit_many(pg, &[row], &[Some(first)])
                        .await
                        .and_then(|mut answers| {
                            answers.pop().unwrap_or_else(|| {
                                Err(StoreError::database(
                                    "internal error: an admission went unanswered",
                                ))
                            })
                        }),
                ),
            },
        }
    }

    /// Records `answer` as the write's own. An answer of the other kind cannot happen; it
    /// is reported, not panicked on.
    pub(super) fn written(&mut self, answer: Answer) {
        let mismatch = || StoreError::database("internal error: a write got another's answer");
        match (self, answer) {
            (Write::Append(r), Answer::Append(a)) => r.written(a),
            (Write::Admit(r), Answer::Admit(a)) => r.written(a),
            (Write::Append(r), _) => r.written(Err(mismatch())),
            (Write::Admit(r), _) => r.written(Err(mismatch())),
        }
    }

    /// The answer of this write failing with `e`.
    pub(super) fn failed(&self, e: StoreError) -> Answer {
        match self {
            Write::Append(..) => Answer::Append(Err(e)),
            Write::Admit(..) => Answer::Admit(Err(e)),
        }
    }
}

impl Finish for Write {
    fn finish(self, commit: Result<(), &DatabaseError>) {
        match self {
            Write::Append(r) => r.finish(commit),
            Write::Admit(r) => r.finish(commit),
        }
    }
}

/// Where a caller waits for its write's answer.
pub(super) type Waiting<T> = oneshot::Receiver<Result<T, StoreError>>;

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
    /// Transactions that committed writes of group commit: one per group, one per write
    /// committed alone (by a committer or its caller); a write refused alone counts none.
    pub(super) commits: Arc<AtomicU64>,
    pub(super) notifier: Arc<Notifier>,
    /// Each group the committers wrote together.
    #[cfg(test)]
    pub(super) groups: Arc<std::sync::Mutex<Vec<GroupRecord>>>,
}

/// A group the committers wrote together: its writes' kinds, in the order written, and
/// whether its transaction committed.
#[cfg(test)]
#[derive(Clone, Debug)]
pub(super) struct GroupRecord {
    pub(super) kinds: Vec<&'static str>,
    pub(super) committed: bool,
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

/// Takes the writes waiting in `writes` as groups (at least one write: a lone write goes out
/// at once) and commits each, until every store clone is gone.
pub(super) async fn committer(writer: Writer, writes: Arc<Mutex<mpsc::UnboundedReceiver<Write>>>) {
    loop {
        let group = {
            // Held only while taking writes, never while committing them.
            let mut queue = writes.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            batch::take(first, MAX_BATCH, || queue.try_recv().ok())
        };
        let n = group.len();
        batch::commit(&writer, group).await;
        writer.writing.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The committers' side of group commit: a group in one transaction on a pooled connection,
/// in run-id order; a write alone as one statement where it is one.
impl Committer for Writer {
    type Request = Write;

    fn order(&self, group: &mut [Write]) {
        group.sort_by(|a, b| a.run_id().cmp(b.run_id()));
    }

    async fn together(&self, group: &mut [Write]) -> Group {
        let written = self.in_one_transaction(group).await;
        #[cfg(test)]
        self.record(group, written.is_ok());
        match written {
            Ok(answers) => {
                for (write, answer) in group.iter_mut().zip(answers) {
                    write.written(answer);
                }
                Group::Committed
            }
            Err(ended) => ended,
        }
    }

    /// The answer says how the write's own transaction ended.
    async fn alone(&self, write: &mut Write) -> Result<(), DatabaseError> {
        let answer = self.write_alone(write).await;
        write.written(answer);
        Ok(())
    }
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

    /// One write in its own transaction, as if no other were waiting: a write of one
    /// statement (a step's events, a run's usual end, an admission) commits by itself,
    /// without BEGIN and COMMIT.
    pub(super) async fn write_alone(&self, write: &Write) -> Answer {
        let single = match write {
            // Both are one statement (see `policy::append`).
            Write::Append(r) => r.write.1.events_only() || r.write.1.plain_end(),
            // A queued run that may begin at admission takes its queue's lock, then inserts
            // (`Tx::admit_begun`): two statements, the lock held to the commit.
            Write::Admit(r) => r.write.0.queue_lease.is_none(),
        };
        let conn = match self.stash.conn().await {
            Ok(conn) => conn,
            Err(e) => return write.failed(e),
        };
        let began = std::time::Instant::now();
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
            self.commits.fetch_add(1, Ordering::Relaxed);
            crate::telemetry::store_commit("postgres", began.elapsed());
            self.announce(notes);
        }
        answer
    }

    /// Records `group`'s kinds of writes and whether its transaction `committed`.
    #[cfg(test)]
    fn record(&self, group: &[Write], committed: bool) {
        let kinds = group
            .iter()
            .map(|w| match w {
                Write::Admit(..) => "admit",
                Write::Append(r) if r.write.1.end.is_some() => "end",
                Write::Append(..) => "append",
            })
            .collect();
        crate::sync::lock(&self.groups).push(GroupRecord { kinds, committed });
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
    pub(super) async fn in_one_transaction(&self, batch: &[Write]) -> Result<Vec<Answer>, Group> {
        let began = std::time::Instant::now();
        let begun = match self.stash.conn().await {
            Ok(conn) => conn.begin().await,
            Err(e) => Err(e),
        };
        let mut tx = match begun {
            Ok(tx) => tx,
            Err(e) => return Err(Group::Failed(database_of(e))),
        };
        let mut notes = Vec::new();
        match self.together_on(&mut tx, batch, &mut notes).await {
            Ok(answers) => match tx.commit().await {
                Ok(()) => {
                    self.commits.fetch_add(1, Ordering::Relaxed);
                    crate::telemetry::store_commit("postgres", began.elapsed());
                    self.announce(notes);
                    Ok(answers)
                }
                Err(e) => Err(Group::Failed(database_of(e))),
            },
            Err(group) => {
                if let Err(why) = tx.rollback().await {
                    tracing::debug!(error = %why, "rolling back after an error failed");
                }
                Err(group)
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
            let mut write = write;
            let ended = writer.alone(&mut write).await;
            // Uncounted before the answer: the caller's next write, sent at once, goes alone
            // too.
            drop(under_way);
            write.finish(ended.as_ref().map(|_| ()));
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
        if let Err(mpsc::error::SendError(mut write)) = queue.send(write) {
            let ended = writer.alone(&mut write).await;
            writer.writing.fetch_sub(1, Ordering::AcqRel);
            write.finish(ended.as_ref().map(|_| ()));
        }
    }
}
