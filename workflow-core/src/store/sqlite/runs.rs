//! [`RunStore`] on SQLite: admission, acquiring, appending, ending, failures, blocks and child
//! runs. Each method sends its work to the writer (`write`) or a reader (`read`) and decodes
//! the rows; what a write decides is the shared policy's (`store::sql::policy`), which this
//! file calls and must not repeat.

use std::time::{Duration, SystemTime};

use rusqlite::params;

use super::statements::SQL;
use super::tx::{all, exec, leased_row, now, one, Lite};
use super::SqliteStore;
use crate::error::{Error, StoreError};
use crate::ids::RunId;
use crate::store::sql::policy::{self, EncodedCancel, EncodedFailure, NewRunRow};
use crate::store::sql::rows::{decode_events, EventRow, Picked, RunRow};
use crate::store::sql::{
    lease_end, sql_epoch, sql_id, sql_time, to_json, EncodedAppend, EncodedEvents,
};
use crate::store::{
    AcquireRequest, Admission, AdmittedWith, Append, CancelOutcome, EventRecord, FailureOutcome,
    Lease, LeasedRun, NewEvent, NewRun, RetryOutcome, RunRecord, RunStore,
};

#[async_trait::async_trait]
impl RunStore for SqliteStore {
    async fn create_run(&self, run: NewRun) -> Result<Admission, StoreError> {
        Ok(self.admit(run, None).await?.0)
    }

    async fn create_run_leased(
        &self,
        run: NewRun,
        lease: Duration,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        self.admit(run, Some(lease)).await
    }

