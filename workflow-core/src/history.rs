//! The history format: the events a run's history is made of, as every store keeps them and as
//! the replay core reads them. A history is append-only; its events are the only input replay
//! needs, so this module depends on nothing but the error and id types.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::ids::RunId;

/// One entry of a run's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The workflow called a step; this is also the start of its first attempt.
    StepScheduled {
        /// The invocation's stable id.
        step_id: String,
        /// The step's registered name.
        name: String,
        /// The serialized argument tuple.
        input: Value,
    },
    /// Attempt `attempt` (2 and up) of a step started.
    StepAttemptStarted {
        /// The invocation's stable id.
        step_id: String,
        /// From 2 on (the first attempt starts with `StepScheduled`).
        attempt: u32,
    },
    /// An attempt failed and the step will be retried.
    StepAttemptFailed {
        /// The invocation's stable id.
        step_id: String,
        /// The failed attempt.
        attempt: u32,
        /// Why.
        error: Error,
        /// When the next attempt may start (ms since the Unix epoch).
        retry_at_ms: u64,
    },
    /// The step's final result, delivered to the workflow.
    StepCompleted {
        /// The invocation's stable id.
        step_id: String,
        /// Its value or its last error.
        result: Result<Value, Error>,
    },
    /// The workflow started a durable sleep.
    TimerScheduled {
        /// The timer's id within the run.
        timer_id: String,
        /// When it fires (ms since the Unix epoch).
        fire_at_ms: u64,
    },
    /// A durable sleep ended; delivered to the workflow.
    TimerFired {
        /// The timer's id within the run.
        timer_id: String,
    },
    /// The workflow returned `Ok`.
    RunCompleted {
        /// The return value.
        output: Value,
    },
    /// The workflow returned `Err` or panicked.
    RunFailed {
        /// Why.
        error: Error,
    },
    /// The run was cancelled.
    RunCancelled,
    /// The workflow returned `continue_as_new(wf, args)`: the run ended as
    /// `continued_as_new` and, in the same store transaction, run `next_run` of `workflow` was
    /// admitted (its arguments are its own record's input). The last event of such a run.
    RunContinuedAsNew {
        /// The run that carries on.
        next_run: RunId,
        /// Its workflow (the same or another).
        workflow: String,
    },
    /// The workflow committed the registration of a hook; delivered to the workflow.
    HookRegistered {
        /// The hook's key within the run (`hk_<n>`).
        hook_key: String,
        /// The requested token.
        token: String,
        /// The run owning the token, when it was not free; `None` when this run claimed it.
        conflict: Option<RunId>,
    },
    /// A payload sent with `resume_hook` was delivered to the workflow.
    HookReceived {
        /// The hook's token.
        token: String,
        /// The payload's id in the store's inbox (commit order).
        payload_id: u64,
        /// The payload as sent (kept raw for inspection, even if it does not fit the hook's type).
        payload: Value,
    },
    /// The workflow released a hook (dropped or disposed it).
    HookReleased {
        /// The hook's key within the run.
        hook_key: String,
        /// Its token.
        token: String,
    },
    /// The workflow reached `patched(patch_id)` live: from here on the run takes the patched
    /// path, on every replay.
    PatchMarked {
        /// The id given to `patched`.
        patch_id: String,
    },
    /// A failed run was re-opened with `retry()`: the end recorded before is void, and the
    /// steps whose error ended the run (no command recorded after their result) get a fresh
    /// set of attempts.
    RunRetried,
    /// The workflow started a child run (`start_child`); the child's admission and this event
    /// are one store transaction. Delivered to the workflow.
    ChildStarted {
        /// The start's key within the run (`ch_<n>`).
        child_key: String,
        /// The child run's id (admitted, or meant to be when `conflict` is set).
        child_id: RunId,
        /// The child's workflow.
        workflow: String,
        /// The run owning the child's `.hook(token)`, when the token was taken: then no child
        /// was admitted.
        conflict: Option<RunId>,
        /// Why no child was admitted otherwise (its queue is declared nowhere).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refused: Option<String>,
    },
    /// A child run's end, delivered to the workflow awaiting `child.return_value()`.
    ChildEnded {
        /// The child run.
        child_id: RunId,
        /// The id of the end notice in this run's inbox (commit order); 0 when the end was
        /// read from the child's record instead (a fork's copy awaiting a child its
        /// original started).
        payload_id: u64,
        /// The child's return value, or its error (a cancelled child: the cancellation).
        result: Result<Value, Error>,
    },
    /// The workflow published `value` as the latest value of `key` (`set_event`).
    EventSet {
        /// The call's id within the run (`set_<n>`): a replay records each call once.
        set_id: String,
        /// The key.
        key: String,
        /// The value.
        value: Value,
    },
    /// A message sent with `run.send(topic, msg)`, delivered to the workflow's
    /// `recv(topic)`.
    MessageReceived {
        /// The topic it was sent on.
        topic: String,
        /// The message's id in the store's inbox (commit order).
        payload_id: u64,
        /// The message as sent (kept raw for inspection, even if it does not fit the type
        /// `recv` asked for).
        payload: Value,
    },
    /// A request sent with `run.request(name, req)`, delivered to the workflow's
    /// `requests(name)`.
    RequestReceived {
        /// The name it was sent under.
        name: String,
        /// The request's id: its id in the store's inbox (commit order).
        payload_id: u64,
        /// The request as sent (kept raw, even if it does not fit the workflow's type).
        payload: Value,
    },
    /// The workflow replied to request `request_id` (`req.reply(v)`); the append that records
    /// it also keeps the reply where the request's callers read it. An `Err` is a request the
    /// workflow could not read (its body did not fit the type `requests` asked for).
    RequestReplied {
        /// The request's id (the `payload_id` of its `RequestReceived`).
        request_id: u64,
        /// The name it was sent under.
        name: String,
        /// The reply.
        reply: Result<Value, Error>,
    },
}

