//! Continue-as-new, written once for both dialects: the leased run's last events and its end
//! as `continued_as_new`, and the admission of the run that carries on, in one transaction
//! (see [`crate::store::RunStore::continue_as_new`]). The dialect supplies the statements that
//! move what the chain keeps ([`ChainTx::continue_run`]); the order of the locks (the inbox,
//! then the run's row) and the fence are decided here.

use std::future::Future;

use super::{exists, Tx};
use crate::error::StoreError;
use crate::store::sql::rows::RunRow;
use crate::store::sql::{sql_epoch, sql_time, to_json, EncodedAppend, EncodedInbox};
use crate::store::{Lease, LeasedRun, NewRun};

/// The run that carries on, as its row is written: only what is its own (the rest is the
/// previous run's, copied by the statements).
pub(in crate::store) struct NextRunRow {
    pub key: String,
    pub workflow: String,
    /// JSON.
    pub input: String,
    /// Admission time, also when it is due.
    pub at: i64,
    /// Admitted leased to the worker that ended the previous run, under the same lease
    /// (epoch 1, until the previous run's lease ends); otherwise pending.
    pub leased: bool,
}

impl NextRunRow {
    pub fn new(next: &NewRun, leased: bool) -> Result<Self, StoreError> {
        Ok(NextRunRow {
            key: next.id.to_string(),
            workflow: next.workflow.clone(),
            input: to_json(&next.input, "the next run's input")?,
            at: sql_time(next.created_at),
            leased,
        })
    }
}

/// The statements of a continuation, beside [`Tx`]'s.
pub(in crate::store) trait ChainTx: Tx {
    /// After the fence held `old`'s row: admits `next` due at `next.at`, pending, or when
    /// `next.leased` running under `old`'s lease (epoch 1, `old`'s `lease_until`), its
    /// `previous_run` `old`, with what it inherits copied from `old`'s row (start token,
    /// deadline, parent, detached, queue entry and `began_at`, version, the chain's origin,
    /// and, once runs store one, their trace context); ends `old` as `continued_as_new` with
    /// `next_run` set and no lease, at `now`; gives `old`'s active hook tokens, inbox entries
    /// (not its children's ends), message idempotency keys and requests not replied to to
    /// `next`; copies its published values; repoints the schedule ticks naming `old`; and
    /// announces `old` as ended and, unless it is leased, `next` as ready where the dialect
    /// can. Returns `next`'s row as admitted, or `None` when `old` has no row.
    fn continue_run(
        &mut self,
        old: &str,
        next: &NextRunRow,
        now: i64,
    ) -> impl Future<Output = Result<Option<RunRow>, StoreError>>;

    /// Puts `entry` into `run`'s inbox under its own id (free: its row was taken out when
    /// the old run recorded its delivery), at `now`; a hook's payload only when `run` owns
    /// its token.
    fn requeue(
        &mut self,
        run: &str,
        entry: &EncodedInbox,
        now: i64,
    ) -> impl Future<Output = Result<(), StoreError>>;
}

/// The continuation of the run `lease` holds: all of it, or [`StoreError::LeaseLost`] (or
/// another error) and nothing. The next run, when it was admitted leased.
pub(in crate::store) async fn continue_as_new(
    tx: &mut impl ChainTx,
    lease: &Lease,
    write: &EncodedAppend,
    next: &NextRunRow,
) -> Result<Option<LeasedRun>, StoreError> {
    // The inbox first, as every writer that queues payloads takes it: a send or a resume
    // racing the seam lands in the old run's inbox before it moves, or finds the next run.
    tx.lock_inbox_for_end(None).await?;
    let run = lease.run_id.to_string();
    if !tx
        .append_events(&run, Some(sql_epoch(lease.epoch)), &write.events)
        .await?
    {
        return Err(StoreError::LeaseLost(lease.run_id));
    }
    if tx.run_exists(&next.key).await? {
        return Err(match next.key.parse() {
            Ok(id) => exists(&id),
            Err(_) => StoreError::database(format!("run {} already exists", next.key)),
        });
    }
    if !write.events.received.is_empty() {
        tx.forget_payloads(&run, &write.events.received).await?;
    }
    for (key, value) in &write.events.published {
        tx.publish_event(&run, key, value, write.now).await?;
    }
    for (id, reply) in &write.events.replies {
        tx.record_reply(&run, *id, reply, write.now).await?;
    }
    let Some(row) = tx.continue_run(&run, next, write.now).await? else {
        return Err(StoreError::database(format!(
            "the run continuing {run} was not admitted"
        )));
    };
    // After the inbox moved: what the old run received and did not take, back under its
    // own ids (so in its order among what moved), for the next run.
    for entry in &write.carried {
        tx.requeue(&next.key, entry, write.now).await?;
    }
    if !next.leased {
        return Ok(None);
    }
    let record = row.decode()?;
    Ok(Some(LeasedRun::admitted(record)))
}
