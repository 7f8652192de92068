//! [`RunStore`] for PostgreSQL: admission (with its token claim), reading runs and their
//! histories, acquiring, appending, releasing, failing, blocking, retrying, cancelling and the
//! notices. Each method binds a request to the shared policy or one statement; the decisions
//! are the policy's (`store::sql::policy`), the SQL is the `statements` table's.

use std::time::{Duration, SystemTime};

use tokio::sync::{broadcast, oneshot};

use super::commit::{writer_gone, Write, Writing};
use super::listen::{listen, NOTICE_CAPACITY};
use super::stash::settle;
use super::statements::CLOCK;
use super::tx::Pg;
use super::{Notices, PostgresStore};
use crate::error::{Error, StoreError};
use crate::ids::RunId;
use crate::store::sql::policy::{self, EncodedCancel, EncodedFailure, NewRunRow, Tx};
use crate::store::sql::rows::{decode_events, EventRow, LeasedRow, Picked, RunRow};
use crate::store::sql::{
    lease_end, sql_epoch, sql_id, sql_time, to_json, EncodedAppend, EncodedEvents,
};
use crate::store::{
    AcquireRequest, Admission, AdmittedWith, Append, CancelOutcome, EventRecord, FailureOutcome,
    Lease, LeasedRun, NewEvent, NewRun, Notice, RetryOutcome, RunRecord, RunStore,
};

impl PostgresStore {
    /// Admits `run`; with `lease`, leased to the caller at once (epoch 1).
    pub(super) async fn admit(
        &self,
        run: NewRun,
        lease: Option<Duration>,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        let row = NewRunRow::new(run, lease)?;
        if row.hook.is_none() {
            // One statement (the insert): committed with whatever other writes are waiting.
            // A queued run the admitting worker would lease begins at once when it is
            // committed alone and its queue has room and an unheld lock (`Tx::admit_begun`);
            // among other writes it is inserted waiting, and the next `acquire` begins it
            // with the others that waited, taking the queue's lock once for all of them.
            let (write, answer) = Write::admit(row, None);
            self.commit(write).await;
            return answer.await.unwrap_or_else(|_| Err(writer_gone()));
        }
        // `Pg`'s admission claiming a token is one statement, committed by itself when it
        // decides (see `Tx::admit_claiming`).
        let mut conn = self.conn().await?;
        let mut notes = Vec::new();
        let decided = self
            .noting(&mut conn, &mut notes)
            .admit_claiming(&row)
            .await;
        if let Some(decided) = conn.kept(decided)? {
            self.inner.writer.announce(notes);
            return Ok(decided);
        }
        // Not batched: a claim locks its token's row, won or lost, and a group transaction
        // would hold it to its commit while the run owning the token, ending in another
        // batch, waits for it (and that batch may hold a token this one claims next). A
        // conflict wrote nothing: ending the transaction at once frees the token's row lock
        // for the next contender.
        self.in_tx_noting(async |pg| policy::admit(pg, &row).await)
            .await
    }

    /// `policy` in a transaction, its notices sent once it committed.
    pub(super) async fn in_tx_noting<T>(
        &self,
        policy: impl AsyncFnOnce(&mut Pg<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut tx = self.begin().await?;
        let mut notes = Vec::new();
        let done = policy(&mut self.noting(&mut tx, &mut notes)).await;
        let done = settle(tx, done).await?;
        self.inner.writer.announce(notes);
        Ok(done)
    }
}

#[async_trait::async_trait]
impl RunStore for PostgresStore {
    /// The database server's clock: every process on this store times its writes and
    /// decisions by it, whatever its own clock says.
    async fn now(&self) -> Result<Option<SystemTime>, StoreError> {
        let mut conn = self.conn().await?;
        let micros = sqlx::query_scalar(CLOCK).fetch_one(&mut *conn).await;
        let micros: i64 = conn.kept(micros)?;
        let micros = u64::try_from(micros).map_err(|e| {
            StoreError::Corrupt(format!("the database's clock reads {micros} µs: {e}"))
        })?;
        Ok(Some(SystemTime::UNIX_EPOCH + Duration::from_micros(micros)))
    }

    async fn create_run(&self, run: NewRun) -> Result<Admission, StoreError> {
        Ok(self.admit(run, None).await?.0)
    }

