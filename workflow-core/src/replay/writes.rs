//! What the core hands back to the driver: the writes to make durable (events, releases, the
//! run's end), all or nothing, and the effects to carry out once they are; and the run's end
//! when the workflow returns, or the divergence if the history records more than it did.

use std::time::SystemTime;

use serde_json::Value;

use super::{ChildKey, Delivered, HookKey, Replay, StepId};
use crate::divergence::{Divergence, DivergenceKind};
use crate::error::Error;
use crate::history::{Event, NewEvent};

/// Work the driver carries out once the events returned before it are durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Run attempt `attempt` of step `step_id` ([`Replay::step`] has the call) and report its
    /// outcome with [`Replay::attempt_finished`].
    Attempt { step_id: StepId, attempt: u32 },
    /// Claim `token` for hook `hook_key` in the store (which records the decision) and report
    /// it with [`Replay::claimed`].
    Claim { hook_key: HookKey, token: String },
    /// Admit the child run of start `child_key` ([`Replay::child`] has the call) in the store
    /// (which records it) and report the decision with [`Replay::child_started`].
    StartChild { child_key: ChildKey },
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
#[derive(Debug, Default, Clone, PartialEq)]
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

impl<S> Replay<S> {
    /// Takes what must be made durable before the effects now pending are carried out.
    pub(crate) fn take_writes(&mut self) -> Writes {
        self.durable = self.durable + std::mem::take(&mut self.pending);
        Writes {
            events: std::mem::take(&mut self.writes),
            releases: std::mem::take(&mut self.releases),
            end: None,
        }
    }

    /// Puts back `writes` taken with [`Replay::take_writes`] and not made durable (a
    /// transactional attempt that committed nothing), ahead of what was decided since.
    pub(crate) fn restore_writes(&mut self, writes: Writes) {
        let Writes {
            mut events,
            mut releases,
            end: _,
        } = writes;
        events.append(&mut self.writes);
        self.writes = events;
        releases.append(&mut self.releases);
        self.releases = releases;
    }

    /// Whether the next effect is an attempt of a transactional step: what is to be written
    /// before it can commit with its transaction instead.
    pub(crate) fn next_is_transactional(&self) -> bool {
        match self.effects.front() {
            Some(Effect::Attempt { step_id, .. }) => self
                .steps
                .get(step_id)
                .is_some_and(|s| s.call.transactional),
            _ => false,
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
        self.check_end(found)?;
        let (event, end) = match result {
            Ok(v) => (Event::RunCompleted { output: v.clone() }, End::Completed(v)),
            Err(e) => (Event::RunFailed { error: e.clone() }, End::Failed(e)),
        };
        self.record(NewEvent { at: now, event });
        let mut writes = self.take_writes();
        writes.end = Some(end);
        Ok(writes)
    }

    /// The workflow returned `continue_as_new(..)`: the writes that end its history with
    /// [`Event::RunContinuedAsNew`] naming `next_run` (no end: the store ends the run and
    /// admits the next one in the same act), or the divergence if the history records more
    /// than it did. The tokens its dropped hooks would give up are not given up: the next
    /// run inherits every token the run owns.
    pub(crate) fn continued(
        &mut self,
        next_run: crate::ids::RunId,
        workflow: String,
        now: SystemTime,
    ) -> Result<Writes, Divergence> {
        self.check_end(format!("continue_as_new({workflow})"))?;
        self.record(NewEvent {
            at: now,
            event: Event::RunContinuedAsNew { next_run, workflow },
        });
        let mut writes = self.take_writes();
        writes.releases.clear();
        Ok(writes)
    }

    /// The divergence of a workflow that returned (`found`) while its history records more.
    fn check_end(&self, found: String) -> Result<(), Divergence> {
        if let Some(rec) = self.recorded.get(self.matched) {
            return Err(Divergence::new(
                DivergenceKind::Returned,
                rec.seq,
                rec.what.describe(),
                found,
            ));
        }
        if let Some((seq, d)) = self.history.front() {
            let expected = match &d.what {
                Delivered::Payload { token, .. } => format!("a payload for hook {token:?}"),
                Delivered::Message { mailbox, .. } => mailbox.to_string(),
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
            return Err(Divergence::new(
                DivergenceKind::Unreplayed,
                *seq,
                expected,
                found,
            ));
        }
        Ok(())
    }
}
