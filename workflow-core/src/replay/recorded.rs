//! Reading a run's recorded history into the core: the commands to match, the results to
//! deliver in order, where each recorded step's attempts stand, and what a `retry()` of a
//! failed run voids.

use std::collections::HashSet;
use std::time::SystemTime;

use super::{
    Attempts, ChildKey, Delivered, Delivery, HookKey, Key, Mailbox, Recorded, RecordedCommand,
    Replay, SetId, StepId, TimerId,
};
use crate::history::{from_millis, Event, EventRecord, HistorySize};

/// Where a recorded event stands: its number, its time and the history up to it.
#[derive(Clone, Copy)]
struct At {
    seq: u64,
    at: SystemTime,
    history: HistorySize,
}

impl<S> Replay<S> {
    /// Takes in the next recorded event: what it records, by kind.
    pub(super) fn read(&mut self, rec: EventRecord) {
        let EventRecord { seq, at, mut event } = rec;
        let bytes = (self.measure)(&mut event);
        self.durable.add(bytes);
        let at = At {
            seq,
            at,
            history: self.durable,
        };
        match event {
            e @ (Event::StepScheduled { .. }
            | Event::StepAttemptStarted { .. }
            | Event::StepAttemptFailed { .. }
            | Event::StepCompleted { .. }) => self.read_step(at, e),
            e @ (Event::TimerScheduled { .. } | Event::TimerFired { .. }) => self.read_timer(at, e),
            e @ (Event::HookRegistered { .. }
            | Event::HookReceived { .. }
            | Event::HookReleased { .. }) => self.read_hook(at, e),
            e @ (Event::MessageReceived { .. }
            | Event::RequestReceived { .. }
            | Event::RequestReplied { .. }
            | Event::EventSet { .. }) => self.read_message(at, e),
            e @ (Event::ChildStarted { .. } | Event::ChildEnded { .. }) => self.read_child(at, e),
            Event::PatchMarked { patch_id } => self.recorded.push(Recorded {
                seq,
                what: RecordedCommand::Patch { patch_id },
            }),
            Event::RunRetried => self.reopen(),
            Event::RunCompleted { .. }
            | Event::RunFailed { .. }
            | Event::RunCancelled
            | Event::RunContinuedAsNew { .. } => {}
        }
    }

    /// A recorded result, delivered in history order when the workflow asks for it.
    fn result(&mut self, at: At, what: Delivered) {
        if let Some(key) = what.key() {
            self.recorded_results.insert(key);
        }
        let delivery = Delivery {
            at: at.at,
            history: at.history,
            what,
        };
        self.history.push_back((at.seq, delivery));
    }

    /// A step's call, its attempts and its result.
    fn read_step(&mut self, at: At, event: Event) {
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
                    seq: at.seq,
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
            Event::StepCompleted { step_id, result } => {
                let step_id = StepId::recorded(step_id);
                self.result(at, Delivered::Step { step_id, result });
            }
            _ => {}
        }
    }

    /// A timer scheduled, and fired.
    fn read_timer(&mut self, at: At, event: Event) {
        match event {
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
                self.recorded.push(Recorded { seq: at.seq, what });
            }
            Event::TimerFired { timer_id } => {
                // An unreadable one was scheduled by an unreadable command, where replay
                // diverges before any result after it is delivered.
                if let Some(timer_id) = TimerId::recorded(&timer_id) {
                    self.result(at, Delivered::Timer { timer_id });
                }
            }
            _ => {}
        }
    }

    /// A hook's registration (the command and its decision are one event), its payloads
    /// and its release.
    fn read_hook(&mut self, at: At, event: Event) {
        match event {
            Event::HookRegistered {
                hook_key,
                token,
                conflict,
            } => {
                let Some(hook_key) = HookKey::recorded(&hook_key) else {
                    self.recorded.push(Recorded {
                        seq: at.seq,
                        what: unreadable("hook", hook_key),
                    });
                    return;
                };
                if conflict.is_none() {
                    self.claimed.insert(hook_key);
                }
                self.recorded.push(Recorded {
                    seq: at.seq,
                    what: RecordedCommand::Hook {
                        hook_key,
                        token: token.clone(),
                    },
                });
                let what = Delivered::Registration {
                    hook_key,
                    token,
                    conflict,
                };
                self.result(at, what);
            }
            Event::HookReceived {
                token,
                payload_id,
                payload,
            } => {
                self.received.insert(payload_id);
                let what = Delivered::Payload {
                    token,
                    id: payload_id,
                    payload,
                };
                self.result(at, what);
            }
            Event::HookReleased { hook_key, .. } => {
                if let Some(hook_key) = HookKey::recorded(&hook_key) {
                    self.released.insert(hook_key);
                }
            }
            _ => {}
        }
    }

    /// Messages and requests received, replies given and values published.
    fn read_message(&mut self, at: At, event: Event) {
        let (mailbox, id, payload) = match event {
            Event::MessageReceived {
                topic,
                payload_id,
                payload,
            } => (Mailbox::Topic(topic), payload_id, payload),
            Event::RequestReceived {
                name,
                payload_id,
                payload,
            } => (Mailbox::Requests(name), payload_id, payload),
            Event::RequestReplied { request_id, .. } => {
                self.replied.insert(request_id);
                return;
            }
            Event::EventSet { set_id, .. } => {
                if let Some(set_id) = SetId::recorded(&set_id) {
                    self.published.insert(set_id);
                }
                return;
            }
            _ => return,
        };
        self.received.insert(id);
        let what = Delivered::Message {
            mailbox,
            id,
            payload,
        };
        self.result(at, what);
    }

    /// A child's start (the command and its decision are one event, as for hooks) and its
    /// end.
    fn read_child(&mut self, at: At, event: Event) {
        match event {
            Event::ChildStarted {
                child_key,
                child_id,
                workflow,
                conflict,
                refused,
            } => {
                let Some(child_key) = ChildKey::recorded(&child_key) else {
                    self.recorded.push(Recorded {
                        seq: at.seq,
                        what: unreadable("child run", child_key),
                    });
                    return;
                };
                self.recorded.push(Recorded {
                    seq: at.seq,
                    what: RecordedCommand::Child {
                        child_key,
                        workflow,
                    },
                });
                let what = Delivered::ChildStarted {
                    child_key,
                    child_id,
                    conflict,
                    refused,
                };
                self.result(at, what);
            }
            Event::ChildEnded {
                child_id,
                payload_id,
                result,
            } => {
                self.received.insert(payload_id);
                self.result(at, Delivered::ChildEnded { child_id, result });
            }
            _ => {}
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
