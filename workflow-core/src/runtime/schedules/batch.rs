//! The ticks of one look fired together ([`Batch`]): each schedule's firing sends its tick,
//! the ticks sent meanwhile go out in one `fire_ticks_when` call, and a look decided ahead of
//! its due time is handed to the store at once and written at that time (or not at all).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::{mpsc, oneshot, Notify};

use super::super::Inner;
use crate::error::StoreError;
use crate::store::{FiredTick, NewTick};

/// The most ticks one `fire_ticks` call carries.
const MAX_TICKS_PER_CALL: usize = 1024;
/// From this many ticks on, a group of ticks goes out as two calls at once.
const SPLIT_AT: usize = 256;
/// How long a call of the firing loop waits for the next promised tick before it goes out
/// without the rest ([`Batch::promise`]).
const PROMISE_WAIT: Duration = Duration::from_millis(10);

/// A tick a schedule's firing asks the batch to fire, and where its answer goes.
pub(super) struct Firing {
    pub(super) tick: NewTick,
    pub(super) answer: oneshot::Sender<Result<FiredTick, StoreError>>,
}

/// The ticks of one look, fired together: each schedule's firing sends its tick and waits
/// for the answer, and while one `fire_ticks` call is under way the ticks sent meanwhile wait
/// to go out together in the next (group commit, as the stores' writers do it). A schedule's
/// own ticks still go one after the other, each decided on what the previous one did.
///
/// A tick whose run is driven here is sent by the run's driver once it has polled the
/// workflow's first round ([`Inner::fire`]): such a tick is promised to the batch
/// ([`Batch::promise`]) when its driver is spawned, and a call waits a little for the promised
/// ticks, so that a look's ticks still go out together rather than the first few alone.
#[derive(Clone)]
pub(super) struct Batch {
    send: mpsc::UnboundedSender<Firing>,
    coming: Arc<Coming>,
    /// Nothing goes out before this instant: the ticks of a look made ahead of its due time
    /// ([`schedule_loop`]) wait for it.
    held_until: Option<tokio::time::Instant>,
}

/// The ticks promised to a batch and not sent yet.
#[derive(Default)]
pub(super) struct Coming {
    count: AtomicUsize,
    sent: Notify,
    /// The schedules changed while the batch was held: its ticks are decided again.
    abandoned: std::sync::atomic::AtomicBool,
}

/// A tick promised to a batch: counted in its [`Coming`] until sent, or given up (dropped).
pub(super) struct Promise(Arc<Coming>);

impl Drop for Promise {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        self.0.sent.notify_one();
    }
}

impl Batch {
    /// The batch, and the loop that fires what it is sent until every clone of it is gone;
    /// with `held_until`, nothing goes out before that instant.
    pub(super) fn new(
        rt: &Arc<Inner>,
        held_until: Option<tokio::time::Instant>,
    ) -> (Batch, impl std::future::Future<Output = ()> + '_) {
        let (send, receive) = mpsc::unbounded_channel();
        let coming = Arc::new(Coming::default());
        let batch = Batch {
            send,
            coming: coming.clone(),
            held_until,
        };
        (batch, fire_batches(rt, receive, coming, held_until))
    }

    /// Whether its calls wait for a due time, so that what is sent now goes out then.
    pub(super) fn held(&self) -> bool {
        self.held_until.is_some()
    }

    /// Counts a tick to be sent soon.
    pub(super) fn promise(&self) -> Promise {
        self.coming.count.fetch_add(1, Ordering::AcqRel);
        Promise(self.coming.clone())
    }

    pub(super) async fn fire(&self, tick: NewTick) -> Result<FiredTick, StoreError> {
        self.fire_promised(tick, None).await
    }

    /// Sends `tick`, fulfilling `promise`, and waits for its answer.
    pub(super) async fn fire_promised(
        &self,
        tick: NewTick,
        promise: Option<Promise>,
    ) -> Result<FiredTick, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.send
            .send(Firing { tick, answer })
            .map_err(|_| StoreError::database("the firing loop stopped"))?;
        drop(promise);
        answered
            .await
            .map_err(|_| StoreError::database("the firing loop stopped"))?
    }

    /// Whether the schedules changed while this batch was held: its ticks are decided again.
    pub(super) fn abandoned(&self) -> bool {
        self.coming.abandoned.load(Ordering::Acquire)
    }
}

