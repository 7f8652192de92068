//! The replay core: every decision about one run, as a state machine with no I/O.
//!
//! It reads the run's recorded history, matches the commands the workflow issues against it,
//! hands recorded results back in history order, decides what to record next (a step's
//! scheduling and attempts, retries, timer firings, hook payload deliveries) and detects
//! divergence between the code and the history. It knows no store and no async runtime: the
//! driver (`crate::driver`) feeds it commands, attempt outcomes, claim decisions, payloads and
//! the current time, persists the events it returns and carries out its effects. Its tests
//! (`tests.rs`) build histories by hand and check the decisions, with no store and no executor.
//!
//! Ordering is the core's main promise. Results reach the workflow one at a time, in the order
//! they were recorded, and the driver polls the workflow to quiescence between two deliveries:
//! a live run records results in the order it delivered them, so a replay delivers them in the
//! same order and a `select` in the workflow picks the same branch on every replay. Live
//! results wait until the whole history has been delivered.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::error::Error;
use crate::history::{after, from_millis, to_millis, Event, EventRecord, NewEvent};
use crate::ids::RunId;
use crate::store::{ChildNotice, CHILD_NOTICE_TOKEN};

#[cfg(test)]
mod tests;

/// What the workflow waits on: the key a result is delivered under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Key {
    /// A step invocation's final result, by step id.
    Step(String),
    /// A durable sleep's firing, by timer id.
    Timer(String),
    /// The decision on a hook's registration, by hook key.
    Hook(String),
    /// The next payload for a token. Only the workflow's `recv` waits on it; payloads are
    /// recorded by their inbox id, not under this key.
    Payload(String),
    /// The admission of a child run, by the start's key (`ch_<n>`).
    Child(String),
    /// A child run's end, by the child's id.
    ChildEnd(RunId),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Step(id) | Key::Timer(id) | Key::Hook(id) | Key::Child(id) => f.write_str(id),
            Key::Payload(token) => write!(f, "the next payload for {token:?}"),
            Key::ChildEnd(id) => write!(f, "the end of child run {id}"),
        }
    }
}

/// A command the workflow issued. `S` is how the driver runs the step's body; the core only
/// keeps it for the driver.
pub(crate) enum Command<S> {
    /// Call a step.
    Step(StepCall<S>),
    /// Sleep until `fire_at`.
    Timer {
        /// The timer's id within the run.
        timer_id: String,
        /// When it fires, as computed by this replay (the recorded time wins on replay).
        fire_at: SystemTime,
    },
    /// Commit the registration of a hook (claim its token).
    HookRegister {
        /// The hook's key within the run.
        hook_key: String,
        /// The requested token.
        token: String,
    },
    /// Give up a token this run owns.
    HookRelease {
        /// The hook's key within the run.
        hook_key: String,
        /// Its token.
        token: String,
    },
    /// `patched(patch_id)` answered true: match the recorded marker, or record it.
    Patch {
        /// The id given to `patched`.
        patch_id: String,
    },
    /// Start a child run.
    StartChild(ChildCall),
    /// Wait for a child run's end (`child.result()`). Not a recorded command: the end is
    /// recorded when it is delivered, like a payload.
    AwaitChild {
        /// The child run.
        child_id: RunId,
    },
}

/// One `start_child` call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChildCall {
    /// The start's key within the run (`ch_<n>`).
    pub(crate) child_key: String,
    /// The child's registered workflow.
    pub(crate) workflow: &'static str,
    /// Its serialized argument tuple.
    pub(crate) input: Value,
    /// The token its admission claims (`.hook(token)`).
    pub(crate) hook: Option<String>,
    /// Its run deadline (`.timeout(d)`), from its admission.
    pub(crate) timeout: Option<Duration>,
    /// Started with `.detached()`: the parent's cancellation does not reach it.
    pub(crate) detached: bool,
    /// The queue it waits in (`.queue(..)` or the child workflow's own), with its partition
    /// key and priority.
    pub(crate) queue: Option<crate::store::QueueEntry>,
}

impl<S> Command<S> {
    fn describe(&self) -> String {
        match self {
            Command::Step(call) => format!("step `{}` ({})", call.name, call.step_id),
            Command::Timer { timer_id, .. } => format!("sleep ({timer_id})"),
            Command::HookRegister { hook_key, token } => format!("hook {token:?} ({hook_key})"),
            Command::HookRelease { hook_key, token } => {
                format!("release of hook {token:?} ({hook_key})")
            }
            Command::Patch { patch_id } => format!("patch {patch_id:?}"),
            Command::StartChild(call) => {
                format!("child run of `{}` ({})", call.workflow, call.child_key)
            }
            Command::AwaitChild { child_id } => format!("the end of child run {child_id}"),
        }
    }
}

