//! What a run looks like to a person: its steps with their attempts, its sleeps and its hooks,
//! derived from the recorded history. The command line's tables and `--json`, and the
//! dashboard's pages, are all drawn from these views, so they never disagree.

use std::time::SystemTime;

use serde::{Serialize, Serializer};
use serde_json::Value;
use workflow_core::store::{
    to_millis, Event, EventRecord, HookRecord, QueueEntry, QueueInfo, RunRecord,
};
use workflow_core::{Error, RunId, RunStatus};

use crate::text;

/// A point in time; serialized as RFC 3339 in UTC with milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time(pub SystemTime);

impl Time {
    /// Milliseconds since the Unix epoch.
    pub fn ms(self) -> u64 {
        to_millis(self.0)
    }

    /// Milliseconds from `self` to `later` (0 if `later` is earlier).
    pub fn until(self, later: Time) -> u64 {
        later.ms().saturating_sub(self.ms())
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text::rfc3339(self.0))
    }
}

impl std::fmt::Display for Time {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&text::rfc3339(self.0))
    }
}

/// One run, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub id: RunId,
    pub workflow: String,
    pub status: RunStatus,
    pub created_at: Time,
    pub updated_at: Time,
    /// From admission to the end, for ended runs.
    pub duration_ms: Option<u64>,
    pub hook_token: Option<String>,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<Error>,
    /// The run that started this one with `start_child`.
    pub parent: Option<RunId>,
    /// The queue it was started in, with its partition key and priority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueEntry>,
}

impl RunSummary {
    pub fn new(r: RunRecord) -> Self {
        let created_at = Time(r.created_at);
        let updated_at = Time(r.updated_at);
        RunSummary {
            id: r.id,
            workflow: r.workflow,
            status: r.status,
            duration_ms: r.status.is_terminal().then(|| created_at.until(updated_at)),
            created_at,
            updated_at,
            hook_token: r.hook_token,
            input: r.input,
            output: r.output,
            error: r.error,
            parent: r.parent,
            queue: r.queue,
        }
    }
}

/// A queue's limits and occupancy, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    pub name: String,
    /// At most this many runs begun and not ended; `None`: no limit.
    pub concurrency: Option<u32>,
    /// At most `runs` begin per `period_ms`; `None`: no limit.
    pub rate_limit: Option<RateView>,
    /// Runs begun and not ended (each holds a slot).
    pub occupied: u64,
    /// Runs waiting to begin.
    pub waiting: u64,
    /// Runs begun within the last rate window.
    pub begun_in_window: u64,
}

/// A rate limit: at most `runs` begin in any window of `period_ms`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RateView {
    pub runs: u32,
    pub period_ms: u64,
}

impl QueueView {
    pub fn new(q: QueueInfo) -> Self {
        QueueView {
            name: q.def.name,
            concurrency: q.def.concurrency,
            rate_limit: q.def.rate_limit.map(|(runs, p)| RateView {
                runs,
                period_ms: u64::try_from(p.as_millis()).unwrap_or(u64::MAX),
            }),
            occupied: q.occupied,
            waiting: q.waiting,
            begun_in_window: q.begun_in_window,
        }
    }

    /// `slots 3/10`, `rate 42/100 per 1m`, or `no limits`.
    pub fn limits(&self) -> String {
        let mut parts = Vec::new();
        match self.concurrency {
            Some(c) => parts.push(format!("slots {}/{c}", self.occupied)),
            None => parts.push(format!("slots {}/unlimited", self.occupied)),
        }
        if let Some(r) = self.rate_limit {
            parts.push(format!(
                "rate {}/{} per {}",
                self.begun_in_window,
                r.runs,
                text::duration_ms(r.period_ms)
            ));
        }
        parts.join(", ")
    }
}

/// A run of a queue, as `workflow runs --queue` lists it: where it stands.
#[derive(Debug, Clone, Serialize)]
pub struct QueuedRun {
    #[serde(flatten)]
    pub run: RunSummary,
    /// For a run waiting to begin: its place in the order the queue begins runs in (1 is
    /// next: higher priority first, then start order); `None` once begun.
    pub position: Option<usize>,
}

/// The runs of one queue with the waiting ones numbered in the order they begin: higher
/// priority first, then start order. (A waiting run of a partition key whose earlier run
/// holds the key keeps its number but begins only after that run.)
pub fn positions(runs: Vec<RunSummary>) -> Vec<QueuedRun> {
    let mut waiting: Vec<(i32, Time, RunId)> = runs
        .iter()
        .filter(|r| r.status == RunStatus::Pending)
        .map(|r| {
            let priority = r.queue.as_ref().map_or(0, |q| q.priority);
            (priority, r.created_at, r.id)
        })
        .collect();
    waiting.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    runs.into_iter()
        .map(|run| QueuedRun {
            position: waiting
                .iter()
                .position(|w| w.2 == run.id && run.status == RunStatus::Pending)
                .map(|i| i + 1),
            run,
        })
        .collect()
}

