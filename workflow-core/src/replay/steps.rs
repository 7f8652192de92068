//! Steps and timers as the core runs them live: a step's attempts, retries and final result,
//! and everything that becomes due at a time (a timer's firing, a retry's next attempt).

use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::{Delivered, Delivery, Effect, Replay, StepCall, StepId, TimerId};
use crate::error::Error;
use crate::history::{after, to_millis, Event, NewEvent};

/// The `EventSet` events of the values attempt `attempt` of a step published with
/// `set_event`, in call order, recorded just before the attempt's outcome. Their ids
/// (`<step id>/<attempt>/set_<n>`) are not the body's `set_<n>`: a replay, which does not run
/// the step, does not look for them.
pub(crate) fn published_events(
    step_id: &StepId,
    attempt: u32,
    published: Vec<(String, Value)>,
    at: SystemTime,
) -> Vec<NewEvent> {
    published
        .into_iter()
        .enumerate()
        .map(|(n, (key, value))| NewEvent {
            at,
            event: Event::EventSet {
                set_id: format!("{step_id}/{attempt}/set_{n}"),
                key,
                value,
            },
        })
        .collect()
}

/// Where a recorded step without a result resumes.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Attempts {
    /// The last attempt that started (0: none yet).
    pub(super) started: u32,
    /// Set when that attempt failed and a retry was scheduled: the earliest next start.
    pub(super) retry_at: Option<SystemTime>,
}

/// A step being executed by this replay.
pub(super) struct LiveStep<S> {
    pub(super) call: StepCall<S>,
    /// The attempt running now, or the last one that ran.
    pub(super) attempt: u32,
}

/// Something that becomes due at a time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Due {
    Timer(TimerId),
    Retry(StepId),
}

impl<S> Replay<S> {
    /// Starts or resumes a step: `attempts` is what the history says about it.
    pub(super) fn start_step(&mut self, call: StepCall<S>, attempts: Attempts, now: SystemTime) {
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
    fn begin_attempt(&mut self, step_id: &StepId, now: SystemTime) {
        let Some(step) = self.steps.get_mut(step_id) else {
            return;
        };
        step.attempt += 1;
        let attempt = step.attempt;
        self.record(NewEvent {
            at: now,
            event: Event::StepAttemptStarted {
                step_id: step_id.to_string(),
                attempt,
            },
        });
        self.running += 1;
        self.effects.push_back(Effect::Attempt {
            step_id: step_id.clone(),
            attempt,
        });
    }

    /// Records a step's final result and queues it for the workflow.
    fn complete(&mut self, step_id: StepId, result: Result<Value, Error>, now: SystemTime) {
        self.steps.remove(&step_id);
        let history = self.record(NewEvent {
            at: now,
            event: Event::StepCompleted {
                step_id: step_id.to_string(),
                result: result.clone(),
            },
        });
        self.ready.push_back(Delivery {
            history,
            at: now,
            what: Delivered::Step { step_id, result },
        });
    }

    /// The step call behind an [`Effect::Attempt`].
    pub(crate) fn step(&self, step_id: &StepId) -> Option<&StepCall<S>> {
        self.steps.get(step_id).map(|s| &s.call)
    }

    /// Attempt `attempt` of the step published `published` (`set_event` in the step): recorded
    /// with the attempt's outcome, which [`Replay::attempt_finished`] takes next. What attempts
    /// this replay did not ask for published is ignored, like their outcomes.
    pub(crate) fn attempt_published(
        &mut self,
        step_id: &StepId,
        attempt: u32,
        published: Vec<(String, Value)>,
        now: SystemTime,
    ) {
        if published.is_empty() || self.steps.get(step_id).is_none_or(|s| s.attempt != attempt) {
            return;
        }
        for event in published_events(step_id, attempt, published, now) {
            self.record(event);
        }
    }

    /// Attempt `attempt` of the step committed `published` (its `set_event` values) with its
    /// result, in its own transaction: counted in the history before the result, which
    /// [`Replay::attempt_recorded`] takes next.
    pub(crate) fn published_by_store(
        &mut self,
        step_id: &StepId,
        attempt: u32,
        published: Vec<NewEvent>,
    ) {
        if self.steps.get(step_id).is_none_or(|s| s.attempt != attempt) {
            return;
        }
        for e in published {
            self.recorded_by_store(e.event);
        }
    }

    /// An attempt ended with `outcome`. A success, a non-retryable error or the last allowed
    /// attempt's error is the step's result; another error schedules a retry after the
    /// error's `retry_after`, or else `backoff`. Outcomes of attempts this replay did not ask
    /// for (a stale or unknown step) are ignored.
    pub(crate) fn attempt_finished(
        &mut self,
        step_id: &StepId,
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
            Ok(v) => return self.complete(step_id.clone(), Ok(v), now),
            Err(e) if !e.is_retryable() || attempt >= max_attempts => {
                return self.complete(step_id.clone(), Err(e), now)
            }
            Err(e) => e,
        };
        let delay = error.retry_after_hint().unwrap_or(backoff);
        let retry_at = after(now, delay);
        self.record(NewEvent {
            at: now,
            event: Event::StepAttemptFailed {
                step_id: step_id.to_string(),
                attempt,
                error,
                retry_at_ms: to_millis(retry_at),
            },
        });
        self.due.insert((retry_at, Due::Retry(step_id.clone())));
    }

    /// Attempt `attempt` of the step succeeded with `value` and recorded its `StepCompleted`
    /// itself, at `at` (a transactional step's commit): the result is delivered as
    /// [`Replay::attempt_finished`] would deliver it, with nothing left to write. Outcomes of
    /// attempts this replay did not ask for are ignored.
    pub(crate) fn attempt_recorded(
        &mut self,
        step_id: &StepId,
        attempt: u32,
        value: Value,
        at: SystemTime,
    ) {
        if self.steps.get(step_id).is_none_or(|s| s.attempt != attempt) {
            return;
        }
        self.running = self.running.saturating_sub(1);
        self.steps.remove(step_id);
        let history = self.recorded_by_store(Event::StepCompleted {
            step_id: step_id.to_string(),
            result: Ok(value.clone()),
        });
        self.ready.push_back(Delivery {
            at,
            history,
            what: Delivered::Step {
                step_id: step_id.clone(),
                result: Ok(value),
            },
        });
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
                    let history = self.record(NewEvent {
                        at,
                        event: Event::TimerFired {
                            timer_id: timer_id.to_string(),
                        },
                    });
                    self.ready.push_back(Delivery {
                        history,
                        at,
                        what: Delivered::Timer { timer_id },
                    });
                }
                Due::Retry(step_id) => self.begin_attempt(&step_id, now),
            }
        }
        fired
    }
}
