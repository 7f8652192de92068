//! A run's step attempts as the driver runs them: each attempt a task of its own (a
//! transactional one in a store transaction, `transactional.rs`), its span, timeout and
//! metrics, and its outcome reported back to the driver exactly once ([`Report`]), handed to
//! the core in the order the history must keep.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::FutureExt;
use serde_json::Value;
use tokio::sync::mpsc;

use super::transactional::{Recorded as TxRecorded, TxAttempt};
use super::{bounded, panic_message, Driver};
use crate::context::{step_scope, StepMetadata, StepSets};
use crate::crypto::places;
use crate::error::{Error, StoreError};
use crate::registry::BoxFuture;
use crate::replay::StepId;
use crate::telemetry::AttemptOutcome;
use crate::traces::InSpan;

/// An attempt's outcome, reported by its task.
pub(super) struct AttemptDone {
    step_id: StepId,
    attempt: u32,
    outcome: Result<Value, Error>,
    /// What the attempt published with `set_event` (encoded), recorded with its outcome.
    published: Vec<(String, Value)>,
    /// Whether the attempt recorded its outcome itself (a transactional step's commit).
    recorded: TxRecorded,
}

/// Sends an attempt's outcome to the driver exactly once: if the attempt's task ends without
/// one (it panicked outside the step's own future), the attempt counts as failed, so the driver
/// never waits for an attempt that is gone. (An aborted task reports to a driver that stopped.)
struct Report {
    done: mpsc::UnboundedSender<AttemptDone>,
    step_id: Option<StepId>,
    attempt: u32,
    sets: Arc<StepSets>,
}

impl Report {
    fn send(&mut self, outcome: Result<Value, Error>, recorded: TxRecorded) {
        if let Some(step_id) = self.step_id.take() {
            // A transactional attempt committed its values with its result.
            let published = match &recorded {
                TxRecorded::No => self.sets.take(),
                _ => Vec::new(),
            };
            let _ = self.done.send(AttemptDone {
                step_id,
                attempt: self.attempt,
                outcome,
                published,
                recorded,
            });
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        self.send(
            Err(Error::panicked(
                "the step attempt's task ended without an outcome",
            )),
            TxRecorded::No,
        );
    }
}

impl Driver {
    /// An attempt reported `done`. While a transactional attempt is in flight, the others'
    /// outcomes wait for it; a lost lease stops the driver.
    pub(super) fn attempt_done(&mut self, done: AttemptDone) -> Result<(), StoreError> {
        match &self.tx_attempt {
            Some(tx) if *tx != done.step_id => {
                self.held.push_back(done);
                return Ok(());
            }
            Some(_) => self.tx_attempt = None,
            None => {}
        }
        self.finish_attempt(done)?;
        while let Some(done) = self.held.pop_front() {
            self.finish_attempt(done)?;
        }
        Ok(())
    }

    /// Hands an attempt's outcome to the core: recorded (and delivered) by the next write,
    /// or, when the attempt's transaction recorded it, delivered at once.
    fn finish_attempt(&mut self, done: AttemptDone) -> Result<(), StoreError> {
        self.attempts.remove(&done.step_id);
        match (done.recorded, done.outcome) {
            (TxRecorded::LeaseLost, _) => return Err(StoreError::LeaseLost(self.ctx.run_id)),
            (
                TxRecorded::At {
                    at,
                    events,
                    published,
                },
                Ok(value),
            ) => {
                self.last_seq += events;
                let carried = self.tx_unwritten.take().unwrap_or_default();
                let wake =
                    !published.is_empty() || carried.events.iter().any(|e| e.event.publishes());
                self.replay
                    .published_by_store(&done.step_id, done.attempt, published);
                self.replay
                    .attempt_recorded(&done.step_id, done.attempt, value, at);
                if wake {
                    self.host.published(self.ctx.run_id);
                }
            }
            (_, outcome) => {
                // A transactional attempt that committed nothing: what it carried is written
                // first, as it would have been before it.
                if let Some(carried) = self.tx_unwritten.take() {
                    // The attempt's task has ended: this is the last handle.
                    let carried = Arc::try_unwrap(carried).unwrap_or_else(|c| (*c).clone());
                    self.replay.restore_writes(carried);
                }
                let backoff = self.host.config().backoff(done.attempt);
                // Every error an attempt recorded is sealed (a step's message, a panic's).
                let place = done.step_id.to_string();
                let binding = places::of_run(self.ctx.owner(), places::STEP_ERROR, &place);
                let outcome = outcome.map_err(|e| self.ctx.payloads.seal_error(e, &binding));
                let now = self.host.now();
                self.replay
                    .attempt_published(&done.step_id, done.attempt, done.published, now);
                self.replay
                    .attempt_finished(&done.step_id, done.attempt, outcome, now, backoff);
            }
        }
        self.deliver_ready();
        Ok(())
    }

