//! A store for tests of what the runtime does when the store fails: [`FailingAdmissions`]
//! passes every call to another store, except the failures a test sets.
#![allow(dead_code)]

use std::time::{Duration, SystemTime};

use workflow_core::store::{
    AcquireRequest, AdminStore, Admission, AdmittedWith, Append, CancelOutcome, ClaimOutcome,
    EventRecord, FailureOutcome, HookFilter, HookRecord, HookStore, InboxEntry, Lease, LeasedRun,
    NewEvent, NewRun, Notice, QueueStore, RetryOutcome, RunFilter, RunRecord, RunStore, Store,
    StreamStore,
};
use workflow_core::{RunId, StoreError};

/// How [`FailingAdmissions::fail_appends`] makes an append fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendFailure {
    /// The database refuses the write (not transient): nothing is written.
    Refused,
    /// The connection is lost before the write (transient): nothing is written.
    Lost,
    /// The connection is lost after the commit, before the answer (transient): the write
    /// is there.
    LostAfterCommit,
}

/// A store that passes everything to another store, except that its next `failures`
/// admissions wait at a gate and then fail: for tests of what the runtime does when the store
/// refuses a start. Clones share the gate.
#[derive(Clone)]
pub struct FailingAdmissions(std::sync::Arc<Failing>);

pub struct Failing {
    inner: std::sync::Arc<dyn Store>,
    failures: std::sync::atomic::AtomicUsize,
    /// How many of the next appends that carry events panic inside the store call.
    append_panics: std::sync::atomic::AtomicUsize,
    /// Whether heartbeats fail (a worker that stalls: its leases expire).
    heartbeats_fail: std::sync::atomic::AtomicBool,
    /// How many of the next appends that carry events fail, and how ([`AppendFailure`]).
    append_failures: std::sync::atomic::AtomicUsize,
    append_failure: std::sync::Mutex<AppendFailure>,
    /// How many admissions are waiting at the gate now.
    pub waiting: std::sync::atomic::AtomicUsize,
    /// Each `read_stream` of a batch (limit above 0): (stream, from, chunks found), in order.
    stream_reads: std::sync::Mutex<Vec<(String, u64, usize)>>,
    gate: tokio::sync::Semaphore,
    /// How many times a run's record was read (`get_run`).
    pub run_reads: std::sync::atomic::AtomicUsize,
    /// Each run's end written, with the hint it carried.
    ends: std::sync::Mutex<Vec<(RunId, workflow_core::store::EndHint)>>,
    /// Whether admissions with a first write go to the store under test
    /// (`create_run_leased_with`); otherwise this store cannot make them, and the runtime
    /// admits and appends in two calls (what the failure tests inject failures into).
    first_writes: std::sync::atomic::AtomicBool,
    /// Each write of a run, in order: `admit`, `admit+N` (admitted with N events in one
    /// act), `append+N` (N events), `end+N` (N events with the run's end).
    writes: std::sync::Mutex<Vec<String>>,
}

impl std::ops::Deref for FailingAdmissions {
    type Target = Failing;
    fn deref(&self) -> &Failing {
        &self.0
    }
}

impl FailingAdmissions {
    pub fn new(inner: std::sync::Arc<dyn Store>, failures: usize) -> Self {
        FailingAdmissions(std::sync::Arc::new(Failing {
            inner,
            failures: failures.into(),
            append_panics: 0.into(),
            heartbeats_fail: false.into(),
            append_failures: 0.into(),
            append_failure: std::sync::Mutex::new(AppendFailure::Refused),
            waiting: 0.into(),
            stream_reads: Default::default(),
            gate: tokio::sync::Semaphore::new(0),
            run_reads: 0.into(),
            ends: std::sync::Mutex::default(),
            first_writes: false.into(),
            writes: std::sync::Mutex::default(),
        }))
    }