/// How one attempt of a step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Returned the step's value.
    Ok,
    /// Returned an error (retried if more attempts remained).
    Failed,
    /// Still running.
    Running,
    /// Its worker stopped, or the run ended, before it finished.
    Interrupted,
}

/// One attempt of a step.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptView {
    pub attempt: u32,
    pub started_at: Time,
    pub ended_at: Option<Time>,
    pub duration_ms: Option<u64>,
    pub outcome: AttemptOutcome,
    pub error: Option<Error>,
    /// When the next attempt may start, after a failure that is retried.
    pub retry_at: Option<Time>,
}

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Completed,
    Failed,
    Running,
    /// An attempt failed; the next one starts at the last attempt's `retry_at`.
    Retrying,
    /// The run ended before the step did.
    Abandoned,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Running => "running",
            Self::Retrying => "retrying",
            Self::Abandoned => "abandoned",
        }
    }
}

/// One step invocation.
#[derive(Debug, Clone, Serialize)]
pub struct StepView {
    pub step_id: String,
    pub name: String,
    pub input: Value,
    pub status: StepStatus,
    pub scheduled_at: Time,
    pub ended_at: Option<Time>,
    /// From scheduling to the final result, retries included.
    pub duration_ms: Option<u64>,
    pub attempts: Vec<AttemptView>,
    pub output: Option<Value>,
    pub error: Option<Error>,
    /// Which call of this step name in the run this is, from 0, counted in scheduling order
    /// (the order the workflow numbers its calls): never read back out of the step id.
    #[serde(skip)]
    pub call: u32,
}

impl StepView {
    /// `name #n`: the step's name without its module path, and which call of that step this
    /// is.
    pub fn label(&self) -> String {
        format!("{} #{}", short_name(&self.name), self.call)
    }
}

/// Where a durable sleep stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerStatus {
    /// It ended and the workflow went on.
    Fired,
    /// Its time has not come.
    Waiting,
    /// Its time has passed; a worker will deliver it.
    Due,
    /// The run ended first.
    Abandoned,
}

impl TimerStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fired => "fired",
            Self::Waiting => "waiting",
            Self::Due => "due",
            Self::Abandoned => "abandoned",
        }
    }
}

/// One durable sleep.
#[derive(Debug, Clone, Serialize)]
pub struct TimerView {
    pub timer_id: String,
    pub scheduled_at: Time,
    pub fire_at: Time,
    pub fired_at: Option<Time>,
    pub status: TimerStatus,
}

/// A payload a hook delivered to the workflow.
#[derive(Debug, Clone, Serialize)]
pub struct PayloadView {
    pub at: Time,
    pub payload_id: u64,
    pub payload: Value,
}

/// One hook of the run: a registration (or the token claimed at start) until its release.
#[derive(Debug, Clone, Serialize)]
pub struct HookView {
    pub token: String,
    /// `hk_<n>` for hooks the workflow created; `None` for the token claimed at start.
    pub hook_key: Option<String>,
    pub registered_at: Time,
    pub released_at: Option<Time>,
    /// The run owning the token when this registration found it taken.
    pub conflict: Option<RunId>,
    /// The store says this run owns the token now: `resume` reaches it.
    pub active: bool,
    pub payloads: Vec<PayloadView>,
}

/// One run with everything its history says.
#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunSummary,
    /// For a live run, what it is waiting for, in words.
    pub waiting_on: Vec<String>,
    /// For a blocked run, where its replay left the recorded history.
    pub divergence: Option<DivergenceView>,
    pub steps: Vec<StepView>,
    pub timers: Vec<TimerView>,
    pub hooks: Vec<HookView>,
    /// Patch markers and retries, in history order.
    pub marks: Vec<MarkView>,
    /// The child runs it started, in start order.
    pub children: Vec<ChildView>,
    /// The run's streams by name, each with its last chunks (filled by `ops`, which reads
    /// them from the store beside the history).
    pub streams: Vec<StreamView>,
    /// The time the views were computed at (open bars end there).
    pub as_of: Time,
}

/// One stream of a run, as shown: its length, whether it was closed, and its last
/// chunks.
#[derive(Debug, Clone, Serialize)]
pub struct StreamView {
    pub name: String,
    /// How many chunks it holds.
    pub chunks: u64,
    pub closed: bool,
    /// The last chunks, at most [`StreamView::RECENT`], in index order.
    pub recent: Vec<ChunkView>,
}

impl StreamView {
    /// How many of a stream's last chunks a run's view shows.
    pub const RECENT: u64 = 20;
}

/// One chunk of a run's stream.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkView {
    pub index: u64,
    /// The attempt of the step that wrote it.
    pub attempt: u32,
    pub value: Value,
}