/// Fires the ticks `firings` brings, as many at once as are waiting (up to
/// [`MAX_TICKS_PER_CALL`]). A tick's run is leased to this worker when its firing found room
/// for it here (its driver counted among the runs driven here from then on, see
/// [`Inner::fire`]); the others are admitted for any worker to take.
async fn fire_batches(
    rt: &Arc<Inner>,
    mut firings: mpsc::UnboundedReceiver<Firing>,
    coming: Arc<Coming>,
    held_until: Option<tokio::time::Instant>,
) {
    let mut shutdown = rt.shutdown.subscribe();
    while let Some(first) = firings.recv().await {
        let mut group = vec![first];
        loop {
            while group.len() < MAX_TICKS_PER_CALL {
                match firings.try_recv() {
                    Ok(more) => group.push(more),
                    Err(_) => break,
                }
            }
            if group.len() >= MAX_TICKS_PER_CALL || coming.count.load(Ordering::Acquire) == 0 {
                break;
            }
            // Promised ticks are on their way (their runs' first rounds being polled): wait
            // for them, but not for long for any one of them, or (a look decided ahead) not
            // beyond its due time, nor past a shutdown or a change of the schedules, which
            // `held` then answers at once.
            let wait = held_until.map_or(PROMISE_WAIT, |due| {
                due.saturating_duration_since(tokio::time::Instant::now())
                    .max(PROMISE_WAIT)
            });
            tokio::select! {
                biased;
                promised = tokio::time::timeout(wait, coming.sent.notified()) => {
                    if promised.is_err() {
                        break;
                    }
                }
                _ = shutdown.changed(), if held_until.is_some() => break,
                _ = rt.schedules_changed.notified(), if held_until.is_some() => {
                    coming.abandoned.store(true, Ordering::Release);
                    rt.schedules_changed.notify_one();
                    break;
                }
            }
        }
        // A large group goes out as two calls at once, each locking its schedules in name
        // order, to a store that writes them in parallel (two connections of PostgreSQL's
        // pool).
        group.sort_unstable_by(|a, b| a.tick.schedule.cmp(&b.tick.schedule));
        let halves = if group.len() >= SPLIT_AT && rt.store.writes_in_parallel() {
            let second = group.split_off(group.len() / 2);
            vec![group, second]
        } else {
            vec![group]
        };
        // A look decided ahead is handed to the store at once, to be written at its due time
        // (the store prepares the writes meanwhile), or not at all (see `held`).
        let ready = match held_until {
            Some(due) => held(rt, due, &mut shutdown, &coming).boxed(),
            None => futures::future::ready(Ok(())).boxed(),
        }
        .shared();
        futures::future::join_all(
            halves
                .into_iter()
                .map(|part| fire_call(rt, part, ready.clone())),
        )
        .await;
    }
}

/// Waits for a held batch's due time: `Err` with why its ticks are not fired when the runtime
/// shuts down before it, or when the schedules change before it (a pause, a deletion, here
/// or notified by the store): then the batch is abandoned and the notice passed on, so the
/// look is made again on a new listing once this one ends.
async fn held(
    rt: &Inner,
    due: tokio::time::Instant,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    coming: &Coming,
) -> Result<(), &'static str> {
    if !*shutdown.borrow() && !coming.abandoned.load(Ordering::Acquire) {
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(due) => {}
            _ = shutdown.changed() => {}
            _ = rt.schedules_changed.notified() => {
                coming.abandoned.store(true, Ordering::Release);
                rt.schedules_changed.notify_one();
            }
        }
    }
    if *shutdown.borrow() {
        Err("the runtime is shutting down")
    } else if coming.abandoned.load(Ordering::Acquire) {
        Err("the schedules changed before the tick's due time; it is decided again")
    } else {
        Ok(())
    }
}

/// One `fire_ticks_when` call of `part`, written once `ready` says so, each tick's answer
/// sent where it is awaited.
async fn fire_call(
    rt: &Arc<Inner>,
    part: Vec<Firing>,
    ready: impl Future<Output = Result<(), &'static str>> + Send,
) {
    let (ticks, answers): (Vec<NewTick>, Vec<_>) =
        part.into_iter().map(|f| (f.tick, f.answer)).unzip();
    let ready = ready.map(|r| r.map_err(StoreError::database)).boxed();
    match rt.store.fire_ticks_when(ticks, ready).await {
        Ok(fired) => {
            for (answer, fired) in answers.into_iter().zip(fired) {
                let _ = answer.send(Ok(fired));
            }
        }
        Err(e) => {
            // Every tick of the call gets the error (none of them was written).
            for answer in answers {
                let copy = match &e {
                    StoreError::Database(why) => StoreError::Database(why.clone()),
                    other => StoreError::database(other.to_string()),
                };
                let _ = answer.send(Err(copy));
            }
        }
    }
}
