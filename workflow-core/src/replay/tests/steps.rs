//! Steps: scheduling, attempts, retries and backoff, recorded results, and the order
//! in which concurrent results are delivered.

use super::*;

#[test]
fn a_new_step_is_scheduled_and_its_first_attempt_asked_for() {
    let mut r = History::default().replay();
    assert!(!r.has_history());
    r.issue([step("s1", "charge")], t(5)).unwrap();
    let w = r.take_writes();
    assert_eq!(kinds(&w), ["step_scheduled"]);
    assert_eq!(w.events[0].at, t(5));
    assert_eq!(effects(&mut r), [attempt("s1", 1)]);
    assert!(!r.is_idle());
    assert!(r.step(&"s1".into()).is_some());
}

#[test]
fn a_live_success_is_recorded_then_delivered() {
    let mut r = History::default().replay();
    r.issue([step("s1", "charge")], t(0)).unwrap();
    r.take_writes();
    effects(&mut r);
    r.attempt_finished(&"s1".into(), 1, Ok(json!(42)), t(7), backoff());
    let w = r.take_writes();
    assert_eq!(kinds(&w), ["step_completed"]);
    let d = r.next_delivery().unwrap().unwrap();
    assert_eq!(d.at, t(7));
    assert_eq!(d.what, step_ok("s1", json!(42)));
    assert!(r.is_idle());
    assert!(r.step(&"s1".into()).is_none());
}

#[test]
fn a_recorded_result_is_replayed_without_running_the_step() {
    let mut r = History::default()
        .scheduled(1, "s1", "charge")
        .completed(2, "s1", Ok(json!("receipt")))
        .replay();
    assert!(r.has_history());
    r.issue([step("s1", "charge")], t(100)).unwrap();
    assert!(r.take_writes().is_empty());
    assert!(effects(&mut r).is_empty());
    let d = r.next_delivery().unwrap().unwrap();
    assert_eq!(d.at, t(2), "the recorded time becomes the workflow's clock");
    assert_eq!(d.what, step_ok("s1", json!("receipt")));
    assert!(!r.replaying());
}