/// One invocation of a step.
pub(crate) struct StepCall<S> {
    /// The invocation's stable id.
    pub(crate) step_id: String,
    /// The step's registered name.
    pub(crate) name: &'static str,
    /// The serialized argument tuple.
    pub(crate) input: Value,
    /// Retries after the first attempt.
    pub(crate) max_retries: u32,
    /// Each attempt's deadline.
    pub(crate) timeout: Option<Duration>,
    /// What the driver runs for each attempt.
    pub(crate) body: S,
}

/// A result handed to the workflow, stamped with the time that becomes its clock.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Delivery {
    /// The workflow's clock from this delivery on.
    pub(crate) at: SystemTime,
    /// What is delivered.
    pub(crate) what: Delivered,
}

/// What a [`Delivery`] carries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Delivered {
    /// A step's final result.
    Step {
        step_id: String,
        result: Result<Value, Error>,
    },
    /// A timer fired.
    Timer { timer_id: String },
    /// The decision on a hook's registration: `None` when this run owns the token.
    Registration {
        hook_key: String,
        token: String,
        conflict: Option<RunId>,
    },
    /// A payload sent to a token this run owns.
    Payload { token: String, payload: Value },
    /// The decision on a child's admission: `conflict` names the owner of its token when no
    /// child was admitted.
    ChildStarted {
        child_key: String,
        child_id: RunId,
        conflict: Option<RunId>,
        refused: Option<String>,
    },
    /// A child run's end.
    ChildEnded {
        child_id: RunId,
        result: Result<Value, Error>,
    },
}

impl Delivered {
    /// The key the workflow waits on for this result (payloads are queued per token instead).
    fn key(&self) -> Option<Key> {
        match self {
            Delivered::Step { step_id, .. } => Some(Key::Step(step_id.clone())),
            Delivered::Timer { timer_id } => Some(Key::Timer(timer_id.clone())),
            Delivered::Registration { hook_key, .. } => Some(Key::Hook(hook_key.clone())),
            Delivered::Payload { .. } => None,
            Delivered::ChildStarted { child_key, .. } => Some(Key::Child(child_key.clone())),
            Delivered::ChildEnded { child_id, .. } => Some(Key::ChildEnd(*child_id)),
        }
    }
}

/// Work the driver carries out once the events returned before it are durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Run attempt `attempt` of step `step_id` ([`Replay::step`] has the call) and report its
    /// outcome with [`Replay::attempt_finished`].
    Attempt { step_id: String, attempt: u32 },
    /// Claim `token` for hook `hook_key` in the store (which records the decision) and report
    /// it with [`Replay::claimed`].
    Claim { hook_key: String, token: String },
    /// Admit the child run of start `child_key` ([`Replay::child`] has the call) in the store
    /// (which records it) and report the decision with [`Replay::child_started`].
    StartChild { child_key: String },
}

/// A payload in the run's inbox, as the driver read it from the store.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Inbound {
    /// Its inbox id (global commit order).
    pub(crate) id: u64,
    /// The token it was sent to.
    pub(crate) token: String,
    /// As sent.
    pub(crate) payload: Value,
}

/// How a run ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum End {
    /// The workflow returned `Ok`.
    Completed(Value),
    /// The workflow returned `Err` or panicked.
    Failed(Error),
}

/// What to make durable, all or nothing, before any effect returned after it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Writes {
    /// Events to append, in order.
    pub(crate) events: Vec<NewEvent>,
    /// Tokens the run gives up.
    pub(crate) releases: Vec<String>,
    /// The run's end, when it returned.
    pub(crate) end: Option<End>,
}

impl Writes {
    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty() && self.releases.is_empty() && self.end.is_none()
    }
}

/// The ways code and history can disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DivergenceKind {
    /// The workflow issued a different command than the one recorded next.
    Command,
    /// The history delivers a result the workflow is not waiting for.
    Result,
    /// The workflow returned while the history records further commands.
    Returned,
    /// The workflow returned while recorded results were still to be delivered.
    Unreplayed,
}

/// Where replay stopped matching the history. Nothing is written when it is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Divergence {
    /// Which disagreement.
    pub(crate) kind: DivergenceKind,
    /// The position (event sequence number) of the recorded event involved.
    pub(crate) seq: u64,
    /// What the history holds there.
    pub(crate) expected: String,
    /// What the workflow did instead.
    pub(crate) found: String,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Divergence {
            seq,
            expected,
            found,
            ..
        } = self;
        match self.kind {
            DivergenceKind::Command => write!(
                f,
                "at event {seq} its history expects {expected} next, but the workflow called {found}"
            ),
            DivergenceKind::Result => write!(
                f,
                "at event {seq} its history delivers the result of {expected}, but the workflow \
                 is waiting on {found}"
            ),
            DivergenceKind::Returned => write!(
                f,
                "the workflow returned ({found}) where its history expects {expected} next \
                 (event {seq})"
            ),
            DivergenceKind::Unreplayed => write!(
                f,
                "the workflow returned ({found}) before its history delivered {expected} \
                 (event {seq})"
            ),
        }
    }
}

