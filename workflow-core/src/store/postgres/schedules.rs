//! [`ScheduleStore`] for PostgreSQL: the schedules' statements and the methods (their tables
//! are `schema.rs`'s migration 7). Firing a tick is the shared policy's
//! (`store::sql::schedules::fire_tick`), in one transaction with the run's admission; the
//! schedule's row lock makes firings of one schedule take turns, the record's primary key
//! decides between firings of one tick. Changes to schedules are announced after their commit
//! (`NOTE_SCHEDULES`), so other processes' firing loops look again at once.

use std::time::SystemTime;

use super::listen::NOTE_SCHEDULES;
use super::schema::quote_ident;
use super::stash::settle;
use super::tx::Pg;
use super::PostgresStore;
use crate::error::StoreError;
use crate::store::sql::schedules::{
    decode_schedule, decode_tick, encode_def, fire_tick, ScheduleCols, ScheduleSql, ScheduleTx,
    TickCols, TickRow,
};
use crate::store::sql::{sql_id, sql_time};
use crate::store::{NewTick, ScheduleDef, ScheduleState, ScheduleStore, TickRecord, TickWrite};

/// The statements of this file (`ScheduleSql`), `{s}` standing for the quoted schema.
const SQL: ScheduleSql = ScheduleSql {
    define: "INSERT INTO {s}.schedules (name, def, paused, next_at, created_at, updated_at)
         VALUES ($1, $2, FALSE, $3, $4, $4)
         ON CONFLICT (name) DO UPDATE SET def = excluded.def, updated_at = excluded.updated_at,
             next_at = LEAST(schedules.next_at, excluded.next_at)",
    list: "SELECT s.name, s.def, s.paused, s.next_at,
             (SELECT MAX(t.nominal) FROM {s}.schedule_ticks t WHERE t.schedule = s.name),
             (SELECT t.nominal FROM {s}.schedule_ticks t WHERE t.schedule = s.name
                AND t.outcome = 'started' AND NOT t.backfill ORDER BY t.nominal DESC LIMIT 1),
             (SELECT t.run_id FROM {s}.schedule_ticks t WHERE t.schedule = s.name
                AND t.outcome = 'started' AND NOT t.backfill ORDER BY t.nominal DESC LIMIT 1),
             (SELECT MIN(t.nominal) FROM {s}.schedule_ticks t WHERE t.schedule = s.name
                AND t.outcome = 'buffered')
         FROM {s}.schedules s ORDER BY s.name",
    lock: "SELECT 1 FROM {s}.schedules WHERE name = $1 FOR UPDATE",
    upsert_tick: "INSERT INTO {s}.schedule_ticks
             (schedule, nominal, outcome, run_id, backfill, recorded_at)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (schedule, nominal) DO UPDATE SET outcome = excluded.outcome,
             run_id = excluded.run_id, backfill = excluded.backfill,
             recorded_at = excluded.recorded_at
         WHERE $7 AND schedule_ticks.run_id IS NULL
         RETURNING 1",
    advance: "UPDATE {s}.schedules SET next_at = GREATEST(next_at, $2) WHERE name = $1",
    trim: "DELETE FROM {s}.schedule_ticks WHERE schedule = $1 AND nominal <
         (SELECT nominal FROM {s}.schedule_ticks WHERE schedule = $1
          ORDER BY nominal DESC LIMIT 1 OFFSET $2)",
    ticks: "SELECT schedule, nominal, outcome, run_id, backfill, recorded_at
         FROM {s}.schedule_ticks WHERE schedule = $1 ORDER BY nominal DESC LIMIT $2",
    pause: "UPDATE {s}.schedules SET paused = $2, next_at = GREATEST(next_at, $3::BIGINT)
         WHERE name = $1",
    delete: "DELETE FROM {s}.schedules WHERE name = $1",
    delete_ticks: "DELETE FROM {s}.schedule_ticks WHERE schedule = $1",
};

/// `sql` for the schema `schema`.
fn on(sql: &str, schema: &str) -> String {
    sql.replace("{s}", &quote_ident(schema))
}

