//! Continue-as-new on PostgreSQL: the statement of [`ChainTx`] (what the next run inherits,
//! in one round trip after the fence) and the continuation itself, one transaction. The
//! decision (fence, lock order, what is recorded) is the shared policy's
//! (`store::sql::policy::chain`).

use super::listen::{NOTE_ENDED, NOTE_READY};
use super::tx::Pg;
use super::PostgresStore;
use crate::error::StoreError;
use crate::store::sql::policy::{self, ChainTx, NextRunRow};
use crate::store::sql::rows::RunRow;
use crate::store::sql::{EncodedAppend, EncodedInbox};
use crate::store::{check_continuation, Append, Lease, LeasedRun, NewRun, CHILD_NOTICE_TOKEN};

impl ChainTx for Pg<'_> {
    async fn requeue(&mut self, run: &str, e: &EncodedInbox, now: i64) -> Result<(), StoreError> {
        sqlx::query(&self.sql.dialect.chain.requeue)
            .bind(e.id)
            .bind(run)
            .bind(&e.token)
            .bind(&e.topic)
            .bind(&e.payload)
            .bind(now)
            .bind(e.topic.is_none())
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn continue_run(
        &mut self,
        old: &str,
        next: &NextRunRow,
        now: i64,
    ) -> Result<Option<RunRow>, StoreError> {
        let row: Option<RunRow> = sqlx::query_as(&self.sql.dialect.chain.continue_run)
            .bind(old)
            .bind(&next.key)
            .bind(&next.workflow)
            .bind(&next.input)
            .bind(next.at)
            .bind(now)
            .bind(CHILD_NOTICE_TOKEN)
            .bind(next.leased)
            .fetch_optional(&mut *self.conn)
            .await?;
        if row.is_none() {
            return Ok(None);
        }
        // A leased next run is driven by the caller: no other worker need look.
        let mut notes = vec![format!("{NOTE_ENDED}{old}")];
        if !next.leased {
            notes.push(NOTE_READY.to_owned());
        }
        self.announce(notes).await?;
        Ok(row)
    }
}

impl PostgresStore {
    /// [`crate::store::RunStore::continue_as_new`] in one transaction.
    /// The next run leased to the caller when `leased`, and then returned.
    pub(super) async fn continue_chain(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
        leased: bool,
    ) -> Result<Option<LeasedRun>, StoreError> {
        check_continuation(write, &next)?;
        let write = EncodedAppend::timed(write, std::time::SystemTime::now)?;
        let next = NextRunRow::new(&next, leased)?;
        self.in_tx_noting(async |pg| policy::continue_as_new(pg, lease, &write, &next).await)
            .await
    }
}