/// Where the patch markers of a history stand: what `patched` needs to answer at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Patches {
    /// How many commands the history records.
    pub(crate) recorded: usize,
    /// The recorded commands that are patch markers, by position, with their ids.
    pub(crate) markers: HashMap<usize, String>,
}

/// A recorded command, for matching.
#[derive(Debug)]
struct Recorded {
    seq: u64,
    what: RecordedCommand,
}

#[derive(Debug)]
enum RecordedCommand {
    Step {
        step_id: String,
        name: String,
    },
    Timer {
        timer_id: String,
        fire_at: SystemTime,
    },
    Hook {
        hook_key: String,
        token: String,
    },
    Patch {
        patch_id: String,
    },
    Child {
        child_key: String,
        workflow: String,
    },
}

impl RecordedCommand {
    /// The key its result is delivered under (a patch marker has no result).
    fn key(&self) -> Option<Key> {
        match self {
            RecordedCommand::Step { step_id, .. } => Some(Key::Step(step_id.clone())),
            RecordedCommand::Timer { timer_id, .. } => Some(Key::Timer(timer_id.clone())),
            RecordedCommand::Hook { hook_key, .. } => Some(Key::Hook(hook_key.clone())),
            RecordedCommand::Child { child_key, .. } => Some(Key::Child(child_key.clone())),
            RecordedCommand::Patch { .. } => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            RecordedCommand::Step { step_id, name } => format!("step `{name}` ({step_id})"),
            RecordedCommand::Timer { timer_id, .. } => format!("sleep ({timer_id})"),
            RecordedCommand::Hook { hook_key, token } => format!("hook {token:?} ({hook_key})"),
            RecordedCommand::Patch { patch_id } => format!("patch {patch_id:?}"),
            RecordedCommand::Child {
                child_key,
                workflow,
            } => format!("child run of `{workflow}` ({child_key})"),
        }
    }

    fn matches<S>(&self, cmd: &Command<S>) -> bool {
        match (self, cmd) {
            (RecordedCommand::Step { step_id, name }, Command::Step(call)) => {
                *step_id == call.step_id && name == call.name
            }
            (RecordedCommand::Timer { timer_id, .. }, Command::Timer { timer_id: t, .. }) => {
                timer_id == t
            }
            (
                RecordedCommand::Hook { hook_key, token },
                Command::HookRegister {
                    hook_key: k,
                    token: t,
                },
            ) => hook_key == k && token == t,
            (RecordedCommand::Patch { patch_id }, Command::Patch { patch_id: p }) => patch_id == p,
            (
                RecordedCommand::Child {
                    child_key,
                    workflow,
                },
                Command::StartChild(call),
            ) => *child_key == call.child_key && workflow == call.workflow,
            _ => false,
        }
    }
}

/// Where a recorded step without a result resumes.
#[derive(Debug, Default, Clone, Copy)]
struct Attempts {
    /// The last attempt that started (0: none yet).
    started: u32,
    /// Set when that attempt failed and a retry was scheduled: the earliest next start.
    retry_at: Option<SystemTime>,
}

/// A step being executed by this replay.
struct LiveStep<S> {
    call: StepCall<S>,
    /// The attempt running now, or the last one that ran.
    attempt: u32,
}

/// Something that becomes due at a time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Timer(String),
    Retry(String),
}

/// The state machine of one run. See the module docs.
pub(crate) struct Replay<S> {
    /// Recorded commands, in order, and how many the workflow has matched.
    recorded: Vec<Recorded>,
    matched: usize,
    /// Recorded results not yet delivered, in order, with their event sequence number.
    history: VecDeque<(u64, Delivery)>,
    /// The keys of recorded results (delivered or not).
    recorded_results: HashSet<Key>,
    /// Attempts of recorded steps.
    attempts: HashMap<String, Attempts>,
    /// Inbox ids of recorded payload deliveries.
    received: HashSet<u64>,
    /// Hook keys whose release is recorded.
    released: HashSet<String>,

    /// Keys the workflow waits on.
    waiting: HashSet<Key>,
    /// Events and releases to make durable.
    writes: Vec<NewEvent>,
    releases: Vec<String>,
    /// Effects to carry out once `writes` are durable.
    effects: VecDeque<Effect>,
    /// Live results, delivered after the whole history.
    ready: VecDeque<Delivery>,
    steps: HashMap<String, LiveStep<S>>,
    /// Attempts running now.
    running: usize,
    due: BTreeSet<(SystemTime, Due)>,
    /// Payloads read from the inbox and not yet delivered, in id order.
    inbox: VecDeque<Inbound>,
    /// The highest inbox id read.
    inbox_seen: u64,
    /// Child starts waiting for their admission, by key.
    children: HashMap<String, ChildCall>,
    /// Ends of children read from the inbox and not yet delivered: inbox id and result.
    child_ends: HashMap<RunId, (u64, Result<Value, Error>)>,
}

