//! The views derived from hand-built histories.

use serde_json::json;
use workflow_core::store::{
    from_millis, to_millis, Event, EventRecord, HookRecord, QueueEntry, RunRecord,
};
use workflow_core::{Error, RunId, RunStatus};

use super::*;

fn t(ms: u64) -> SystemTime {
    from_millis(1_700_000_000_000 + ms)
}

fn ev(seq: u64, at: u64, event: Event) -> EventRecord {
    EventRecord {
        seq,
        at: t(at),
        event,
    }
}

fn run(status: RunStatus, updated: u64, hook_token: Option<&str>) -> RunRecord {
    RunRecord {
        trace_context: None,
        parent: None,
        id: RunId::new(),
        workflow: "wf".into(),
        status,
        input: json!([]),
        output: None,
        error: None,
        created_at: t(0),
        updated_at: t(updated),
        hook_token: hook_token.map(str::to_owned),
        deadline: None,
        queue: None,
        start_at: None,
        version: None,
        previous_run: None,
        next_run: None,
        origin: None,
    }
}

#[test]
fn waiting_runs_are_numbered_by_priority_then_start_order() {
    let queued = |status, created: u64, priority| {
        let mut r = run(status, created, None);
        r.created_at = t(created);
        r.queue = Some(QueueEntry {
            name: "q".into(),
            partition_key: None,
            priority,
        });
        RunSummary::new(r)
    };
    let runs = vec![
        queued(RunStatus::Pending, 3, 0),
        queued(RunStatus::Running, 0, 9),
        queued(RunStatus::Pending, 2, 5),
        queued(RunStatus::Pending, 1, 0),
    ];
    let numbered: Vec<Option<usize>> = positions(runs).iter().map(|r| r.position).collect();
    assert_eq!(numbered, [Some(3), None, Some(1), Some(2)]);
}

#[test]
fn attempts_retries_and_interruptions() {
    let events = vec![
        ev(
            1,
            10,
            Event::StepScheduled {
                step_id: "stp_x_1".into(),
                name: "charge".into(),
                input: json!([1]),
            },
        ),
        ev(
            2,
            30,
            Event::StepAttemptFailed {
                step_id: "stp_x_1".into(),
                attempt: 1,
                error: Error::retryable("timeout"),
                retry_at_ms: to_millis(t(130)),
            },
        ),
        ev(
            3,
            130,
            Event::StepAttemptStarted {
                step_id: "stp_x_1".into(),
                attempt: 2,
            },
        ),
        // The worker died during attempt 2.
        ev(
            4,
            500,
            Event::StepAttemptStarted {
                step_id: "stp_x_1".into(),
                attempt: 3,
            },
        ),
        ev(
            5,
            520,
            Event::StepCompleted {
                step_id: "stp_x_1".into(),
                result: Ok(json!("r")),
            },
        ),
        ev(
            6,
            530,
            Event::TimerScheduled {
                timer_id: "tm_1".into(),
                fire_at_ms: to_millis(t(100_000)),
            },
        ),
    ];
    let d = RunDetail::new(run(RunStatus::Running, 530, None), &events, &[], t(1000));
    let s = &d.steps[0];
    assert_eq!(s.label(), "charge #0");
    assert_eq!(short_name("shop::orders::charge"), "charge");
    assert_eq!(s.status, StepStatus::Completed);
    assert_eq!(s.duration_ms, Some(510));
    let got: Vec<_> = s
        .attempts
        .iter()
        .map(|a| (a.attempt, a.outcome, a.duration_ms))
        .collect();
    assert_eq!(
        got,
        [
            (1, AttemptOutcome::Failed, Some(20)),
            (2, AttemptOutcome::Interrupted, Some(370)),
            (3, AttemptOutcome::Ok, Some(20)),
        ]
    );
    assert_eq!(s.attempts[0].retry_at, Some(Time(t(130))));
    assert_eq!(d.timers[0].status, TimerStatus::Waiting);
    assert_eq!(d.waiting_on.len(), 1, "{:?}", d.waiting_on);
    assert!(d.waiting_on[0].starts_with("sleep tm_1 until"));
}

