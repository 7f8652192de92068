//! Transactional steps: a transaction of the store's own database, in which a step's
//! body writes the user's tables and the runtime then records the step's result, fenced by the
//! run's lease, all in one commit. A worker that lost the lease commits nothing; a crash before
//! the commit leaves nothing. [`TransactionalStore`] opens one; the [`StepTransaction`] it
//! returns is what `Tx` (the step's first parameter) lends to the body, and what the runtime
//! commits.

use std::any::Any;

use super::{Append, Lease};
use crate::error::StoreError;

/// An open transaction of a transactional step, on the store's own database.
///
/// Dropped without [`StepTransaction::commit`], it rolls back: nothing the body wrote is
/// kept. Busy and serialization failures are reported as transient [`StoreError`]s (see
/// [`StoreError::is_transient`]); the runtime then runs the whole attempt again in a new
/// transaction.
#[async_trait::async_trait]
pub trait StepTransaction: Send {
    /// The database, for messages: `"SQLite"` or `"PostgreSQL"`.
    fn store_name(&self) -> &'static str;

    /// The transaction itself, for the accessors of `Tx` (`tx.sqlite(..)`, `tx.postgres()`)
    /// to find their database's connection.
    fn as_any(&mut self) -> &mut (dyn Any + Send);

    /// Appends `write` to the run of `lease` as [`super::RunStore::append`] does, in this
    /// transaction, and commits everything: the body's writes and the append together, or
    /// (on [`StoreError::LeaseLost`] or any other error) nothing.
    async fn commit(self: Box<Self>, lease: &Lease, write: &Append) -> Result<(), StoreError>;
}

/// Stores whose database can hold a step's writes and its recorded result in one
/// transaction: SQLite and PostgreSQL. The memory store has none (the default).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use workflow_core::store::memory::MemoryStore;
/// use workflow_core::store::{Lease, TransactionalStore};
/// use workflow_core::RunId;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let lease = Lease { run_id: RunId::new(), epoch: 1 };
/// // Nothing in memory can commit together with the user's own database.
/// assert!(store.begin_step(&lease).await.unwrap().is_none());
/// # }
/// ```
#[async_trait::async_trait]
pub trait TransactionalStore: Send + Sync + 'static {
    /// Begins a step transaction for the run of `lease`. The commit is what is fenced: under
    /// a lease that is no longer current it fails with [`StoreError::LeaseLost`] and nothing
    /// of the transaction stays. A store may also refuse to begin under a lost lease where
    /// checking costs nothing (SQLite checks once it holds the file's write lock; PostgreSQL
    /// leaves it to the commit rather than spend a round trip per step). `None`: this store
    /// has no transactions to offer (the default).
    async fn begin_step(
        &self,
        lease: &Lease,
    ) -> Result<Option<Box<dyn StepTransaction>>, StoreError> {
        let _ = lease;
        Ok(None)
    }
}
