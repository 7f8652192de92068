//! One run with everything its history says: its steps and their attempts, its sleeps,
//! hooks, children, streams, marks, divergence and what it waits on.

use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;
use workflow_core::store::{Event, EventRecord, HookRecord, RunRecord};
use workflow_core::{Error, RunId, RunStatus};

use super::*;
use crate::text;

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

impl AttemptOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Running => "running",
            Self::Interrupted => "interrupted",
        }
    }
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
    /// The latest value of each key the run published with `set_event` (filled by `ops`).
    pub published: std::collections::BTreeMap<String, Value>,
    /// Messages sent to the run that no `recv` took yet: inbox id, topic, message (filled by
    /// `ops`).
    pub waiting_messages: Vec<(u64, String, Value)>,
    /// Requests sent to the run (`run.request`) that it has not replied to, by id (filled by
    /// `ops`).
    pub open_requests: Vec<OpenRequest>,
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

/// A request sent to the run that it has not replied to (a caller may be waiting for it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpenRequest {
    /// The request's id.
    pub id: u64,
    /// The name it was sent under.
    pub name: String,
    /// Its idempotency key, if any.
    pub key: Option<String>,
    /// Whether the workflow took it (`requests(name)`), and has yet to reply; otherwise it
    /// waits for the workflow to listen.
    pub received: bool,
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
        let now = Time(now);
        let mut replay = Replay::new(run.created_at);
        for e in events {
            replay.apply(e);
        }
        replay.add_claimed_token(&run);
        replay.mark_active(&run, active_hooks);
        match run.status.is_terminal().then_some(run.updated_at) {
            Some(end) => replay.settle_ended(end),
            None => replay.mark_due(now),
        }
        let Replay {
            steps,
            timers,
            hooks,
            marks,
            children,
            ..
        } = replay;
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
            published: std::collections::BTreeMap::new(),
            waiting_messages: Vec::new(),
            open_requests: Vec::new(),
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

/// What a run's history says, built up event by event: its steps, sleeps, hooks, marks and
/// children as they stood after the last event applied.
struct Replay {
    /// When the run was created: the time of a hook bound at start, which has no event.
    created_at: Time,
    steps: Vec<StepView>,
    timers: Vec<TimerView>,
    hooks: Vec<HookView>,
    marks: Vec<MarkView>,
    children: Vec<ChildView>,
    /// What a retry re-opens: the steps whose error came after the last command recorded.
    last_command: u64,
    failed_at: Vec<(String, u64)>,
}

impl Replay {
    fn new(created_at: Time) -> Self {
        Replay {
            created_at,
            steps: Vec::new(),
            timers: Vec::new(),
            hooks: Vec::new(),
            marks: Vec::new(),
            children: Vec::new(),
            last_command: 0,
            failed_at: Vec::new(),
        }
    }

