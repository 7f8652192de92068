//! [`ScheduleStore`] on SQLite: the schedules' statements (their tables are `schema.rs`'s
//! migration 8) and the methods, which send their work to the writer or a reader. Firing a
//! tick is the shared policy's (`store::sql::schedules::fire_tick`), run in one writer
//! transaction with the run's admission.

use std::collections::HashSet;
use std::time::SystemTime;

use rusqlite::{params, Row};

use super::tx::{all, exec, now, one, Lite};
use super::SqliteStore;
use crate::error::StoreError;
use crate::store::sql::schedules::{
    decode_schedule, decode_tick, encode_def, fire_ticks, ready_now, tick_rows, ScheduleCols,
    ScheduleSql, ScheduleTx, TickCols, TickRow,
};
use crate::store::sql::{sql_id, sql_time, to_json};
use crate::store::{
    FiredTick, NewTick, ScheduleDef, ScheduleState, ScheduleStore, TickRecord, TickWrite,
    TICKS_KEPT,
};

/// The statements of this file (`ScheduleSql`), side by side with PostgreSQL's.
const SQL: ScheduleSql = ScheduleSql {
    define: "INSERT INTO schedules (name, def, paused, next_at, created_at, updated_at)
         VALUES (?1, ?2, 0, ?3, ?4, ?4)
         ON CONFLICT (name) DO UPDATE SET def = excluded.def, updated_at = excluded.updated_at,
             next_at = CASE WHEN schedules.next_at IS NULL THEN excluded.next_at
                            WHEN excluded.next_at IS NULL THEN schedules.next_at
                            ELSE MIN(schedules.next_at, excluded.next_at) END",
    // The latest started tick is found once (in `schedule_ticks_started`), then joined by
    // its key; MIN/MAX over the key's index would read every tick of the schedule.
    list: "SELECT s.name, s.def, s.paused, s.next_at,
             (SELECT t.nominal FROM schedule_ticks t WHERE t.schedule = s.name
                ORDER BY t.nominal DESC LIMIT 1),
             l.nominal, l.run_id, (SELECT r.status FROM runs r WHERE r.id = l.run_id),
             (SELECT t.nominal FROM schedule_ticks t WHERE t.schedule = s.name
                AND t.outcome = 'buffered' ORDER BY t.nominal LIMIT 1)
         FROM schedules s
         LEFT JOIN schedule_ticks l ON l.schedule = s.name AND l.nominal =
             (SELECT t.nominal FROM schedule_ticks t WHERE t.schedule = s.name
                AND t.outcome = 'started' AND t.backfill = 0 ORDER BY t.nominal DESC LIMIT 1)
         ORDER BY s.name",
    lock: "SELECT 1 FROM schedules WHERE name = ?1",
    upsert_tick: "INSERT INTO schedule_ticks
             (schedule, nominal, outcome, run_id, backfill, recorded_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (schedule, nominal) DO UPDATE SET outcome = excluded.outcome,
             run_id = excluded.run_id, backfill = excluded.backfill,
             recorded_at = excluded.recorded_at
         WHERE ?7 AND schedule_ticks.run_id IS NULL",
    advance: "UPDATE schedules SET next_at = MAX(COALESCE(next_at, ?2), ?2) WHERE name = ?1",
    trim: "DELETE FROM schedule_ticks WHERE schedule = ?1 AND nominal <
         (SELECT nominal FROM schedule_ticks WHERE schedule = ?1
          ORDER BY nominal DESC LIMIT 1 OFFSET ?2)",
    ticks: "SELECT schedule, nominal, outcome, run_id, backfill, recorded_at
         FROM schedule_ticks WHERE schedule = ?1 ORDER BY nominal DESC LIMIT ?2",
    pause: "UPDATE schedules SET paused = ?2,
             next_at = CASE WHEN ?3 IS NULL THEN next_at ELSE MAX(COALESCE(next_at, ?3), ?3) END
         WHERE name = ?1",
    delete_ticks: "DELETE FROM schedule_ticks WHERE schedule = ?1",
    delete: "DELETE FROM schedules WHERE name = ?1",
};

fn schedule_cols(r: &Row<'_>) -> rusqlite::Result<ScheduleCols> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
    ))
}

fn tick_cols(r: &Row<'_>) -> rusqlite::Result<TickCols> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
    ))
}