impl ScheduleTx for Pg<'_> {
    async fn lock_schedule(&mut self, name: &str) -> Result<bool, StoreError> {
        let found: Option<i32> = sqlx::query_scalar(&on(SQL.lock, self.channel))
            .bind(name)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(found.is_some())
    }

    async fn upsert_tick(&mut self, t: &TickRow) -> Result<bool, StoreError> {
        let written: Option<i32> = sqlx::query_scalar(&on(SQL.upsert_tick, self.channel))
            .bind(&t.schedule)
            .bind(t.nominal)
            .bind(t.outcome)
            .bind(&t.run_id)
            .bind(t.backfill)
            .bind(t.recorded_at)
            .bind(t.replace_runless)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(written.is_some())
    }

    async fn advance(&mut self, name: &str, next: i64) -> Result<(), StoreError> {
        sqlx::query(&on(SQL.advance, self.channel))
            .bind(name)
            .bind(next)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn trim_ticks(&mut self, name: &str, keep: i64) -> Result<(), StoreError> {
        sqlx::query(&on(SQL.trim, self.channel))
            .bind(name)
            .bind(keep - 1)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }
}

impl PostgresStore {
    /// Tells every process's firing loop that the schedules changed (after the commit).
    fn schedules_changed(&self) {
        self.inner.writer.announce(vec![NOTE_SCHEDULES.to_owned()]);
    }

    fn sql(&self, sql: &str) -> String {
        on(sql, &self.inner.schema)
    }
}

#[async_trait::async_trait]
impl ScheduleStore for PostgresStore {
    async fn define_schedule(
        &self,
        def: &ScheduleDef,
        next: Option<SystemTime>,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let json = encode_def(def)?;
        let mut conn = self.conn().await?;
        let done = sqlx::query(&self.sql(SQL.define))
            .bind(&def.name)
            .bind(json)
            .bind(next.map(sql_time))
            .bind(sql_time(at))
            .execute(&mut *conn)
            .await;
        conn.kept(done)?;
        self.schedules_changed();
        Ok(())
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleState>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.sql(SQL.list))
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<ScheduleCols> = conn.kept(rows)?;
        rows.into_iter().map(decode_schedule).collect()
    }

    async fn fire_tick(&self, tick: NewTick) -> Result<TickWrite, StoreError> {
        let row = TickRow::new(tick)?;
        self.in_tx_noting(async |pg| fire_tick(pg, &row).await)
            .await
    }

    async fn advance_schedule(&self, name: &str, next: SystemTime) -> Result<bool, StoreError> {
        let mut conn = self.conn().await?;
        let done = sqlx::query(&self.sql(SQL.advance))
            .bind(name)
            .bind(sql_time(next))
            .execute(&mut *conn)
            .await;
        Ok(conn.kept(done)?.rows_affected() > 0)
    }

    async fn schedule_ticks(&self, name: &str, n: usize) -> Result<Vec<TickRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as(&self.sql(SQL.ticks))
            .bind(name)
            .bind(sql_id(n))
            .fetch_all(&mut *conn)
            .await;
        let rows: Vec<TickCols> = conn.kept(rows)?;
        rows.into_iter().map(decode_tick).collect()
    }

    async fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
        next: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn().await?;
        let done = sqlx::query(&self.sql(SQL.pause))
            .bind(name)
            .bind(paused)
            .bind(next.map(sql_time))
            .execute(&mut *conn)
            .await;
        let found = conn.kept(done)?.rows_affected() > 0;
        if found {
            self.schedules_changed();
        }
        Ok(found)
    }

    /// The schedule's row first, then its ticks, in one transaction: the order a firing
    /// takes its locks in, so the two never wait for each other in a cycle.
    async fn delete_schedule(&self, name: &str) -> Result<bool, StoreError> {
        let (delete, ticks) = (self.sql(SQL.delete), self.sql(SQL.delete_ticks));
        let mut tx = self.begin().await?;
        let done = async {
            let found = sqlx::query(&delete).bind(name).execute(&mut *tx).await?;
            sqlx::query(&ticks).bind(name).execute(&mut *tx).await?;
            Ok::<_, StoreError>(found.rows_affected() > 0)
        }
        .await;
        let found = settle(tx, done).await?;
        if found {
            self.schedules_changed();
        }
        Ok(found)
    }
}
