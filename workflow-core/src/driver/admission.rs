//! A fresh run started in this process is driven before it is admitted: its driver polls the
//! workflow once, and the admission carries what that first round decided (the start of its
//! first steps), so that both are durable with one commit instead of two. A one-step run then
//! takes two commits (admission with its first step's start; the step's result with the run's
//! end) instead of three.
//!
//! Nothing of the run reaches the world before its admission has committed: its first round
//! only decides (steps are started once what they need is durable, and no other effect of the
//! round is carried out before that), and every way the driver may take first (an end at the
//! first poll, a deadline already past, an input that cannot be read) admits the run plainly
//! before it writes anything else. Whoever awaits the start hears of the admission from the
//! driver ([`Pending::answer`]); should the admission fail, the driver stops without a trace
//! of the run anywhere.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

use super::Driver;
use crate::error::StoreError;
use crate::replay::Writes;
use crate::store::{Admission, AdmittedWith, Append, EndHint, NewRun};

/// What the start learns of the admission: admitted (leased here and driven on, or left for
/// a worker the driver woke), or why not.
pub(crate) type Admitted = Result<(), StoreError>;

/// The admission a driver makes for a run started here (see the module docs).
pub(crate) struct Pending {
    /// The run to admit, to be leased to this process (no token, not delayed; a queued run
    /// is leased only when the store lets it begin at once).
    pub(crate) run: NewRun,
    /// Where the start waits for the admission.
    pub(crate) answer: oneshot::Sender<Admitted>,
    /// Set until the admission is decided: heartbeats leave the run alone meanwhile.
    pub(crate) admitting: Arc<AtomicBool>,
}

impl Driver {
    /// Admits the run this driver started before its admission, with `first` (the writes of
    /// its first round) when they only start steps; any other writes are put back, to be
    /// written after the admission as usual. Nothing happens for a run admitted already.
    /// False when the driver has to stop: the admission failed (the start hears why), or the
    /// store admitted the run without leasing it here (a worker takes it).
    pub(super) async fn admit_pending(
        &mut self,
        first: Option<Writes>,
    ) -> Result<bool, StoreError> {
        let Some(pending) = self.pending.take() else {
            if let Some(first) = first {
                self.replay.restore_writes(first);
            }
            return Ok(true);
        };
        let Pending {
            run,
            answer,
            admitting,
        } = *pending;
        let (events, kept) = match first {
            Some(w) if w.end.is_none() && w.releases.is_empty() => (w.events, None),
            other => (Vec::new(), other),
        };
        if let Some(kept) = kept {
            self.replay.restore_writes(kept);
        }
        let append = Append {
            events,
            release_tokens: Vec::new(),
            outcome: None,
            end_hint: EndHint::Alone,
        };
        let queue = run.queue.as_ref().map(|q| q.name.clone());
        let admitted_at = run.created_at;
        let lease = self.host.config().lease;
        let store = self.host.store();
        let admitted = match store.create_run_leased_with(run, lease, &append).await {
            Ok(AdmittedWith::Done(admission, leased)) => {
                if leased.is_some() {
                    self.last_seq += append.events.len() as u64;
                }
                Ok((admission, leased))
            }
            // The store cannot write both at once: the admission alone, and the first
            // round's writes after it, as any others.
            Ok(AdmittedWith::Unsupported(run)) => {
                let Append { events, .. } = append;
                self.replay.restore_writes(Writes {
                    events,
                    releases: Vec::new(),
                    end: None,
                });
                store.create_run_leased(*run, lease).await
            }
            Err(e) => Err(e),
        };
        admitting.store(false, Ordering::Release);
        match admitted {
            Ok((Admission::Admitted, Some(leased))) => {
                self.lease = leased;
                if let Some(queue) = queue {
                    // Begun at its admission, holding its slot.
                    let waited = self.host.now().duration_since(admitted_at);
                    crate::telemetry::queue_waited(&queue, waited.unwrap_or_default());
                }
                let _ = answer.send(Ok(()));
                Ok(true)
            }
            Ok((Admission::Admitted, None)) => {
                // Admitted for any worker: its first round is decided again by whoever
                // acquires it.
                let _ = answer.send(Ok(()));
                self.host.admitted();
                Ok(false)
            }
            Ok((Admission::Conflict(owner), _)) => {
                // A run without a token conflicts with none; reported, not assumed.
                let _ = answer.send(Err(StoreError::database(format!(
                    "internal error: a run without a start token conflicted with run {owner}"
                ))));
                Ok(false)
            }
            Err(e) => {
                let _ = answer.send(Err(e));
                Ok(false)
            }
        }
    }
}
