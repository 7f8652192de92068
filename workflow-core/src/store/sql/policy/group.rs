//! Group transactions: the writes of several runs (appends and admissions without a token)
//! in one transaction, each with its own answer, where the dialect's fused statements do the
//! work of several writes. PostgreSQL's committers use it; SQLite's writer thread runs each
//! request's own work in a savepoint instead.

use super::{admit, admit_many, append, Admitted, NewRunRow, Tx};
use crate::error::StoreError;
use crate::store::sql::{sql_epoch, EncodedAppend, EncodedEnd, EncodedEvents};
use crate::store::{EndHint, Lease};

/// A write of a group transaction ([`group`]): an append, or an admission without a token
/// (of a run leased to the admitting worker, with its first events when it has them).
pub(in crate::store) enum GroupWrite<'a> {
    Append(&'a Lease, &'a EncodedAppend),
    Admit(&'a NewRunRow, Option<&'a EncodedEvents>),
}

impl GroupWrite<'_> {
    /// The append, when it only adds events (a step's result and the next step, say).
    fn events_only(&self) -> Option<(&Lease, &EncodedAppend)> {
        match self {
            GroupWrite::Append(lease, write) if write.events_only() => Some((lease, write)),
            _ => None,
        }
    }

    /// The append, when it is a run's usual last write (events and the end, nothing else)
    /// and its writer knows the run has no ties ([`EndHint::Alone`]).
    fn alone_end(&self) -> Option<(&Lease, &EncodedAppend, &EncodedEnd)> {
        match self {
            GroupWrite::Append(lease, write)
                if write.plain_end() && write.hint == EndHint::Alone =>
            {
                write.end.as_ref().map(|end| (*lease, *write, end))
            }
            _ => None,
        }
    }
}

/// The answer of one write of a group.
#[derive(Debug)]
pub(in crate::store) enum Answer {
    Append(Result<(), StoreError>),
    Admit(Result<Admitted, StoreError>),
}

impl Answer {
    /// The error, if the write failed.
    pub fn error(&self) -> Option<&StoreError> {
        match self {
            Answer::Append(r) => r.as_ref().err(),
            Answer::Admit(r) => r.as_ref().err(),
        }
    }
}

/// Why a group transaction cannot give its writes their own answers: it is rolled back.
#[derive(Debug)]
pub(in crate::store) enum GroupError {
    /// A statement failed in a way that may have aborted the transaction (PostgreSQL aborts
    /// it on any failed statement): each write is redone alone.
    Redo(StoreError),
    /// The transaction cannot go on: every write fails with this.
    Failed(StoreError),
}

