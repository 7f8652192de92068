//! [`TransactionalStore`] on PostgreSQL: a transactional step's transaction is a pooled
//! connection in a transaction at the database's default isolation (READ COMMITTED unless
//! configured otherwise; the lease check is its first statement, so a body cannot change the
//! level and takes row locks, `SELECT .. FOR UPDATE`, where it reads to write). The body runs
//! its statements on it (`tx.postgres()`); the commit appends the step's result with the
//! shared policy's fenced append, whose `UPDATE` of the run's row waits for (and then fails
//! against) a takeover, in the same transaction. Dropped without a commit, it rolls back.

use std::any::Any;

use sqlx::{PgConnection, Postgres};

use super::PostgresStore;
use crate::error::StoreError;
use crate::store::sql::policy;
use crate::store::sql::{sql_epoch, EncodedAppend};
use crate::store::{Append, Lease, StepTransaction, TransactionalStore};

/// An open step transaction on PostgreSQL, as the body's `Tx` finds it.
pub(crate) struct PgStepTx {
    tx: sqlx::Transaction<'static, Postgres>,
    store: PostgresStore,
}

impl PgStepTx {
    /// The connection, inside the transaction.
    pub(crate) fn connection(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

#[async_trait::async_trait]
impl StepTransaction for PgStepTx {
    fn store_name(&self) -> &'static str {
        "PostgreSQL"
    }

    fn as_any(&mut self) -> &mut (dyn Any + Send) {
        self
    }

    async fn commit(self: Box<Self>, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        let write = EncodedAppend::new(write)?;
        let PgStepTx { mut tx, store } = *self;
        let began = std::time::Instant::now();
        // On an error `tx` is dropped: the connection goes back to the pool rolled back.
        policy::append(&mut store.tx(&mut tx), lease, &write).await?;
        tx.commit().await?;
        crate::telemetry::store_commit("postgres", began.elapsed());
        Ok(())
    }
}

#[async_trait::async_trait]
impl TransactionalStore for PostgresStore {
    async fn begin_step(
        &self,
        lease: &Lease,
    ) -> Result<Option<Box<dyn StepTransaction>>, StoreError> {
        let mut tx = self.inner.pool.begin().await?;
        // Read, not locked: the run's row stays free for heartbeats while the body runs; the
        // append's fence at the commit is what decides.
        let held: Option<i32> = sqlx::query_scalar(&self.inner.sql.lease_held)
            .bind(lease.run_id.to_string())
            .bind(sql_epoch(lease.epoch))
            .fetch_optional(&mut *tx)
            .await?;
        if held.is_none() {
            return Err(StoreError::LeaseLost(lease.run_id));
        }
        Ok(Some(Box::new(PgStepTx {
            tx,
            store: self.clone(),
        })))
    }
}

/// Whether `e` is a serialization failure or a deadlock (SQLSTATE 40001, 40P01): the
/// attempt is run again.
pub(crate) fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().is_some_and(|c| c == "40001" || c == "40P01"))
}