    /// The admission and the append are one request to the writer: one transaction.
    async fn create_run_leased_with(
        &self,
        run: NewRun,
        lease: Duration,
        first: &Append,
    ) -> Result<AdmittedWith, StoreError> {
        crate::store::first_events_only(first)?;
        let row = NewRunRow::new(run, Some(lease))?;
        let first = EncodedAppend::new(first)?;
        self.write_on((row, first), |tx, (row, first)| {
            let (admission, leased) = now(policy::admit(&mut Lite(tx), row))?;
            if let Some(leased) = &leased {
                if !first.events.is_empty() {
                    now(policy::append(&mut Lite(tx), leased, first))?;
                }
            }
            Ok((admission, leased))
        })
        .await
        .map(|(admission, leased)| AdmittedWith::Done(admission, leased))
    }

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        let id = id.to_string();
        let row = self
            .read(move |conn| one(conn, SQL.get_run, [id], RunRow::from_sqlite))
            .await?;
        row.map(RunRow::decode).transpose()
    }

    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        let id = id.to_string();
        self.read(move |conn| decode_events(all(conn, SQL.events, [id], EventRow::from_sqlite)?))
            .await
    }

    /// Leases in the writer's transaction, then reads the histories on a reader connection:
    /// the write lock, which every other writer (heartbeats included) waits for, is held only
    /// for the lease itself, not for reading whole histories. The leases are committed first,
    /// so nobody else writes to these runs meanwhile.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Vec<LeasedRun>, StoreError> {
        if req.limit == 0 || req.workflows.is_empty() {
            return Ok(Vec::new());
        }
        let workflows = to_json(&req.workflows, "workflow names")?;
        let until = lease_end(req.now, req.lease);
        let (at, limit) = (sql_time(req.now), sql_id(req.limit));
        let names = req.workflows.to_vec();
        let picked = self
            .write(move |tx| {
                let args = params![until, at, &workflows, limit];
                let mut rows = all(tx, SQL.acquire, args, leased_row)?;
                let room = limit - rows.len() as i64;
                let begin = now(policy::queued_to_begin(&mut Lite(tx), at, &names, room))?;
                if !begin.is_empty() {
                    let ids = to_json(&begin, "run ids")?;
                    rows.extend(all(
                        tx,
                        SQL.begin_queued,
                        params![until, at, &ids],
                        leased_row,
                    )?);
                    exec(tx, SQL.dialect.held_begun, [ids])?;
                }
                Ok(Picked::new(rows))
            })
            .await?;
        let ids = picked.ids();
        // An idle worker's poll leases nothing: no histories to read.
        let events = if ids.is_empty() {
            Vec::new()
        } else {
            let ids = to_json(&ids, "run ids")?;
            self.read(move |conn| all(conn, SQL.events_of, [ids], EventRow::from_sqlite))
                .await?
        };
        let acquired = picked.attach(events);
        for (lease, why) in acquired.failed {
            policy::undecodable(self, &lease, &why, req.now).await;
        }
        Ok(acquired.runs)
    }

    async fn append(&self, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        let write = (lease.clone(), EncodedAppend::new(write)?);
        self.write_on(write, |tx, (lease, write)| {
            now(policy::append(&mut Lite(tx), lease, write))
        })
        .await
    }

    async fn continue_as_new(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
    ) -> Result<(), StoreError> {
        self.continue_chain(lease, write, next, false).await?;
        Ok(())
    }

    async fn continue_as_new_leased(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
    ) -> Result<Option<LeasedRun>, StoreError> {
        self.continue_chain(lease, write, next, true).await
    }

    async fn release(
        &self,
        lease: &Lease,
        wake_at: SystemTime,
        payloads_seen: u64,
    ) -> Result<(), StoreError> {
        let lease = lease.clone();
        let (wake_at, seen) = (sql_time(wake_at), sql_id(payloads_seen));
        let now = sql_time(SystemTime::now());
        self.write(move |tx| {
            let (run, epoch) = (lease.run_id.to_string(), sql_epoch(lease.epoch));
            match exec(tx, SQL.release, params![run, epoch, wake_at, seen, now])? {
                0 => Err(StoreError::LeaseLost(lease.run_id)),
                _ => Ok(()),
            }
        })
        .await
    }

    async fn ended_among(&self, runs: &[RunId]) -> Result<Vec<RunId>, StoreError> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let ids = to_json(&runs, "run ids")?;
        let ended: Vec<String> = self
            .read(move |conn| all(conn, SQL.dialect.ended_among, [ids], |r| r.get(0)))
            .await?;
        ended
            .iter()
            .map(|id| {
                id.parse()
                    .map_err(|e| StoreError::Corrupt(format!("run id {id:?}: {e}")))
            })
            .collect()
    }

    async fn block(
        &self,
        lease: &Lease,
        divergence: &Error,
        now: SystemTime,
    ) -> Result<SystemTime, StoreError> {
        let error = to_json(divergence, "the divergence")?;
        let (run, epoch) = (lease.run_id, sql_epoch(lease.epoch));
        self.write(move |tx| self::now(policy::block(&mut Lite(tx), &run, epoch, &error, now)))
            .await
    }

    async fn retry(&self, id: &RunId, now: SystemTime) -> Result<RetryOutcome, StoreError> {
        let id = *id;
        self.write(move |tx| self::now(policy::retry(&mut Lite(tx), &id, now)))
            .await
    }

    async fn wake_blocked(&self, now: SystemTime) -> Result<u64, StoreError> {
        let at = sql_time(now);
        let woken = self
            .write(move |tx| exec(tx, SQL.wake_blocked, [at]))
            .await?;
        Ok(woken as u64)
    }

    async fn create_run_with_history(
        &self,
        run: NewRun,
        history: &[NewEvent],
    ) -> Result<(), StoreError> {
        let row = NewRunRow::new(run, None)?;
        let events = EncodedEvents::new(history)?;
        self.write(move |tx| self::now(policy::create_with_history(&mut Lite(tx), &row, &events)))
            .await
    }

    async fn start_child(
        &self,
        lease: &Lease,
        child_key: &str,
        child: NewRun,
    ) -> Result<Admission, StoreError> {
        let row = NewRunRow::new(child, None)?;
        let (lease, key) = (lease.clone(), child_key.to_owned());
        self.write(move |tx| self::now(policy::start_child(&mut Lite(tx), &lease, &key, &row)))
            .await
    }

    async fn record_failure(
        &self,
        lease: &Lease,
        cause: &Error,
        now: SystemTime,
    ) -> Result<FailureOutcome, StoreError> {
        let failure = EncodedFailure::new(cause, now)?;
        let (run, epoch) = (lease.run_id, sql_epoch(lease.epoch));
        self.write(move |tx| {
            self::now(policy::record_failure(&mut Lite(tx), &run, epoch, &failure))
        })
        .await
    }

    async fn heartbeat(
        &self,
        leases: &[Lease],
        lease: Duration,
        now: SystemTime,
    ) -> Result<Vec<RunId>, StoreError> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let held: Vec<_> = leases
            .iter()
            .map(|l| (l.run_id.to_string(), sql_epoch(l.epoch)))
            .collect();
        let (held, until) = (to_json(&held, "the leases")?, lease_end(now, lease));
        let renewed = self
            .write(move |tx| {
                all(tx, SQL.heartbeat, params![held, until], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
            })
            .await?;
        Ok(policy::lost(leases, renewed))
    }

    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        let cancel = EncodedCancel::new(id, now)?;
        self.write(move |tx| self::now(policy::cancel(&mut Lite(tx), &cancel)))
            .await
    }
}