    /// One statement on a connection of the pool when no other write is under way (not a
    /// group transaction): the run and its first events, plain ones (events that deliver a
    /// payload, publish a value or record a reply take the two calls, as do runs with a token
    /// or a queue). A delayed run is admitted as `create_run_leased` admits it: not leased, so
    /// nothing else is written.
    async fn create_run_leased_with(
        &self,
        run: NewRun,
        lease: Duration,
        first: &Append,
    ) -> Result<AdmittedWith, StoreError> {
        crate::store::first_events_only(first)?;
        let events = EncodedEvents::new(&first.events)?;
        if run.hook.is_some() || run.queue.is_some() || !events.is_plain() {
            return Ok(AdmittedWith::Unsupported(Box::new(run)));
        }
        if run.delayed() {
            // Not leased at admission, so nothing of `first` is written.
            let (admission, leased) = self.admit(run, Some(lease)).await?;
            return Ok(AdmittedWith::Done(admission, leased));
        }
        // Alone, as the committers write a lone write: among other writes, the admission and
        // its first events go to the committers as one write of their group transactions
        // (one statement on a connection of its own per start cost W3 a third), admitted
        // with the group's other admissions in one statement.
        let under_way = Writing::count(&self.inner.writer.writing);
        if under_way.before > 0 {
            drop(under_way);
            let row = NewRunRow::new(run, Some(lease))?;
            let (write, answer) = Write::admit(row, Some(events));
            self.commit(write).await;
            let (admission, leased) = answer.await.unwrap_or_else(|_| Err(writer_gone()))?;
            return Ok(AdmittedWith::Done(admission, leased));
        }
        let row = NewRunRow::new(run, Some(lease))?;
        let (parent, detached) = row.parent_cols();
        let mut conn = self.conn().await?;
        let inserted: Result<Option<String>, _> =
            sqlx::query_scalar(&self.inner.sql.dialect.insert_leased_with)
                .bind(&row.key)
                .bind(&row.workflow)
                .bind(&row.input)
                .bind(row.created_at)
                .bind(row.lease_until)
                .bind(row.deadline)
                .bind(parent)
                .bind(detached)
                .bind(row.start_at)
                .bind(&row.version)
                .bind(&row.trace_context)
                .bind(&events.at)
                .bind(&events.kind)
                .bind(&events.data)
                .fetch_optional(&mut *conn)
                .await;
        match conn.kept(inserted)? {
            Some(_) => {
                let (admission, leased) = policy::admitted(&row);
                Ok(AdmittedWith::Done(admission, leased))
            }
            None => Err(policy::exists(&row.id)),
        }
    }

    async fn create_run_leased(
        &self,
        run: NewRun,
        lease: Duration,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        self.admit(run, Some(lease)).await
    }

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let row = sqlx::query_as::<_, RunRow>(&self.inner.sql.get_run)
            .bind(id.to_string())
            .fetch_optional(&mut *conn)
            .await;
        conn.kept(row)?.map(RunRow::decode).transpose()
    }

    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sqlx::query_as::<_, EventRow>(&self.inner.sql.events)
            .bind(id.to_string())
            .fetch_all(&mut *conn)
            .await;
        decode_events(conn.kept(rows)?)
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Vec<LeasedRun>, StoreError> {
        if req.limit == 0 || req.workflows.is_empty() {
            return Ok(Vec::new());
        }
        let s = &self.inner.sql;
        let mut tx = self.begin().await?;
        let leased = async {
            // One statement picks and leases; SKIP LOCKED makes concurrent acquirers, in any
            // process, pass over each other's picks instead of waiting or sharing them.
            let (until, at, limit) = (
                lease_end(req.now, req.lease),
                sql_time(req.now),
                sql_id(req.limit),
            );
            let mut rows: Vec<LeasedRow> = sqlx::query_as(&s.acquire)
                .bind(until)
                .bind(at)
                .bind(req.workflows)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?;
            // Then the queued runs that may begin, each queue's row locked meanwhile.
            let room = limit - rows.len() as i64;
            let begin =
                policy::queued_to_begin(&mut self.tx(&mut tx), at, req.workflows, room).await?;
            if !begin.is_empty() {
                let begun: Vec<LeasedRow> = sqlx::query_as(&s.begin_queued)
                    .bind(until)
                    .bind(at)
                    .bind(&begin)
                    .fetch_all(&mut *tx)
                    .await?;
                rows.extend(begun);
            }
            let picked = Picked::new(rows.into_iter().map(Ok).collect());
            let ids = picked.ids();
            if ids.is_empty() {
                return Ok((picked, Vec::new()));
            }
            // All histories in one query, not one round trip per run.
            let events = sqlx::query_as(&s.events_of)
                .bind(&ids)
                .fetch_all(&mut *tx)
                .await?;
            Ok((picked, events))
        }
        .await;
        let (picked, events) = settle(tx, leased).await?;
        let acquired = picked.attach(events);
        for (lease, why) in acquired.failed {
            policy::undecodable(self, &lease, &why, req.now).await;
        }
        Ok(acquired.runs)
    }

