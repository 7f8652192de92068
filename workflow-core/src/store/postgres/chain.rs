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