impl Event {
    /// Whether it publishes something readers outside the run wait for: a `set_event` value
    /// or a request's reply.
    pub(crate) fn publishes(&self) -> bool {
        matches!(self, Event::EventSet { .. } | Event::RequestReplied { .. })
    }

    /// The event's serde tag (`step_scheduled`, `hook_received`, ...): the `type` field of its
    /// JSON, and the `kind` column of the SQL stores.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::StepScheduled { .. } => "step_scheduled",
            Event::StepAttemptStarted { .. } => "step_attempt_started",
            Event::StepAttemptFailed { .. } => "step_attempt_failed",
            Event::StepCompleted { .. } => "step_completed",
            Event::TimerScheduled { .. } => "timer_scheduled",
            Event::TimerFired { .. } => "timer_fired",
            Event::RunCompleted { .. } => "run_completed",
            Event::RunFailed { .. } => "run_failed",
            Event::RunCancelled => "run_cancelled",
            Event::RunContinuedAsNew { .. } => "run_continued_as_new",
            Event::HookRegistered { .. } => "hook_registered",
            Event::HookReceived { .. } => "hook_received",
            Event::HookReleased { .. } => "hook_released",
            Event::PatchMarked { .. } => "patch_marked",
            Event::RunRetried => "run_retried",
            Event::ChildStarted { .. } => "child_started",
            Event::ChildEnded { .. } => "child_ended",
            Event::MessageReceived { .. } => "message_received",
            Event::EventSet { .. } => "event_set",
            Event::RequestReceived { .. } => "request_received",
            Event::RequestReplied { .. } => "request_replied",
        }
    }
}

impl Event {
    /// The inbox payload this event delivers (a hook's payload, a child's end notice): the
    /// write that records it takes the payload out of the inbox.
    pub fn delivered_payload(&self) -> Option<u64> {
        match self {
            Event::HookReceived { payload_id, .. }
            | Event::ChildEnded { payload_id, .. }
            | Event::MessageReceived { payload_id, .. }
            | Event::RequestReceived { payload_id, .. } => Some(*payload_id),
            _ => None,
        }
    }
}

