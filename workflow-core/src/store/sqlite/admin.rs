//! [`AdminStore`] on SQLite: listing runs and pruning ended ones. Listing reads on a reader
//! thread; pruning is the shared policy's, run on the writer, which this file must not repeat.

use std::time::SystemTime;

use super::statements::SQL;
use super::tx::{all, now, Lite};
use super::SqliteStore;
use crate::error::StoreError;
use crate::store::sql::policy::{self};
use crate::store::sql::rows::RunRow;
use crate::store::{AdminStore, PruneStats, RunCount, RunFilter, RunRecord};

#[async_trait::async_trait]
impl AdminStore for SqliteStore {
    async fn prune(&self, before: SystemTime, now: SystemTime) -> Result<PruneStats, StoreError> {
        self.write(move |tx| self::now(policy::prune(&mut Lite(tx), before, now)))
            .await
    }

    async fn run_counts(&self) -> Result<Vec<RunCount>, StoreError> {
        let rows: Vec<(String, String, i64)> = self
            .read(|conn| {
                all(conn, SQL.run_counts, [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
            })
            .await?;
        policy::counted(rows)
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let args = policy::run_filter(filter);
        let rows = self
            .read(move |conn| all(conn, SQL.list_runs, args, RunRow::from_sqlite))
            .await?;
        let runs = rows
            .into_iter()
            .map(RunRow::decode)
            .collect::<Result<_, _>>()?;
        policy::listed(self, filter, runs).await
    }
}
