//! [`QueueStore`] on SQLite: declaring queues and reading their state. Each method sends its
//! work to the writer (`write`) or a reader (`read`) and decodes the rows; which runs a queue
//! lets begin is decided by the shared policy when runs are acquired, not here.

use std::time::SystemTime;

use rusqlite::params;

use super::statements::SQL;
use super::tx::{all, exec, one};
use super::SqliteStore;
use crate::error::StoreError;
use crate::store::sql::policy::{self};
use crate::store::sql::rows::QueueRow;
use crate::store::sql::sql_time;
use crate::store::{QueueDef, QueueInfo, QueueStore};

#[async_trait::async_trait]
impl QueueStore for SqliteStore {
    async fn define_queues(&self, queues: &[QueueDef]) -> Result<(), StoreError> {
        let rows = policy::queue_rows(queues);
        let at = sql_time(SystemTime::now());
        self.write(move |tx| {
            for (name, concurrency, rate, period) in &rows {
                exec(
                    tx,
                    SQL.define_queue,
                    params![name, concurrency, rate, period, at],
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        let at = sql_time(now);
        let opening: Option<i64> = self
            .read(move |conn| one(conn, SQL.queue_opening, [at], |r| r.get(0)))
            .await?
            .flatten();
        opening
            .map(|ms| crate::store::sql::time_of(ms, "-", "queue opening"))
            .transpose()
    }

    async fn has_waiting_runs(&self) -> Result<bool, StoreError> {
        self.read(|conn| {
            Ok(one(conn, SQL.has_waiting, [], |r| r.get::<_, bool>(0))?.unwrap_or(false))
        })
        .await
    }

    async fn list_queues(&self, now: SystemTime) -> Result<Vec<QueueInfo>, StoreError> {
        let at = sql_time(now);
        let rows = self
            .read(move |conn| all(conn, SQL.list_queues, [at], QueueRow::from_sqlite))
            .await?;
        rows.into_iter().map(QueueRow::decode).collect()
    }
}