/// An event to append, stamped by the writer. The stamp of a delivered event is the workflow's
/// clock from then on, so it is chosen before the write and replayed as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// When it happened.
    pub at: SystemTime,
    /// What happened.
    pub event: Event,
}

/// A recorded event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    /// Position in the run's history, from 1, in commit order.
    pub seq: u64,
    /// When it happened.
    pub at: SystemTime,
    /// What happened.
    pub event: Event,
}

/// How much of a run's history lies behind a point of its workflow body: the events up to the
/// last one delivered to the body, and the plaintext size of the payloads they hold (see
/// [`crate::WorkflowMetadata::history_bytes`]). The same at the same point on every replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct HistorySize {
    /// Events.
    pub(crate) events: u64,
    /// Bytes of payloads, as serialized before any codec or encryption.
    pub(crate) bytes: u64,
}

impl HistorySize {
    /// One more event, holding `bytes` of payloads.
    pub(crate) fn add(&mut self, bytes: u64) {
        self.events = self.events.saturating_add(1);
        self.bytes = self.bytes.saturating_add(bytes);
    }
}

impl std::ops::Add for HistorySize {
    type Output = HistorySize;
    fn add(self, other: HistorySize) -> HistorySize {
        HistorySize {
            events: self.events.saturating_add(other.events),
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }
}

/// The version of the history format: the events above, as `run.export()` writes them. A
/// later version reads every earlier one. Version 2 added the child-run events
/// (`child_started`, `child_ended`).
pub const HISTORY_FORMAT_VERSION: u32 = 2;

/// The `format` field of an exported history.
pub const HISTORY_FORMAT: &str = "workflow-rs/history";

/// A run's history as `run.export()` gives it (serialized) and
/// `workflow_core::testing::replay` reads it: documented, versioned JSON.
///
/// ```json
/// {
///   "format": "workflow-rs/history",
///   "version": 1,
///   "run": { "id": "01J…", "workflow": "checkout", "status": "completed",
///            "input": [7], "created_at_ms": 1764547200000 },
///   "events": [
///     { "seq": 1, "at_ms": 1764547200001,
///       "event": { "type": "step_scheduled", "step_id": "charge#0", "name": "charge", "input": [7] } }
///   ]
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportedHistory {
    /// Always [`HISTORY_FORMAT`].
    pub format: String,
    /// [`HISTORY_FORMAT_VERSION`] when written.
    pub version: u32,
    /// The run the history belongs to.
    pub run: ExportedRun,
    /// Its events, in order.
    pub events: Vec<ExportedEvent>,
}

/// The run of an [`ExportedHistory`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportedRun {
    /// The run's id.
    pub id: RunId,
    /// The workflow's registered name.
    pub workflow: String,
    /// Its status when exported (`RunStatus::as_str`).
    pub status: String,
    /// The serialized argument tuple.
    pub input: Value,
    /// When it was admitted (ms since the Unix epoch).
    pub created_at_ms: u64,
    /// The token claimed at admission (`start(..).hook(token)`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_token: Option<String>,
    /// The first run of the chain it continues (`continue_as_new`), if any: the payloads the
    /// runs of a chain share are sealed for it (see [`RunRecord::origin`]).
    ///
    /// [`RunRecord::origin`]: crate::RunRecord::origin
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<RunId>,
}

/// One event of an [`ExportedHistory`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportedEvent {
    /// Position in the history, from 1.
    pub seq: u64,
    /// When it happened (ms since the Unix epoch).
    pub at_ms: u64,
    /// What happened.
    pub event: Event,
}

impl ExportedHistory {
    /// Reads an exported history, checking its format and version.
    pub fn from_json(json: &Value) -> Result<Self, String> {
        let history: ExportedHistory = serde_json::from_value(json.clone())
            .map_err(|e| format!("not an exported run history: {e}"))?;
        if history.format != HISTORY_FORMAT {
            return Err(format!(
                "not an exported run history: format is {:?}, expected {HISTORY_FORMAT:?}",
                history.format
            ));
        }
        if history.version > HISTORY_FORMAT_VERSION {
            return Err(format!(
                "history format version {} is newer than this build reads (up to {})",
                history.version, HISTORY_FORMAT_VERSION
            ));
        }
        Ok(history)
    }

