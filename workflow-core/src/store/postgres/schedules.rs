//! [`ScheduleStore`] for PostgreSQL: the schedules' statements and the methods (their tables
//! are `schema.rs`'s migration 7). Firing a tick is the shared policy's
//! (`store::sql::schedules::fire_tick`), in one transaction with the run's admission; the
//! schedule's row lock makes firings of one schedule take turns, the record's primary key
//! decides between firings of one tick. Changes to schedules are announced after their commit
//! (`NOTE_SCHEDULES`), so other processes' firing loops look again at once.

use std::collections::HashSet;
use std::time::SystemTime;

use super::listen::NOTE_SCHEDULES;
use super::schema::quote_ident;
use super::stash::settle;
use super::tx::Pg;
use super::PostgresStore;
use crate::error::StoreError;
use crate::store::sql::schedules::{
    decode_schedule, decode_tick, encode_def, fire_ticks, ready_now, tick_rows, ScheduleCols,
    ScheduleSql, ScheduleTx, TickCols, TickRow,
};
use crate::store::sql::{sql_id, sql_time};
use crate::store::{
    FiredTick, NewTick, ScheduleDef, ScheduleState, ScheduleStore, TickRecord, TickWrite,
    TICKS_KEPT,
};

/// The statements of this file (`ScheduleSql`), `{s}` standing for the quoted schema.
const SQL: ScheduleSql = ScheduleSql {
    define: "INSERT INTO {s}.schedules (name, def, paused, next_at, created_at, updated_at)
         VALUES ($1, $2, FALSE, $3, $4, $4)
         ON CONFLICT (name) DO UPDATE SET def = excluded.def, updated_at = excluded.updated_at,
             next_at = LEAST(schedules.next_at, excluded.next_at)",
    // Each subquery is one probe of an index: the key's for the latest tick, and the
    // partial indexes of migration 13 for the latest started and the earliest buffered.
    list: "SELECT s.name, s.def, s.paused, s.next_at,
             (SELECT MAX(t.nominal) FROM {s}.schedule_ticks t WHERE t.schedule = s.name),
             l.nominal, l.run_id, (SELECT r.status FROM {s}.runs r WHERE r.id = l.run_id),
             (SELECT MIN(t.nominal) FROM {s}.schedule_ticks t WHERE t.schedule = s.name
                AND t.outcome = 'buffered')
         FROM {s}.schedules s
         LEFT JOIN LATERAL (SELECT t.nominal, t.run_id FROM {s}.schedule_ticks t
                WHERE t.schedule = s.name AND t.outcome = 'started' AND NOT t.backfill
                ORDER BY t.nominal DESC LIMIT 1) l ON TRUE
         ORDER BY s.name",
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

/// The fast paths of firing a batch of ticks (`ScheduleTx`'s `_many` methods), each one
/// statement over arrays.
struct BatchSql {
    lock: &'static str,
    insert: &'static str,
    replace: &'static str,
    advance: &'static str,
    trim: &'static str,
}

const BATCH: BatchSql = BatchSql {
    lock: "SELECT name FROM {s}.schedules WHERE name = ANY($1::text[]) ORDER BY name
         FOR UPDATE",
    insert: "INSERT INTO {s}.schedule_ticks
             (schedule, nominal, outcome, run_id, backfill, recorded_at)
         SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bool[],
                              $6::bigint[])
         ON CONFLICT (schedule, nominal) DO NOTHING
         RETURNING schedule, nominal",
    replace: "INSERT INTO {s}.schedule_ticks
             (schedule, nominal, outcome, run_id, backfill, recorded_at)
         SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bool[],
                              $6::bigint[])
         ON CONFLICT (schedule, nominal) DO UPDATE SET outcome = excluded.outcome,
             run_id = excluded.run_id, backfill = excluded.backfill,
             recorded_at = excluded.recorded_at
         WHERE schedule_ticks.run_id IS NULL
         RETURNING schedule, nominal",
    advance: "UPDATE {s}.schedules s SET next_at = GREATEST(s.next_at, v.next)
         FROM UNNEST($1::text[], $2::bigint[]) AS v(name, next)
         WHERE s.name = v.name COLLATE \"C\"",
    trim: "DELETE FROM {s}.schedule_ticks t USING
             (SELECT v.name, c.nominal FROM UNNEST($1::text[]) AS v(name)
              CROSS JOIN LATERAL (SELECT u.nominal FROM {s}.schedule_ticks u
                  WHERE u.schedule = v.name COLLATE \"C\"
                  ORDER BY u.nominal DESC LIMIT 1 OFFSET $2) c) cut
         WHERE t.schedule = cut.name COLLATE \"C\" AND t.nominal < cut.nominal",
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

    async fn lock_schedules(&mut self, names: &[&str]) -> Result<HashSet<String>, StoreError> {
        let found: Vec<String> = sqlx::query_scalar(&on(BATCH.lock, self.channel))
            .bind(names)
            .fetch_all(&mut *self.conn)
            .await?;
        Ok(found.into_iter().collect())
    }

    /// Two statements at most: the ticks that may replace a run-less record, and the others.
    async fn upsert_ticks(&mut self, ticks: &[&TickRow]) -> Result<Vec<bool>, StoreError> {
        let mut written = HashSet::new();
        for replace in [false, true] {
            let some: Vec<&TickRow> = ticks
                .iter()
                .copied()
                .filter(|t| t.replace_runless == replace)
                .collect();
            if some.is_empty() {
                continue;
            }
            let sql = if replace { BATCH.replace } else { BATCH.insert };
            let rows: Vec<(String, i64)> = sqlx::query_as(&on(sql, self.channel))
                .bind(some.iter().map(|t| t.schedule.as_str()).collect::<Vec<_>>())
                .bind(some.iter().map(|t| t.nominal).collect::<Vec<_>>())
                .bind(some.iter().map(|t| t.outcome).collect::<Vec<_>>())
                .bind(some.iter().map(|t| t.run_id.as_deref()).collect::<Vec<_>>())
                .bind(some.iter().map(|t| t.backfill).collect::<Vec<_>>())
                .bind(some.iter().map(|t| t.recorded_at).collect::<Vec<_>>())
                .fetch_all(&mut *self.conn)
                .await?;
            written.extend(rows);
        }
        Ok(ticks
            .iter()
            .map(|t| written.contains(&(t.schedule.clone(), t.nominal)))
            .collect())
    }

    async fn advance_many(&mut self, nexts: &[(&str, i64)]) -> Result<(), StoreError> {
        sqlx::query(&on(BATCH.advance, self.channel))
            .bind(nexts.iter().map(|(name, _)| *name).collect::<Vec<_>>())
            .bind(nexts.iter().map(|(_, next)| *next).collect::<Vec<_>>())
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn trim_many(&mut self, names: &[&str], keep: i64) -> Result<(), StoreError> {
        sqlx::query(&on(BATCH.trim, self.channel))
            .bind(names)
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

    async fn fire_tick(&self, mut tick: NewTick) -> Result<TickWrite, StoreError> {
        tick.lease = None;
        let mut fired = self.fire_ticks(vec![tick]).await?;
        Ok(fired.pop().map_or(TickWrite::NoSchedule, |f| f.write))
    }

    /// Each call is a transaction on a connection of the pool of its own.
    fn writes_in_parallel(&self) -> bool {
        true
    }

    /// One transaction of five statements or so, however many ticks (see `BATCH`).
    async fn fire_ticks(&self, ticks: Vec<NewTick>) -> Result<Vec<FiredTick>, StoreError> {
        self.fire_ticks_when(ticks, ready_now()).await
    }

    /// The rows are made (the runs' arguments and first events serialized) while `ready` is
    /// awaited.
    async fn fire_ticks_when(
        &self,
        ticks: Vec<NewTick>,
        ready: futures::future::BoxFuture<'_, Result<(), StoreError>>,
    ) -> Result<Vec<FiredTick>, StoreError> {
        let rows = tick_rows(ticks)?;
        ready.await?;
        self.in_tx_noting(async |pg| fire_ticks(pg, &rows).await)
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
            .bind(sql_id(n.min(TICKS_KEPT)))
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
