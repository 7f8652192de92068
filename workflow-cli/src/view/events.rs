//! One history entry as shown in the event log of a run.

use serde::Serialize;
use workflow_core::store::{Event, EventRecord};

use super::*;
use crate::text;

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
                text::time(workflow_core::store::from_millis(*retry_at_ms))
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
                text::time(workflow_core::store::from_millis(*fire_at_ms))
            ),
            Event::TimerFired { timer_id } => timer_id.clone(),
            Event::RunCompleted { output } => format!("output={}", text::json_line(output, 80)),
            Event::RunFailed { error } => format!("{:?}: {error}", error.kind()),
            Event::RunCancelled => String::new(),
            Event::RunContinuedAsNew { next_run, workflow } => {
                format!("continued as new: run {next_run} of {workflow}")
            }
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