impl<S> Replay<S> {
    /// Prepares the replay of `history` (the run's events in order).
    pub(crate) fn new(history: impl IntoIterator<Item = EventRecord>) -> Self {
        let mut r = Replay {
            recorded: Vec::new(),
            matched: 0,
            history: VecDeque::new(),
            recorded_results: HashSet::new(),
            attempts: HashMap::new(),
            received: HashSet::new(),
            released: HashSet::new(),
            waiting: HashSet::new(),
            writes: Vec::new(),
            releases: Vec::new(),
            effects: VecDeque::new(),
            ready: VecDeque::new(),
            steps: HashMap::new(),
            running: 0,
            due: BTreeSet::new(),
            inbox: VecDeque::new(),
            inbox_seen: 0,
            children: HashMap::new(),
            child_ends: HashMap::new(),
        };
        for rec in history {
            r.read(rec);
        }
        r
    }

    fn read(&mut self, rec: EventRecord) {
        let EventRecord { seq, at, event } = rec;
        let result = |r: &mut Self, what: Delivered| {
            if let Some(key) = what.key() {
                r.recorded_results.insert(key);
            }
            r.history.push_back((seq, Delivery { at, what }));
        };
        match event {
            Event::StepScheduled { step_id, name, .. } => {
                self.attempts.insert(
                    step_id.clone(),
                    Attempts {
                        started: 1,
                        retry_at: None,
                    },
                );
                self.recorded.push(Recorded {
                    seq,
                    what: RecordedCommand::Step { step_id, name },
                });
            }
            Event::StepAttemptStarted { step_id, attempt } => {
                let a = self.attempts.entry(step_id).or_default();
                a.started = a.started.max(attempt);
                a.retry_at = None;
            }
            Event::StepAttemptFailed {
                step_id,
                attempt,
                retry_at_ms,
                ..
            } => {
                let a = self.attempts.entry(step_id).or_default();
                if attempt >= a.started {
                    a.retry_at = Some(from_millis(retry_at_ms));
                }
            }
            Event::StepCompleted { step_id, result: r } => {
                result(self, Delivered::Step { step_id, result: r });
            }
            Event::TimerScheduled {
                timer_id,
                fire_at_ms,
            } => self.recorded.push(Recorded {
                seq,
                what: RecordedCommand::Timer {
                    timer_id,
                    fire_at: from_millis(fire_at_ms),
                },
            }),
            Event::TimerFired { timer_id } => result(self, Delivered::Timer { timer_id }),
            Event::HookRegistered {
                hook_key,
                token,
                conflict,
            } => {
                // The command and its decision are one event.
                self.recorded.push(Recorded {
                    seq,
                    what: RecordedCommand::Hook {
                        hook_key: hook_key.clone(),
                        token: token.clone(),
                    },
                });
                result(
                    self,
                    Delivered::Registration {
                        hook_key,
                        token,
                        conflict,
                    },
                );
            }
            Event::HookReceived {
                token,
                payload_id,
                payload,
            } => {
                self.received.insert(payload_id);
                result(self, Delivered::Payload { token, payload });
            }
            Event::HookReleased { hook_key, .. } => {
                self.released.insert(hook_key);
            }
            Event::PatchMarked { patch_id } => self.recorded.push(Recorded {
                seq,
                what: RecordedCommand::Patch { patch_id },
            }),
            Event::RunRetried => self.reopen(),
            Event::ChildStarted {
                child_key,
                child_id,
                workflow,
                conflict,
                refused,
            } => {
                // The command and its decision are one event, as for hooks.
                self.recorded.push(Recorded {
                    seq,
                    what: RecordedCommand::Child {
                        child_key: child_key.clone(),
                        workflow,
                    },
                });
                result(
                    self,
                    Delivered::ChildStarted {
                        child_key,
                        child_id,
                        conflict,
                        refused,
                    },
                );
            }
            Event::ChildEnded {
                child_id,
                payload_id,
                result: r,
            } => {
                self.received.insert(payload_id);
                result(
                    self,
                    Delivered::ChildEnded {
                        child_id,
                        result: r,
                    },
                );
            }
            Event::RunCompleted { .. } | Event::RunFailed { .. } | Event::RunCancelled => {}
        }
    }

    /// A failed run re-opened (`RunRetried`): the steps whose error ended it — their error is
    /// recorded after the last recorded command, so the workflow did not go on from it — lose
    /// that result and get a fresh set of attempts.
    fn reopen(&mut self) {
        let last_command = self.recorded.last().map_or(0, |r| r.seq);
        let mut voided = HashSet::new();
        self.history.retain(|(seq, d)| match &d.what {
            Delivered::Step {
                step_id,
                result: Err(_),
            } if *seq > last_command => {
                voided.insert(step_id.clone());
                false
            }
            _ => true,
        });
        for step_id in voided {
            self.recorded_results.remove(&Key::Step(step_id.clone()));
            self.attempts.insert(step_id, Attempts::default());
        }
    }

