//! [`QueueStore`] for PostgreSQL: declaring queues, their next opening and their occupancy.
//! Binds requests to the statements; which queued runs begin is the shared policy's, decided in
//! `acquire`.

use std::time::SystemTime;

use super::PostgresStore;
use crate::error::StoreError;
use crate::store::sql::policy::{self};
use crate::store::sql::rows::QueueRow;
use crate::store::sql::sql_time;
use crate::store::{QueueDef, QueueInfo, QueueStore, RunStore};

#[async_trait::async_trait]
impl QueueStore for PostgresStore {
    async fn define_queues(&self, queues: &[QueueDef]) -> Result<(), StoreError> {
        if queues.is_empty() {
            return Ok(());
        }
        let rows = policy::queue_rows(queues);
        let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let concurrency: Vec<Option<i64>> = rows.iter().map(|r| r.1).collect();
        let rates: Vec<Option<i64>> = rows.iter().map(|r| r.2).collect();
        let periods: Vec<Option<i64>> = rows.iter().map(|r| r.3).collect();
        let at = self.now().await?.unwrap_or_else(SystemTime::now);
        let mut conn = self.conn().await?;
        let done = sqlx::query(&self.inner.sql.define_queue)
            .bind(names)
            .bind(concurrency)
            .bind(rates)
            .bind(periods)
            .bind(sql_time(at))
            .execute(&mut *conn)
            .await;
        conn.kept(done)?;
        Ok(())
    }

    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        let mut conn = self.conn().await?;
        let opening = sqlx::query_scalar(&self.inner.sql.queue_opening)
            .bind(sql_time(now))
            .fetch_one(&mut *conn)
            .await;
        let opening: Option<i64> = conn.kept(opening)?;
        opening
            .map(|ms| crate::store::sql::time_of(ms, "-", "queue opening"))
            .transpose()
    }

    async fn has_waiting_runs(&self) -> Result<bool, StoreError> {
        let mut conn = self.conn().await?;
        let waiting = sqlx::query_scalar(&self.inner.sql.has_waiting)
            .fetch_one(&mut *conn)
            .await;
        conn.kept(waiting)
    }

    async fn list_queues(&self, now: SystemTime) -> Result<Vec<QueueInfo>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.inner.sql.list_queues)
            .bind(sql_time(now))
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<QueueRow> = conn.kept(rows)?;
        rows.into_iter().map(QueueRow::decode).collect()
    }
}