    /// Lets admissions with a first write through to the store under test.
    pub fn pass_first_writes(&self) {
        self.first_writes
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The writes of runs so far (see [`Failing::writes`]).
    pub fn writes(&self) -> Vec<String> {
        self.writes.lock().unwrap().clone()
    }

    fn wrote(&self, what: String) {
        self.writes.lock().unwrap().push(what);
    }

    /// The hint each run's end carried, by run, for the ends written so far.
    pub fn end_hints(&self) -> Vec<(RunId, workflow_core::store::EndHint)> {
        self.ends.lock().unwrap().clone()
    }

    /// Makes the next `n` appends carrying events panic (a bug in code the driver calls).
    pub fn panic_on_appends(&self, n: usize) {
        self.append_panics
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the next `n` appends carrying events fail as `how` says.
    pub fn fail_appends(&self, n: usize, how: AppendFailure) {
        *self.append_failure.lock().unwrap() = how;
        self.append_failures
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes heartbeats fail (`true`) or reach the store again.
    pub fn fail_heartbeats(&self, fail: bool) {
        self.heartbeats_fail
            .store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a reader of `stream` has read from chunk `from` and found nothing: it waits for
    /// that chunk.
    pub fn read_nothing_from(&self, stream: &str, from: u64) -> bool {
        self.stream_reads
            .lock()
            .unwrap()
            .iter()
            .any(|(s, f, got)| s == stream && *f == from && *got == 0)
    }

    /// Lets the admissions waiting at the gate fail, and every later one through at once.
    pub fn open_gate(&self) {
        self.gate
            .add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
    }

    async fn maybe_fail(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let fail = self
            .failures
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !fail {
            return Ok(());
        }
        self.waiting.fetch_add(1, SeqCst);
        let _permit = self.gate.acquire().await;
        self.waiting.fetch_sub(1, SeqCst);
        Err(StoreError::Database("injected admission failure".into()))
    }
}

#[async_trait::async_trait]
impl RunStore for FailingAdmissions {
    async fn create_run(&self, run: NewRun) -> Result<Admission, StoreError> {
        self.maybe_fail().await?;
        self.inner.create_run(run).await
    }

    async fn create_run_leased(
        &self,
        run: NewRun,
        lease: Duration,
    ) -> Result<(Admission, Option<Lease>), StoreError> {
        self.maybe_fail().await?;
        self.wrote("admit".to_owned());
        self.inner.create_run_leased(run, lease).await
    }

    async fn create_run_leased_with(
        &self,
        run: NewRun,
        lease: Duration,
        first: &Append,
    ) -> Result<AdmittedWith, StoreError> {
        if !self.first_writes.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(AdmittedWith::Unsupported(Box::new(run)));
        }
        self.maybe_fail().await?;
        let admitted = self.inner.create_run_leased_with(run, lease, first).await?;
        match &admitted {
            AdmittedWith::Done(_, Some(_)) => self.wrote(format!("admit+{}", first.events.len())),
            // Not leased: admitted without its first events.
            AdmittedWith::Done(_, None) => self.wrote("admit".to_owned()),
            AdmittedWith::Unsupported(_) => {}
        }
        Ok(admitted)
    }

    async fn get_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        self.run_reads
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.get_run(id).await
    }

    async fn events(&self, id: &RunId) -> Result<Vec<EventRecord>, StoreError> {
        self.inner.events(id).await
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Vec<LeasedRun>, StoreError> {
        self.inner.acquire(req).await
    }

    async fn continue_as_new(
        &self,
        lease: &Lease,
        write: &Append,
        next: NewRun,
    ) -> Result<(), StoreError> {
        self.inner.continue_as_new(lease, write, next).await
    }

    async fn append(&self, lease: &Lease, write: &Append) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        if !write.events.is_empty()
            && self
                .append_panics
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            panic!("injected panic in append");
        }
        let fail = !write.events.is_empty()
            && self
                .append_failures
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
        self.wrote(format!(
            "{}+{}",
            if write.outcome.is_some() {
                "end"
            } else {
                "append"
            },
            write.events.len()
        ));
        if write.outcome.is_some() {
            self.ends
                .lock()
                .unwrap()
                .push((lease.run_id, write.end_hint));
        }
        if !fail {
            return self.inner.append(lease, write).await;
        }
        let how = *self.append_failure.lock().unwrap();
        let error = |transient| {
            StoreError::Database(
                workflow_core::DatabaseError::new("injected append failure").transient(transient),
            )
        };
        match how {
            AppendFailure::Refused => Err(error(false)),
            AppendFailure::Lost => Err(error(true)),
            AppendFailure::LostAfterCommit => {
                self.inner.append(lease, write).await?;
                Err(error(true))
            }
        }
    }

    async fn record_failure(
        &self,
        lease: &Lease,
        cause: &workflow_core::Error,
        now: SystemTime,
    ) -> Result<FailureOutcome, StoreError> {
        self.inner.record_failure(lease, cause, now).await
    }

    async fn block(
        &self,
        lease: &Lease,
        divergence: &workflow_core::Error,
        now: SystemTime,
    ) -> Result<SystemTime, StoreError> {
        self.inner.block(lease, divergence, now).await
    }

    async fn retry(&self, id: &RunId, now: SystemTime) -> Result<RetryOutcome, StoreError> {
        self.inner.retry(id, now).await
    }

    async fn wake_blocked(&self, now: SystemTime) -> Result<u64, StoreError> {
        self.inner.wake_blocked(now).await
    }

    async fn create_run_with_history(
        &self,
        run: NewRun,
        history: &[NewEvent],
    ) -> Result<(), StoreError> {
        self.inner.create_run_with_history(run, history).await
    }

    async fn release(
        &self,
        lease: &Lease,
        wake_at: SystemTime,
        payloads_seen: u64,
    ) -> Result<(), StoreError> {
        self.inner.release(lease, wake_at, payloads_seen).await
    }

    async fn start_child(
        &self,
        lease: &Lease,
        child_key: &str,
        child: NewRun,
    ) -> Result<workflow_core::store::Admission, StoreError> {
        self.inner.start_child(lease, child_key, child).await
    }

    async fn ended_among(&self, runs: &[RunId]) -> Result<Vec<RunId>, StoreError> {
        self.inner.ended_among(runs).await
    }

    async fn now(&self) -> Result<Option<SystemTime>, StoreError> {
        self.inner.now().await
    }

    async fn heartbeat(
        &self,
        leases: &[Lease],
        lease: Duration,
        now: SystemTime,
    ) -> Result<Vec<RunId>, StoreError> {
        if self
            .heartbeats_fail
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(StoreError::Database("injected heartbeat failure".into()));
        }
        self.inner.heartbeat(leases, lease, now).await
    }