#[test]
fn an_ended_run_closes_what_was_open() {
    let events = vec![
        ev(
            1,
            10,
            Event::StepScheduled {
                step_id: "stp_x_1".into(),
                name: "slow".into(),
                input: json!([]),
            },
        ),
        ev(
            2,
            20,
            Event::TimerScheduled {
                timer_id: "tm_1".into(),
                fire_at_ms: to_millis(t(100_000)),
            },
        ),
        ev(3, 50, Event::RunCancelled),
    ];
    let d = RunDetail::new(
        run(RunStatus::Cancelled, 50, Some("tok")),
        &events,
        &[],
        t(1000),
    );
    assert_eq!(d.steps[0].status, StepStatus::Abandoned);
    assert_eq!(d.steps[0].attempts[0].outcome, AttemptOutcome::Interrupted);
    assert_eq!(d.steps[0].attempts[0].ended_at, Some(Time(t(50))));
    assert_eq!(d.timers[0].status, TimerStatus::Abandoned);
    assert_eq!(d.hooks[0].token, "tok");
    assert_eq!(d.hooks[0].released_at, Some(Time(t(50))));
    assert!(!d.hooks[0].active);
    assert!(d.waiting_on.is_empty());
    assert_eq!(d.end(), Time(t(50)));
}

#[test]
fn hooks_payloads_and_conflicts() {
    let owner = RunId::new();
    let events = vec![
        ev(
            1,
            10,
            Event::HookRegistered {
                hook_key: "hk_1".into(),
                token: "a".into(),
                conflict: None,
            },
        ),
        ev(
            2,
            11,
            Event::HookRegistered {
                hook_key: "hk_2".into(),
                token: "b".into(),
                conflict: Some(owner),
            },
        ),
        ev(
            3,
            40,
            Event::HookReceived {
                token: "a".into(),
                payload_id: 7,
                payload: json!({"ok": true}),
            },
        ),
        ev(
            4,
            60,
            Event::HookReceived {
                token: "start".into(),
                payload_id: 8,
                payload: json!(1),
            },
        ),
    ];
    let active = [
        HookRecord {
            token: "a".into(),
            run_id: RunId::new(),
            created_at: t(10),
        },
        HookRecord {
            token: "start".into(),
            run_id: RunId::new(),
            created_at: t(0),
        },
    ];
    let d = RunDetail::new(
        run(RunStatus::Running, 60, Some("start")),
        &events,
        &active,
        t(100),
    );
    let got: Vec<_> = d
        .hooks
        .iter()
        .map(|h| (h.token.as_str(), h.active, h.payloads.len(), h.conflict))
        .collect();
    assert_eq!(
        got,
        [
            ("a", true, 1, None),
            ("b", false, 0, Some(owner)),
            ("start", true, 1, None),
        ]
    );
    assert_eq!(d.hooks[2].registered_at, Time(t(0)));
    assert_eq!(d.waiting_on.len(), 2, "{:?}", d.waiting_on);
}

#[test]
fn a_divergence_is_read_from_the_error_not_its_wording() {
    // As a blocked run's error is recorded: the message and the parts beside it.
    let error: Error = serde_json::from_value(json!({
        "kind": "diverged",
        "message": "worded any way at all",
        "divergence": {
            "event": 3,
            "expected": "step `a` (stp_1_0)",
            "found": "step `b` (stp_2_0)",
            "kind": "command"
        }
    }))
    .unwrap();
    let v = DivergenceView::new(&error);
    assert_eq!(v.message, "worded any way at all");
    assert_eq!(v.event, Some(3));
    assert_eq!(v.expected.as_deref(), Some("step `a` (stp_1_0)"));
    assert_eq!(v.found.as_deref(), Some("step `b` (stp_2_0)"));
    let v = DivergenceView::new(&Error::fatal("worded otherwise"));
    assert_eq!((v.message.as_str(), v.event), ("worded otherwise", None));
}

