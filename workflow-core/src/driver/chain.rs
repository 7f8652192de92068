//! How a driven run continues as new: the workflow returned `continue_as_new(wf, args)`, so
//! the run's last events (the decision, naming the next run) and the next run's admission
//! are one store call ([`RunStore::continue_as_new`]), fenced by the lease.
//!
//! [`RunStore::continue_as_new`]: crate::store::RunStore::continue_as_new

use std::time::SystemTime;

use super::{Driver, Stop};
use crate::error::{Continuation, Error, StoreError};
use crate::ids::RunId;
use crate::payload::{Encoded, PayloadError, PayloadKind};
use crate::store::{Append, LeasedRun, NewRun, RunStatus};

impl Driver {
    /// Continues the run as `c` asks: records the decision and admits the next run in one
    /// store call, or, when the next run's arguments cannot be stored (serialization, size),
    /// fails the run with that error.
    pub(super) async fn continue_as_new(
        &mut self,
        c: Continuation,
        now: SystemTime,
    ) -> Result<Stop, StoreError> {
        let next_id = RunId::new();
        let cx = PayloadKind::WorkflowInput {
            workflow: c.workflow,
        };
        let input = c.input.map_err(Error::fatal).and_then(|v| {
            self.ctx
                .payloads
                .seal(Ok(v), cx.of(next_id))
                .map_err(PayloadError::fatal)
        });
        let input = match input {
            Ok(input) => input,
            Err(e) => return self.end_with(Err(e), now).await,
        };
        let writes = match self.replay.continued(next_id, c.workflow.to_owned(), now) {
            Ok(writes) => writes,
            Err(d) => return self.diverge(d).await,
        };
        // What the run received and its workflow did not take goes back to the inbox, for
        // the next run, in the same transaction.
        let append = Append {
            events: writes.events,
            carried: self.ctx.unconsumed(),
            ..Append::default()
        };
        // Only the next run's own parts: the store copies what it inherits.
        let next = NewRun::new(next_id, c.workflow.to_owned(), input, now);
        // Driven here at once when this process can take it: the store admits it leased
        // under this run's lease, so no worker has to find it first.
        let lease_next = self.host.can_continue(c.workflow);
        #[cfg(any(test, feature = "testing"))]
        crate::testing::failpoint("continue_as_new.before_commit");
        let mut tries = 0;
        let leased = loop {
            let store = self.host.store();
            let done = if lease_next {
                store
                    .continue_as_new_leased(&self.lease, &append, next.clone())
                    .await
            } else {
                store
                    .continue_as_new(&self.lease, &append, next.clone())
                    .await
                    .map(|()| None)
            };
            match done {
                Ok(leased) => break leased,
                Err(e) if e.is_transient() => {
                    self.back_off(e, &mut tries).await?;
                    // Committed after all, if the run now names its next run.
                    let run = self.ctx.run_id;
                    let record = self.retry(|| self.host.store().get_run(&run)).await?;
                    match record {
                        Some(r) if r.next_run == Some(next_id) && lease_next => {
                            break self.leased_after_all(next_id).await?;
                        }
                        Some(r) if r.next_run == Some(next_id) => break None,
                        Some(r) if r.status == RunStatus::Running => {}
                        _ => return Err(StoreError::LeaseLost(run)),
                    }
                }
                Err(e) => return Err(e),
            }
        };
        self.last_seq += append.events.len() as u64;
        crate::telemetry::run_ended(self.ctx.workflow, RunStatus::ContinuedAsNew);
        tracing::debug!(run_id = %self.ctx.run_id, next_run = %next_id, "continued as new");
        // Waiters on this run read its record and follow it to the next run; the parent is
        // told only by the chain's last run.
        self.host.ended(self.ctx.run_id, None, None, None);
        match leased {
            Some(next) => self.host.clone().continued(next),
            None => self.host.admitted(),
        }
        Ok(Stop::Ended)
    }

    /// The next run, `next`, of a continuation asked to lease it that committed although
    /// the store's answer was lost: leased here (epoch 1) while it runs. No other worker
    /// acquires it before its lease ends, and one that does after holds a later epoch, so
    /// the fence refuses every write of a driver whose lease that was.
    async fn leased_after_all(&mut self, next: RunId) -> Result<Option<LeasedRun>, StoreError> {
        let record = self.retry(|| self.host.store().get_run(&next)).await?;
        Ok(record
            .filter(|r| r.status == RunStatus::Running)
            .map(LeasedRun::admitted))
    }

    /// Ends the run with `result` as if the workflow had returned it.
    pub(super) async fn end_with(
        &mut self,
        result: Result<Encoded, Error>,
        now: SystemTime,
    ) -> Result<Stop, StoreError> {
        let (result, plain) = match result {
            Ok(Encoded { stored, plain }) => (Ok(stored), plain),
            Err(e) => (Err(self.seal_run_error(e)), None),
        };
        match self.replay.returned(result, now) {
            Ok(end) => {
                let outcome = self.write(end).await?;
                self.host
                    .ended(self.ctx.run_id, self.parent, outcome, plain);
                Ok(Stop::Ended)
            }
            Err(d) => self.diverge(d).await,
        }
    }
}
