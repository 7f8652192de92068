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
//! driver ([`Via::Start`]); should the admission fail, the driver stops without a trace of
//! the run anywhere.
//!
//! The run of a schedule's tick is driven the same way: its admission is the firing of its
//! tick ([`Via::Tick`]), which records the tick and admits the run with its first round's
//! events in one act, so the first step of a scheduled run starts with the tick's commit
//! instead of one more. A tick recorded already (another worker fired it) admits nothing, and
//! the driver stops as it does after a failed admission.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

use super::Driver;
use crate::error::StoreError;
use crate::replay::Writes;
use crate::store::{
    Admission, AdmittedWith, Append, EndHint, FiredTick, Lease, NewEvent, NewRun, NewTick,
    TickWrite,
};

/// What the start learns of the admission: admitted (leased here and driven on, or left for
/// a worker the driver woke), or why not.
pub(crate) type Admitted = Result<(), StoreError>;

/// The admission a driver makes for a run started here (see the module docs).
pub(crate) struct Pending {
    /// The run to admit, to be leased to this process (no token, not delayed; a queued run
    /// is leased only when the store lets it begin at once).
    pub(crate) run: NewRun,
    /// Set until the admission is decided: heartbeats leave the run alone meanwhile.
    pub(crate) admitting: Arc<AtomicBool>,
    /// How the run is admitted, and who hears of it.
    pub(crate) via: Via,
    /// The plain value of `run.input` when the start sealed it here (with encryption or a
    /// codec on): the driver reads it instead of opening the stored arguments.
    pub(crate) known_input: Option<serde_json::Value>,
}

/// How a pending run is admitted.
pub(crate) enum Via {
    /// Started by a caller (`Runtime::start`): admitted by the store's
    /// `create_run_leased_with`; the start waits here for the answer.
    Start(oneshot::Sender<Admitted>),
    /// The run of a schedule's tick: admitted by firing the tick, which records it and
    /// admits the run in one act (`runtime/schedules.rs`).
    Tick(Box<TickAdmission>),
}

/// What firing a tick answers: as the store answers it.
pub(crate) type TickFired = Result<FiredTick, StoreError>;

/// Fires a tick (the firing loop's batch of ticks).
pub(crate) type FireTick =
    Box<dyn FnOnce(NewTick) -> Pin<Box<dyn Future<Output = TickFired> + Send>> + Send + Sync>;

/// The admission of a tick's run by the firing of its tick.
pub(crate) struct TickAdmission {
    /// The tick, whose run (and first events) the driver adds.
    pub(crate) tick: NewTick,
    /// Fires it.
    pub(crate) fire: FireTick,
    /// Where the firing loop hears what the firing did.
    pub(crate) answer: oneshot::Sender<TickFired>,
}

/// What an admission did, as the driver goes on from it.
enum Decided {
    /// Admitted, leased here or not (the first round's events written with it or put
    /// back, to be written after it).
    Admitted(Option<Lease>),
    /// Not admitted, nothing written: the driver stops.
    Not,
}

impl Driver {
    /// Admits the run this driver started before its admission, with `first` (the writes of
    /// its first round) when they only start steps; any other writes are put back, to be
    /// written after the admission as usual. Nothing happens for a run admitted already.
    /// False when the driver has to stop: the admission failed (the start hears why), the
    /// tick was recorded already, or the store admitted the run without leasing it here (a
    /// worker takes it).
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
            admitting,
            via,
            ..
        } = *pending;
        let (events, kept) = match first {
            Some(w) if w.end.is_none() && w.releases.is_empty() => (w.events, None),
            other => (Vec::new(), other),
        };
        if let Some(kept) = kept {
            self.replay.restore_writes(kept);
        }
        let queue = run.queue.as_ref().map(|q| q.name.clone());
        let admitted_at = run.created_at;
        let decided = match via {
            Via::Start(answer) => self.admit_started(run, events, answer).await,
            Via::Tick(tick) => self.admit_ticked(run, events, *tick).await,
        };
        admitting.store(false, Ordering::Release);
        match decided {
            Decided::Admitted(Some(leased)) => {
                self.lease = leased;
                if let Some(queue) = queue {
                    // Begun at its admission, holding its slot.
                    let waited = self.host.now().duration_since(admitted_at);
                    crate::telemetry::queue_waited(&queue, waited.unwrap_or_default());
                }
                Ok(true)
            }
            Decided::Admitted(None) => {
                // Admitted for any worker: its first round is decided again by whoever
                // acquires it.
                self.host.admitted();
                Ok(false)
            }
            Decided::Not => Ok(false),
        }
    }

    /// Admits a run a caller started (`Via::Start`), with `events` when the store can write
    /// both at once; the start hears the answer.
    async fn admit_started(
        &mut self,
        run: NewRun,
        events: Vec<NewEvent>,
        answer: oneshot::Sender<Admitted>,
    ) -> Decided {
        let append = Append {
            events,
            release_tokens: Vec::new(),
            outcome: None,
            end_hint: EndHint::Alone,
            carried: Vec::new(),
        };
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
                let admitted = store.create_run_leased(*run, lease).await;
                self.put_back(append.events);
                admitted
            }
            Err(e) => Err(e),
        };
        match admitted {
            Ok((Admission::Admitted, lease)) => {
                let _ = answer.send(Ok(()));
                Decided::Admitted(lease)
            }
            Ok((Admission::Conflict(owner), _)) => {
                // A run without a token conflicts with none; reported, not assumed.
                let _ = answer.send(Err(StoreError::database(format!(
                    "internal error: a run without a start token conflicted with run {owner}"
                ))));
                Decided::Not
            }
            Err(e) => {
                let _ = answer.send(Err(e));
                Decided::Not
            }
        }
    }

    /// Admits the run of a schedule's tick (`Via::Tick`) by firing the tick with the run and
    /// `events`; the firing loop hears what the firing did. A tick recorded already (by
    /// another worker) admits nothing.
    async fn admit_ticked(
        &mut self,
        run: NewRun,
        mut events: Vec<NewEvent>,
        admission: TickAdmission,
    ) -> Decided {
        let TickAdmission {
            mut tick,
            fire,
            answer,
        } = admission;
        // A round polled ahead of the tick's due time (the run's creation) took effect at
        // the admission: its events are not dated before the run.
        for e in &mut events {
            e.at = e.at.max(run.created_at);
        }
        tick.run = Some(run);
        tick.first = events.clone();
        let fired = fire(tick).await;
        let decided = match &fired {
            Ok(f) if f.write == TickWrite::Recorded => {
                if f.first {
                    self.last_seq += events.len() as u64;
                } else {
                    self.put_back(events);
                }
                Decided::Admitted(f.lease.clone())
            }
            Ok(_) | Err(_) => Decided::Not,
        };
        let _ = answer.send(fired);
        decided
    }

    /// The first round's `events`, written after the admission as any others.
    fn put_back(&mut self, events: Vec<NewEvent>) {
        self.replay.restore_writes(Writes {
            events,
            releases: Vec::new(),
            end: None,
        });
    }
}
