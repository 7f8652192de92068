//! The replay core on hand-built histories: a history and the commands a workflow issues go in,
//! the decisions (writes, effects, deliveries, divergences) are checked. No store, no executor.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::divergence::DivergenceKind;
use crate::history::{from_millis, never, to_millis, Event, EventRecord};
use crate::model::{ChildNotice, Inbound, InboxEntry, RunStatus};

/// A fixed origin, so every time in these tests is exact.
fn t(ms: u64) -> SystemTime {
    from_millis(1_700_000_000_000 + ms)
}

/// A history written event by event; sequence numbers follow the order.
#[derive(Default)]
struct History(Vec<EventRecord>);

impl History {
    fn at(mut self, ms: u64, event: Event) -> Self {
        let seq = self.0.len() as u64 + 1;
        self.0.push(EventRecord {
            seq,
            at: t(ms),
            event,
        });
        self
    }

    fn scheduled(self, ms: u64, step_id: &str, name: &str) -> Self {
        self.at(
            ms,
            Event::StepScheduled {
                step_id: step_id.into(),
                name: name.into(),
                input: json!([]),
            },
        )
    }

    fn completed(self, ms: u64, step_id: &str, result: Result<Value, Error>) -> Self {
        self.at(
            ms,
            Event::StepCompleted {
                step_id: step_id.into(),
                result,
            },
        )
    }

    fn started(self, ms: u64, step_id: &str, attempt: u32) -> Self {
        self.at(
            ms,
            Event::StepAttemptStarted {
                step_id: step_id.into(),
                attempt,
            },
        )
    }

    fn failed(self, ms: u64, step_id: &str, attempt: u32, retry_at: u64) -> Self {
        self.at(
            ms,
            Event::StepAttemptFailed {
                step_id: step_id.into(),
                attempt,
                error: Error::retryable("boom"),
                retry_at_ms: to_millis(t(retry_at)),
            },
        )
    }

    fn timer(self, ms: u64, timer_id: &str, fire_at: u64) -> Self {
        self.at(
            ms,
            Event::TimerScheduled {
                timer_id: timer_id.into(),
                fire_at_ms: to_millis(t(fire_at)),
            },
        )
    }

    fn fired(self, ms: u64, timer_id: &str) -> Self {
        self.at(
            ms,
            Event::TimerFired {
                timer_id: timer_id.into(),
            },
        )
    }

    fn registered(self, ms: u64, hook_key: &str, token: &str, conflict: Option<RunId>) -> Self {
        self.at(
            ms,
            Event::HookRegistered {
                hook_key: hook_key.into(),
                token: token.into(),
                conflict,
            },
        )
    }

    fn received(self, ms: u64, token: &str, payload_id: u64, payload: Value) -> Self {
        self.at(
            ms,
            Event::HookReceived {
                token: token.into(),
                payload_id,
                payload,
            },
        )
    }

    fn replay(self) -> Replay<()> {
        Replay::new(self.0, measure())
    }
}

/// Sizes an event as its whole JSON (the runtime counts payloads alone; the core does not
/// care how).
fn measure() -> Measure {
    Box::new(|e: &mut Event| serde_json::to_vec(e).map_or(0, |v| v.len() as u64))
}

fn step(step_id: &str, name: &'static str) -> Command<()> {
    step_with(step_id, name, 3)
}

fn step_with(step_id: &str, name: &'static str, max_retries: u32) -> Command<()> {
    Command::Step(StepCall {
        step_id: step_id.into(),
        name,
        input: json!([]),
        max_retries,
        timeout: None,
        transactional: false,
        body: (),
    })
}

fn timer(timer_id: &str, fire_at: u64) -> Command<()> {
    Command::Timer {
        timer_id: timer_id.into(),
        fire_at: t(fire_at),
    }
}

fn hook(hook_key: &str, token: &str) -> Command<()> {
    Command::HookRegister {
        hook_key: hook_key.into(),
        token: token.into(),
    }
}

fn release(hook_key: &str, token: &str) -> Command<()> {
    Command::HookRelease {
        hook_key: hook_key.into(),
        token: token.into(),
    }
}

fn kinds(w: &Writes) -> Vec<&'static str> {
    w.events.iter().map(|e| e.event.kind()).collect()
}

fn effects(r: &mut Replay<()>) -> Vec<Effect> {
    std::iter::from_fn(|| r.next_effect()).collect()
}

fn attempt(step_id: &str, attempt: u32) -> Effect {
    Effect::Attempt {
        step_id: step_id.into(),
        attempt,
    }
}

fn deliveries(r: &mut Replay<()>) -> Vec<Delivered> {
    std::iter::from_fn(|| r.next_delivery())
        .map(|d| d.expect("no divergence").what)
        .collect()
}

fn step_ok(step_id: &str, v: Value) -> Delivered {
    Delivered::Step {
        step_id: step_id.into(),
        result: Ok(v),
    }
}

fn backoff() -> Duration {
    Duration::from_secs(1)
}

/// Inbox entry `id`: `payload` sent to `token`.
fn payload(id: u64, token: &str, payload: Value) -> InboxEntry {
    InboxEntry {
        id,
        what: Inbound::Hook {
            token: token.into(),
            payload,
        },
    }
}

fn divergence(r: &mut Replay<()>, cmds: Vec<Command<()>>) -> Divergence {
    r.issue(cmds, t(0)).expect_err("a divergence")
}

mod children;
mod divergence;
mod ends;
mod history;
mod hooks;
mod messages;
mod patches;
mod steps;
mod timers;