/// The writes of several runs in one transaction, in the order given (the caller's order of
/// locking rows): each write's own answer. A write refused without writing (lease lost)
/// answers only its caller; any other error of a write is the group's
/// ([`GroupError::Redo`]). No savepoints: a refusal of these policies (`append`: the fenced
/// first statement; `admit` without a token: its one insert) writes nothing.
///
/// Where the dialect can, one statement does the work of several writes: the admissions,
/// which insert new rows no other writer waits for, go first and together
/// ([`Tx::insert_many`]); neighbours that only add events go together
/// ([`Tx::append_many`]), locking their rows in the given order, and so do neighbouring
/// usual ends of runs without ties ([`Tx::end_many_alone`]). A group ending runs that may
/// have a parent (ends not hinted [`EndHint::Alone`]) takes the inbox lock first
/// ([`Tx::lock_inbox_for_ends`]), before any row lock, as every writer that queues a child's
/// end does.
pub(in crate::store) async fn group(
    tx: &mut impl Tx,
    writes: &[GroupWrite<'_>],
) -> Result<Vec<Answer>, GroupError> {
    // Ends hinted `Alone` have no parent to tell, so they need no inbox lock. A writer whose
    // hint was wrong gets the lock taken in its run's own statement, after rows this group
    // already locked: at worst the transaction waits for a deadlock to be detected and is
    // redone, never written wrongly.
    let ending: Vec<String> = writes
        .iter()
        .filter_map(|w| match w {
            GroupWrite::Append(lease, write)
                if write.end.is_some() && write.hint != EndHint::Alone =>
            {
                Some(lease.run_id.to_string())
            }
            _ => None,
        })
        .collect();
    if !ending.is_empty() {
        tx.lock_inbox_for_ends(&ending)
            .await
            .map_err(GroupError::Failed)?;
    }
    let (admitting, first): (Vec<&NewRunRow>, Vec<Option<&EncodedEvents>>) = writes
        .iter()
        .filter_map(|w| match w {
            GroupWrite::Admit(row, first) => Some((*row, *first)),
            GroupWrite::Append(..) => None,
        })
        .unzip();
    // An admission with its first events goes this way even alone (one statement).
    let together = admitting.len() >= 2 || first.iter().any(Option::is_some);
    let mut admitted = if together {
        admit_many(tx, &admitting, &first)
            .await
            .map_err(GroupError::Redo)?
    } else {
        Vec::new()
    }
    .into_iter();
    let mut answers = Vec::with_capacity(writes.len());
    let mut rest = writes;
    while let Some(write) = rest.first() {
        let plain = rest
            .iter()
            .take_while(|w| w.events_only().is_some())
            .count();
        if plain >= 2 {
            let (these, after) = rest.split_at(plain);
            rest = after;
            answers.extend(append_many(tx, these).await.map_err(GroupError::Redo)?);
            continue;
        }
        let alone = rest.iter().take_while(|w| w.alone_end().is_some()).count();
        if alone >= 2 {
            let (these, after) = rest.split_at(alone);
            rest = after;
            answers.extend(end_many(tx, these).await?);
            continue;
        }
        rest = &rest[1..];
        let answer = match write {
            // Answered by `admit_many`, an id that existed included (that statement wrote
            // the others).
            GroupWrite::Admit(..) if together => match admitted.next() {
                Some(answer) => Answer::Admit(answer),
                None => {
                    return Err(GroupError::Redo(StoreError::database(
                        "internal error: an admission of a group went unanswered",
                    )))
                }
            },
            GroupWrite::Admit(row, _) => Answer::Admit(admit(tx, row).await),
            GroupWrite::Append(lease, write) => Answer::Append(append(tx, lease, write).await),
        };
        if let Some(StoreError::Database(why)) = answer.error() {
            return Err(GroupError::Redo(StoreError::Database(why.clone())));
        }
        answers.push(answer);
    }
    Ok(answers)
}

/// The ends of `writes` (runs' usual last writes, of distinct runs without ties, in the
/// order their rows are to be locked), each fenced by its lease: each one's answer. Those
/// the dialect's statement for many did not end (a lost lease, or a tie the hint did not
/// know of) are written alone, as any append is.
async fn end_many(tx: &mut impl Tx, writes: &[GroupWrite<'_>]) -> Result<Vec<Answer>, GroupError> {
    let (mut runs, mut fences, mut events, mut ends) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (lease, write, end) in writes.iter().filter_map(GroupWrite::alone_end) {
        runs.push(lease.run_id.to_string());
        fences.push(sql_epoch(lease.epoch));
        events.push(&write.events);
        ends.push((end, write.now));
    }
    let ended = tx
        .end_many_alone(&runs, &fences, &events, &ends)
        .await
        .map_err(GroupError::Redo)?;
    let mut answers = Vec::with_capacity(writes.len());
    for ((lease, write, _), ended) in writes.iter().filter_map(GroupWrite::alone_end).zip(ended) {
        let answer = match ended {
            true => Answer::Append(Ok(())),
            false => Answer::Append(append(tx, lease, write).await),
        };
        if let Some(StoreError::Database(why)) = answer.error() {
            return Err(GroupError::Redo(StoreError::Database(why.clone())));
        }
        answers.push(answer);
    }
    Ok(answers)
}

/// The events of `writes` (appends that only add events, of distinct runs, in the order
/// their rows are to be locked), each fenced by its lease: each one's answer.
async fn append_many(
    tx: &mut impl Tx,
    writes: &[GroupWrite<'_>],
) -> Result<Vec<Answer>, StoreError> {
    let (mut runs, mut fences, mut events, mut ids) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (lease, write) in writes.iter().filter_map(GroupWrite::events_only) {
        runs.push(lease.run_id.to_string());
        fences.push(sql_epoch(lease.epoch));
        events.push(&write.events);
        ids.push(lease.run_id);
    }
    let written = tx.append_many(&runs, &fences, &events).await?;
    Ok(ids
        .into_iter()
        .zip(written)
        .map(|(id, written)| {
            Answer::Append(match written {
                true => Ok(()),
                false => Err(StoreError::LeaseLost(id)),
            })
        })
        .collect())
}