    /// The events as the replay core reads them.
    pub fn records(&self) -> Vec<EventRecord> {
        self.events
            .iter()
            .map(|e| EventRecord {
                seq: e.seq,
                at: from_millis(e.at_ms),
                event: e.event.clone(),
            })
            .collect()
    }
}

/// The history a fork of a run starts with (`run.fork(from_step)`): the recorded
/// results of its first `from_step` steps in scheduling order, with the timers, patch
/// markers and child starts recorded before the next step was scheduled, and the ends of
/// those children delivered before then. `Err` with why not: fewer steps, or a hook
/// registered before that point (a fork claims no token, so its replay could not match it).
///
/// The kept children stay the original's (a fork starts no second one); an end the original
/// received only after the cut is left out, to be read by the fork from the child's record
/// when its workflow awaits it (delivered there, it could not come earlier in the fork's
/// replay than the commands after the cut that the fork runs again).
///
/// Step ids name their run, so the copied events carry `fork`'s ids for them: made from each
/// step's name and call number (which call of that name it is, counted in scheduling order,
/// as the workflow numbers its calls), never read out of `original`'s ids.
pub(crate) fn fork_history(
    events: &[EventRecord],
    from_step: usize,
    _original: &RunId,
    fork: &RunId,
) -> Result<Vec<NewEvent>, String> {
    let mut calls: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    let mut renamed = std::collections::HashMap::new();
    for e in events {
        if let Event::StepScheduled { step_id, name, .. } = &e.event {
            let call = calls.entry(name.as_str()).or_insert(0);
            renamed.insert(step_id.clone(), crate::ids::step_id(fork, name, *call));
            *call += 1;
        }
    }
    let rename = |id: &mut String| {
        if let Some(new) = renamed.get(id.as_str()) {
            id.clone_from(new);
        }
    };
    let scheduled: Vec<&EventRecord> = events
        .iter()
        .filter(|e| matches!(e.event, Event::StepScheduled { .. }))
        .collect();
    if from_step > scheduled.len() {
        return Err(format!(
            "the run scheduled {} steps; cannot fork from step {from_step}",
            scheduled.len()
        ));
    }
    let cut = scheduled.get(from_step).map_or(u64::MAX, |e| e.seq);
    let mut steps = std::collections::HashSet::new();
    let mut timers = std::collections::HashSet::new();
    let mut children = std::collections::HashSet::new();
    let mut out = Vec::new();
    for e in events {
        let keep = match &e.event {
            Event::StepScheduled { step_id, .. } if e.seq < cut => steps.insert(step_id.clone()),
            Event::StepAttemptStarted { step_id, .. }
            | Event::StepAttemptFailed { step_id, .. }
            | Event::StepCompleted { step_id, .. } => steps.contains(step_id),
            Event::TimerScheduled { timer_id, .. } if e.seq < cut => {
                timers.insert(timer_id.clone())
            }
            Event::TimerFired { timer_id } => timers.contains(timer_id),
            Event::PatchMarked { .. } => e.seq < cut,
            Event::HookRegistered { token, .. } if e.seq < cut => {
                return Err(format!(
                    "the run registered hook {token:?} before step {}; a fork claims no token, \
                     so fork from an earlier step",
                    from_step + 1
                ))
            }
            Event::MessageReceived { topic, .. } if e.seq < cut => {
                return Err(format!(
                    "the run received a message on topic {topic:?} before step {}; messages \
                     go to the original run only, so fork from an earlier step",
                    from_step + 1
                ))
            }
            Event::RequestReceived { name, .. } if e.seq < cut => {
                return Err(format!(
                    "the run received a request {name:?} before step {}; requests go to the \
                     original run only, so fork from an earlier step",
                    from_step + 1
                ))
            }
            Event::ChildStarted { child_id, .. } if e.seq < cut => children.insert(*child_id),
            Event::ChildEnded { child_id, .. } => e.seq < cut && children.contains(child_id),
            _ => false,
        };
        if keep {
            let mut event = e.event.clone();
            match &mut event {
                Event::StepScheduled { step_id, .. }
                | Event::StepAttemptStarted { step_id, .. }
                | Event::StepAttemptFailed { step_id, .. }
                | Event::StepCompleted { step_id, .. } => rename(step_id),
                _ => {}
            }
            out.push(NewEvent { at: e.at, event });
        }
    }
    Ok(out)
}