    async fn cancel(&self, id: &RunId, now: SystemTime) -> Result<CancelOutcome, StoreError> {
        self.inner.cancel(id, now).await
    }

    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<Notice>> {
        self.inner.notices()
    }
}

#[async_trait::async_trait]
impl HookStore for FailingAdmissions {
    async fn admit_or_resume(
        &self,
        run: NewRun,
        lease: Option<Duration>,
        payload: serde_json::Value,
    ) -> Result<workflow_core::store::AdmitOrResume, StoreError> {
        self.maybe_fail().await?;
        self.inner.admit_or_resume(run, lease, payload).await
    }

    async fn claim_hook(
        &self,
        lease: &Lease,
        hook_key: &str,
        token: &str,
        at: SystemTime,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim_hook(lease, hook_key, token, at).await
    }

    async fn resume_hook(
        &self,
        token: &str,
        payload: serde_json::Value,
        at: SystemTime,
    ) -> Result<Option<(RunId, u64)>, StoreError> {
        self.inner.resume_hook(token, payload, at).await
    }

    async fn payloads(&self, run: &RunId, after: u64) -> Result<Vec<InboxEntry>, StoreError> {
        self.inner.payloads(run, after).await
    }

    async fn payloads_since(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, RunId)>, StoreError> {
        self.inner.payloads_since(after, limit).await
    }

    async fn last_payload_id(&self) -> Result<u64, StoreError> {
        self.inner.last_payload_id().await
    }

    async fn get_hook(&self, token: &str) -> Result<Option<HookRecord>, StoreError> {
        self.inner.get_hook(token).await
    }

    async fn list_hooks(&self, filter: &HookFilter) -> Result<Vec<HookRecord>, StoreError> {
        self.inner.list_hooks(filter).await
    }
}

#[async_trait::async_trait]
impl workflow_core::store::MessageStore for FailingAdmissions {
    async fn send_message(
        &self,
        run: &RunId,
        message: workflow_core::store::NewMessage,
    ) -> Result<workflow_core::store::SendOutcome, StoreError> {
        self.inner.send_message(run, message).await
    }

    async fn run_events(
        &self,
        run: &RunId,
    ) -> Result<Option<workflow_core::store::RunEvents>, StoreError> {
        self.inner.run_events(run).await
    }

    async fn send_request(
        &self,
        run: &RunId,
        request: workflow_core::store::NewRequest,
    ) -> Result<workflow_core::store::SendOutcome, StoreError> {
        self.inner.send_request(run, request).await
    }

    async fn request_reply(
        &self,
        run: &RunId,
        id: u64,
    ) -> Result<Option<workflow_core::store::ReplyState>, StoreError> {
        self.inner.request_reply(run, id).await
    }

