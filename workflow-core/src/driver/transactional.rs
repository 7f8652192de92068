//! The driver's side of transactional steps: an attempt that runs its body in a
//! transaction of the store and commits the body's writes with the step's `StepCompleted`,
//! fenced by the lease, in one commit. The attempt task writes that one event itself (the
//! driver records everything else), so while it is in flight the driver records and delivers
//! nothing else of the run (see `Driver::tx_attempt`): the history's order of results stays
//! the order the workflow saw them in.
//!
//! A busy database or a serialization failure (at the begin, in the body's statements, at the
//! commit) runs the whole attempt again, lease check included, without counting it; an error
//! of the body rolls back and is the attempt's outcome, retried by the step's policy; a lost
//! lease commits nothing and stops the driver.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use serde_json::Value;

use super::{bounded, panic_message, Host};
use crate::context::{step_scope, StepExec, StepMetadata, StepSets};
use crate::error::{Error, StoreError};
use crate::history::{Event, NewEvent};
use crate::replay::{published_events, StepId, Writes};
use crate::store::{Append, Lease};
use crate::transactional::TxEnv;

/// What an attempt's task did with its outcome besides reporting it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Recorded {
    /// Nothing: the driver records the outcome.
    No,
    /// Its `StepCompleted` committed at `at`, with the body's writes, after what the driver
    /// had to write before the attempt and the values the body published: `events` events in
    /// all; `published`: the `EventSet`s of the values the body published, among them.
    At {
        at: SystemTime,
        events: u64,
        published: Vec<NewEvent>,
    },
    /// The lease was lost: nothing committed, the driver must stop.
    LeaseLost,
}

/// The first wait before an attempt that met a busy database or a serialization failure runs
/// again; it doubles up to [`CONFLICT_WAIT_MAX`], with jitter so that the contenders spread.
const CONFLICT_WAIT: Duration = Duration::from_millis(5);
const CONFLICT_WAIT_MAX: Duration = Duration::from_secs(1);

/// One attempt of a transactional step, as its task runs it.
pub(super) struct TxAttempt {
    pub(super) host: Arc<dyn Host>,
    pub(super) lease: Lease,
    pub(super) step_id: StepId,
    pub(super) name: &'static str,
    pub(super) exec: StepExec,
    pub(super) input: Value,
    pub(super) timeout: Option<Duration>,
    pub(super) meta: StepMetadata,
    /// Where the body's `set_event` calls collect their values.
    pub(super) sets: Arc<StepSets>,
    /// What the driver had to write before the attempt (its `StepAttemptStarted` at least):
    /// committed first, in the same transaction.
    pub(super) carried: Arc<Writes>,
}

impl TxAttempt {
    /// Runs the attempt to its outcome: begin, body, commit, again after each conflict.
    /// `timed_out` is set when the outcome is the body's deadline.
    pub(super) async fn run(self, timed_out: Arc<AtomicBool>) -> (Result<Value, Error>, Recorded) {
        let name = self.name;
        let mut conflicts = 0u32;
        loop {
            let open = match self.host.store().begin_step(&self.lease).await {
                Ok(Some(open)) => open,
                Ok(None) => {
                    let why = format!(
                        "transactional step `{name}` cannot run on the memory store: its writes \
                         must commit with its recorded result in the store's own database; \
                         build the runtime with `.sqlite(path)` or `.postgres(url)`"
                    );
                    return (Err(Error::fatal(why)), Recorded::No);
                }
                Err(StoreError::LeaseLost(id)) => return lease_lost(id.to_string()),
                Err(e) if e.is_transient() => {
                    conflict_wait(&mut conflicts, name, &e.to_string()).await;
                    continue;
                }
                Err(e) => {
                    let why = format!("transactional step `{name}` could not begin: {e}");
                    return (Err(Error::retryable(why)), Recorded::No);
                }
            };
            let env = TxEnv::new(name, open);
            // A run of the body again after a conflict publishes anew.
            drop(self.sets.take());
            let body = bounded((self.exec)(&self.input), self.timeout, name, &timed_out);
            let scoped = env
                .clone()
                .scope(step_scope(self.meta.clone(), self.sets.clone(), body));
            let attempt = self.host.clone().enter_step(Box::pin(scoped));
            let outcome = AssertUnwindSafe(attempt)
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(Error::panicked(format!(
                        "step `{name}` panicked: {}",
                        panic_message(&panic)
                    )))
                });
            let conflict = env.conflict.load(Ordering::Relaxed)
                || outcome.as_ref().err().is_some_and(Error::lost_race);
            let open = env.take();
            let (value, open) = match (outcome, open) {
                (Ok(value), Some(open)) => (value, open),
                (Ok(_), None) => {
                    let why = format!("transactional step `{name}` lost its transaction");
                    return (Err(Error::retryable(why)), Recorded::No);
                }
                (Err(e), open) => {
                    drop(open); // rolls back
                    if conflict && !timed_out.load(Ordering::Relaxed) {
                        conflict_wait(&mut conflicts, name, e.message()).await;
                        continue;
                    }
                    return (Err(e), Recorded::No);
                }
            };
            let at = self.host.now();
            let published =
                published_events(&self.step_id, self.meta.attempt, self.sets.take(), at);
            let mut events = self.carried.events.clone();
            events.extend(published.iter().cloned());
            events.push(NewEvent {
                at,
                event: Event::StepCompleted {
                    step_id: self.step_id.to_string(),
                    result: Ok(value.clone()),
                },
            });
            let recorded = Recorded::At {
                at,
                events: events.len() as u64,
                published,
            };
            let write = Append {
                events,
                release_tokens: self.carried.releases.clone(),
                ..Append::default()
            };
            match open.commit(&self.lease, &write).await {
                Ok(()) => return (Ok(value), recorded),
                Err(StoreError::LeaseLost(id)) => return lease_lost(id.to_string()),
                Err(e) if e.is_transient() || conflict => {
                    conflict_wait(&mut conflicts, name, &e.to_string()).await;
                }
                Err(e) => {
                    let why = format!("transactional step `{name}` could not commit: {e}");
                    return (Err(Error::retryable(why)), Recorded::No);
                }
            }
        }
    }
}

fn lease_lost(run: String) -> (Result<Value, Error>, Recorded) {
    let why = format!("the lease on run {run} was lost; the step's transaction was rolled back");
    (Err(Error::retryable(why)), Recorded::LeaseLost)
}

/// Waits before the attempt runs again after conflict number `conflicts + 1`.
async fn conflict_wait(conflicts: &mut u32, name: &str, why: &str) {
    let base = CONFLICT_WAIT
        .saturating_mul(1 << (*conflicts).min(10))
        .min(CONFLICT_WAIT_MAX);
    *conflicts += 1;
    let jitter = base.mul_f64(rand::random::<f64>());
    tracing::debug!(
        step = name,
        conflicts = *conflicts,
        error = why,
        "transactional step met a busy database or a serialization failure; running it again"
    );
    tokio::time::sleep(base + jitter).await;
}
