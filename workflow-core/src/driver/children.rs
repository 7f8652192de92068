//! The driver's side of child runs: admitting a child with the event that records it, and
//! reading the ends of children whose ends come to another run's inbox (a fork's copy shares
//! the children its original started before the cut).

use std::time::{Duration, SystemTime};

use super::Driver;
use crate::error::{Error, StoreError};
use crate::history::after;
use crate::ids::RunId;
use crate::replay::ChildCall;
use crate::store::{Admission, ChildNotice, Event as Recorded, NewRun, ParentLink, StartHook};

/// The longest wait between two reads of a shared child's record (see
/// [`Driver::read_shared_child_ends`]); the first wait is the poll interval.
const SHARED_CHILD_READ_MAX: Duration = Duration::from_secs(60);

impl Driver {
    /// Admits child `child_id` of `call` with its `ChildStarted` event; the owner of its
    /// token when it was taken (and no child was admitted). After a transient error, the
    /// history tells whether the start committed before it is tried again.
    pub(super) async fn start_child(
        &self,
        call: ChildCall,
        child_id: RunId,
        at: SystemTime,
    ) -> Result<Option<RunId>, StoreError> {
        // The store and the history know the key as text.
        let child_key = call.child_key.to_string();
        // The child's start span is a child of the parent's start (one trace for both).
        let (_span, trace) = crate::traces::start_span(call.workflow, child_id, Some(&self.trace));
        let child = NewRun::new(child_id, call.workflow.to_owned(), call.input, at)
            .version(self.host.config().version.clone())
            .hook(call.hook.map(|token| StartHook {
                token,
                retain_until: None,
            }))
            .deadline(match call.timeout {
                Some(d) => (d != Duration::MAX).then(|| crate::history::after(at, d)),
                None if call.detached => None,
                None => self.deadline.map(|(at, _)| at),
            })
            .parent(Some(ParentLink {
                run: self.ctx.run_id,
                detached: call.detached,
            }))
            .queue(call.queue)
            .trace_context(trace);
        let mut tries = 0;
        loop {
            let started = self
                .host
                .store()
                .start_child(&self.lease, &child_key, child.clone());
            let e = match started.await {
                Ok(Admission::Admitted) => {
                    crate::telemetry::run_started(call.workflow);
                    return Ok(None);
                }
                Ok(Admission::Conflict(owner)) => return Ok(Some(owner)),
                Err(e) if e.is_transient() => e,
                Err(e) => return Err(e),
            };
            self.back_off(e, &mut tries).await?;
            let run_id = self.ctx.run_id;
            let events = self.retry(|| self.host.store().events(&run_id)).await?;
            match events.last() {
                Some(e) if e.seq == self.last_seq + 1 => {
                    return match &e.event {
                        Recorded::ChildStarted {
                            child_key: recorded,
                            child_id: id,
                            conflict,
                            ..
                        } if *recorded == child_key && *id == child_id => Ok(*conflict),
                        _ => Err(StoreError::LeaseLost(run_id)),
                    };
                }
                last if last.map_or(0, |e| e.seq) == self.last_seq => {}
                _ => return Err(StoreError::LeaseLost(run_id)),
            }
        }
    }

    /// Reads the records of the awaited children whose ends do not come to this run's inbox:
    /// a fork's copy shares the children its original started before the cut, and their
    /// ends go to the original. An ended one's end is handed to the core (delivered and
    /// recorded like one from the inbox); one still running is read again later, the wait
    /// doubling from the poll interval up to [`SHARED_CHILD_READ_MAX`]. A child whose end
    /// comes from the history, or whose record names this run as its parent, is never read.
    pub(super) async fn read_shared_child_ends(&mut self) -> Result<(), StoreError> {
        let unread = self.replay.unread_child_ends();
        self.shared_children.retain(|c, _| unread.contains(c));
        for child in unread {
            if self.own_children.contains(&child) {
                continue;
            }
            let now = self.host.now();
            let wait = match self.shared_children.get(&child) {
                Some((next, _)) if *next > now => continue,
                Some((_, wait)) => *wait,
                None => self.host.config().poll_interval,
            };
            let record = self.retry(|| self.host.store().get_run(&child)).await?;
            let result = match record {
                Some(r) if r.parent == Some(self.ctx.run_id) => {
                    self.own_children.insert(child);
                    continue;
                }
                Some(r) if r.status.is_terminal() => ChildNotice {
                    child,
                    status: r.status,
                    output: r.output,
                    error: r.error,
                }
                .result(),
                Some(_) => {
                    let next = (
                        after(now, wait),
                        wait.saturating_mul(2).min(SHARED_CHILD_READ_MAX),
                    );
                    self.shared_children.insert(child, next);
                    continue;
                }
                None => Err(Error::fatal(format!(
                    "child run {child} is not in the store (pruned?), so its end is unknown"
                ))),
            };
            self.shared_children.remove(&child);
            self.replay.child_end_read(child, result);
        }
        Ok(())
    }
}