    /// Whether the history records any command (a run that did nothing yet has none).
    pub(crate) fn has_history(&self) -> bool {
        !self.recorded.is_empty()
    }

    /// Whether recorded results are still to be delivered.
    #[cfg(test)]
    pub(crate) fn replaying(&self) -> bool {
        !self.history.is_empty()
    }

    /// Takes the commands the workflow issued in one poll, in issue order: matches them
    /// against the history and decides what each needs (recording, an attempt, a timer, a
    /// claim). On a divergence nothing of these commands is kept for writing.
    pub(crate) fn issue(
        &mut self,
        commands: impl IntoIterator<Item = Command<S>>,
        now: SystemTime,
    ) -> Result<(), Divergence> {
        for cmd in commands {
            let (hook_key, token) = match cmd {
                Command::HookRelease { hook_key, token } => (hook_key, token),
                Command::Patch { patch_id } => {
                    self.issue_patch(patch_id, now)?;
                    continue;
                }
                Command::AwaitChild { child_id } => {
                    // Delivered from the history when recorded there; otherwise recorded
                    // when its end arrives ([`Replay::deliver_child_end`]).
                    self.waiting.insert(Key::ChildEnd(child_id));
                    continue;
                }
                cmd => {
                    self.issue_one(cmd, now)?;
                    continue;
                }
            };
            // Releases are not results: each is recorded once, and a recorded one is skipped.
            if self.released.insert(hook_key.clone()) {
                self.writes.push(NewEvent {
                    at: now,
                    event: Event::HookReleased {
                        hook_key,
                        token: token.clone(),
                    },
                });
                self.releases.push(token);
            }
        }
        Ok(())
    }

    /// A patch marker: matched against the history, or recorded when the run is live.
    fn issue_patch(&mut self, patch_id: String, now: SystemTime) -> Result<(), Divergence> {
        let cmd: Command<S> = Command::Patch { patch_id };
        if self.match_recorded(&cmd)?.is_none() {
            if let Command::Patch { patch_id } = cmd {
                self.writes.push(NewEvent {
                    at: now,
                    event: Event::PatchMarked { patch_id },
                });
            }
        }
        Ok(())
    }

    /// Matches `cmd` against the next recorded command: the one it replays, `None` when the
    /// history has no more (the command is live), or the divergence (and then nothing of the
    /// commands issued in this poll is kept for writing).
    fn match_recorded(&mut self, cmd: &Command<S>) -> Result<Option<&Recorded>, Divergence> {
        let Some(rec) = self.recorded.get(self.matched) else {
            return Ok(None);
        };
        if !rec.what.matches(cmd) {
            let divergence = Divergence {
                kind: DivergenceKind::Command,
                seq: rec.seq,
                expected: rec.what.describe(),
                found: cmd.describe(),
            };
            self.writes.clear();
            self.releases.clear();
            return Err(divergence);
        }
        self.matched += 1;
        Ok(self.recorded.get(self.matched - 1))
    }

    /// Where the history's patch markers stand among its recorded commands, for the
    /// workflow's `patched` to answer without waiting for the core.
    pub(crate) fn patches(&self) -> Patches {
        Patches {
            recorded: self.recorded.len(),
            markers: self
                .recorded
                .iter()
                .enumerate()
                .filter_map(|(i, r)| match &r.what {
                    RecordedCommand::Patch { patch_id } => Some((i, patch_id.clone())),
                    _ => None,
                })
                .collect(),
        }
    }

    fn issue_one(&mut self, cmd: Command<S>, now: SystemTime) -> Result<(), Divergence> {
        let key = match &cmd {
            Command::Step(call) => Key::Step(call.step_id.clone()),
            Command::Timer { timer_id, .. } => Key::Timer(timer_id.clone()),
            Command::HookRegister { hook_key, .. } => Key::Hook(hook_key.clone()),
            Command::StartChild(call) => Key::Child(call.child_key.clone()),
            Command::HookRelease { .. } | Command::Patch { .. } | Command::AwaitChild { .. } => {
                return Ok(())
            }
        };
        let (replayed, recorded_fire_at) = match self.match_recorded(&cmd)? {
            Some(rec) => match rec.what {
                RecordedCommand::Timer { fire_at, .. } => (true, Some(fire_at)),
                _ => (true, None),
            },
            None => (false, None),
        };
        let resolved = replayed && self.recorded_results.contains(&key);
        self.waiting.insert(key);
        if resolved {
            // Its result comes from the history, in order.
            return Ok(());
        }
        match cmd {
            Command::Step(call) => {
                let attempts = if replayed {
                    self.attempts
                        .get(&call.step_id)
                        .copied()
                        .unwrap_or_default()
                } else {
                    self.writes.push(NewEvent {
                        at: now,
                        event: Event::StepScheduled {
                            step_id: call.step_id.clone(),
                            name: call.name.to_owned(),
                            input: call.input.clone(),
                        },
                    });
                    Attempts::default()
                };
                self.start_step(call, attempts, now);
            }
            Command::Timer { timer_id, fire_at } => {
                let fire_at = match recorded_fire_at {
                    Some(at) => at,
                    None => {
                        self.writes.push(NewEvent {
                            at: now,
                            event: Event::TimerScheduled {
                                timer_id: timer_id.clone(),
                                fire_at_ms: to_millis(fire_at),
                            },
                        });
                        fire_at
                    }
                };
                self.due.insert((fire_at, Due::Timer(timer_id)));
            }
            Command::HookRegister { hook_key, token } => {
                self.effects.push_back(Effect::Claim { hook_key, token });
            }
            Command::StartChild(call) => {
                let child_key = call.child_key.clone();
                self.children.insert(child_key.clone(), call);
                self.effects.push_back(Effect::StartChild { child_key });
            }
            Command::HookRelease { .. } | Command::Patch { .. } | Command::AwaitChild { .. } => {}
        }
        Ok(())
    }

