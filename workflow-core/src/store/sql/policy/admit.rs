//! Admission: a run inserted with the claim of its start token, start-or-resume, a child
//! started by a leased run, a run created with a history, and a hook's token claimed by a
//! leased run.

use std::time::Duration;

use super::{fence, Tx};
use crate::error::StoreError;
use crate::ids::RunId;
use crate::store::sql::{lease_end, owner_of, sql_time, to_json, EncodedEvents};
use crate::store::{
    no_token, Admission, AdmitOrResume, ClaimOutcome, Event, Lease, NewEvent, NewRun,
};
use std::time::SystemTime;

/// A run to insert, as its columns.
#[derive(Debug)]
pub(in crate::store) struct NewRunRow {
    pub id: RunId,
    pub key: String,
    pub workflow: String,
    pub input: String,
    pub created_at: i64,
    /// The token to claim with the admission, and until when it stays retained.
    pub hook: Option<(String, Option<i64>)>,
    /// Leased to the admitting worker (epoch 1) until then.
    pub lease_until: Option<i64>,
    /// A queued run the admitting worker would lease until then, if its queue has room at
    /// admission ([`Tx::admit_begun`]).
    pub queue_lease: Option<i64>,
    /// The run fails if it has not ended by then.
    pub deadline: Option<i64>,
    /// The parent that started it with `start_child`, and whether it is detached from it.
    pub parent: Option<(String, bool)>,
    /// The queue it waits in, its partition key and priority.
    pub queue: Option<String>,
    pub partition_key: Option<String>,
    pub priority: i32,
    /// Not begun before then (`start(..).delay(d)`); its wake time is the later of this and
    /// `created_at`, which the insert statements compute.
    pub start_at: Option<i64>,
    /// The version of the build that started it.
    pub version: Option<String>,
    /// Its trace context, as [`crate::store::TraceContext::to_text`] writes it.
    pub trace_context: Option<String>,
}

impl NewRunRow {
    /// Its parent's columns: the parent's id, and whether the run is detached from it.
    pub fn parent_cols(&self) -> (Option<&str>, bool) {
        match &self.parent {
            Some((p, detached)) => (Some(p.as_str()), *detached),
            None => (None, false),
        }
    }

    /// `run`, leased to the admitting worker for `lease` if given.
    pub fn new(run: NewRun, lease: Option<Duration>) -> Result<Self, StoreError> {
        // A queued run holds a slot before it is leased: only `acquire`, or an admission
        // that finds room in its queue, gives one; a delayed run waits for its time.
        let queue_lease = lease
            .filter(|_| run.queue.is_some() && !run.delayed())
            .map(|l| lease_end(run.created_at, l));
        let lease = lease.filter(|_| run.queue.is_none() && !run.delayed());
        let (queue, partition_key, priority) = match run.queue {
            Some(q) => (Some(q.name), q.partition_key, q.priority),
            None => (None, None, 0),
        };
        Ok(NewRunRow {
            queue,
            partition_key,
            priority,
            id: run.id,
            key: run.id.to_string(),
            input: to_json(&run.input, "the run's input")?,
            workflow: run.workflow,
            created_at: sql_time(run.created_at),
            hook: run.hook.map(|h| (h.token, h.retain_until.map(sql_time))),
            lease_until: lease.map(|l| lease_end(run.created_at, l)),
            queue_lease,
            deadline: run.deadline.map(sql_time),
            parent: run.parent.map(|p| (p.run.to_string(), p.detached)),
            start_at: run.start_at.map(sql_time),
            version: run.version,
            trace_context: run.trace_context.as_ref().map(|t| t.to_text()),
        })
    }

    /// Whether its start lies ahead of its admission: nobody may take it yet, so nobody
    /// need be told it is ready. (Only PostgreSQL announces ready runs.)
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub fn delayed(&self) -> bool {
        self.start_at.is_some_and(|t| t > self.created_at)
    }
}

