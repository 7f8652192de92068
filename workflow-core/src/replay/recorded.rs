//! Reading a run's recorded history into the core: the commands to match, the results to
//! deliver in order, where each recorded step's attempts stand, and what a `retry()` of a
//! failed run voids.

use std::collections::HashSet;

use super::{
    Attempts, ChildKey, Delivered, Delivery, HookKey, Key, Mailbox, Recorded, RecordedCommand,
    Replay, SetId, StepId, TimerId,
};
use crate::history::{from_millis, Event, EventRecord};

impl<S> Replay<S> {
    pub(super) fn read(&mut self, rec: EventRecord) {
        let EventRecord { seq, at, mut event } = rec;
        let bytes = (self.measure)(&mut event);
        self.durable.add(bytes);
        let history = self.durable;
        let result = |r: &mut Self, what: Delivered| {
            if let Some(key) = what.key() {
                r.recorded_results.insert(key);
            }
            r.history.push_back((seq, Delivery { at, history, what }));
        };
        match event {
            Event::StepScheduled { step_id, name, .. } => {
                let step_id = StepId::recorded(step_id);
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
                let a = self.attempts.entry(StepId::recorded(step_id)).or_default();
                a.started = a.started.max(attempt);
                a.retry_at = None;
            }
            Event::StepAttemptFailed {
                step_id,
                attempt,
                retry_at_ms,
                ..
            } => {
                let a = self.attempts.entry(StepId::recorded(step_id)).or_default();
                if attempt >= a.started {
                    a.retry_at = Some(from_millis(retry_at_ms));
                }
            }
            Event::StepCompleted { step_id, result: r } => {
                let step_id = StepId::recorded(step_id);
                result(self, Delivered::Step { step_id, result: r });
            }
            Event::TimerScheduled {
                timer_id,
                fire_at_ms,
            } => {
                let what = match TimerId::recorded(&timer_id) {
                    Some(timer_id) => RecordedCommand::Timer {
                        timer_id,
                        fire_at: from_millis(fire_at_ms),
                    },
                    None => unreadable("sleep", timer_id),
                };
                self.recorded.push(Recorded { seq, what });
            }
            Event::TimerFired { timer_id } => {
                // An unreadable one was scheduled by an unreadable command, where replay
                // diverges before any result after it is delivered.
                if let Some(timer_id) = TimerId::recorded(&timer_id) {
                    result(self, Delivered::Timer { timer_id });
                }
            }
            Event::HookRegistered {
                hook_key,
                token,
                conflict,
            } => {
                let Some(hook_key) = HookKey::recorded(&hook_key) else {
                    self.recorded.push(Recorded {
                        seq,
                        what: unreadable("hook", hook_key),
                    });
                    return;
                };
                if conflict.is_none() {
                    self.claimed.insert(hook_key);
                }
                // The command and its decision are one event.
                self.recorded.push(Recorded {
                    seq,
                    what: RecordedCommand::Hook {
                        hook_key,
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
                result(
                    self,
                    Delivered::Payload {
                        token,
                        id: payload_id,
                        payload,
                    },
                );
            }
            Event::MessageReceived {
                topic,
                payload_id,
                payload,
            } => {
                self.received.insert(payload_id);
                result(
                    self,
                    Delivered::Message {
                        mailbox: Mailbox::Topic(topic),
                        id: payload_id,
                        payload,
                    },
                );
            }
            Event::RequestReceived {
                name,
                payload_id,
                payload,
            } => {
                self.received.insert(payload_id);
                result(
                    self,
                    Delivered::Message {
                        mailbox: Mailbox::Requests(name),
                        id: payload_id,
                        payload,
                    },
                );
            }
            Event::RequestReplied { request_id, .. } => {
                self.replied.insert(request_id);
            }
            Event::EventSet { set_id, .. } => {
                if let Some(set_id) = SetId::recorded(&set_id) {
                    self.published.insert(set_id);
                }
            }
            Event::HookReleased { hook_key, .. } => {
                if let Some(hook_key) = HookKey::recorded(&hook_key) {
                    self.released.insert(hook_key);
                }
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
                let Some(child_key) = ChildKey::recorded(&child_key) else {
                    self.recorded.push(Recorded {
                        seq,
                        what: unreadable("child run", child_key),
                    });
                    return;
                };
                // The command and its decision are one event, as for hooks.
                self.recorded.push(Recorded {
                    seq,
                    what: RecordedCommand::Child {
                        child_key,
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
            Event::RunCompleted { .. }
            | Event::RunFailed { .. }
            | Event::RunCancelled
            | Event::RunContinuedAsNew { .. } => {}
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
}

/// A recorded command whose id (`id`, of a `what`) this build does not read.
fn unreadable(what: &'static str, id: String) -> RecordedCommand {
    RecordedCommand::Unreadable { what, id }
}