impl RunDetail {
    /// Builds the view of `run` from its history and the active hooks the store reports for it.
    pub fn new(
        run: RunRecord,
        events: &[EventRecord],
        active_hooks: &[HookRecord],
        now: SystemTime,
    ) -> Self {
        let run = RunSummary::new(run);
        let ended = run.status.is_terminal().then_some(run.updated_at);
        let now = Time(now);
        let mut steps: Vec<StepView> = Vec::new();
        let mut timers: Vec<TimerView> = Vec::new();
        let mut hooks: Vec<HookView> = Vec::new();
        let mut marks: Vec<MarkView> = Vec::new();
        let mut children: Vec<ChildView> = Vec::new();
        // What a retry re-opens: the steps whose error came after the last command recorded.
        let mut last_command = 0;
        let mut failed_at: Vec<(String, u64)> = Vec::new();
        for e in events {
            let at = Time(e.at);
            if matches!(
                e.event,
                Event::StepScheduled { .. }
                    | Event::TimerScheduled { .. }
                    | Event::HookRegistered { .. }
                    | Event::HookReleased { .. }
                    | Event::PatchMarked { .. }
                    | Event::ChildStarted { .. }
            ) {
                last_command = e.seq;
            }
            if let Event::StepCompleted {
                step_id,
                result: Err(_),
            } = &e.event
            {
                failed_at.push((step_id.clone(), e.seq));
            }
            match &e.event {
                Event::StepScheduled {
                    step_id,
                    name,
                    input,
                } => steps.push(StepView {
                    call: steps.iter().filter(|s| &s.name == name).count() as u32,
                    step_id: step_id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                    status: StepStatus::Running,
                    scheduled_at: at,
                    ended_at: None,
                    duration_ms: None,
                    attempts: vec![open_attempt(1, at)],
                    output: None,
                    error: None,
                }),
                Event::StepAttemptStarted { step_id, attempt } => {
                    if let Some(s) = find_step(&mut steps, step_id) {
                        // An attempt still open here was cut short by its worker's stop.
                        if let Some(prev) = s.attempts.last_mut() {
                            if prev.outcome == AttemptOutcome::Running {
                                close(prev, at, AttemptOutcome::Interrupted);
                            }
                        }
                        s.attempts.push(open_attempt(*attempt, at));
                        s.status = StepStatus::Running;
                    }
                }
                Event::StepAttemptFailed {
                    step_id,
                    attempt,
                    error,
                    retry_at_ms,
                } => {
                    if let Some(s) = find_step(&mut steps, step_id) {
                        if let Some(a) = s.attempts.iter_mut().rfind(|a| a.attempt == *attempt) {
                            close(a, at, AttemptOutcome::Failed);
                            a.error = Some(error.clone());
                            a.retry_at =
                                Some(Time(workflow_core::store::from_millis(*retry_at_ms)));
                        }
                        s.status = StepStatus::Retrying;
                    }
                }
                Event::StepCompleted { step_id, result } => {
                    if let Some(s) = find_step(&mut steps, step_id) {
                        let outcome = if result.is_ok() {
                            AttemptOutcome::Ok
                        } else {
                            AttemptOutcome::Failed
                        };
                        if let Some(a) = s.attempts.last_mut() {
                            if a.outcome == AttemptOutcome::Running {
                                close(a, at, outcome);
                                a.error = result.as_ref().err().cloned();
                            }
                        }
                        s.status = if result.is_ok() {
                            StepStatus::Completed
                        } else {
                            StepStatus::Failed
                        };
                        s.ended_at = Some(at);
                        s.duration_ms = Some(s.scheduled_at.until(at));
                        match result {
                            Ok(v) => s.output = Some(v.clone()),
                            Err(err) => s.error = Some(err.clone()),
                        }
                    }
                }
                Event::TimerScheduled {
                    timer_id,
                    fire_at_ms,
                } => timers.push(TimerView {
                    timer_id: timer_id.clone(),
                    scheduled_at: at,
                    fire_at: Time(workflow_core::store::from_millis(*fire_at_ms)),
                    fired_at: None,
                    status: TimerStatus::Waiting,
                }),
                Event::TimerFired { timer_id } => {
                    if let Some(t) = timers.iter_mut().rfind(|t| &t.timer_id == timer_id) {
                        t.fired_at = Some(at);
                        t.status = TimerStatus::Fired;
                    }
                }
                Event::HookRegistered {
                    hook_key,
                    token,
                    conflict,
                } => hooks.push(HookView {
                    token: token.clone(),
                    hook_key: Some(hook_key.clone()),
                    registered_at: at,
                    released_at: conflict.map(|_| at),
                    conflict: *conflict,
                    active: false,
                    payloads: Vec::new(),
                }),
                Event::HookReceived {
                    token,
                    payload_id,
                    payload,
                } => {
                    let payload = PayloadView {
                        at,
                        payload_id: *payload_id,
                        payload: payload.clone(),
                    };
                    let hook = hooks
                        .iter_mut()
                        .rfind(|h| &h.token == token && h.conflict.is_none());
                    match hook {
                        Some(h) => h.payloads.push(payload),
                        // The token claimed at start: bound without a registration event.
                        None => hooks.push(HookView {
                            token: token.clone(),
                            hook_key: None,
                            registered_at: run.created_at,
                            released_at: None,
                            conflict: None,
                            active: false,
                            payloads: vec![payload],
                        }),
                    }
                }
                Event::HookReleased { hook_key, token } => {
                    let hook = hooks.iter_mut().rfind(|h| {
                        &h.token == token
                            && h.released_at.is_none()
                            && h.hook_key.as_ref().is_none_or(|k| k == hook_key)
                    });
                    if let Some(h) = hook {
                        h.released_at = Some(at);
                    }
                }
                Event::PatchMarked { patch_id } => marks.push(MarkView {
                    at,
                    kind: MarkKind::Patch,
                    label: format!("patch {patch_id:?} taken"),
                }),
                Event::RunRetried => {
                    marks.push(MarkView {
                        at,
                        kind: MarkKind::Retried,
                        label: "failed run re-opened by retry".to_owned(),
                    });
                    // A fresh set of attempts, the first one starting now (like a scheduling).
                    for (step_id, _) in failed_at.drain(..).filter(|(_, seq)| *seq > last_command) {
                        if let Some(s) = find_step(&mut steps, &step_id) {
                            s.status = StepStatus::Running;
                            s.ended_at = None;
                            s.duration_ms = None;
                            s.error = None;
                            s.attempts.push(open_attempt(1, at));
                        }
                    }
                }
                Event::ChildStarted {
                    child_key,
                    child_id,
                    workflow,
                    conflict,
                    refused,
                } => children.push(ChildView {
                    child_key: child_key.clone(),
                    child_id: (conflict.is_none() && refused.is_none()).then_some(*child_id),
                    workflow: workflow.clone(),
                    started_at: at,
                    conflict: *conflict,
                    refused: refused.clone(),
                    status: None,
                    ended_at: None,
                    output: None,
                    error: None,
                }),
                Event::ChildEnded {
                    child_id, result, ..
                } => {
                    if let Some(c) = children.iter_mut().find(|c| c.child_id == Some(*child_id)) {
                        c.ended_at = Some(at);
                        match result {
                            Ok(v) => c.output = Some(v.clone()),
                            Err(e) => c.error = Some(e.clone()),
                        }
                    }
                }
                // The run's end is in its record; events added later are not drawn.
                _ => {}
            }
        }
        // The token claimed at start, before any payload reached the workflow.
        if let Some(token) = &run.hook_token {
            if !hooks.iter().any(|h| &h.token == token) {
                hooks.insert(
                    0,
                    HookView {
                        token: token.clone(),
                        hook_key: None,
                        registered_at: run.created_at,
                        released_at: None,
                        conflict: None,
                        active: false,
                        payloads: Vec::new(),
                    },
                );
            }
        }
        for active in active_hooks {
            if let Some(h) = hooks
                .iter_mut()
                .rfind(|h| h.token == active.token && h.conflict.is_none())
            {
                h.active = h.released_at.is_none() && !run.status.is_terminal();
            }
        }
        if let Some(end) = ended {
            for s in &mut steps {
                if matches!(s.status, StepStatus::Running | StepStatus::Retrying) {
                    s.status = StepStatus::Abandoned;
                }
                if let Some(a) = s.attempts.last_mut() {
                    if a.outcome == AttemptOutcome::Running {
                        close(a, end.max(a.started_at), AttemptOutcome::Interrupted);
                    }
                }
            }
            for t in &mut timers {
                if t.status == TimerStatus::Waiting {
                    t.status = TimerStatus::Abandoned;
                }
            }
            for h in &mut hooks {
                if h.released_at.is_none() {
                    h.released_at = Some(end.max(h.registered_at));
                }
            }
        } else {
            for t in &mut timers {
                if t.status == TimerStatus::Waiting && t.fire_at <= now {
                    t.status = TimerStatus::Due;
                }
            }
        }
        let waiting_on = waiting_on(&run, &steps, &timers, &hooks, now);
        let divergence = match (&run.status, &run.error) {
            (RunStatus::Blocked, Some(e)) => Some(DivergenceView::new(e)),
            _ => None,
        };
        RunDetail {
            run,
            waiting_on,
            divergence,
            steps,
            timers,
            hooks,
            marks,
            children,
            streams: Vec::new(),
            as_of: now,
        }
    }

