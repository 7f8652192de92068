//! Continue-as-new on PostgreSQL: the statement of [`ChainTx`] (what the next run inherits,
//! in one round trip after the fence) and the continuation itself, one transaction. The
//! decision (fence, lock order, what is recorded) is the shared policy's
//! (`store::sql::policy::chain`).

use super::listen::{NOTE_ENDED, NOTE_READY};
use super::tx::Pg;
use super::PostgresStore;
use crate::error::StoreError;
use crate::store::sql::policy::{self, ChainTx, NextRunRow};
use crate::store::sql::EncodedAppend;
use crate::store::{check_continuation, Append, Lease, NewRun, CHILD_NOTICE_TOKEN};

/// The statements of a continuation in schema `s`.
pub(super) struct ChainSql {
    /// `$1` the old run, `$2` the next run, `$3` its workflow, `$4` its input, `$5` its
    /// admission, `$6` now, `$7` the token of children's ends (which stay with the old run).
    /// The inherited columns are copied in `next` (a column a run keeps through its chain is
    /// added to both of its lists), the trace context among them. One row: whether the next run was
    /// inserted.
    pub(super) continue_run: String,
    /// `Tx::bind_inherited`: `$1` token, `$2` run.
    pub(super) bind_inherited: String,
}

impl ChainSql {
    pub(super) fn new(s: &str) -> Self {
        ChainSql {
            continue_run: format!(
                "WITH next AS (
                     INSERT INTO {s}.runs
                         (id, workflow, status, input, created_at, updated_at, wake_at,
                          hook_token, deadline, parent_id, detached, queue, partition_key,
                          priority, began_at, version, trace_context, previous_run, origin)
                     SELECT $2, $3, 'pending', $4, $5, $5, $5,
                            hook_token, deadline, parent_id, detached, queue, partition_key,
                            priority, began_at, version, trace_context, id, COALESCE(origin, id)
                     FROM {s}.runs WHERE id = $1
                     RETURNING id),
                 ended AS (
                     UPDATE {s}.runs SET status = 'continued_as_new', next_run = $2,
                         lease_until = NULL, updated_at = $6
                     WHERE id = $1),
                 hooks AS (
                     UPDATE {s}.hooks SET run_id = $2, inherited = TRUE
                     WHERE run_id = $1 AND active),
                 inbox AS (
                     UPDATE {s}.hook_inbox SET run_id = $2 WHERE run_id = $1 AND token <> $7),
                 message_keys AS (
                     UPDATE {s}.message_keys SET run_id = $2 WHERE run_id = $1),
                 requests AS (
                     UPDATE {s}.run_requests SET run_id = $2
                     WHERE run_id = $1 AND reply IS NULL),
                 published AS (
                     INSERT INTO {s}.run_events (run_id, key, value, at)
                     SELECT $2, key, value, at FROM {s}.run_events WHERE run_id = $1),
                 ticks AS (
                     UPDATE {s}.schedule_ticks SET run_id = $2 WHERE run_id = $1)
                 SELECT EXISTS (SELECT 1 FROM next)"
            ),
            bind_inherited: format!(
                "UPDATE {s}.hooks SET inherited = FALSE
                 WHERE token = $1 AND run_id = $2 AND active AND inherited"
            ),
        }
    }
}

impl ChainTx for Pg<'_> {
    async fn continue_run(
        &mut self,
        old: &str,
        next: &NextRunRow,
        now: i64,
    ) -> Result<(), StoreError> {
        let inserted: bool = sqlx::query_scalar(&self.sql.dialect.chain.continue_run)
            .bind(old)
            .bind(&next.key)
            .bind(&next.workflow)
            .bind(&next.input)
            .bind(next.at)
            .bind(now)
            .bind(CHILD_NOTICE_TOKEN)
            .fetch_one(&mut *self.conn)
            .await?;
        if !inserted {
            return Err(StoreError::database(format!(
                "the run continuing {old} was not admitted"
            )));
        }
        self.announce(vec![NOTE_READY.to_owned(), format!("{NOTE_ENDED}{old}")])
            .await
    }
}

impl PostgresStore {
    /// [`crate::store::RunStore::continue_as_new`] in one transaction.
    pub(super) async fn continue_chain(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
    ) -> Result<(), StoreError> {
        check_continuation(write, &next)?;
        let write = EncodedAppend::timed(write, std::time::SystemTime::now)?;
        let next = NextRunRow::new(&next)?;
        self.in_tx_noting(async |pg| policy::continue_as_new(pg, lease, &write, &next).await)
            .await
    }
}
