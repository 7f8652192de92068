//! The commands a workflow issues (steps, timers, hooks, patches, children) and the commands
//! its history records, with how the two are matched and how each is named in a divergence.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::{ChildKey, HookKey, Key, SetId, StepId, TimerId};
use crate::ids::RunId;

/// A command the workflow issued. `S` is how the driver runs the step's body; the core only
/// keeps it for the driver.
pub(crate) enum Command<S> {
    /// Call a step.
    Step(StepCall<S>),
    /// Sleep until `fire_at`.
    Timer {
        /// The timer's id within the run.
        timer_id: TimerId,
        /// When it fires, as computed by this replay (the recorded time wins on replay).
        fire_at: SystemTime,
    },
    /// Commit the registration of a hook (claim its token).
    HookRegister {
        /// The hook's key within the run.
        hook_key: HookKey,
        /// The requested token.
        token: String,
    },
    /// Give up a token this run owns.
    HookRelease {
        /// The hook's key within the run.
        hook_key: HookKey,
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
    /// Publish `value` as the latest value of `key` (`set_event`). Not matched against the
    /// history: recorded once per call, skipped when the history has it.
    SetEvent {
        /// The call's id within the run.
        set_id: SetId,
        /// The key.
        key: String,
        /// The value.
        value: Value,
    },
    /// Reply `reply` to request `request_id` (`req.reply(v)`). Not matched against the
    /// history: recorded once per request, skipped when the history has it.
    Reply {
        /// The request's id.
        request_id: u64,
        /// The name it was sent under.
        name: String,
        /// The reply.
        reply: Result<Value, crate::error::Error>,
    },
    /// Wait for a child run's end (`child.return_value()`). Not a recorded command: the end is
    /// recorded when it is delivered, like a payload.
    AwaitChild {
        /// The child run.
        child_id: RunId,
    },
}

/// One `start_child` call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChildCall {
    /// The start's key within the run.
    pub(crate) child_key: ChildKey,
    /// The child's registered workflow.
    pub(crate) workflow: &'static str,
    /// The id the child is admitted with when this call is live (a replayed start keeps the
    /// recorded one): chosen with the call, because the arguments are sealed for it.
    pub(crate) child_id: crate::ids::RunId,
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
    pub(crate) queue: Option<crate::model::QueueEntry>,
}

impl<S> Command<S> {
    pub(super) fn describe(&self) -> String {
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
            Command::SetEvent { set_id, key, .. } => format!("set_event {key:?} ({set_id})"),
            Command::Reply {
                request_id, name, ..
            } => format!("the reply to request {name:?} ({request_id})"),
        }
    }
}

/// One invocation of a step.
pub(crate) struct StepCall<S> {
    /// The invocation's stable id.
    pub(crate) step_id: StepId,
    /// The step's registered name.
    pub(crate) name: &'static str,
    /// The serialized argument tuple.
    pub(crate) input: Value,
    /// Retries after the first attempt.
    pub(crate) max_retries: u32,
    /// Each attempt's deadline.
    pub(crate) timeout: Option<Duration>,
    /// A `#[step(transactional)]`: each attempt runs in a store transaction that records its
    /// result.
    pub(crate) transactional: bool,
    /// What the driver runs for each attempt.
    pub(crate) body: S,
}

/// A recorded command, for matching.
#[derive(Debug)]
pub(super) struct Recorded {
    pub(super) seq: u64,
    pub(super) what: RecordedCommand,
}

#[derive(Debug)]
pub(super) enum RecordedCommand {
    Step {
        step_id: StepId,
        name: String,
    },
    Timer {
        timer_id: TimerId,
        fire_at: SystemTime,
    },
    Hook {
        hook_key: HookKey,
        token: String,
    },
    Patch {
        patch_id: String,
    },
    Child {
        child_key: ChildKey,
        workflow: String,
    },
    /// A command whose id this build never records (`what` names the command, `id` is the
    /// id as recorded): it matches nothing, so replay diverges there.
    Unreadable {
        what: &'static str,
        id: String,
    },
}

impl RecordedCommand {
    /// The key its result is delivered under (a patch marker has no result).
    pub(super) fn key(&self) -> Option<Key> {
        match self {
            RecordedCommand::Step { step_id, .. } => Some(Key::Step(step_id.clone())),
            RecordedCommand::Timer { timer_id, .. } => Some(Key::Timer(*timer_id)),
            RecordedCommand::Hook { hook_key, .. } => Some(Key::Hook(*hook_key)),
            RecordedCommand::Child { child_key, .. } => Some(Key::Child(*child_key)),
            RecordedCommand::Patch { .. } | RecordedCommand::Unreadable { .. } => None,
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            RecordedCommand::Step { step_id, name } => format!("step `{name}` ({step_id})"),
            RecordedCommand::Timer { timer_id, .. } => format!("sleep ({timer_id})"),
            RecordedCommand::Hook { hook_key, token } => format!("hook {token:?} ({hook_key})"),
            RecordedCommand::Patch { patch_id } => format!("patch {patch_id:?}"),
            RecordedCommand::Child {
                child_key,
                workflow,
            } => format!("child run of `{workflow}` ({child_key})"),
            RecordedCommand::Unreadable { what, id } => {
                format!("{what} ({id}, an id this build does not read)")
            }
        }
    }

    pub(super) fn matches<S>(&self, cmd: &Command<S>) -> bool {
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