    async fn run_requests(
        &self,
        run: &RunId,
    ) -> Result<Vec<workflow_core::store::RequestRecord>, StoreError> {
        self.inner.run_requests(run).await
    }
}

#[async_trait::async_trait]
impl StreamStore for FailingAdmissions {
    async fn append_chunk(
        &self,
        lease: &Lease,
        stream: &str,
        attempt: u32,
        value: serde_json::Value,
        at: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        self.inner
            .append_chunk(lease, stream, attempt, value, at)
            .await
    }

    async fn close_stream(
        &self,
        lease: &Lease,
        stream: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        self.inner.close_stream(lease, stream, at).await
    }

    async fn read_stream(
        &self,
        run: &RunId,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<workflow_core::store::StreamPage, StoreError> {
        let page = self.inner.read_stream(run, stream, from, limit).await?;
        if limit > 0 {
            let read = (stream.to_owned(), from, page.chunks.len());
            self.stream_reads.lock().unwrap().push(read);
        }
        Ok(page)
    }

    async fn list_streams(
        &self,
        run: &RunId,
    ) -> Result<Vec<workflow_core::store::StreamInfo>, StoreError> {
        self.inner.list_streams(run).await
    }
}

#[async_trait::async_trait]
impl QueueStore for FailingAdmissions {
    async fn define_queues(
        &self,
        queues: &[workflow_core::store::QueueDef],
    ) -> Result<(), StoreError> {
        self.inner.define_queues(queues).await
    }

    async fn queue_opening(&self, now: SystemTime) -> Result<Option<SystemTime>, StoreError> {
        self.inner.queue_opening(now).await
    }

    async fn list_queues(
        &self,
        now: SystemTime,
    ) -> Result<Vec<workflow_core::store::QueueInfo>, StoreError> {
        self.inner.list_queues(now).await
    }
}

#[async_trait::async_trait]
impl workflow_core::store::ScheduleStore for FailingAdmissions {
    async fn define_schedule(
        &self,
        def: &workflow_core::store::ScheduleDef,
        next: Option<SystemTime>,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        self.inner.define_schedule(def, next, at).await
    }

    async fn list_schedules(&self) -> Result<Vec<workflow_core::store::ScheduleState>, StoreError> {
        self.inner.list_schedules().await
    }

    async fn fire_tick(
        &self,
        tick: workflow_core::store::NewTick,
    ) -> Result<workflow_core::store::TickWrite, StoreError> {
        self.inner.fire_tick(tick).await
    }

    async fn advance_schedule(&self, name: &str, next: SystemTime) -> Result<bool, StoreError> {
        self.inner.advance_schedule(name, next).await
    }

    async fn schedule_ticks(
        &self,
        name: &str,
        n: usize,
    ) -> Result<Vec<workflow_core::TickRecord>, StoreError> {
        self.inner.schedule_ticks(name, n).await
    }

    async fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
        next: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        self.inner.set_schedule_paused(name, paused, next).await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, StoreError> {
        self.inner.delete_schedule(name).await
    }
}

#[async_trait::async_trait]
impl workflow_core::store::TransactionalStore for FailingAdmissions {
    async fn begin_step(
        &self,
        lease: &Lease,
    ) -> Result<Option<Box<dyn workflow_core::store::StepTransaction>>, StoreError> {
        self.inner.begin_step(lease).await
    }
}

#[async_trait::async_trait]
impl workflow_core::store::RekeyStore for FailingAdmissions {
    async fn sealed_rows(
        &self,
        table: workflow_core::store::PayloadTable,
        after: Option<&workflow_core::store::SealedAt>,
        limit: usize,
    ) -> Result<Vec<workflow_core::store::SealedRow>, StoreError> {
        self.inner.sealed_rows(table, after, limit).await
    }

    async fn replace_sealed(
        &self,
        row: &workflow_core::store::SealedRow,
        value: &workflow_core::store::SealedValue,
    ) -> Result<bool, StoreError> {
        self.inner.replace_sealed(row, value).await
    }
}

#[async_trait::async_trait]
impl AdminStore for FailingAdmissions {
    async fn prune(
        &self,
        ended_before: SystemTime,
        now: SystemTime,
    ) -> Result<workflow_core::PruneStats, StoreError> {
        self.inner.prune(ended_before, now).await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(filter).await
    }
}