    /// Starts or resumes a step: `attempts` is what the history says about it.
    fn start_step(&mut self, call: StepCall<S>, attempts: Attempts, now: SystemTime) {
        let step_id = call.step_id.clone();
        let max_attempts = call.max_retries.saturating_add(1);
        if attempts.started == 0 {
            // Attempt 1 starts with the durable `StepScheduled`.
            self.steps
                .insert(step_id.clone(), LiveStep { call, attempt: 1 });
            self.running += 1;
            self.effects.push_back(Effect::Attempt {
                step_id,
                attempt: 1,
            });
            return;
        }
        // The last started attempt either failed with a retry scheduled or was interrupted
        // (its worker stopped): either way it counts.
        if attempts.started >= max_attempts {
            let name = call.name;
            self.complete(
                step_id.clone(),
                Err(Error::retryable(format!(
                    "step `{name}` ({step_id}) was interrupted in each of its {max_attempts} \
                     attempts (its worker stopped while running it)"
                ))),
                now,
            );
            return;
        }
        self.steps.insert(
            step_id.clone(),
            LiveStep {
                call,
                attempt: attempts.started,
            },
        );
        match attempts.retry_at {
            Some(at) if at > now => {
                self.due.insert((at, Due::Retry(step_id)));
            }
            _ => self.begin_attempt(&step_id, now),
        }
    }

    /// Records the start of the step's next attempt and asks for it.
    fn begin_attempt(&mut self, step_id: &str, now: SystemTime) {
        let Some(step) = self.steps.get_mut(step_id) else {
            return;
        };
        step.attempt += 1;
        let attempt = step.attempt;
        self.writes.push(NewEvent {
            at: now,
            event: Event::StepAttemptStarted {
                step_id: step_id.to_owned(),
                attempt,
            },
        });
        self.running += 1;
        self.effects.push_back(Effect::Attempt {
            step_id: step_id.to_owned(),
            attempt,
        });
    }

    /// Records a step's final result and queues it for the workflow.
    fn complete(&mut self, step_id: String, result: Result<Value, Error>, now: SystemTime) {
        self.steps.remove(&step_id);
        self.writes.push(NewEvent {
            at: now,
            event: Event::StepCompleted {
                step_id: step_id.clone(),
                result: result.clone(),
            },
        });
        self.ready.push_back(Delivery {
            at: now,
            what: Delivered::Step { step_id, result },
        });
    }

    /// The step call behind an [`Effect::Attempt`].
    pub(crate) fn step(&self, step_id: &str) -> Option<&StepCall<S>> {
        self.steps.get(step_id).map(|s| &s.call)
    }

    /// An attempt ended with `outcome`. A success, a non-retryable error or the last allowed
    /// attempt's error is the step's result; another error schedules a retry after the
    /// error's `retry_after`, or else `backoff`. Outcomes of attempts this replay did not ask
    /// for (a stale or unknown step) are ignored.
    pub(crate) fn attempt_finished(
        &mut self,
        step_id: &str,
        attempt: u32,
        outcome: Result<Value, Error>,
        now: SystemTime,
        backoff: Duration,
    ) {
        let Some(step) = self.steps.get(step_id) else {
            return;
        };
        if step.attempt != attempt {
            return;
        }
        self.running = self.running.saturating_sub(1);
        let max_attempts = step.call.max_retries.saturating_add(1);
        let error = match outcome {
            Ok(v) => return self.complete(step_id.to_owned(), Ok(v), now),
            Err(e) if !e.is_retryable() || attempt >= max_attempts => {
                return self.complete(step_id.to_owned(), Err(e), now)
            }
            Err(e) => e,
        };
        let delay = error.retry_after_hint().unwrap_or(backoff);
        let retry_at = after(now, delay);
        self.writes.push(NewEvent {
            at: now,
            event: Event::StepAttemptFailed {
                step_id: step_id.to_owned(),
                attempt,
                error,
                retry_at_ms: to_millis(retry_at),
            },
        });
        self.due.insert((retry_at, Due::Retry(step_id.to_owned())));
    }