/// Milliseconds since the Unix epoch (0 for earlier times), the stores' time format.
pub fn to_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The wake time of a run that waits for nothing but payloads: it is woken by them.
pub fn never() -> SystemTime {
    // 9999-12-31T23:59:59Z fits every store's time column.
    UNIX_EPOCH + Duration::from_secs(253_402_300_799)
}

/// `t + d`, or the latest time every store can keep ([`never`]) when that is later or not
/// representable: user-given durations mean "as long as representable", never a panic.
pub(crate) fn after(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_add(d)
        .map_or_else(never, |later| later.min(never()))
}

/// The inverse of [`to_millis`].
pub fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Event::kind` is the serde tag, variant by variant (a new variant must be added to both).
    #[test]
    fn event_kind_is_the_serde_tag() {
        let s = String::new;
        let events = [
            Event::StepScheduled {
                step_id: s(),
                name: s(),
                input: Value::Null,
            },
            Event::StepAttemptStarted {
                step_id: s(),
                attempt: 2,
            },
            Event::StepAttemptFailed {
                step_id: s(),
                attempt: 1,
                error: Error::fatal("x"),
                retry_at_ms: 0,
            },
            Event::StepCompleted {
                step_id: s(),
                result: Ok(Value::Null),
            },
            Event::TimerScheduled {
                timer_id: s(),
                fire_at_ms: 0,
            },
            Event::TimerFired { timer_id: s() },
            Event::RunCompleted {
                output: Value::Null,
            },
            Event::RunFailed {
                error: Error::fatal("x"),
            },
            Event::RunCancelled,
            Event::RunContinuedAsNew {
                next_run: RunId::new(),
                workflow: s(),
            },
            Event::HookRegistered {
                hook_key: s(),
                token: s(),
                conflict: None,
            },
            Event::HookReceived {
                token: s(),
                payload_id: 1,
                payload: Value::Null,
            },
            Event::HookReleased {
                hook_key: s(),
                token: s(),
            },
            Event::PatchMarked { patch_id: s() },
            Event::RunRetried,
            Event::ChildStarted {
                refused: None,
                child_key: s(),
                child_id: RunId::new(),
                workflow: s(),
                conflict: None,
            },
            Event::ChildEnded {
                child_id: RunId::new(),
                payload_id: 1,
                result: Ok(Value::Null),
            },
            Event::MessageReceived {
                topic: s(),
                payload_id: 1,
                payload: Value::Null,
            },
            Event::EventSet {
                set_id: s(),
                key: s(),
                value: Value::Null,
            },
            Event::RequestReceived {
                name: s(),
                payload_id: 1,
                payload: Value::Null,
            },
            Event::RequestReplied {
                request_id: 1,
                name: s(),
                reply: Ok(Value::Null),
            },
        ];
        for e in events {
            let json = serde_json::to_value(&e).unwrap();
            assert_eq!(json["type"], e.kind(), "{e:?}");
        }
    }
}

#[cfg(test)]
mod fork_tests {
    use super::*;

    fn rec(seq: u64, event: Event) -> EventRecord {
        EventRecord {
            seq,
            at: from_millis(seq),
            event,
        }
    }

    /// The first (and only) call of step `s<n>`.
    fn scheduled(run: &RunId, n: u32) -> Event {
        Event::StepScheduled {
            step_id: crate::ids::step_id(run, &format!("s{n}"), 0),
            name: format!("s{n}"),
            input: Value::Null,
        }
    }

    fn done(run: &RunId, n: u32) -> Event {
        Event::StepCompleted {
            step_id: crate::ids::step_id(run, &format!("s{n}"), 0),
            result: Ok(Value::from(n)),
        }
    }

    #[test]
    fn a_fork_keeps_the_first_steps_with_its_own_step_ids() {
        let (old, new) = (RunId::new(), RunId::new());
        let events = [
            rec(1, scheduled(&old, 0)),
            rec(
                2,
                Event::TimerScheduled {
                    timer_id: "tmr_0".into(),
                    fire_at_ms: 5,
                },
            ),
            rec(3, scheduled(&old, 1)),
            rec(4, done(&old, 0)),
            rec(
                5,
                Event::TimerFired {
                    timer_id: "tmr_0".into(),
                },
            ),
            rec(6, scheduled(&old, 2)),
            rec(7, done(&old, 1)),
            rec(8, done(&old, 2)),
            rec(
                9,
                Event::RunCompleted {
                    output: Value::Null,
                },
            ),
        ];
        let fork = fork_history(&events, 2, &old, &new).unwrap();
        let kinds: Vec<&str> = fork.iter().map(|e| e.event.kind()).collect();
        assert_eq!(
            kinds,
            [
                "step_scheduled",
                "timer_scheduled",
                "step_scheduled",
                "step_completed",
                "timer_fired",
                "step_completed"
            ]
        );
        assert_eq!(fork[0].event, scheduled(&new, 0));
        assert_eq!(fork[5].event, done(&new, 1));
        assert_eq!(fork_history(&events, 0, &old, &new).unwrap(), []);
        assert_eq!(fork_history(&events, 3, &old, &new).unwrap().len(), 8);
        let err = fork_history(&events, 4, &old, &new).unwrap_err();
        assert!(err.contains("scheduled 3 steps"), "{err}");
    }

    #[test]
    fn a_fork_keeps_the_children_started_before_the_cut() {
        let (old, new) = (RunId::new(), RunId::new());
        let (early, late) = (RunId::new(), RunId::new());
        let started = |child_id, n: u32| Event::ChildStarted {
            child_key: format!("ch_{n}"),
            child_id,
            workflow: "kid".into(),
            conflict: None,
            refused: None,
        };
        let ended = |child_id, payload_id| Event::ChildEnded {
            child_id,
            payload_id,
            result: Ok(Value::from(7)),
        };
        let events = [
            rec(1, started(early, 0)),
            rec(2, scheduled(&old, 0)),
            rec(3, done(&old, 0)),
            rec(4, started(late, 1)),
            rec(5, scheduled(&old, 1)),
            rec(6, done(&old, 1)),
            rec(7, ended(early, 40)),
            rec(8, ended(late, 41)),
        ];
        let kinds = |fork: Vec<NewEvent>| -> Vec<&'static str> {
            fork.iter().map(|e| e.event.kind()).collect()
        };
        // Cut before the second step: both children stay, their ends (after the cut) do not.
        let fork = fork_history(&events, 1, &old, &new).unwrap();
        assert_eq!(fork[0].event, started(early, 0));
        assert_eq!(
            kinds(fork),
            [
                "child_started",
                "step_scheduled",
                "step_completed",
                "child_started"
            ]
        );
        // Nothing cut: both children and both ends stay, in their order.
        let fork = fork_history(&events, 2, &old, &new).unwrap();
        assert_eq!(fork[6].event, ended(early, 40));
        assert_eq!(fork.len(), 8);
        // A child started after the cut is not kept.
        assert_eq!(
            kinds(fork_history(&events, 0, &old, &new).unwrap()),
            ["child_started"]
        );
    }

    #[test]
    fn a_fork_after_a_hook_is_refused() {
        let (old, new) = (RunId::new(), RunId::new());
        let events = [
            rec(1, scheduled(&old, 0)),
            rec(
                2,
                Event::HookRegistered {
                    hook_key: "hk_0".into(),
                    token: "t".into(),
                    conflict: None,
                },
            ),
            rec(3, scheduled(&old, 1)),
        ];
        assert_eq!(fork_history(&events, 0, &old, &new).unwrap(), []);
        let err = fork_history(&events, 1, &old, &new).unwrap_err();
        assert!(err.contains("hook \"t\""), "{err}");
    }
}
