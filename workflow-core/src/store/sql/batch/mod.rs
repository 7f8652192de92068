//! Group commit, written once for both SQL stores. Callers hand the store's committer a
//! [`Request`] (a write and where its answer goes); the committer takes a group ([`take`]:
//! the first request, then whatever waits, up to a maximum), writes it in one transaction,
//! and answers each request only once that transaction's fate is known ([`commit`]): many
//! runs share one commit, and no caller hears of a write that did not commit.
//!
//! What a backend supplies is a [`Committer`]: how it writes a group in one transaction and
//! one request alone. SQLite's writer thread writes a group in one IMMEDIATE transaction
//! (again with a savepoint per request when one failed), synchronously (its futures are ready at once); PostgreSQL's
//! committers write one on a pooled connection, in run-id order, redoing each write alone
//! when a statement may have aborted the group.

use std::future::Future;

use tokio::sync::oneshot;

use crate::error::{DatabaseError, StoreError};

/// Where a request's answer goes.
pub(in crate::store) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A request: the write, its answer once written (held until the transaction's fate is
/// known), and where the answer goes.
pub(in crate::store) struct Request<W, T> {
    pub write: W,
    answer: Option<Result<T, StoreError>>,
    reply: Reply<T>,
}

impl<W, T> Request<W, T> {
    /// A request for `write`, and where its caller waits for the answer.
    pub fn new(write: W) -> (Self, oneshot::Receiver<Result<T, StoreError>>) {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            write,
            answer: None,
            reply,
        };
        (request, answer)
    }

    /// Records the write's own answer, given inside the transaction (a later one replaces
    /// it: a write redone alone).
    pub fn written(&mut self, answer: Result<T, StoreError>) {
        self.answer = Some(answer);
    }

    /// Answers the caller now that the transaction ended as `commit` says. A refused write
    /// wrote nothing, so its own answer holds whatever the commit did; an accepted one
    /// stands only if the commit did. The caller may have stopped waiting; the write stands
    /// either way.
    pub fn finish(self, commit: Result<(), &DatabaseError>) {
        let answer = match (self.answer, commit) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), Ok(())) => Ok(v),
            (_, Err(why)) => Err(StoreError::Database(why.clone())),
            (None, Ok(())) => Err(StoreError::database(
                "internal error: a store write was never run",
            )),
        };
        let _ = self.reply.send(answer);
    }
}

/// A request as [`commit`] handles it, whatever it writes: it answers its caller once the
/// transaction ended.
pub(in crate::store) trait Finish {
    /// See [`Request::finish`].
    fn finish(self, commit: Result<(), &DatabaseError>);
}

impl<W, T> Finish for Request<W, T> {
    fn finish(self, commit: Result<(), &DatabaseError>) {
        Request::finish(self, commit);
    }
}

/// How a group's transaction ended.
pub(in crate::store) enum Group {
    /// Committed: each request's own answer holds.
    Committed,
    /// A write failed in a way that may have aborted the transaction, which was rolled
    /// back: each request is written again, alone. (SQLite's writer never needs it: it writes a failed group again itself.)
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Redo,
    /// The transaction did not commit: every request fails with this (a refused one keeps
    /// its own answer).
    Failed(DatabaseError),
}

/// A backend's way of writing requests: a group in one transaction, or one alone.
pub(in crate::store) trait Committer {
    type Request: Finish;

    /// Orders a group before it is written (the order its rows are locked in). The default
    /// keeps the order of arrival.
    fn order(&self, group: &mut [Self::Request]) {
        let _ = group;
    }

    /// Writes `group` (two requests or more) in one transaction, recording each request's
    /// own answer on it; how the transaction ended.
    fn together(&self, group: &mut [Self::Request]) -> impl Future<Output = Group>;

    /// Writes `request` in a transaction of its own (or as the one statement it is),
    /// recording its answer on it; how that transaction ended.
    fn alone(&self, request: &mut Self::Request)
        -> impl Future<Output = Result<(), DatabaseError>>;
}

/// A group: `first`, then whatever waits (`waiting`, which never blocks), up to `max`
/// requests.
pub(in crate::store) fn take<R>(
    first: R,
    max: usize,
    mut waiting: impl FnMut() -> Option<R>,
) -> Vec<R> {
    let mut group = vec![first];
    while group.len() < max {
        match waiting() {
            Some(request) => group.push(request),
            None => break,
        }
    }
    group
}

/// Writes `request` alone and answers it.
pub(in crate::store) async fn commit_alone<C: Committer>(c: &C, mut request: C::Request) {
    let commit = c.alone(&mut request).await;
    if let Err(why) = &commit {
        tracing::error!(requests = 1, error = %why, "store write failed");
    }
    request.finish(commit.as_ref().map(|_| ()));
}

/// Writes `group` and answers each request after its transaction ended: a group of one
/// alone; any other in one transaction, after which each request has its own answer, is
/// redone alone, or fails with the transaction.
pub(in crate::store) async fn commit<C: Committer>(c: &C, mut group: Vec<C::Request>) {
    if group.len() == 1 {
        if let Some(request) = group.pop() {
            commit_alone(c, request).await;
        }
        return;
    }
    c.order(&mut group);
    match c.together(&mut group).await {
        Group::Committed => {
            for request in group {
                request.finish(Ok(()));
            }
        }
        Group::Redo => {
            for request in group {
                commit_alone(c, request).await;
            }
        }
        Group::Failed(why) => {
            tracing::error!(requests = group.len(), error = %why, "store write failed");
            for request in group {
                request.finish(Err(&why));
            }
        }
    }
}

#[cfg(test)]
mod tests;