    /// The store decided the registration of hook `hook_key` (and recorded it).
    pub(crate) fn claimed(
        &mut self,
        hook_key: String,
        token: String,
        conflict: Option<RunId>,
        at: SystemTime,
    ) {
        self.ready.push_back(Delivery {
            at,
            what: Delivered::Registration {
                hook_key,
                token,
                conflict,
            },
        });
    }

    /// The child start behind an [`Effect::StartChild`].
    pub(crate) fn child(&self, child_key: &str) -> Option<&ChildCall> {
        self.children.get(child_key)
    }

    /// The store decided the admission of child start `child_key` (and recorded it).
    pub(crate) fn child_started(
        &mut self,
        child_key: String,
        child_id: RunId,
        conflict: Option<RunId>,
        at: SystemTime,
    ) {
        self.children.remove(&child_key);
        self.ready.push_back(Delivery {
            at,
            what: Delivered::ChildStarted {
                child_key,
                child_id,
                conflict,
                refused: None,
            },
        });
    }

    /// Child start `child_key` is refused before the store admits anything (its queue is
    /// declared nowhere): recorded as such, and delivered.
    pub(crate) fn child_refused(
        &mut self,
        child_key: String,
        child_id: RunId,
        why: String,
        at: SystemTime,
    ) {
        let Some(call) = self.children.remove(&child_key) else {
            return;
        };
        self.writes.push(NewEvent {
            at,
            event: Event::ChildStarted {
                child_key: child_key.clone(),
                child_id,
                workflow: call.workflow.to_owned(),
                conflict: None,
                refused: Some(why.clone()),
            },
        });
        self.ready.push_back(Delivery {
            at,
            what: Delivered::ChildStarted {
                child_key,
                child_id,
                conflict: None,
                refused: Some(why),
            },
        });
    }

    /// Records and delivers the end of one child the workflow waits for, if its notice was
    /// read. Returns whether one was delivered.
    pub(crate) fn deliver_child_end(&mut self, now: SystemTime) -> bool {
        // Of the awaited ends read, the first committed (inbox order, as payloads go).
        let Some(child_id) = self
            .child_ends
            .iter()
            .filter(|(id, _)| {
                let key = Key::ChildEnd(**id);
                self.waiting.contains(&key) && !self.recorded_results.contains(&key)
            })
            .min_by_key(|(_, (payload_id, _))| *payload_id)
            .map(|(id, _)| *id)
        else {
            return false;
        };
        let Some((payload_id, result)) = self.child_ends.remove(&child_id) else {
            return false;
        };
        self.received.insert(payload_id);
        self.recorded_results.insert(Key::ChildEnd(child_id));
        self.writes.push(NewEvent {
            at: now,
            event: Event::ChildEnded {
                child_id,
                payload_id,
                result: result.clone(),
            },
        });
        self.ready.push_back(Delivery {
            at: now,
            what: Delivered::ChildEnded { child_id, result },
        });
        true
    }

    /// The earliest time something (a timer, a retry) becomes due.
    pub(crate) fn next_due(&self) -> Option<SystemTime> {
        self.due.first().map(|(at, _)| *at)
    }

    /// Fires everything due at `now`: timers fire (recorded, then delivered) and retries start
    /// their next attempt. Returns whether anything was due.
    pub(crate) fn fire_due(&mut self, now: SystemTime) -> bool {
        let mut fired = false;
        while let Some((at, _)) = self.due.first() {
            if *at > now {
                break;
            }
            let Some((at, due)) = self.due.pop_first() else {
                break;
            };
            fired = true;
            match due {
                Due::Timer(timer_id) => {
                    // Not before its due time, even if the clock reads earlier.
                    let at = now.max(at);
                    self.writes.push(NewEvent {
                        at,
                        event: Event::TimerFired {
                            timer_id: timer_id.clone(),
                        },
                    });
                    self.ready.push_back(Delivery {
                        at,
                        what: Delivered::Timer { timer_id },
                    });
                }
                Due::Retry(step_id) => self.begin_attempt(&step_id, now),
            }
        }
        fired
    }

    /// Adds payloads read from the run's inbox; those the history already delivered are
    /// skipped.
    pub(crate) fn add_payloads(&mut self, payloads: impl IntoIterator<Item = Inbound>) {
        for p in payloads {
            self.inbox_seen = self.inbox_seen.max(p.id);
            if self.received.contains(&p.id) {
                continue;
            }
            if p.token == CHILD_NOTICE_TOKEN {
                // A child's end: kept until the workflow awaits it.
                let (child, result) = match serde_json::from_value::<ChildNotice>(p.payload) {
                    Ok(notice) => (notice.child, notice.result()),
                    Err(e) => {
                        tracing::error!(payload_id = p.id, error = %e, "an undecodable child notice");
                        continue;
                    }
                };
                self.child_ends.insert(child, (p.id, result));
                continue;
            }
            self.inbox.push_back(p);
        }
    }