    /// Runs one attempt of a step as a task of its own; its outcome comes back on `done_tx`.
    /// A transactional step's attempt runs in a store transaction and records its own result
    /// (`driver/transactional.rs`); until it reports, the driver waits for it alone.
    pub(super) fn start_attempt(&mut self, step_id: StepId, attempt: u32) {
        let Some(call) = self.replay.step(&step_id) else {
            return;
        };
        let name = call.name;
        let meta = StepMetadata {
            step_id: step_id.to_string(),
            step_name: name.to_owned(),
            run_id: self.ctx.run_id,
            attempt,
            started_at: self.host.now(),
        };
        // One span per attempt, so exporters see each try with its own duration. In logs it
        // is a child of the run's span; in traces (feature `otel`) a child of the context the
        // run was started in, whatever process runs it and however often the run was picked
        // up again: a span a crash left unfinished is never its parent.
        let span = tracing::info_span!(
            parent: &self.span,
            "step",
            workflow.run_id = %self.ctx.run_id,
            workflow.name = self.ctx.workflow,
            step.name = name,
            step.id = %step_id,
            step.attempt = attempt,
            step.outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        self.trace.adopt(&span);
        let timed_out = Arc::new(AtomicBool::new(false));
        let sets = StepSets::new(self.ctx.owner(), self.ctx.payloads.clone());
        let run: BoxFuture<'static, (Result<Value, Error>, TxRecorded)> = if call.transactional {
            self.tx_attempt = Some(step_id.clone());
            let carried = Arc::new(self.tx_pending.take().unwrap_or_default());
            self.tx_unwritten = Some(carried.clone());
            let attempt = TxAttempt {
                host: self.host.clone(),
                lease: self.lease.clone(),
                step_id: step_id.clone(),
                name,
                exec: call.body.clone(),
                input: call.input.clone(),
                timeout: call.timeout,
                meta,
                sets: sets.clone(),
                carried,
            };
            Box::pin(attempt.run(timed_out.clone()))
        } else {
            let body = bounded((call.body)(&call.input), call.timeout, name, &timed_out);
            let fut = self
                .host
                .clone()
                .enter_step(Box::pin(step_scope(meta, sets.clone(), body)));
            Box::pin(async move {
                let outcome = match AssertUnwindSafe(fut).catch_unwind().await {
                    // The body encoded the result (`call_step`), checked against the limit.
                    Ok(outcome) => outcome,
                    Err(panic) => Err(Error::panicked(format!(
                        "step `{name}` panicked: {}",
                        panic_message(&panic)
                    ))),
                };
                (outcome, TxRecorded::No)
            })
        };
        let key = step_id.clone();
        let mut report = Report {
            done: self.done_tx.clone(),
            step_id: Some(step_id),
            attempt,
            sets,
        };
        // The attempt records its outcome on its span, handed in rather than looked up.
        let outcome_span = span.clone();
        let task = async move {
            let began = std::time::Instant::now();
            let (outcome, recorded) = run.await;
            if let Err(e) = &outcome {
                tracing::warn!(error = %e, "step attempt failed");
            }
            let how = match &outcome {
                Ok(_) => AttemptOutcome::Ok,
                Err(_) if timed_out.load(Ordering::Relaxed) => AttemptOutcome::Timeout,
                Err(e) if e.is_panic() => AttemptOutcome::Panic,
                Err(_) => AttemptOutcome::Error,
            };
            crate::telemetry::step_attempt(name, how, began.elapsed());
            outcome_span.record("step.outcome", how.label());
            if how != AttemptOutcome::Ok {
                outcome_span.record("otel.status_code", "error");
            }
            report.send(outcome, recorded);
        };
        let h = tokio::spawn(InSpan::new(span, task));
        self.attempts.insert(key, h.abort_handle());
    }
}