#[test]
fn a_recorded_error_is_replayed_as_the_error() {
    let mut r = History::default()
        .scheduled(1, "s1", "charge")
        .completed(2, "s1", Err(Error::fatal("card declined")))
        .replay();
    r.issue([step("s1", "charge")], t(9)).unwrap();
    match r.next_delivery().unwrap().unwrap().what {
        Delivered::Step { result: Err(e), .. } => assert_eq!(e.to_string(), "card declined"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_interrupted_first_attempt_resumes_as_attempt_two() {
    let mut r = History::default().scheduled(1, "s1", "charge").replay();
    r.issue([step("s1", "charge")], t(50)).unwrap();
    let w = r.take_writes();
    assert_eq!(kinds(&w), ["step_attempt_started"]);
    assert_eq!(
        w.events[0].event,
        Event::StepAttemptStarted {
            step_id: "s1".into(),
            attempt: 2
        }
    );
    assert_eq!(effects(&mut r), [attempt("s1", 2)]);
}

#[test]
fn a_retryable_failure_schedules_the_next_attempt_after_the_backoff() {
    let mut r = History::default().replay();
    r.issue([step("s1", "charge")], t(0)).unwrap();
    r.take_writes();
    effects(&mut r);
    r.attempt_finished(
        &"s1".into(),
        1,
        Err(Error::retryable("503")),
        t(10),
        backoff(),
    );
    let w = r.take_writes();
    assert_eq!(kinds(&w), ["step_attempt_failed"]);
    match &w.events[0].event {
        Event::StepAttemptFailed { retry_at_ms, .. } => {
            assert_eq!(*retry_at_ms, to_millis(t(1010)))
        }
        other => panic!("{other:?}"),
    }
    assert!(r.next_delivery().is_none(), "nothing reaches the workflow");
    assert_eq!(r.next_due(), Some(t(1010)));
    assert!(r.is_idle(), "a run waiting for a retry runs nothing");
    assert!(!r.fire_due(t(1009)));
    assert!(r.fire_due(t(1010)));
    assert_eq!(kinds(&r.take_writes()), ["step_attempt_started"]);
    assert_eq!(effects(&mut r), [attempt("s1", 2)]);
}

#[test]
fn retry_after_overrides_the_backoff() {
    let mut r = History::default().replay();
    r.issue([step("s1", "charge")], t(0)).unwrap();
    r.take_writes();
    effects(&mut r);
    let e = Error::retryable("rate limited").retry_after(Duration::from_secs(30));
    r.attempt_finished(&"s1".into(), 1, Err(e), t(0), backoff());
    assert_eq!(r.next_due(), Some(t(30_000)));
}

#[test]
fn a_huge_retry_after_saturates_instead_of_overflowing() {
    let mut r = History::default().replay();
    r.issue([step("s1", "charge")], t(0)).unwrap();
    r.take_writes();
    effects(&mut r);
    let e = Error::retryable("later").retry_after(Duration::MAX);
    r.attempt_finished(&"s1".into(), 1, Err(e), t(0), backoff());
    assert_eq!(r.next_due(), Some(never()));
}

#[test]
fn a_fatal_error_ends_the_step_at_once() {
    let mut r = History::default().replay();
    r.issue([step("s1", "charge")], t(0)).unwrap();
    r.take_writes();
    effects(&mut r);
    r.attempt_finished(
        &"s1".into(),
        1,
        Err(Error::fatal("invalid card")),
        t(3),
        backoff(),
    );
    assert_eq!(kinds(&r.take_writes()), ["step_completed"]);
    assert_eq!(r.next_due(), None);
    assert!(matches!(
        r.next_delivery().unwrap().unwrap().what,
        Delivered::Step { result: Err(_), .. }
    ));
}

#[test]
fn the_last_allowed_attempt_error_is_the_result() {
    let mut r = History::default().replay();
    r.issue([step_with("s1", "charge", 1)], t(0)).unwrap();
    r.take_writes();
    effects(&mut r);
    r.attempt_finished(&"s1".into(), 1, Err(Error::retryable("a")), t(1), backoff());
    assert!(r.fire_due(t(5000)));
    assert_eq!(effects(&mut r), [attempt("s1", 2)]);
    r.take_writes();
    r.attempt_finished(
        &"s1".into(),
        2,
        Err(Error::retryable("b")),
        t(5001),
        backoff(),
    );
    assert_eq!(kinds(&r.take_writes()), ["step_completed"]);
    match r.next_delivery().unwrap().unwrap().what {
        Delivered::Step { result: Err(e), .. } => assert_eq!(e.to_string(), "b"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_resumed_step_waits_for_its_recorded_retry_time() {
    let mut r = History::default()
        .scheduled(1, "s1", "charge")
        .failed(2, "s1", 1, 60_000)
        .replay();
    r.issue([step("s1", "charge")], t(10)).unwrap();
    assert!(r.take_writes().is_empty());
    assert!(effects(&mut r).is_empty());
    assert_eq!(r.next_due(), Some(t(60_000)));
    assert!(r.fire_due(t(60_000)));
    assert_eq!(effects(&mut r), [attempt("s1", 2)]);
}

#[test]
fn a_resumed_step_whose_retry_time_passed_starts_at_once() {
    let mut r = History::default()
        .scheduled(1, "s1", "charge")
        .failed(2, "s1", 1, 60)
        .replay();
    r.issue([step("s1", "charge")], t(1_000)).unwrap();
    assert_eq!(kinds(&r.take_writes()), ["step_attempt_started"]);
    assert_eq!(effects(&mut r), [attempt("s1", 2)]);
}

#[test]
fn a_step_interrupted_in_every_attempt_fails_without_another() {
    let mut r = History::default()
        .scheduled(1, "s1", "charge")
        .failed(2, "s1", 1, 3)
        .started(4, "s1", 2)
        .replay();
    r.issue([step_with("s1", "charge", 1)], t(10)).unwrap();
    assert!(effects(&mut r).is_empty());
    assert_eq!(kinds(&r.take_writes()), ["step_completed"]);
    match r.next_delivery().unwrap().unwrap().what {
        Delivered::Step { result: Err(e), .. } => {
            assert!(
                e.to_string()
                    .contains("interrupted in each of its 2 attempts"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn outcomes_of_unknown_or_stale_attempts_are_ignored() {
    let mut r = History::default().replay();
    r.issue([step("s1", "charge")], t(0)).unwrap();
    r.take_writes();
    effects(&mut r);
    r.attempt_finished(&"s1".into(), 2, Ok(json!(1)), t(1), backoff());
    r.attempt_finished(&"nope".into(), 1, Ok(json!(1)), t(1), backoff());
    assert!(r.take_writes().is_empty());
    assert!(r.next_delivery().is_none());
    assert!(!r.is_idle(), "attempt 1 still runs");
}

#[test]
fn concurrent_live_steps_are_delivered_in_completion_order() {
    let mut r = History::default().replay();
    r.issue([step("a", "x"), step("b", "y")], t(0)).unwrap();
    assert_eq!(
        kinds(&r.take_writes()),
        ["step_scheduled", "step_scheduled"]
    );
    assert_eq!(effects(&mut r), [attempt("a", 1), attempt("b", 1)]);
    r.attempt_finished(&"b".into(), 1, Ok(json!("B")), t(1), backoff());
    r.attempt_finished(&"a".into(), 1, Ok(json!("A")), t(2), backoff());
    let w = r.take_writes();
    assert_eq!(
        w.events.iter().map(|e| &e.event).collect::<Vec<_>>(),
        [
            &Event::StepCompleted {
                step_id: "b".into(),
                result: Ok(json!("B"))
            },
            &Event::StepCompleted {
                step_id: "a".into(),
                result: Ok(json!("A"))
            },
        ]
    );
    assert_eq!(
        deliveries(&mut r),
        [step_ok("b", json!("B")), step_ok("a", json!("A"))]
    );
}

#[test]
fn a_race_replays_in_recorded_order_not_issue_order() {
    // Live, `b` finished first; a replay must hand `b` over first too.
    let mut r = History::default()
        .scheduled(1, "a", "x")
        .scheduled(2, "b", "y")
        .completed(3, "b", Ok(json!("B")))
        .completed(4, "a", Ok(json!("A")))
        .replay();
    r.issue([step("a", "x"), step("b", "y")], t(100)).unwrap();
    assert_eq!(
        deliveries(&mut r),
        [step_ok("b", json!("B")), step_ok("a", json!("A"))]
    );
}

#[test]
fn live_results_wait_until_the_history_is_delivered() {
    // `s2` was interrupted in its only attempt, so its result is decided at once; `s1`'s
    // recorded result still comes first.
    let mut r = History::default()
        .scheduled(1, "s1", "x")
        .scheduled(2, "s2", "y")
        .completed(3, "s1", Ok(json!(1)))
        .replay();
    r.issue([step("s1", "x"), step_with("s2", "y", 0)], t(10))
        .unwrap();
    let first = r.next_delivery().unwrap().unwrap();
    assert_eq!(first.what, step_ok("s1", json!(1)));
    match r.next_delivery().unwrap().unwrap().what {
        Delivered::Step { step_id, result } => {
            assert_eq!(step_id, "s2");
            assert!(result.is_err());
        }
        other => panic!("{other:?}"),
    }
}