    async fn append(&self, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        // A write without events that still needs a time (a run's end, token releases) takes
        // the server's, like every other time here.
        let timeless = write.events.is_empty()
            && (write.outcome.is_some() || !write.release_tokens.is_empty());
        let at = if timeless { self.now().await? } else { None };
        let write = EncodedAppend::timed(write, || at.unwrap_or_else(SystemTime::now))?;
        let (write, answer) = Write::append(lease.clone(), write);
        self.commit(write).await;
        answer.await.unwrap_or_else(|_| Err(writer_gone()))
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
        let mut tx = self.begin().await?;
        let released = async {
            // Fenced and locked first (an append of no events), checked for unseen payloads in
            // the next statement: its fresh snapshot sees every payload committed before the
            // lock was granted, and a payload committed later finds the released row and
            // lowers its wake time itself.
            let (run, fence) = (lease.run_id.to_string(), Some(sql_epoch(lease.epoch)));
            let none = EncodedEvents::default();
            if !self.tx(&mut tx).append_events(&run, fence, &none).await? {
                return Err(StoreError::LeaseLost(lease.run_id));
            }
            sqlx::query(&self.inner.sql.release)
                .bind(&run)
                .bind(sql_time(wake_at))
                .bind(sql_id(payloads_seen))
                .bind(&self.inner.schema)
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
        .await;
        settle(tx, released).await
    }

    async fn block(
        &self,
        lease: &Lease,
        divergence: &Error,
        now: SystemTime,
    ) -> Result<SystemTime, StoreError> {
        let error = to_json(divergence, "the divergence")?;
        let epoch = sql_epoch(lease.epoch);
        let mut tx = self.begin().await?;
        let run = &lease.run_id;
        let blocked = policy::block(&mut self.tx(&mut tx), run, epoch, &error, now).await;
        settle(tx, blocked).await
    }

    async fn retry(&self, id: &RunId, now: SystemTime) -> Result<RetryOutcome, StoreError> {
        let mut tx = self.begin().await?;
        let done = policy::retry(&mut self.tx(&mut tx), id, now).await;
        settle(tx, done).await
    }

    async fn wake_blocked(&self, now: SystemTime) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        let woken = sqlx::query_as::<_, (i64, i64)>(&self.inner.sql.wake_blocked)
            .bind(sql_time(now))
            .bind(&self.inner.schema)
            .fetch_one(&mut *conn)
            .await;
        let (woken, _notes) = conn.kept(woken)?;
        Ok(woken.unsigned_abs())
    }

    async fn create_run_with_history(
        &self,
        run: NewRun,
        history: &[NewEvent],
    ) -> Result<(), StoreError> {
        let row = NewRunRow::new(run, None)?;
        let events = EncodedEvents::new(history)?;
        let mut tx = self.begin().await?;
        let created = policy::create_with_history(&mut self.tx(&mut tx), &row, &events).await;
        settle(tx, created).await
    }

    async fn start_child(
        &self,
        lease: &Lease,
        child_key: &str,
        child: NewRun,
    ) -> Result<Admission, StoreError> {
        let row = NewRunRow::new(child, None)?;
        self.in_tx_noting(async |pg| policy::start_child(pg, lease, child_key, &row).await)
            .await
    }

    async fn record_failure(
        &self,
        lease: &Lease,
        cause: &Error,
        now: SystemTime,
    ) -> Result<FailureOutcome, StoreError> {
        let failure = EncodedFailure::new(cause, now)?;
        let epoch = sql_epoch(lease.epoch);
        let mut tx = self.begin().await?;
        let run = &lease.run_id;
        let recorded = policy::record_failure(&mut self.tx(&mut tx), run, epoch, &failure).await;
        settle(tx, recorded).await
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
        let ids: Vec<String> = leases.iter().map(|l| l.run_id.to_string()).collect();
        let epochs: Vec<i64> = leases.iter().map(|l| sql_epoch(l.epoch)).collect();
        // One statement renews every lease still held; the rest are lost.
        let mut conn = self.conn().await?;
        let renewed = sqlx::query_as(&self.inner.sql.heartbeat)
            .bind(&ids)
            .bind(&epochs)
            .bind(lease_end(now, lease))
            .fetch_all(&mut *conn)
            .await;
        let renewed: Vec<(String, i64)> = conn.kept(renewed)?;
        Ok(policy::lost(leases, renewed))
    }

    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        let cancel = EncodedCancel::new(id, now)?;
        self.in_tx_noting(async |pg| policy::cancel(pg, &cancel).await)
            .await
    }

    fn notices(&self) -> Option<broadcast::Receiver<Notice>> {
        let notices = self.inner.notices.get_or_init(|| {
            let (sender, _) = broadcast::channel(NOTICE_CAPACITY);
            let (stop, stopped) = oneshot::channel();
            // The task holds no reference to the store, only what it needs: it ends when the
            // last clone drops `stop`.
            self.inner.runtime.spawn(listen(
                self.inner.options.clone(),
                self.inner.schema.clone(),
                sender.clone(),
                stopped,
            ));
            Notices {
                sender,
                _stop: stop,
            }
        });
        Some(notices.sender.subscribe())
    }
}