#[test]
fn patches_and_retries_are_marked_and_a_retry_opens_fresh_attempts() {
    let step = |seq, at, event| ev(seq, at, event);
    let events = vec![
        step(
            1,
            5,
            Event::PatchMarked {
                patch_id: "use-v2".into(),
            },
        ),
        step(
            2,
            10,
            Event::StepScheduled {
                step_id: "stp_x_0".into(),
                name: "charge".into(),
                input: json!([]),
            },
        ),
        step(
            3,
            20,
            Event::StepCompleted {
                step_id: "stp_x_0".into(),
                result: Err(Error::fatal("declined")),
            },
        ),
        step(
            4,
            20,
            Event::RunFailed {
                error: Error::fatal("declined"),
            },
        ),
        step(5, 100, Event::RunRetried),
    ];
    let d = RunDetail::new(run(RunStatus::Pending, 100, None), &events, &[], t(150));
    let marks: Vec<_> = d.marks.iter().map(|m| (m.kind, m.at)).collect();
    assert_eq!(
        marks,
        [
            (MarkKind::Patch, Time(t(5))),
            (MarkKind::Retried, Time(t(100)))
        ]
    );
    let s = &d.steps[0];
    assert_eq!(s.status, StepStatus::Running);
    let got: Vec<_> = s.attempts.iter().map(|a| (a.attempt, a.outcome)).collect();
    assert_eq!(
        got,
        [(1, AttemptOutcome::Failed), (1, AttemptOutcome::Running)]
    );
    assert_eq!(s.attempts[1].started_at, Time(t(100)));
    let details: Vec<_> = events
        .into_iter()
        .map(|e| EventView::new(e).details())
        .collect();
    assert_eq!(details[0], "patch \"use-v2\": new code path taken");
    assert_eq!(details[4], "failed run re-opened by retry");
}

#[test]
fn json_times_are_rfc3339() {
    let v = serde_json::to_value(Time(from_millis(1_700_000_000_123))).unwrap();
    assert_eq!(v, json!("2023-11-14T22:13:20.123Z"));
}

#[test]
fn a_delayed_run_is_pending_until_its_start_and_waits_for_it() {
    let mut delayed = run(RunStatus::Pending, 0, None);
    delayed.start_at = Some(t(5_000));
    delayed.version = Some("1.4.2".into());
    let summary = RunSummary::new(delayed.clone());
    let start = Time(t(5_000));
    assert_eq!(summary.version.as_deref(), Some("1.4.2"));
    assert_eq!(summary.starts_later(Time(t(1_000))), Some(start));
    assert_eq!(
        summary.status_text(Time(t(1_000))),
        format!("pending, starts at {start}")
    );
    // From its start on it waits for a worker like any pending run.
    assert_eq!(summary.status_text(start), "pending");
    let d = RunDetail::new(delayed.clone(), &[], &[], t(1_000));
    assert_eq!(
        d.waiting_on,
        [format!(
            "its start at {start} (in 4s): it was started with a delay"
        )]
    );
    let d = RunDetail::new(delayed.clone(), &[], &[], t(6_000));
    assert_eq!(
        d.waiting_on,
        ["a worker to pick it up (no worker has run it yet)"]
    );
    // A run that began shows its status alone, its start kept.
    delayed.status = RunStatus::Running;
    let begun = RunSummary::new(delayed);
    assert_eq!(begun.status_text(Time(t(1_000))), "running");
    assert_eq!(begun.start_at, Some(start));
}

#[test]
fn a_run_s_trace_is_shown_by_its_traceparent() {
    let mut traced = run(RunStatus::Running, 0, None);
    let summary = RunSummary::new(traced.clone());
    assert_eq!(summary.traceparent, None);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    traced.trace_context = workflow_core::store::TraceContext::parse(&format!("{parent},k=v"));
    let summary = RunSummary::new(traced);
    assert_eq!(summary.traceparent.as_deref(), Some(parent));
    let v = serde_json::to_value(&summary).unwrap();
    assert_eq!(v["traceparent"], json!(parent));
}