    /// Fills in the children's current state from their own records (`list_runs` by
    /// parent), which the parent's history does not have until it receives their ends.
    pub fn with_children(mut self, records: &[RunRecord]) -> Self {
        for c in &mut self.children {
            if let Some(r) = records.iter().find(|r| Some(r.id) == c.child_id) {
                c.status = Some(r.status);
            }
        }
        if self.run.status == RunStatus::Running {
            for c in self.children.iter().filter(|c| c.ended_at.is_none()) {
                if let (Some(id), Some(status)) = (c.child_id, c.status) {
                    self.waiting_on
                        .push(format!("child run {id} ({}), {status}", c.workflow));
                }
            }
        }
        self
    }

    /// When the run ended, or `as_of` for a live run.
    pub fn end(&self) -> Time {
        if self.run.status.is_terminal() {
            self.run.updated_at
        } else {
            self.as_of
        }
    }
}

/// A child run the run started (`start_child`).
#[derive(Debug, Clone, Serialize)]
pub struct ChildView {
    /// The start's key in the parent (`ch_<n>`).
    pub child_key: String,
    /// The child run; `None` when its token was taken and none was started.
    pub child_id: Option<RunId>,
    pub workflow: String,
    pub started_at: Time,
    /// The owner of the child's `.hook(token)`, when that kept it from starting.
    pub conflict: Option<RunId>,
    /// Why else it was not started (its queue is declared nowhere).
    pub refused: Option<String>,
    /// The child's status now, from its own record.
    pub status: Option<RunStatus>,
    /// When the parent received the child's end.
    pub ended_at: Option<Time>,
    pub output: Option<Value>,
    pub error: Option<Error>,
}