impl ScheduleTx for Lite<'_> {
    async fn lock_schedule(&mut self, name: &str) -> Result<bool, StoreError> {
        // The writer's transaction holds the database's write lock: nobody else fires.
        Ok(one(self.0, SQL.lock, [name], |_| Ok(()))?.is_some())
    }

    async fn upsert_tick(&mut self, t: &TickRow) -> Result<bool, StoreError> {
        let args = params![
            t.schedule,
            t.nominal,
            t.outcome,
            t.run_id,
            t.backfill,
            t.recorded_at,
            t.replace_runless
        ];
        // A row inserted or replaced counts as changed; a record that stays does not (no
        // RETURNING: it would build an ephemeral table per tick).
        Ok(exec(self.0, SQL.upsert_tick, args)? > 0)
    }

    async fn advance(&mut self, name: &str, next: i64) -> Result<(), StoreError> {
        exec(self.0, SQL.advance, params![name, next])?;
        Ok(())
    }

    async fn trim_ticks(&mut self, name: &str, keep: i64) -> Result<(), StoreError> {
        exec(self.0, SQL.trim, params![name, keep - 1])?;
        Ok(())
    }

    /// One statement for all of them (a second's 1,000 schedules were 1,000 statements).
    async fn lock_schedules(&mut self, names: &[&str]) -> Result<HashSet<String>, StoreError> {
        let names = to_json(&names, "schedule names")?;
        let found = all(self.0, LOCK_MANY, [names], |r| r.get::<_, String>(0))?;
        Ok(found.into_iter().collect())
    }

    /// One statement for all of them.
    async fn advance_many(&mut self, nexts: &[(&str, i64)]) -> Result<(), StoreError> {
        let nexts = to_json(&nexts, "next nominal times")?;
        exec(self.0, ADVANCE_MANY, [nexts])?;
        Ok(())
    }
}

/// [`ScheduleSql::lock`] of the names in the JSON array `?1`: those that exist.
const LOCK_MANY: &str =
    "SELECT name FROM schedules WHERE name IN (SELECT value FROM json_each(?1))";

/// [`ScheduleSql::advance`] of each `[name, next]` of the JSON array `?1`.
const ADVANCE_MANY: &str = "UPDATE schedules SET next_at = MAX(COALESCE(next_at, v.next), v.next)
     FROM (SELECT value ->> 0 AS name, value ->> 1 AS next FROM json_each(?1)) AS v
     WHERE schedules.name = v.name";

#[async_trait::async_trait]
impl ScheduleStore for SqliteStore {
    async fn define_schedule(
        &self,
        def: &ScheduleDef,
        next: Option<SystemTime>,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let (name, json) = (def.name.clone(), encode_def(def)?);
        let (next, at) = (next.map(sql_time), sql_time(at));
        self.write(move |tx| {
            exec(tx, SQL.define, params![name, json, next, at])?;
            Ok(())
        })
        .await
    }

    async fn list_schedules(&self) -> Result<Vec<ScheduleState>, StoreError> {
        let rows = self
            .read(|conn| all(conn, SQL.list, [], schedule_cols))
            .await?;
        rows.into_iter().map(decode_schedule).collect()
    }

    async fn fire_tick(&self, mut tick: NewTick) -> Result<TickWrite, StoreError> {
        tick.lease = None;
        let mut fired = self.fire_ticks(vec![tick]).await?;
        Ok(fired.pop().map_or(TickWrite::NoSchedule, |f| f.write))
    }

    /// One request to the writer: the ticks are one request of its group transaction.
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
        self.write_on(rows, |tx, rows| now(fire_ticks(&mut Lite(tx), rows)))
            .await
    }

    async fn advance_schedule(&self, name: &str, next: SystemTime) -> Result<bool, StoreError> {
        let (name, next) = (name.to_owned(), sql_time(next));
        self.write(move |tx| Ok(exec(tx, SQL.advance, params![name, next])? > 0))
            .await
    }

    async fn schedule_ticks(&self, name: &str, n: usize) -> Result<Vec<TickRecord>, StoreError> {
        // Records beyond the latest TICKS_KEPT wait for the next trim: never listed.
        let (name, n) = (name.to_owned(), sql_id(n.min(TICKS_KEPT)));
        let rows = self
            .read(move |conn| all(conn, SQL.ticks, params![name, n], tick_cols))
            .await?;
        rows.into_iter().map(decode_tick).collect()
    }

    async fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
        next: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let (name, next) = (name.to_owned(), next.map(sql_time));
        self.write(move |tx| Ok(exec(tx, SQL.pause, params![name, paused, next])? > 0))
            .await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, StoreError> {
        let name = name.to_owned();
        self.write(move |tx| {
            exec(tx, SQL.delete_ticks, [&name])?;
            Ok(exec(tx, SQL.delete, [&name])? > 0)
        })
        .await
    }
}