    /// Applies the next event of the history.
    fn apply(&mut self, e: &EventRecord) {
        let at = Time(e.at);
        self.note_for_retry(e);
        match &e.event {
            Event::StepScheduled {
                step_id,
                name,
                input,
            } => self.step_scheduled(step_id, name, input, at),
            Event::StepAttemptStarted { step_id, attempt } => {
                self.attempt_started(step_id, *attempt, at)
            }
            Event::StepAttemptFailed {
                step_id,
                attempt,
                error,
                retry_at_ms,
            } => self.attempt_failed(step_id, *attempt, error, *retry_at_ms, at),
            Event::StepCompleted { step_id, result } => self.step_completed(step_id, result, at),
            Event::TimerScheduled {
                timer_id,
                fire_at_ms,
            } => self.timers.push(TimerView {
                timer_id: timer_id.clone(),
                scheduled_at: at,
                fire_at: Time(workflow_core::store::from_millis(*fire_at_ms)),
                fired_at: None,
                status: TimerStatus::Waiting,
            }),
            Event::TimerFired { timer_id } => {
                if let Some(t) = self.timers.iter_mut().rfind(|t| &t.timer_id == timer_id) {
                    t.fired_at = Some(at);
                    t.status = TimerStatus::Fired;
                }
            }
            Event::HookRegistered {
                hook_key,
                token,
                conflict,
            } => self.hooks.push(HookView {
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
            } => self.hook_received(token, *payload_id, payload, at),
            Event::HookReleased { hook_key, token } => self.hook_released(hook_key, token, at),
            Event::PatchMarked { patch_id } => self.marks.push(MarkView {
                at,
                kind: MarkKind::Patch,
                label: format!("patch {patch_id:?} taken"),
            }),
            Event::RunRetried => self.retried(at),
            Event::ChildStarted {
                child_key,
                child_id,
                workflow,
                conflict,
                refused,
            } => self.children.push(ChildView {
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
            } => self.child_ended(*child_id, result, at),
            // The run's end is in its record; events added later are not drawn.
            _ => {}
        }
    }

    /// Keeps what a later retry needs: the last command's sequence number, and which steps
    /// failed after which event.
    fn note_for_retry(&mut self, e: &EventRecord) {
        if matches!(
            e.event,
            Event::StepScheduled { .. }
                | Event::TimerScheduled { .. }
                | Event::HookRegistered { .. }
                | Event::HookReleased { .. }
                | Event::PatchMarked { .. }
                | Event::ChildStarted { .. }
        ) {
            self.last_command = e.seq;
        }
        if let Event::StepCompleted {
            step_id,
            result: Err(_),
        } = &e.event
        {
            self.failed_at.push((step_id.clone(), e.seq));
        }
    }

    fn step_scheduled(&mut self, step_id: &str, name: &str, input: &Value, at: Time) {
        self.steps.push(StepView {
            call: self.steps.iter().filter(|s| s.name == name).count() as u32,
            step_id: step_id.to_owned(),
            name: name.to_owned(),
            input: input.clone(),
            status: StepStatus::Running,
            scheduled_at: at,
            ended_at: None,
            duration_ms: None,
            attempts: vec![open_attempt(1, at)],
            output: None,
            error: None,
        });
    }

    fn attempt_started(&mut self, step_id: &str, attempt: u32, at: Time) {
        if let Some(s) = find_step(&mut self.steps, step_id) {
            // An attempt still open here was cut short by its worker's stop.
            if let Some(prev) = s.attempts.last_mut() {
                if prev.outcome == AttemptOutcome::Running {
                    close(prev, at, AttemptOutcome::Interrupted);
                }
            }
            s.attempts.push(open_attempt(attempt, at));
            s.status = StepStatus::Running;
        }
    }

    fn attempt_failed(
        &mut self,
        step_id: &str,
        attempt: u32,
        error: &Error,
        retry_at_ms: u64,
        at: Time,
    ) {
        if let Some(s) = find_step(&mut self.steps, step_id) {
            if let Some(a) = s.attempts.iter_mut().rfind(|a| a.attempt == attempt) {
                close(a, at, AttemptOutcome::Failed);
                a.error = Some(error.clone());
                a.retry_at = Some(Time(workflow_core::store::from_millis(retry_at_ms)));
            }
            s.status = StepStatus::Retrying;
        }
    }

    fn step_completed(&mut self, step_id: &str, result: &Result<Value, Error>, at: Time) {
        let Some(s) = find_step(&mut self.steps, step_id) else {
            return;
        };
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

    fn hook_received(&mut self, token: &str, payload_id: u64, payload: &Value, at: Time) {
        let payload = PayloadView {
            at,
            payload_id,
            payload: payload.clone(),
        };
        let hook = self
            .hooks
            .iter_mut()
            .rfind(|h| h.token == token && h.conflict.is_none());
        match hook {
            Some(h) => h.payloads.push(payload),
            // The token claimed at start: bound without a registration event.
            None => self.hooks.push(HookView {
                token: token.to_owned(),
                hook_key: None,
                registered_at: self.created_at,
                released_at: None,
                conflict: None,
                active: false,
                payloads: vec![payload],
            }),
        }
    }

    fn hook_released(&mut self, hook_key: &str, token: &str, at: Time) {
        let hook = self.hooks.iter_mut().rfind(|h| {
            h.token == token
                && h.released_at.is_none()
                && h.hook_key.as_deref().is_none_or(|k| k == hook_key)
        });
        if let Some(h) = hook {
            h.released_at = Some(at);
        }
    }

    /// A failed run re-opened: the steps that failed it get a fresh set of attempts, the first
    /// one starting now (like a scheduling).
    fn retried(&mut self, at: Time) {
        self.marks.push(MarkView {
            at,
            kind: MarkKind::Retried,
            label: "failed run re-opened by retry".to_owned(),
        });
        let last_command = self.last_command;
        for (step_id, _) in self
            .failed_at
            .drain(..)
            .filter(|(_, seq)| *seq > last_command)
        {
            if let Some(s) = find_step(&mut self.steps, &step_id) {
                s.status = StepStatus::Running;
                s.ended_at = None;
                s.duration_ms = None;
                s.error = None;
                s.attempts.push(open_attempt(1, at));
            }
        }
    }

    fn child_ended(&mut self, child_id: RunId, result: &Result<Value, Error>, at: Time) {
        let child = self
            .children
            .iter_mut()
            .find(|c| c.child_id == Some(child_id));
        if let Some(c) = child {
            c.ended_at = Some(at);
            match result {
                Ok(v) => c.output = Some(v.clone()),
                Err(e) => c.error = Some(e.clone()),
            }
        }
    }

    /// The token claimed at start, before any payload reached the workflow.
    fn add_claimed_token(&mut self, run: &RunSummary) {
        if let Some(token) = &run.hook_token {
            if !self.hooks.iter().any(|h| &h.token == token) {
                self.hooks.insert(
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
    }

    /// Marks open the hooks the store reports active, while the run goes on.
    fn mark_active(&mut self, run: &RunSummary, active_hooks: &[HookRecord]) {
        for active in active_hooks {
            if let Some(h) = self
                .hooks
                .iter_mut()
                .rfind(|h| h.token == active.token && h.conflict.is_none())
            {
                h.active = h.released_at.is_none() && !run.status.is_terminal();
            }
        }
    }

    /// The run ended at `end`: what was still going on was abandoned or cut short then.
    fn settle_ended(&mut self, end: Time) {
        for s in &mut self.steps {
            if matches!(s.status, StepStatus::Running | StepStatus::Retrying) {
                s.status = StepStatus::Abandoned;
            }
            if let Some(a) = s.attempts.last_mut() {
                if a.outcome == AttemptOutcome::Running {
                    close(a, end.max(a.started_at), AttemptOutcome::Interrupted);
                }
            }
        }
        for t in &mut self.timers {
            if t.status == TimerStatus::Waiting {
                t.status = TimerStatus::Abandoned;
            }
        }
        for h in &mut self.hooks {
            if h.released_at.is_none() {
                h.released_at = Some(end.max(h.registered_at));
            }
        }
    }

    /// The run goes on: the sleeps whose time has come are due.
    fn mark_due(&mut self, now: Time) {
        for t in &mut self.timers {
            if t.status == TimerStatus::Waiting && t.fire_at <= now {
                t.status = TimerStatus::Due;
            }
        }
    }
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
            out.push(match run.starts_later(now) {
                Some(t) => format!(
                    "its start at {t} (in {}): it was started with a delay",
                    text::duration_ms(now.until(t))
                ),
                None => "a worker to pick it up (no worker has run it yet)".to_owned(),
            });
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