pub(in crate::store) fn exists(id: &RunId) -> StoreError {
    StoreError::database(format!("run {id} already exists"))
}

/// What an admission decided, and the lease of a run leased to the admitting worker.
pub(in crate::store) type Admitted = (Admission, Option<Lease>);

/// `run` admitted: leased to the admitting worker (epoch 1) when it asked.
pub(in crate::store) fn admitted(run: &NewRunRow) -> Admitted {
    let lease = run.lease_until.map(|_| Lease::admitted(run.id));
    (Admission::Admitted, lease)
}

/// Admits `run`. With a token, the claim goes first: when it loses, nothing at all is
/// written; the dialect may decide it in one statement ([`Tx::admit_claiming`]). Without
/// one, the insert alone decides (one statement); a queued run the admitting worker would
/// lease is inserted begun, holding its slot, when its queue has room ([`Tx::admit_begun`],
/// the same one statement), and waiting for an `acquire` otherwise (one more).
pub(in crate::store) async fn admit(
    tx: &mut impl Tx,
    run: &NewRunRow,
) -> Result<Admitted, StoreError> {
    if run.hook.is_some() {
        if let Some(decided) = tx.admit_claiming(run).await? {
            return Ok(decided);
        }
        return claim_and_insert(tx, run).await;
    }
    if let Some(until) = run.queue_lease {
        if tx.admit_begun(run, until).await? {
            return Ok((Admission::Admitted, Some(Lease::admitted(run.id))));
        }
    }
    if !tx.insert_run(run).await? {
        return Err(exists(&run.id));
    }
    Ok(admitted(run))
}

/// Admits `runs` (none claiming a token) as [`admit`] admits each, a leased one with
/// `first[i]`'s events written as its first (see [`Tx::insert_many`]): its answer, in order
/// (an id that exists, or was given before, is refused). `Err` when a statement failed.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(in crate::store) async fn admit_many(
    tx: &mut impl Tx,
    runs: &[&NewRunRow],
    first: &[Option<&EncodedEvents>],
) -> Result<Vec<Result<Admitted, StoreError>>, StoreError> {
    let inserted = tx.insert_many(runs, first).await?;
    Ok(runs
        .iter()
        .zip(inserted)
        .map(|(run, inserted)| match inserted {
            true => Ok(admitted(run)),
            false => Err(exists(&run.id)),
        })
        .collect())
}

/// [`admit`] of a run with a token, in plain statements: the claim, then the insert when it
/// won.
pub(in crate::store) async fn claim_and_insert(
    tx: &mut impl Tx,
    run: &NewRunRow,
) -> Result<Admitted, StoreError> {
    let Some((token, retain_until)) = &run.hook else {
        return Err(no_token());
    };
    // An existing id is an error before any claim, as in the memory store.
    if tx.run_exists(&run.key).await? {
        return Err(exists(&run.id));
    }
    if let Some(owner) = claim_token(tx, token, &run.key, run.created_at, *retain_until).await? {
        return Ok((Admission::Conflict(owner), None));
    }
    if !tx.insert_run(run).await? {
        return Err(exists(&run.id));
    }
    Ok(admitted(run))
}