/// A moment of the run that is not a step, sleep or hook: a patch taken, a retry.
#[derive(Debug, Clone, Serialize)]
pub struct MarkView {
    pub at: Time,
    pub kind: MarkKind,
    /// In words.
    pub label: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    /// `patched(id)` was reached live: the run takes the new path from here.
    Patch,
    /// A failed run was re-opened.
    Retried,
}

/// Why a blocked run is blocked: the runtime's message, and its parts as the error records
/// them ([`Error::divergence`]; an error recorded without them keeps just `message`).
#[derive(Debug, Clone, Serialize)]
pub struct DivergenceView {
    pub message: String,
    /// The history's event at which replay left it.
    pub event: Option<u64>,
    /// What the history holds there.
    pub expected: Option<String>,
    /// What the deployed code did instead.
    pub found: Option<String>,
}

impl DivergenceView {
    pub fn new(error: &Error) -> Self {
        let d = error.divergence();
        DivergenceView {
            message: error.to_string(),
            event: d.map(|d| d.event),
            expected: d.map(|d| d.expected.clone()),
            found: d.map(|d| d.found.clone()),
        }
    }
}

/// `charge_card` for `shop::orders::charge_card`: registered names carry the module path.
pub fn short_name(name: &str) -> &str {
    name.rsplit("::").next().unwrap_or(name)
}

fn find_step<'a>(steps: &'a mut [StepView], step_id: &str) -> Option<&'a mut StepView> {
    steps.iter_mut().rfind(|s| s.step_id == step_id)
}

fn open_attempt(attempt: u32, at: Time) -> AttemptView {
    AttemptView {
        attempt,
        started_at: at,
        ended_at: None,
        duration_ms: None,
        outcome: AttemptOutcome::Running,
        error: None,
        retry_at: None,
    }
}

fn close(a: &mut AttemptView, at: Time, outcome: AttemptOutcome) {
    a.ended_at = Some(at);
    a.duration_ms = Some(a.started_at.until(at));
    a.outcome = outcome;
}

/// What a live run waits for, in the words a person on call wants to read.
fn waiting_on(
    run: &RunSummary,
    steps: &[StepView],
    timers: &[TimerView],
    hooks: &[HookView],
    now: Time,
) -> Vec<String> {
    let mut out = Vec::new();
    match run.status {
        RunStatus::Pending => {
            out.push("a worker to pick it up (no worker has run it yet)".to_owned());
            return out;
        }
        RunStatus::Running => {}
        RunStatus::Blocked => {
            out.push(
                "a build whose code fits its recorded history (its replay diverged from it); \
                 workers try again with backoff, a retry tries now"
                    .to_owned(),
            );
            return out;
        }
        _ => return out,
    }
    for s in steps {
        let Some(a) = s.attempts.last() else { continue };
        match s.status {
            StepStatus::Running => out.push(format!(
                "step {} (attempt {}), running for {}",
                s.label(),
                a.attempt,
                text::duration_ms(a.started_at.until(now))
            )),
            StepStatus::Retrying => {
                let at = a.retry_at.unwrap_or(now);
                out.push(format!(
                    "step {}: attempt {} failed; attempt {} {}",
                    s.label(),
                    a.attempt,
                    a.attempt + 1,
                    if at > now {
                        format!("starts in {}", text::duration_ms(now.until(at)))
                    } else {
                        "is due".to_owned()
                    }
                ))
            }
            _ => {}
        }
    }
    for t in timers {
        match t.status {
            TimerStatus::Waiting => out.push(format!(
                "sleep {} until {} (in {})",
                t.timer_id,
                t.fire_at,
                text::duration_ms(now.until(t.fire_at))
            )),
            TimerStatus::Due => out.push(format!(
                "sleep {} ended at {}; a worker will resume the run",
                t.timer_id, t.fire_at
            )),
            _ => {}
        }
    }
    for h in hooks.iter().filter(|h| h.active) {
        out.push(format!(
            "hook {:?}, open for {} with {} payload(s) received",
            h.token,
            text::duration_ms(h.registered_at.until(now)),
            h.payloads.len()
        ));
    }
    out
}

