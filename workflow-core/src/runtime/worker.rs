//! The worker's loops: leasing runs from the store (`worker_loop`), renewing the leases of the
//! runs driven here (`heartbeat_loop`), applying the changes a pushing store reports
//! (`notice_loop`), and starting the driver of each leased run (`spawn_run`). Every loop ends
//! when the runtime shuts down.

use std::sync::Arc;

use tokio::sync::{broadcast, Notify};

use super::{Active, Inner};
use crate::driver::{Driver, Pending, Signals};
use crate::ids::RunId;
use crate::store::{AcquireRequest, Lease, LeasedRun, Notice};

/// With a store that pushes changes, the safety-net poll runs this many times less often.
pub(super) const PUSHED_POLL_FACTOR: u32 = 10;

/// Applies the changes a pushing store reports: wakes the worker, the drivers of runs that got
/// payloads, and the waiters of runs that ended (in any process, so client-only runtimes too).
pub(super) async fn notice_loop(rt: Arc<Inner>, mut notices: broadcast::Receiver<Notice>) {
    let mut shutdown = rt.shutdown.subscribe();
    loop {
        let n = tokio::select! {
            n = notices.recv() => n,
            _ = shutdown.changed() => return,
        };
        match n {
            Ok(Notice::RunsReady) => rt.work.notify_one(),
            Ok(Notice::Payload(run)) => {
                rt.payload_arrived(&run);
            }
            Ok(Notice::RunEnded(run)) => {
                // Cancelled or ended elsewhere: stop driving it here at once.
                if let Some(a) = rt.active().get(&run) {
                    a.stop.notify_one();
                }
                rt.run_ended(run, None, None);
            }
            Ok(Notice::Chunk(run)) => rt.stream_changed(run),
            Ok(Notice::SchedulesChanged) => rt.schedules_changed.notify_one(),
            // Missed notices: the worker's poll and the waiters' timeouts catch up.
            Err(broadcast::error::RecvError::Lagged(_)) => {
                // Notices were lost: look again at whatever they may have been about.
                rt.work.notify_one();
                rt.schedules_changed.notify_one();
                let waiting = crate::sync::lock(&rt.waiting);
                for w in waiting.values() {
                    w.ended.send_modify(|_| {});
                }
                drop(waiting);
                rt.streams_changed();
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Leases runs this process can drive and spawns their drivers, woken by local work, store
/// notices or the poll interval.
pub(super) async fn worker_loop(rt: Arc<Inner>) {
    let mut shutdown = rt.shutdown.subscribe();
    let mut failures = 0u32;
    // Payloads sent through other processes reach the runs driven here through this cursor.
    let mut payload_cursor = rt.store.last_payload_id().await.unwrap_or(0);
    // A worker starting may be a new build whose code fits the blocked runs: they try again.
    match rt.store.wake_blocked(rt.clock.tick().await).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(runs = n, "trying blocked runs again with this build"),
        Err(e) => tracing::warn!(error = %e, "could not wake the blocked runs"),
    }
    // Stores that push changes wake the worker at once; the poll stays as a safety net.
    let pushed = rt.pushed;
    // Payloads sent in this process notify their runs directly: the cursor is only for other
    // processes' payloads, so it is read once per poll interval, not on every local wake-up.
    let mut payloads_polled: Option<std::time::Instant> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        if payloads_polled.is_none_or(|t| t.elapsed() >= rt.config.poll_interval) {
            payloads_polled = Some(std::time::Instant::now());
            match rt.store.payloads_since(payload_cursor, 1024).await {
                Ok(news) => {
                    for (id, run) in news {
                        payload_cursor = payload_cursor.max(id);
                        rt.payload_arrived(&run);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading new hook payloads failed"),
            }
            if !pushed {
                stop_runs_ended_elsewhere(&rt).await;
            }
        }
        // The payload poll awaited: a shutdown meanwhile must not lease runs any more.
        if *shutdown.borrow() {
            return;
        }
        let capacity = rt.config.max_active_runs.saturating_sub(rt.active().len());
        let mut full_batch = false;
        if capacity > 0 && !rt.workflow_names.is_empty() {
            let req = AcquireRequest {
                worker_id: &rt.worker_id,
                workflows: &rt.workflow_names,
                lease: rt.config.lease,
                limit: capacity.min(64),
                now: rt.clock.tick().await,
            };
            match rt.store.acquire(req).await {
                Ok(runs) => {
                    failures = 0;
                    full_batch = runs.len() == capacity.min(64);
                    for leased in runs {
                        if leased.took_over {
                            crate::telemetry::lease_taken_over();
                        }
                        spawn_run(&rt, leased, None);
                    }
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, "acquiring runs failed; retrying");
                }
            }
        }
        if full_batch {
            continue;
        }
        let mut wait = rt.config.poll_interval.saturating_mul(failures.min(10) + 1);
        if pushed {
            wait = wait.saturating_mul(PUSHED_POLL_FACTOR);
        }
        if rt.rate_limited {
            // Nothing announces a rate window reopening: sleep until it does, not a poll more.
            let now = rt.clock.tick().await;
            match rt.store.queue_opening(now).await {
                Ok(Some(at)) => {
                    let until = at.duration_since(now).unwrap_or_default();
                    wait = wait.min(until + std::time::Duration::from_millis(1));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "reading when a queue's rate window reopens failed")
                }
            }
        }
        tokio::select! {
            _ = rt.work.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Stops driving the runs that ended in another process (cancelled there): with a store that
/// pushes no notices, this poll is how the news arrives.
async fn stop_runs_ended_elsewhere(rt: &Arc<Inner>) {
    let ids: Vec<RunId> = rt
        .active()
        .iter()
        .filter(|(_, a)| a.admitted())
        .map(|(id, _)| *id)
        .collect();
    if ids.is_empty() {
        return;
    }
    match rt.store.ended_among(&ids).await {
        Ok(ended) => {
            for id in ended {
                if let Some(a) = rt.active().get(&id) {
                    tracing::info!(run_id = %id, "run ended elsewhere; stopping it here");
                    a.stop.notify_one();
                }
                rt.run_ended(id, None, None);
            }
        }
        Err(e) => tracing::warn!(error = %e, "checking for runs ended elsewhere failed"),
    }
}

/// Starts driving `leased` here, listing it among the active runs.
pub(crate) fn spawn_run(rt: &Arc<Inner>, leased: LeasedRun, pending: Option<Box<Pending>>) {
    let Some(reg) = rt.workflows.get(leased.run.workflow.as_str()).copied() else {
        // acquire filters by name, so this means the store ignored the filter.
        tracing::error!(run_id = %leased.run.id, workflow = %leased.run.workflow, "leased a run of an unregistered workflow");
        return;
    };
    if leased.run.queue.is_some() {
        rt.queued.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let signals = Signals {
        stop: Arc::new(Notify::new()),
        inbox: Arc::new(Notify::new()),
    };
    let earlier = rt.active().insert(
        leased.run.id,
        Active {
            lease: leased.lease.clone(),
            stop: signals.stop.clone(),
            inbox: signals.inbox.clone(),
            admitting: pending.as_ref().map(|p| p.admitting.clone()),
        },
    );
    if let Some(earlier) = earlier {
        // This process leased the run again after its earlier lease here expired (a stall):
        // that driver's writes are refused from now on, so it stops.
        earlier.stop.notify_one();
    }
    // Boxed: the driver's future is about 8 KiB, which tokio would otherwise copy into the
    // task's cell as it spawns it and copy over again when the task finishes.
    tokio::spawn(Box::pin(Driver::run(
        rt.clone(),
        leased,
        reg,
        signals,
        pending,
    )));
}

/// Renews the leases of the runs driven here every third of the lease, and stops the drivers
/// of runs this process no longer holds.
pub(super) async fn heartbeat_loop(rt: Arc<Inner>) {
    let mut shutdown = rt.shutdown.subscribe();
    let every = rt.config.lease / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        // Also keeps the clock fresh for the drivers, which read it without waiting.
        let now = rt.clock.tick().await;
        let leases: Vec<Lease> = rt
            .active()
            .values()
            .filter(|a| a.admitted())
            .map(|a| a.lease.clone())
            .collect();
        if leases.is_empty() {
            continue;
        }
        match rt.store.heartbeat(&leases, rt.config.lease, now).await {
            Ok(lost) => {
                let active = rt.active();
                for id in lost {
                    if let Some(a) = active.get(&id) {
                        tracing::info!(run_id = %id, "run no longer held here (cancelled, ended or taken over); stopping it");
                        a.stop.notify_one();
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
    }
}