    /// The highest inbox id read so far.
    pub(crate) fn inbox_seen(&self) -> u64 {
        self.inbox_seen
    }

    /// Delivers the first inbox payload whose token `is_open` (a live hook owns it), recording
    /// its delivery. Payloads for tokens no hook owns yet stay queued. Returns whether one was
    /// delivered.
    pub(crate) fn deliver_payload(
        &mut self,
        is_open: impl Fn(&str) -> bool,
        now: SystemTime,
    ) -> bool {
        let Some(i) = self.inbox.iter().position(|p| is_open(&p.token)) else {
            return false;
        };
        let Some(p) = self.inbox.remove(i) else {
            return false;
        };
        self.received.insert(p.id);
        self.writes.push(NewEvent {
            at: now,
            event: Event::HookReceived {
                token: p.token.clone(),
                payload_id: p.id,
                payload: p.payload.clone(),
            },
        });
        self.ready.push_back(Delivery {
            at: now,
            what: Delivered::Payload {
                token: p.token,
                payload: p.payload,
            },
        });
        true
    }

    /// The next result for the workflow: recorded ones in history order, then live ones.
    /// A recorded result the workflow is not waiting for is a divergence.
    pub(crate) fn next_delivery(&mut self) -> Option<Result<Delivery, Divergence>> {
        if let Some((seq, delivery)) = self.history.pop_front() {
            if let Some(key) = delivery.what.key() {
                if !self.waiting.remove(&key) {
                    return Some(Err(self.unexpected(seq, &key)));
                }
            }
            return Some(Ok(delivery));
        }
        let delivery = self.ready.pop_front()?;
        if let Some(key) = delivery.what.key() {
            self.waiting.remove(&key);
        }
        Some(Ok(delivery))
    }

    fn unexpected(&self, seq: u64, key: &Key) -> Divergence {
        let expected = self
            .recorded
            .iter()
            .find(|c| c.what.key().as_ref() == Some(key))
            .map(|c| c.what.describe())
            .unwrap_or_else(|| format!("`{key}`"));
        let mut waiting: Vec<String> = self.waiting.iter().map(Key::to_string).collect();
        waiting.sort_unstable();
        Divergence {
            kind: DivergenceKind::Result,
            seq,
            expected,
            found: if waiting.is_empty() {
                "nothing".to_owned()
            } else {
                waiting.join(", ")
            },
        }
    }

    /// Takes what must be made durable before the effects now pending are carried out.
    pub(crate) fn take_writes(&mut self) -> Writes {
        Writes {
            events: std::mem::take(&mut self.writes),
            releases: std::mem::take(&mut self.releases),
            end: None,
        }
    }

    /// The next effect to carry out (after [`Replay::take_writes`] is durable).
    pub(crate) fn next_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Whether nothing runs for the run: no attempt in flight and no effect pending. Such a
    /// run only waits for due times and payloads, so it may be evicted.
    pub(crate) fn is_idle(&self) -> bool {
        self.running == 0 && self.effects.is_empty()
    }

    /// The workflow returned `result`: its end, with everything still to write, or the
    /// divergence if the history records more than the code did.
    pub(crate) fn returned(
        &mut self,
        result: Result<Value, Error>,
        now: SystemTime,
    ) -> Result<Writes, Divergence> {
        let found = match &result {
            Ok(_) => "Ok".to_owned(),
            Err(e) => format!("Err: {e}"),
        };
        if let Some(rec) = self.recorded.get(self.matched) {
            return Err(Divergence {
                kind: DivergenceKind::Returned,
                seq: rec.seq,
                expected: rec.what.describe(),
                found,
            });
        }
        if let Some((seq, d)) = self.history.front() {
            let expected = match &d.what {
                Delivered::Payload { token, .. } => format!("a payload for hook {token:?}"),
                other => match other.key() {
                    Some(key) => self
                        .recorded
                        .iter()
                        .find(|c| c.what.key() == Some(key.clone()))
                        .map(|c| format!("the result of {}", c.what.describe()))
                        .unwrap_or_else(|| format!("the result of `{key}`")),
                    None => "a result".to_owned(),
                },
            };
            return Err(Divergence {
                kind: DivergenceKind::Unreplayed,
                seq: *seq,
                expected,
                found,
            });
        }
        let (event, end) = match result {
            Ok(v) => (Event::RunCompleted { output: v.clone() }, End::Completed(v)),
            Err(e) => (Event::RunFailed { error: e.clone() }, End::Failed(e)),
        };
        self.writes.push(NewEvent { at: now, event });
        let mut writes = self.take_writes();
        writes.end = Some(end);
        Ok(writes)
    }
}