/// One history entry, as shown.
#[derive(Debug, Clone, Serialize)]
pub struct EventView {
    pub seq: u64,
    pub at: Time,
    pub event: Event,
}

impl EventView {
    pub fn new(e: EventRecord) -> Self {
        EventView {
            seq: e.seq,
            at: Time(e.at),
            event: e.event,
        }
    }

    /// The serde tag of the event (`step_scheduled`, ...).
    pub fn kind(&self) -> String {
        self.event.kind().to_owned()
    }

    /// The event's particulars in one line.
    pub fn details(&self) -> String {
        match &self.event {
            Event::StepScheduled {
                step_id,
                name,
                input,
            } => format!("{name} {step_id} input={}", text::json_line(input, 80)),
            Event::StepAttemptStarted { step_id, attempt } => {
                format!("{step_id} attempt {attempt}")
            }
            Event::StepAttemptFailed {
                step_id,
                attempt,
                error,
                retry_at_ms,
            } => format!(
                "{step_id} attempt {attempt}: {error}; retry at {}",
                text::rfc3339(workflow_core::store::from_millis(*retry_at_ms))
            ),
            Event::StepCompleted { step_id, result } => match result {
                Ok(v) => format!("{step_id} ok={}", text::json_line(v, 80)),
                Err(e) => format!("{step_id} error: {e}"),
            },
            Event::TimerScheduled {
                timer_id,
                fire_at_ms,
            } => format!(
                "{timer_id} until {}",
                text::rfc3339(workflow_core::store::from_millis(*fire_at_ms))
            ),
            Event::TimerFired { timer_id } => timer_id.clone(),
            Event::RunCompleted { output } => format!("output={}", text::json_line(output, 80)),
            Event::RunFailed { error } => format!("{:?}: {error}", error.kind()),
            Event::RunCancelled => String::new(),
            Event::HookRegistered {
                hook_key,
                token,
                conflict,
            } => match conflict {
                Some(owner) => format!("{hook_key} {token:?} conflict: owned by run {owner}"),
                None => format!("{hook_key} {token:?}"),
            },
            Event::HookReceived {
                token,
                payload_id,
                payload,
            } => format!(
                "{token:?} payload #{payload_id} {}",
                text::json_line(payload, 80)
            ),
            Event::HookReleased { hook_key, token } => format!("{hook_key} {token:?}"),
            Event::PatchMarked { patch_id } => format!("patch {patch_id:?}: new code path taken"),
            Event::RunRetried => "failed run re-opened by retry".to_owned(),
            Event::ChildStarted {
                child_key,
                child_id,
                workflow,
                conflict,
                refused,
            } => match (conflict, refused) {
                (Some(owner), _) => format!(
                    "{child_key} {} not started: its token is owned by run {owner}",
                    short_name(workflow)
                ),
                (None, Some(why)) => {
                    format!("{child_key} {} not started: {why}", short_name(workflow))
                }
                (None, None) => format!("{child_key} {} run {child_id}", short_name(workflow)),
            },
            Event::ChildEnded {
                child_id, result, ..
            } => match result {
                Ok(v) => format!("run {child_id} ok={}", text::json_line(v, 80)),
                Err(e) => format!("run {child_id} error: {e}"),
            },
            other => format!("{other:?}"),
        }
    }
}

/// An active hook, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct HookSummary {
    pub token: String,
    pub run_id: RunId,
    pub created_at: Time,
}

