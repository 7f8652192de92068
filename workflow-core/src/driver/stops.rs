//! How a driven run stops short of its workflow's end: a failed try on a store error, its
//! deadline, a failure before the body ran, a missing key, eviction and divergence.

use std::time::SystemTime;

use super::{Driver, Stop};
use crate::config::Past;
use crate::crypto::places::{self, Unreadable};
use crate::error::{Error, StoreError};
use crate::history::{Event, NewEvent};
use crate::replay::{Divergence, End, Writes};
use crate::store::{FailureOutcome, RunStatus};

impl Driver {
    /// Records that this try at the run ended on store error `e`, which is not transient (a
    /// run the store keeps refusing must end): the store gives the run back for a later try,
    /// or fails it after the last. Whether the run was given back.
    pub(super) async fn failed_try(&self, e: StoreError) -> bool {
        let run_id = self.ctx.run_id;
        let cause = Error::fatal(format!("store error: {e}"));
        let recorded = self
            .retry(|| {
                self.host
                    .store()
                    .record_failure(&self.lease, &cause, self.host.now())
            })
            .await;
        match recorded {
            Ok(FailureOutcome::Retrying { tries, at }) => {
                let due_in = at.duration_since(self.host.now()).unwrap_or_default();
                tracing::warn!(
                    %run_id, error = %e, tries, ?due_in,
                    "run driver stopped on a store error; the run is tried again later"
                );
                true
            }
            Ok(FailureOutcome::Failed) => {
                tracing::error!(
                    %run_id, error = %e,
                    "run driver stopped on a store error again; the run failed"
                );
                crate::telemetry::run_ended(self.ctx.workflow, RunStatus::Failed);
                self.host.ended(run_id, self.parent, None, None);
                false
            }
            Err(why) => {
                tracing::warn!(
                    %run_id, error = %e, record_error = %why,
                    "run driver stopped on a store error, and could not record it; the lease \
                     will expire"
                );
                false
            }
        }
    }

    /// Fails the run at its deadline (`start(..).timeout(d)`); its attempts are dropped when
    /// the driver stops.
    pub(super) async fn time_out(&mut self) -> Result<Stop, StoreError> {
        // A run started here is admitted before anything else of it is written.
        if !self.admit_pending(None).await? {
            return Ok(Stop::Abandoned);
        }
        let timeout = self.deadline.map(|(_, d)| d).unwrap_or_default();
        let error = Error::fatal(format!(
            "run {} timed out after {}: its deadline passed",
            self.ctx.run_id,
            crate::config::human_duration(timeout)
        ));
        tracing::warn!(run_id = %self.ctx.run_id, "{error}");
        for (_, attempt) in self.attempts.drain() {
            attempt.abort();
        }
        self.replay.take_writes();
        let outcome = self
            .write(Writes {
                events: vec![NewEvent {
                    at: self.host.now(),
                    event: Event::RunFailed {
                        error: error.clone(),
                    },
                }],
                releases: Vec::new(),
                end: Some(End::Failed(error)),
            })
            .await?;
        self.host.ended(self.ctx.run_id, self.parent, outcome, None);
        Ok(Stop::Ended)
    }

    /// Fails the run because its history grew `past` the hard limit, in one write
    /// with what the core decided and has not written yet, so nothing of it is lost; its
    /// attempts are dropped when the driver stops.
    pub(super) async fn fail_past_limit(&mut self, past: Past) -> Result<Stop, StoreError> {
        let soft = self.host.config().history;
        let error = Error::fatal(format!(
            "run {} (workflow `{}`) failed: its history holds {past} (5 times the soft limit \
             of {} events or {} set with `history_limits`); a run that goes on for long must \
             end with `continue_as_new` once `continue_as_new_suggested()` is true, passing \
             its state to the next run",
            self.ctx.run_id,
            self.ctx.workflow,
            soft.events,
            crate::config::human_bytes(soft.bytes),
        ));
        tracing::error!(run_id = %self.ctx.run_id, "{error}");
        for (_, attempt) in self.attempts.drain() {
            attempt.abort();
        }
        let mut writes = self.replay.take_writes();
        writes.events.push(NewEvent {
            at: self.host.now(),
            event: Event::RunFailed {
                error: error.clone(),
            },
        });
        writes.end = Some(End::Failed(error));
        let outcome = self.write(writes).await?;
        self.host.ended(self.ctx.run_id, self.parent, outcome, None);
        Ok(Stop::Ended)
    }