/// `start(..).hook(token).or_resume(payload)`: queues `payload` to the token's live owner, or
/// else admits `run` with the token; a token only retained by an ended run is a conflict and
/// nothing is written. `None` when neither could be decided in this transaction: a hook took
/// the token between the resume, which found none, and the claim. The caller then rolls the
/// transaction back (nothing was written) and tries again, and the next resume finds that
/// hook.
///
/// The resume goes first, so the locks are taken in the order every other writer takes them
/// (PostgreSQL's inbox lock, then the owner's run row; the token's row only when the run is
/// admitted): a claim that lost would hold the token's row while waking the owner's run row,
/// and that run's worker, ending it, holds the run row while releasing the token's row.
pub(in crate::store) async fn admit_or_resume(
    tx: &mut impl Tx,
    run: &NewRunRow,
    payload: &str,
) -> Result<Option<AdmitOrResume>, StoreError> {
    let Some((token, retain_until)) = &run.hook else {
        return Err(no_token());
    };
    if tx.run_exists(&run.key).await? {
        return Err(exists(&run.id));
    }
    if let Some(queued) = tx.resume(token, payload, run.created_at).await? {
        let (payload_id, run) = queued.decode()?;
        return Ok(Some(AdmitOrResume::Resumed { run, payload_id }));
    }
    if tx
        .claim(token, &run.key, run.created_at, *retain_until)
        .await?
    {
        if !tx.insert_run(run).await? {
            return Err(exists(&run.id));
        }
        return Ok(Some(AdmitOrResume::Admitted(admitted(run).1)));
    }
    let (owner, active) = tx.hook_owner(token).await?;
    if active {
        return Ok(None);
    }
    Ok(Some(AdmitOrResume::Conflict(owner_of(&owner, token)?)))
}

/// Claims `token` for `run`; the owner when it is taken (and then nothing was written).
async fn claim_token(
    tx: &mut impl Tx,
    token: &str,
    run: &str,
    at: i64,
    retain_until: Option<i64>,
) -> Result<Option<RunId>, StoreError> {
    if tx.claim(token, run, at, retain_until).await? {
        return Ok(None);
    }
    // A token the run inherited from the run it continues binds, once.
    if tx.bind_inherited(token, run).await? {
        return Ok(None);
    }
    let (owner, _) = tx.hook_owner(token).await?;
    owner_of(&owner, token).map(Some)
}

/// Admits `run` (no token) with `history` recorded.
pub(in crate::store) async fn create_with_history(
    tx: &mut impl Tx,
    run: &NewRunRow,
    history: &EncodedEvents,
) -> Result<(), StoreError> {
    if run.hook.is_some() {
        return Err(StoreError::database(
            "a run created with a history cannot claim a token",
        ));
    }
    if !tx.insert_run(run).await? {
        return Err(exists(&run.id));
    }
    tx.append_events(&run.key, None, history).await?;
    Ok(())
}

/// Claims `token` for hook `hook_key` of the leased run and records the decision.
pub(in crate::store) async fn claim_hook(
    tx: &mut impl Tx,
    lease: &Lease,
    hook_key: &str,
    token: &str,
    at: SystemTime,
) -> Result<ClaimOutcome, StoreError> {
    let run = fence(tx, lease).await?;
    let conflict = claim_token(tx, token, &run, sql_time(at), None).await?;
    let event = EncodedEvents::new(&[NewEvent {
        at,
        event: Event::HookRegistered {
            hook_key: hook_key.to_owned(),
            token: token.to_owned(),
            conflict,
        },
    }])?;
    tx.append_events(&run, None, &event).await?;
    Ok(match conflict {
        None => ClaimOutcome::Claimed,
        Some(owner) => ClaimOutcome::Conflict(owner),
    })
}

/// Admits `child` under the leased run and records the [`Event::ChildStarted`] that says so
/// (or, when the child's token is taken, its owner as the conflict, and no child).
pub(in crate::store) async fn start_child(
    tx: &mut impl Tx,
    lease: &Lease,
    child_key: &str,
    child: &NewRunRow,
) -> Result<Admission, StoreError> {
    let run = fence(tx, lease).await?;
    let (admission, _) = admit(tx, child).await?;
    let conflict = match admission {
        Admission::Admitted => None,
        Admission::Conflict(owner) => Some(owner),
    };
    let event = EncodedEvents::new(&[NewEvent {
        at: crate::history::from_millis(u64::try_from(child.created_at).unwrap_or(0)),
        event: Event::ChildStarted {
            refused: None,
            child_key: child_key.to_owned(),
            child_id: child.id,
            workflow: child.workflow.clone(),
            conflict,
        },
    }])?;
    tx.append_events(&run, None, &event).await?;
    Ok(admission)
}
