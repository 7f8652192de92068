//! [`AdminStore`] for PostgreSQL: pruning ended runs and listing runs. Binds requests to the
//! shared policy and the statements; holds no SQL and no decision of its own.

use std::time::SystemTime;

use super::stash::settle;
use super::PostgresStore;
use crate::error::StoreError;
use crate::store::sql::policy::{self};
use crate::store::sql::rows::RunRow;
use crate::store::{AdminStore, PruneStats, RunCount, RunFilter, RunRecord};

#[async_trait::async_trait]
impl AdminStore for PostgresStore {
    async fn prune(&self, before: SystemTime, now: SystemTime) -> Result<PruneStats, StoreError> {
        let mut tx = self.begin().await?;
        let pruned = policy::prune(&mut self.tx(&mut tx), before, now).await;
        settle(tx, pruned).await
    }

    async fn run_counts(&self) -> Result<Vec<RunCount>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.run_counts)
            .fetch_all(&mut *conn)
            .await;
        policy::counted(conn.kept(rows)?)
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let (status, workflow, limit, queue, parent, after, before, cursor, version) =
            policy::run_filter(filter);
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.list_runs)
            .bind(status)
            .bind(workflow)
            .bind(limit)
            .bind(queue)
            .bind(parent)
            .bind(after)
            .bind(before)
            .bind(cursor)
            .bind(version)
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<RunRow> = conn.kept(rows)?;
        let runs = rows
            .into_iter()
            .map(RunRow::decode)
            .collect::<Result<_, _>>()?;
        policy::listed(self, filter, runs).await
    }
}