impl From<HookRecord> for HookSummary {
    fn from(h: HookRecord) -> Self {
        HookSummary {
            token: h.token,
            run_id: h.run_id,
            created_at: Time(h.created_at),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use workflow_core::store::from_millis;

    use super::*;

    fn t(ms: u64) -> SystemTime {
        from_millis(1_700_000_000_000 + ms)
    }

    fn ev(seq: u64, at: u64, event: Event) -> EventRecord {
        EventRecord {
            seq,
            at: t(at),
            event,
        }
    }

    fn run(status: RunStatus, updated: u64, hook_token: Option<&str>) -> RunRecord {
        RunRecord {
            parent: None,
            id: RunId::new(),
            workflow: "wf".into(),
            status,
            input: json!([]),
            output: None,
            error: None,
            created_at: t(0),
            updated_at: t(updated),
            hook_token: hook_token.map(str::to_owned),
            deadline: None,
            queue: None,
        }
    }

    #[test]
    fn waiting_runs_are_numbered_by_priority_then_start_order() {
        let queued = |status, created: u64, priority| {
            let mut r = run(status, created, None);
            r.created_at = t(created);
            r.queue = Some(QueueEntry {
                name: "q".into(),
                partition_key: None,
                priority,
            });
            RunSummary::new(r)
        };
        let runs = vec![
            queued(RunStatus::Pending, 3, 0),
            queued(RunStatus::Running, 0, 9),
            queued(RunStatus::Pending, 2, 5),
            queued(RunStatus::Pending, 1, 0),
        ];
        let numbered: Vec<Option<usize>> = positions(runs).iter().map(|r| r.position).collect();
        assert_eq!(numbered, [Some(3), None, Some(1), Some(2)]);
    }

    #[test]
    fn attempts_retries_and_interruptions() {
        let events = vec![
            ev(
                1,
                10,
                Event::StepScheduled {
                    step_id: "stp_x_1".into(),
                    name: "charge".into(),
                    input: json!([1]),
                },
            ),
            ev(
                2,
                30,
                Event::StepAttemptFailed {
                    step_id: "stp_x_1".into(),
                    attempt: 1,
                    error: Error::retryable("timeout"),
                    retry_at_ms: to_millis(t(130)),
                },
            ),
            ev(
                3,
                130,
                Event::StepAttemptStarted {
                    step_id: "stp_x_1".into(),
                    attempt: 2,
                },
            ),
            // The worker died during attempt 2.
            ev(
                4,
                500,
                Event::StepAttemptStarted {
                    step_id: "stp_x_1".into(),
                    attempt: 3,
                },
            ),
            ev(
                5,
                520,
                Event::StepCompleted {
                    step_id: "stp_x_1".into(),
                    result: Ok(json!("r")),
                },
            ),
            ev(
                6,
                530,
                Event::TimerScheduled {
                    timer_id: "tm_1".into(),
                    fire_at_ms: to_millis(t(100_000)),
                },
            ),
        ];
        let d = RunDetail::new(run(RunStatus::Running, 530, None), &events, &[], t(1000));
        let s = &d.steps[0];
        assert_eq!(s.label(), "charge #0");
        assert_eq!(short_name("shop::orders::charge"), "charge");
        assert_eq!(s.status, StepStatus::Completed);
        assert_eq!(s.duration_ms, Some(510));
        let got: Vec<_> = s
            .attempts
            .iter()
            .map(|a| (a.attempt, a.outcome, a.duration_ms))
            .collect();
        assert_eq!(
            got,
            [
                (1, AttemptOutcome::Failed, Some(20)),
                (2, AttemptOutcome::Interrupted, Some(370)),
                (3, AttemptOutcome::Ok, Some(20)),
            ]
        );
        assert_eq!(s.attempts[0].retry_at, Some(Time(t(130))));
        assert_eq!(d.timers[0].status, TimerStatus::Waiting);
        assert_eq!(d.waiting_on.len(), 1, "{:?}", d.waiting_on);
        assert!(d.waiting_on[0].starts_with("sleep tm_1 until"));
    }

    #[test]
    fn an_ended_run_closes_what_was_open() {
        let events = vec![
            ev(
                1,
                10,
                Event::StepScheduled {
                    step_id: "stp_x_1".into(),
                    name: "slow".into(),
                    input: json!([]),
                },
            ),
            ev(
                2,
                20,
                Event::TimerScheduled {
                    timer_id: "tm_1".into(),
                    fire_at_ms: to_millis(t(100_000)),
                },
            ),
            ev(3, 50, Event::RunCancelled),
        ];
        let d = RunDetail::new(
            run(RunStatus::Cancelled, 50, Some("tok")),
            &events,
            &[],
            t(1000),
        );
        assert_eq!(d.steps[0].status, StepStatus::Abandoned);
        assert_eq!(d.steps[0].attempts[0].outcome, AttemptOutcome::Interrupted);
        assert_eq!(d.steps[0].attempts[0].ended_at, Some(Time(t(50))));
        assert_eq!(d.timers[0].status, TimerStatus::Abandoned);
        assert_eq!(d.hooks[0].token, "tok");
        assert_eq!(d.hooks[0].released_at, Some(Time(t(50))));
        assert!(!d.hooks[0].active);
        assert!(d.waiting_on.is_empty());
        assert_eq!(d.end(), Time(t(50)));
    }

    #[test]
    fn hooks_payloads_and_conflicts() {
        let owner = RunId::new();
        let events = vec![
            ev(
                1,
                10,
                Event::HookRegistered {
                    hook_key: "hk_1".into(),
                    token: "a".into(),
                    conflict: None,
                },
            ),
            ev(
                2,
                11,
                Event::HookRegistered {
                    hook_key: "hk_2".into(),
                    token: "b".into(),
                    conflict: Some(owner),
                },
            ),
            ev(
                3,
                40,
                Event::HookReceived {
                    token: "a".into(),
                    payload_id: 7,
                    payload: json!({"ok": true}),
                },
            ),
            ev(
                4,
                60,
                Event::HookReceived {
                    token: "start".into(),
                    payload_id: 8,
                    payload: json!(1),
                },
            ),
        ];
        let active = [
            HookRecord {
                token: "a".into(),
                run_id: RunId::new(),
                created_at: t(10),
            },
            HookRecord {
                token: "start".into(),
                run_id: RunId::new(),
                created_at: t(0),
            },
        ];
        let d = RunDetail::new(
            run(RunStatus::Running, 60, Some("start")),
            &events,
            &active,
            t(100),
        );
        let got: Vec<_> = d
            .hooks
            .iter()
            .map(|h| (h.token.as_str(), h.active, h.payloads.len(), h.conflict))
            .collect();
        assert_eq!(
            got,
            [
                ("a", true, 1, None),
                ("b", false, 0, Some(owner)),
                ("start", true, 1, None),
            ]
        );
        assert_eq!(d.hooks[2].registered_at, Time(t(0)));
        assert_eq!(d.waiting_on.len(), 2, "{:?}", d.waiting_on);
    }

    #[test]
    fn a_divergence_is_read_from_the_error_not_its_wording() {
        // As a blocked run's error is recorded: the message and the parts beside it.
        let error: Error = serde_json::from_value(json!({
            "kind": "diverged",
            "message": "worded any way at all",
            "divergence": {
                "event": 3,
                "expected": "step `a` (stp_1_0)",
                "found": "step `b` (stp_2_0)",
                "kind": "command"
            }
        }))
        .unwrap();
        let v = DivergenceView::new(&error);
        assert_eq!(v.message, "worded any way at all");
        assert_eq!(v.event, Some(3));
        assert_eq!(v.expected.as_deref(), Some("step `a` (stp_1_0)"));
        assert_eq!(v.found.as_deref(), Some("step `b` (stp_2_0)"));
        let v = DivergenceView::new(&Error::fatal("worded otherwise"));
        assert_eq!((v.message.as_str(), v.event), ("worded otherwise", None));
    }

    #[test]
    fn patches_and_retries_are_marked_and_a_retry_opens_fresh_attempts() {
        let step = |seq, at, event| ev(seq, at, event);
        let events = vec![
            step(
                1,
                5,
                Event::PatchMarked {
                    patch_id: "use-v2".into(),
                },
            ),
            step(
                2,
                10,
                Event::StepScheduled {
                    step_id: "stp_x_0".into(),
                    name: "charge".into(),
                    input: json!([]),
                },
            ),
            step(
                3,
                20,
                Event::StepCompleted {
                    step_id: "stp_x_0".into(),
                    result: Err(Error::fatal("declined")),
                },
            ),
            step(
                4,
                20,
                Event::RunFailed {
                    error: Error::fatal("declined"),
                },
            ),
            step(5, 100, Event::RunRetried),
        ];
        let d = RunDetail::new(run(RunStatus::Pending, 100, None), &events, &[], t(150));
        let marks: Vec<_> = d.marks.iter().map(|m| (m.kind, m.at)).collect();
        assert_eq!(
            marks,
            [
                (MarkKind::Patch, Time(t(5))),
                (MarkKind::Retried, Time(t(100)))
            ]
        );
        let s = &d.steps[0];
        assert_eq!(s.status, StepStatus::Running);
        let got: Vec<_> = s.attempts.iter().map(|a| (a.attempt, a.outcome)).collect();
        assert_eq!(
            got,
            [(1, AttemptOutcome::Failed), (1, AttemptOutcome::Running)]
        );
        assert_eq!(s.attempts[1].started_at, Time(t(100)));
        let details: Vec<_> = events
            .into_iter()
            .map(|e| EventView::new(e).details())
            .collect();
        assert_eq!(details[0], "patch \"use-v2\": new code path taken");
        assert_eq!(details[4], "failed run re-opened by retry");
    }

    #[test]
    fn json_times_are_rfc3339() {
        let v = serde_json::to_value(Time(from_millis(1_700_000_000_123))).unwrap();
        assert_eq!(v, json!("2023-11-14T22:13:20.123Z"));
    }
}