    /// Fails a run whose recorded arguments do not fit this binary's workflow.
    pub(super) async fn fail_at_start(&mut self, error: Error) -> Result<Stop, StoreError> {
        // A run started here is admitted before anything else of it is written.
        if !self.admit_pending(None).await? {
            return Ok(Stop::Abandoned);
        }
        // It may quote the arguments.
        let error = self.seal_run_error(error);
        let at = self.host.now();
        let writes = Writes {
            events: vec![NewEvent {
                at,
                event: Event::RunFailed {
                    error: error.clone(),
                },
            }],
            releases: Vec::new(),
            end: Some(End::Failed(error)),
        };
        let outcome = self.write(writes).await?;
        self.host.ended(self.ctx.run_id, self.parent, outcome, None);
        Ok(Stop::Ended)
    }

    /// `error`, ending the run, with its message sealed when encryption is on.
    pub(super) fn seal_run_error(&self, error: Error) -> Error {
        let binding = places::of_run(self.ctx.owner(), places::ERROR, "");
        self.ctx.payloads.seal_error(error, &binding)
    }

    /// Blocks the run, before anything of it is replayed, because a payload of its record or
    /// history cannot be opened here (`why`: sealed with a key this process was not given, or
    /// in a form a newer build writes): nothing is written and nothing decoded; a worker that
    /// can open it takes it (workers retry blocked runs when they start, with backoff, and on
    /// `retry()`).
    pub(super) async fn block_unreadable(&mut self, why: &Unreadable) -> Result<Stop, StoreError> {
        // A run started here is admitted before anything else of it is written.
        if !self.admit_pending(None).await? {
            return Ok(Stop::Abandoned);
        }
        let error = Error::fatal(match why {
            Unreadable::Key(key) => format!(
                "run {} (workflow `{}`) holds payloads encrypted with key {key:?}, which this \
                 worker was not given; the run is blocked, unchanged, until a worker with that \
                 key takes it (give it with `Keys::old({key:?}, key)`, or `workflow rekey` the \
                 store)",
                self.ctx.run_id, self.ctx.workflow
            ),
            Unreadable::Form(form) => format!(
                "run {} (workflow `{}`) holds payloads sealed in a form this build does not read \
                 ({form}): a newer build of workflow-rs wrote them; the run is blocked, \
                 unchanged, until a worker of a build that reads them takes it",
                self.ctx.run_id, self.ctx.workflow
            ),
        });
        tracing::error!(run_id = %self.ctx.run_id, "{error}");
        let at = self
            .retry(|| {
                self.host
                    .store()
                    .block(&self.lease, &error, self.host.now())
            })
            .await?;
        tracing::info!(run_id = %self.ctx.run_id, retry_at = ?at, "run blocked");
        Ok(Stop::Blocked)
    }

    /// Writes what is pending and gives the run back until `wake_at` (or its next payload).
    pub(super) async fn evict(&mut self, wake_at: SystemTime) -> Result<Stop, StoreError> {
        self.flush().await?;
        // The release wakes the run at once for entries above `seen`: messages sent before
        // the run began, which no `recv` waits for yet, must not count as news.
        if self.inbox_unread {
            self.fetch_payloads().await?;
        }
        let seen = self.replay.inbox_seen();
        self.retry(|| self.host.store().release(&self.lease, wake_at, seen))
            .await?;
        Ok(Stop::Evicted)
    }

    /// Blocks the run without touching its history: it waits for a build whose code
    /// fits, tried again when a worker starts, with backoff, or on `retry()`.
    pub(super) async fn diverge(&mut self, divergence: Divergence) -> Result<Stop, StoreError> {
        let msg = format!(
            "replay of run {} (workflow `{}`) diverged from its recorded history: {divergence}; \
             the code changed under a running workflow. The run is blocked until a build whose \
             code fits its history picks it up (or `retry()`); nothing was written.",
            self.ctx.run_id, self.ctx.workflow
        );
        tracing::error!(run_id = %self.ctx.run_id, "{msg}");
        let error = Error::diverged_at(msg, divergence);
        let at = self
            .retry(|| {
                self.host
                    .store()
                    .block(&self.lease, &error, self.host.now())
            })
            .await?;
        tracing::info!(run_id = %self.ctx.run_id, retry_at = ?at, "run blocked");
        Ok(Stop::Blocked)
    }
}
