//! [`TransactionalStore`] on PostgreSQL: a transactional step's transaction is a pooled
//! connection in a transaction at the database's default isolation (READ COMMITTED unless
//! configured otherwise; take row locks, `SELECT .. FOR UPDATE`, where the body reads to
//! write). The body runs its statements on it (`tx.postgres()`); the commit appends the step's
//! result with the shared policy's fenced append, whose `UPDATE` of the run's row waits for
//! (and then fails against) a takeover, in the same transaction. Dropped without a commit, it
//! rolls back.
//!
//! The lease is checked once, by that fence at the commit, not also when the transaction
//! begins: a begin-time read would cost every step a round trip and decide nothing (the lease
//! can be lost right after it). A worker that lost its lease may run the body's statements,
//! but they roll back with the refused commit.

use std::any::Any;

use sqlx::{PgConnection, Postgres};

use super::PostgresStore;
use crate::error::StoreError;
use crate::store::sql::policy;
use crate::store::sql::EncodedAppend;
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
        // No lease read here: the commit's fence decides (see the module's documentation).
        let _ = lease;
        let tx = self.inner.pool.begin().await?;
        Ok(Some(Box::new(PgStepTx {
            tx,
            store: self.clone(),
        })))
    }
}
