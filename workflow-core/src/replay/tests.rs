//! The replay core on hand-built histories: a history and the commands a workflow issues go in,
//! the decisions (writes, effects, deliveries, divergences) are checked. No store, no executor.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::divergence::DivergenceKind;
use crate::history::{from_millis, never, to_millis, Event, EventRecord};
use crate::model::{ChildNotice, CHILD_NOTICE_TOKEN};

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
        Replay::new(self.0)
    }
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

// ---------------------------------------------------------------------------------------------
// Steps

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

// ---------------------------------------------------------------------------------------------
// Timers

#[test]
fn a_new_timer_is_recorded_and_becomes_due() {
    let mut r = History::default().replay();
    r.issue([timer("tmr_0", 5_000)], t(0)).unwrap();
    assert_eq!(kinds(&r.take_writes()), ["timer_scheduled"]);
    assert_eq!(r.next_due(), Some(t(5_000)));
    assert!(r.is_idle());
}

#[test]
fn a_timer_fires_at_its_time_and_never_before() {
    let mut r = History::default().replay();
    r.issue([timer("tmr_0", 5_000)], t(0)).unwrap();
    r.take_writes();
    assert!(!r.fire_due(t(4_999)));
    assert!(r.next_delivery().is_none());
    assert!(r.fire_due(t(5_200)));
    let w = r.take_writes();
    assert_eq!(kinds(&w), ["timer_fired"]);
    assert_eq!(w.events[0].at, t(5_200));
    let d = r.next_delivery().unwrap().unwrap();
    assert_eq!(d.at, t(5_200));
    assert_eq!(
        d.what,
        Delivered::Timer {
            timer_id: "tmr_0".into()
        }
    );
    assert_eq!(r.next_due(), None);
}

#[test]
fn a_replayed_timer_keeps_its_recorded_fire_time() {
    // On replay the workflow computes another time (its clock moved); the recorded one wins.
    let mut r = History::default().timer(1, "tmr_0", 9_000).replay();
    r.issue([timer("tmr_0", 123_456)], t(2_000)).unwrap();
    assert!(r.take_writes().is_empty());
    assert_eq!(r.next_due(), Some(t(9_000)));
}

#[test]
fn a_fired_timer_is_replayed_without_waiting() {
    let mut r = History::default()
        .timer(1, "tmr_0", 9_000)
        .fired(9_001, "tmr_0")
        .replay();
    r.issue([timer("tmr_0", 9_000)], t(20_000)).unwrap();
    assert_eq!(r.next_due(), None);
    let d = r.next_delivery().unwrap().unwrap();
    assert_eq!(d.at, t(9_001));
}

#[test]
fn a_step_against_a_timer_replays_the_recorded_winner() {
    // select(step, sleep): live, the timer fired first.
    let mut r = History::default()
        .scheduled(1, "s1", "slow")
        .timer(1, "tmr_0", 100)
        .fired(100, "tmr_0")
        .completed(150, "s1", Ok(json!("late")))
        .replay();
    r.issue([step("s1", "slow"), timer("tmr_0", 100)], t(1_000))
        .unwrap();
    assert_eq!(
        deliveries(&mut r),
        [
            Delivered::Timer {
                timer_id: "tmr_0".into()
            },
            step_ok("s1", json!("late"))
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Hooks and payloads

#[test]
fn a_new_hook_registration_asks_for_a_claim_and_records_nothing_itself() {
    let mut r = History::default().replay();
    r.issue([hook("hk_0", "order:1")], t(0)).unwrap();
    assert!(r.take_writes().is_empty(), "the store records the claim");
    assert_eq!(
        effects(&mut r),
        [Effect::Claim {
            hook_key: "hk_0".into(),
            token: "order:1".into()
        }]
    );
}

#[test]
fn a_claim_decision_is_delivered() {
    let owner = RunId::new();
    let mut r = History::default().replay();
    r.issue([hook("hk_0", "order:1")], t(0)).unwrap();
    effects(&mut r);
    assert!(!r.is_idle() || r.next_effect().is_none());
    r.claimed("hk_0".into(), "order:1".into(), Some(owner), t(3));
    let d = r.next_delivery().unwrap().unwrap();
    assert_eq!(d.at, t(3));
    assert_eq!(
        d.what,
        Delivered::Registration {
            hook_key: "hk_0".into(),
            token: "order:1".into(),
            conflict: Some(owner)
        }
    );
}

#[test]
fn a_recorded_registration_is_replayed_without_claiming_again() {
    let owner = RunId::new();
    let mut r = History::default()
        .registered(1, "hk_0", "order:1", Some(owner))
        .replay();
    r.issue([hook("hk_0", "order:1")], t(9)).unwrap();
    assert!(effects(&mut r).is_empty());
    assert_eq!(
        deliveries(&mut r),
        [Delivered::Registration {
            hook_key: "hk_0".into(),
            token: "order:1".into(),
            conflict: Some(owner)
        }]
    );
}

#[test]
fn a_release_is_recorded_once() {
    let mut r = History::default().replay();
    r.issue(
        [release("hk_0", "order:1"), release("hk_0", "order:1")],
        t(0),
    )
    .unwrap();
    let w = r.take_writes();
    assert_eq!(kinds(&w), ["hook_released"]);
    assert_eq!(w.releases, ["order:1"]);
}

#[test]
fn a_recorded_release_is_not_written_again() {
    let mut r = History::default()
        .registered(1, "hk_0", "order:1", None)
        .at(
            2,
            Event::HookReleased {
                hook_key: "hk_0".into(),
                token: "order:1".into(),
            },
        )
        .replay();
    r.issue([hook("hk_0", "order:1"), release("hk_0", "order:1")], t(5))
        .unwrap();
    assert!(r.take_writes().is_empty());
}

#[test]
fn the_hooks_a_run_holds_are_those_it_claimed_and_did_not_release() {
    let owner = RunId::new();
    // A lost claim holds nothing; a recorded claim holds until its release.
    let mut r = History::default()
        .registered(1, "hk_0", "lost", Some(owner))
        .replay();
    assert!(!r.holds_hooks());
    r.claimed("hk_1".into(), "won".into(), None, t(2));
    assert!(r.holds_hooks(), "a live claim that won");
    r.issue([release("hk_1", "won")], t(3)).unwrap();
    assert!(!r.holds_hooks(), "released");

    let mut r = History::default()
        .registered(1, "hk_0", "order:1", None)
        .replay();
    assert!(r.holds_hooks(), "a recorded claim that won");
    let r2 = History::default()
        .registered(1, "hk_0", "order:1", None)
        .at(
            2,
            Event::HookReleased {
                hook_key: "hk_0".into(),
                token: "order:1".into(),
            },
        )
        .replay();
    assert!(!r2.holds_hooks(), "a recorded release");
    r.issue([release("hk_0", "order:1")], t(5)).unwrap();
    assert!(!r.holds_hooks());
}

#[test]
fn recorded_payloads_are_replayed_in_order_and_not_delivered_twice() {
    let mut r = History::default()
        .registered(1, "hk_0", "tok", None)
        .received(2, "tok", 7, json!("first"))
        .received(3, "tok", 9, json!("second"))
        .replay();
    r.add_payloads([
        Inbound {
            id: 7,
            token: "tok".into(),
            payload: json!("first"),
        },
        Inbound {
            id: 9,
            token: "tok".into(),
            payload: json!("second"),
        },
        Inbound {
            id: 12,
            token: "tok".into(),
            payload: json!("third"),
        },
    ]);
    assert_eq!(r.inbox_seen(), 12);
    r.issue([hook("hk_0", "tok")], t(50)).unwrap();
    let payloads = |v: &str| Delivered::Payload {
        token: "tok".into(),
        payload: json!(v),
    };
    assert_eq!(
        deliveries(&mut r)[1..],
        [payloads("first"), payloads("second")]
    );
    assert!(r.deliver_payload(|_| true, t(60)));
    assert_eq!(kinds(&r.take_writes()), ["hook_received"]);
    assert_eq!(r.next_delivery().unwrap().unwrap().what, payloads("third"));
    assert!(!r.deliver_payload(|_| true, t(61)), "each payload once");
}

#[test]
fn a_payload_waits_until_a_hook_owns_its_token() {
    let mut r = History::default().replay();
    r.add_payloads([
        Inbound {
            id: 1,
            token: "a".into(),
            payload: json!(1),
        },
        Inbound {
            id: 2,
            token: "b".into(),
            payload: json!(2),
        },
    ]);
    assert!(r.deliver_payload(|t| t == "b", t(1)));
    assert_eq!(
        r.next_delivery().unwrap().unwrap().what,
        Delivered::Payload {
            token: "b".into(),
            payload: json!(2)
        }
    );
    assert!(!r.deliver_payload(|t| t == "b", t(2)), "`a` waits");
    assert!(r.deliver_payload(|_| true, t(3)));
    match &r.take_writes().events[1].event {
        Event::HookReceived { payload_id, .. } => assert_eq!(*payload_id, 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn payloads_for_one_token_go_out_in_inbox_order() {
    let mut r = History::default().replay();
    r.add_payloads((1..=3).map(|id| Inbound {
        id,
        token: "t".into(),
        payload: json!(id),
    }));
    let mut got = Vec::new();
    while r.deliver_payload(|_| true, t(0)) {
        if let Delivered::Payload { payload, .. } = r.next_delivery().unwrap().unwrap().what {
            got.push(payload);
        }
    }
    assert_eq!(got, [json!(1), json!(2), json!(3)]);
}

// ---------------------------------------------------------------------------------------------
// Divergence

fn divergence(r: &mut Replay<()>, cmds: Vec<Command<()>>) -> Divergence {
    r.issue(cmds, t(0)).expect_err("a divergence")
}

#[test]
fn another_step_name_diverges() {
    let mut r = History::default().scheduled(3, "s1", "charge").replay();
    let d = divergence(&mut r, vec![step("s1", "refund")]);
    assert_eq!(d.kind, DivergenceKind::Command);
    assert_eq!(d.event, 1);
    assert_eq!(d.expected, "step `charge` (s1)");
    assert_eq!(d.found, "step `refund` (s1)");
    assert!(d
        .to_string()
        .contains("at event 1 its history expects step `charge` (s1) next"));
}

#[test]
fn another_kind_of_command_diverges() {
    let mut r = History::default()
        .scheduled(1, "s1", "charge")
        .completed(2, "s1", Ok(json!(1)))
        .timer(3, "tmr_0", 10)
        .replay();
    r.issue([step("s1", "charge")], t(0)).unwrap();
    r.next_delivery().unwrap().unwrap();
    let d = divergence(&mut r, vec![step("s2", "ship")]);
    assert_eq!(d.kind, DivergenceKind::Command);
    assert_eq!(d.event, 3);
    assert_eq!(d.expected, "sleep (tmr_0)");
}

#[test]
fn another_hook_token_diverges() {
    let mut r = History::default()
        .registered(1, "hk_0", "order:1", None)
        .replay();
    let d = divergence(&mut r, vec![hook("hk_0", "order:2")]);
    assert_eq!(d.kind, DivergenceKind::Command);
    assert!(d.found.contains("order:2"), "{d}");
}

#[test]
fn a_divergence_keeps_nothing_to_write() {
    let mut r = History::default()
        .scheduled(1, "s1", "a")
        .scheduled(2, "s2", "b")
        .replay();
    // `s1` resumes (an attempt start to write), then `s2` does not match.
    divergence(&mut r, vec![step("s1", "a"), step("s2", "other")]);
    assert!(r.take_writes().is_empty());
}

#[test]
fn a_recorded_result_nobody_waits_for_diverges() {
    // Live, the workflow awaited `s1` before starting the timer; this code awaits the timer
    // alone first.
    let mut r = History::default()
        .timer(1, "tmr_0", 10)
        .scheduled(2, "s1", "x")
        .completed(3, "s1", Ok(json!(1)))
        .fired(10, "tmr_0")
        .replay();
    r.issue([timer("tmr_0", 10)], t(0)).unwrap();
    let d = r.next_delivery().unwrap().unwrap_err();
    assert_eq!(d.kind, DivergenceKind::Result);
    assert_eq!(d.event, 3);
    assert_eq!(d.expected, "step `x` (s1)");
    assert_eq!(d.found, "tmr_0");
}

#[test]
fn returning_while_commands_are_recorded_diverges() {
    let mut r = History::default()
        .scheduled(1, "s1", "x")
        .completed(2, "s1", Ok(json!(1)))
        .replay();
    let d = r.returned(Ok(json!(null)), t(0)).unwrap_err();
    assert_eq!(d.kind, DivergenceKind::Returned);
    assert_eq!(d.event, 1);
    assert!(d.to_string().contains("returned (Ok)"), "{d}");
}

#[test]
fn returning_before_the_history_is_delivered_diverges() {
    let mut r = History::default()
        .registered(1, "hk_0", "tok", None)
        .received(2, "tok", 1, json!("x"))
        .replay();
    r.issue([hook("hk_0", "tok")], t(0)).unwrap();
    r.next_delivery().unwrap().unwrap();
    let d = r.returned(Err(Error::fatal("gave up")), t(0)).unwrap_err();
    assert_eq!(d.kind, DivergenceKind::Unreplayed);
    assert_eq!(d.event, 2);
    assert!(d.expected.contains("payload"), "{d}");
}

// ---------------------------------------------------------------------------------------------
// Ends, eviction and resumption

#[test]
fn returning_records_the_end_with_what_is_pending() {
    let mut r = History::default().replay();
    r.issue([release("hk_0", "tok")], t(1)).unwrap();
    let w = r.returned(Ok(json!({"ok": true})), t(2)).unwrap();
    assert_eq!(kinds(&w), ["hook_released", "run_completed"]);
    assert_eq!(w.releases, ["tok"]);
    assert_eq!(w.end, Some(End::Completed(json!({"ok": true}))));
}

#[test]
fn a_failed_workflow_records_its_error() {
    let mut r = History::default().replay();
    let w = r.returned(Err(Error::fatal("no stock")), t(2)).unwrap();
    assert_eq!(kinds(&w), ["run_failed"]);
    assert!(matches!(w.end, Some(End::Failed(ref e)) if e.to_string() == "no stock"));
}

#[test]
fn only_timers_and_retries_leave_a_run_idle() {
    let mut r = History::default().replay();
    r.issue([timer("tmr_0", 100), step("s1", "x")], t(0))
        .unwrap();
    assert!(!r.is_idle(), "the attempt is still to start");
    effects(&mut r);
    assert!(!r.is_idle(), "the attempt runs");
    r.attempt_finished(&"s1".into(), 1, Ok(json!(1)), t(1), backoff());
    assert!(r.is_idle());
    assert_eq!(r.next_due(), Some(t(100)));
}

#[test]
fn an_evicted_sleeping_run_resumes_where_it_slept() {
    // Evicted during its sleep: the history ends with the timer's scheduling.
    let history = || {
        History::default()
            .scheduled(1, "s1", "x")
            .completed(2, "s1", Ok(json!("a")))
            .timer(3, "tmr_0", 86_400_000)
    };
    let mut r = history().replay();
    r.issue([step("s1", "x")], t(10_000)).unwrap();
    assert_eq!(deliveries(&mut r), [step_ok("s1", json!("a"))]);
    r.issue([timer("tmr_0", 86_410_000)], t(10_000)).unwrap();
    assert!(r.take_writes().is_empty());
    assert!(r.is_idle());
    assert_eq!(r.next_due(), Some(t(86_400_000)));
    assert!(r.fire_due(t(86_400_000)));
    assert_eq!(kinds(&r.take_writes()), ["timer_fired"]);
    r.issue([step("s2", "y")], t(86_400_001)).unwrap();
    assert_eq!(kinds(&r.take_writes()), ["step_scheduled"]);
}

#[test]
fn a_history_in_the_stored_json_format_replays() {
    // Events as every store keeps them (their serde form), including a step retried once, a
    // timer, a hook with a payload and its release.
    let stored = r#"[
        {"type":"step_scheduled","step_id":"stp_a","name":"orders.charge","input":["o-1",1000]},
        {"type":"step_attempt_failed","step_id":"stp_a","attempt":1,
         "error":{"kind":"retryable","message":"503"},"retry_at_ms":1700000001000},
        {"type":"step_attempt_started","step_id":"stp_a","attempt":2},
        {"type":"step_completed","step_id":"stp_a","result":{"Ok":{"charge":"ch_1"}}},
        {"type":"timer_scheduled","timer_id":"tmr_0","fire_at_ms":1700000005000},
        {"type":"timer_fired","timer_id":"tmr_0"},
        {"type":"hook_registered","hook_key":"hk_0","token":"order:o-1","conflict":null},
        {"type":"hook_received","token":"order:o-1","payload_id":3,"payload":{"ok":true}},
        {"type":"hook_released","hook_key":"hk_0","token":"order:o-1"}
    ]"#;
    let events: Vec<Event> = serde_json::from_str(stored).expect("the stored format decodes");
    let records = events
        .into_iter()
        .enumerate()
        .map(|(i, event)| EventRecord {
            seq: i as u64 + 1,
            at: t(i as u64),
            event,
        });
    let mut r: Replay<()> = Replay::new(records);
    r.issue([step("stp_a", "orders.charge")], t(100)).unwrap();
    assert_eq!(
        r.next_delivery().unwrap().unwrap().what,
        step_ok("stp_a", json!({"charge": "ch_1"}))
    );
    r.issue([timer("tmr_0", 0)], t(100)).unwrap();
    r.next_delivery().unwrap().unwrap();
    r.issue([hook("hk_0", "order:o-1")], t(100)).unwrap();
    let rest = deliveries(&mut r);
    assert_eq!(rest.len(), 2);
    r.issue([release("hk_0", "order:o-1")], t(100)).unwrap();
    let end = r.returned(Ok(json!("done")), t(100)).unwrap();
    assert_eq!(kinds(&end), ["run_completed"], "nothing recorded twice");
}

// ---------------------------------------------------------------------------------------------
// Patches and re-opened runs

fn patch(patch_id: &str) -> Command<()> {
    Command::Patch {
        patch_id: patch_id.into(),
    }
}

#[test]
fn a_live_patch_is_recorded_and_its_marker_matched_on_replay() {
    let mut r = History::default().replay();
    assert_eq!(r.patches().recorded, 0);
    r.issue([patch("tax"), step("s1", "charge")], t(1)).unwrap();
    assert_eq!(kinds(&r.take_writes()), ["patch_marked", "step_scheduled"]);

    let h = History::default()
        .at(
            1,
            Event::PatchMarked {
                patch_id: "tax".into(),
            },
        )
        .scheduled(1, "s1", "charge")
        .completed(2, "s1", Ok(json!(1)));
    let mut r = h.replay();
    let p = r.patches();
    assert_eq!(
        (p.recorded, p.markers.get(&0).map(String::as_str)),
        (2, Some("tax"))
    );
    r.issue([patch("tax"), step("s1", "charge")], t(9)).unwrap();
    assert!(
        r.take_writes().is_empty(),
        "a matched marker is not written again"
    );
}

#[test]
fn a_history_from_before_the_patch_has_no_marker_where_it_is_asked() {
    let h = History::default()
        .scheduled(0, "s1", "charge")
        .completed(1, "s1", Ok(json!(1)));
    let r = h.replay();
    let p = r.patches();
    assert_eq!(p.recorded, 1);
    assert!(p.markers.is_empty());
}

#[test]
fn a_marker_the_code_no_longer_asks_for_is_a_divergence() {
    let h = History::default()
        .at(
            1,
            Event::PatchMarked {
                patch_id: "tax".into(),
            },
        )
        .scheduled(1, "s1", "charge");
    let mut r = h.replay();
    let d = r.issue([step("s1", "charge")], t(2)).unwrap_err();
    assert_eq!(d.kind, DivergenceKind::Command);
    assert_eq!((d.event, d.expected.as_str()), (1, "patch \"tax\""));
    let mut r = History::default()
        .at(
            1,
            Event::PatchMarked {
                patch_id: "tax".into(),
            },
        )
        .replay();
    let d = r.issue([patch("vat")], t(2)).unwrap_err();
    assert_eq!(d.found, "patch \"vat\"");
}

#[test]
fn a_reopened_run_runs_the_step_that_ended_it_again_and_keeps_the_others() {
    let boom = || Err(Error::retryable("down"));
    let h = History::default()
        .scheduled(0, "s1", "charge")
        .completed(1, "s1", Ok(json!(1)))
        // A handled error: the workflow went on to schedule s3 after it.
        .scheduled(2, "s2", "probe")
        .completed(3, "s2", boom())
        .scheduled(4, "s3", "ship")
        .completed(5, "s3", boom())
        .at(
            6,
            Event::RunFailed {
                error: Error::retryable("down"),
            },
        )
        .at(7, Event::RunRetried);
    let mut r = h.replay();
    let one = |r: &mut Replay<()>| r.next_delivery().map(|d| d.expect("no divergence").what);
    r.issue([step("s1", "charge")], t(8)).unwrap();
    assert_eq!(one(&mut r), Some(step_ok("s1", json!(1))));
    r.issue([step("s2", "probe")], t(8)).unwrap();
    let d = one(&mut r);
    assert!(matches!(&d, Some(Delivered::Step { step_id, result: Err(_) }) if step_id == "s2"));
    r.issue([step("s3", "ship")], t(8)).unwrap();
    assert_eq!(one(&mut r), None, "s3's error is void");
    assert_eq!(effects(&mut r), [attempt("s3", 1)]);
    assert!(
        r.take_writes().is_empty(),
        "s3's scheduling is recorded already"
    );
    r.attempt_finished(&"s3".into(), 1, Ok(json!(3)), t(9), backoff());
    assert_eq!(kinds(&r.take_writes()), ["step_completed"]);
    assert_eq!(deliveries(&mut r), [step_ok("s3", json!(3))]);
    assert!(r.returned(Ok(json!(4)), t(10)).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Child runs

fn start_child(child_key: &str, workflow: &'static str) -> Command<()> {
    Command::StartChild(ChildCall {
        queue: None,
        child_key: child_key.into(),
        workflow,
        input: json!([]),
        hook: None,
        timeout: None,
        detached: false,
    })
}

fn child_notice(id: u64, child: RunId, output: Value) -> Inbound {
    Inbound {
        id,
        token: CHILD_NOTICE_TOKEN.into(),
        payload: serde_json::to_value(ChildNotice {
            child,
            status: crate::store::RunStatus::Completed,
            output: Some(output),
            error: None,
        })
        .unwrap(),
    }
}

#[test]
fn a_new_child_start_asks_the_store_and_records_nothing_itself() {
    let mut r = History::default().replay();
    r.issue([start_child("ch_0", "ship")], t(1)).unwrap();
    assert!(r.take_writes().is_empty());
    assert_eq!(
        effects(&mut r),
        [Effect::StartChild {
            child_key: "ch_0".into()
        }]
    );
    assert_eq!(r.child("ch_0".into()).map(|c| c.workflow), Some("ship"));
    let child = RunId::new();
    r.child_started("ch_0".into(), child, None, t(2));
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildStarted {
            refused: None,
            child_key: "ch_0".into(),
            child_id: child,
            conflict: None
        }]
    );
    assert!(r.child("ch_0".into()).is_none());
}

#[test]
fn a_recorded_child_is_replayed_and_never_started_again() {
    let child = RunId::new();
    let mut r = History::default()
        .at(
            1,
            Event::ChildStarted {
                refused: None,
                child_key: "ch_0".into(),
                child_id: child,
                workflow: "ship".into(),
                conflict: None,
            },
        )
        .at(
            5,
            Event::ChildEnded {
                child_id: child,
                payload_id: 9,
                result: Ok(json!("parcel")),
            },
        )
        .replay();
    r.issue([start_child("ch_0", "ship")], t(10)).unwrap();
    assert!(effects(&mut r).is_empty());
    assert_eq!(
        r.next_delivery().unwrap().unwrap().what,
        Delivered::ChildStarted {
            refused: None,
            child_key: "ch_0".into(),
            child_id: child,
            conflict: None
        }
    );
    r.issue([Command::AwaitChild { child_id: child }], t(10))
        .unwrap();
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildEnded {
            child_id: child,
            result: Ok(json!("parcel"))
        }]
    );
    // Its notice, still read from the inbox, is not delivered a second time.
    r.add_payloads([child_notice(9, child, json!("parcel"))]);
    assert!(!r.deliver_child_end(t(11)));
    assert!(r.take_writes().is_empty());
}

#[test]
fn another_child_workflow_diverges() {
    let mut r = History::default()
        .at(
            1,
            Event::ChildStarted {
                refused: None,
                child_key: "ch_0".into(),
                child_id: RunId::new(),
                workflow: "ship".into(),
                conflict: None,
            },
        )
        .replay();
    let d = divergence(&mut r, vec![start_child("ch_0", "refund")]);
    assert_eq!(d.kind, DivergenceKind::Command);
    assert!(
        d.expected.contains("ship") && d.found.contains("refund"),
        "{d}"
    );
}

#[test]
fn a_child_end_is_recorded_when_awaited_not_when_read() {
    let child = RunId::new();
    let mut r = History::default()
        .at(
            1,
            Event::ChildStarted {
                refused: None,
                child_key: "ch_0".into(),
                child_id: child,
                workflow: "ship".into(),
                conflict: None,
            },
        )
        .replay();
    r.issue([start_child("ch_0", "ship")], t(2)).unwrap();
    deliveries(&mut r);
    // Read before the workflow awaits it: kept, not recorded.
    r.add_payloads([child_notice(4, child, json!(7))]);
    assert!(!r.deliver_child_end(t(3)));
    assert!(r.take_writes().is_empty());
    // Awaited: recorded with its inbox id, then delivered.
    r.issue([Command::AwaitChild { child_id: child }], t(5))
        .unwrap();
    assert!(r.is_idle(), "a parent waiting for its child may be evicted");
    assert!(r.deliver_child_end(t(6)));
    let w = r.take_writes();
    assert_eq!(
        w.events[0].event,
        Event::ChildEnded {
            child_id: child,
            payload_id: 4,
            result: Ok(json!(7))
        }
    );
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildEnded {
            child_id: child,
            result: Ok(json!(7))
        }]
    );
    assert!(!r.deliver_child_end(t(7)));
}

#[test]
fn a_child_notice_is_not_a_hook_payload() {
    let child = RunId::new();
    let mut r = History::default().registered(1, "hk_0", "x", None).replay();
    r.issue([hook("hk_0", "x")], t(2)).unwrap();
    deliveries(&mut r);
    r.add_payloads([child_notice(3, child, json!(1))]);
    assert!(!r.deliver_payload(|_| true, t(4)));
}

#[test]
fn a_shared_child_end_read_from_its_record_is_recorded_when_awaited() {
    let (child, recorded) = (RunId::new(), RunId::new());
    let started = |child_key: &str, child_id| Event::ChildStarted {
        refused: None,
        child_key: child_key.into(),
        child_id,
        workflow: "ship".into(),
        conflict: None,
    };
    // A fork's history: two children of its original, the second one's end recorded.
    let mut r = History::default()
        .at(1, started("ch_0", child))
        .at(2, started("ch_1", recorded))
        .at(
            3,
            Event::ChildEnded {
                child_id: recorded,
                payload_id: 9,
                result: Ok(json!(2)),
            },
        )
        .replay();
    r.issue(
        [start_child("ch_0", "ship"), start_child("ch_1", "ship")],
        t(4),
    )
    .unwrap();
    // The two starts, one at a time (the workflow awaits the ends after both).
    for _ in 0..2 {
        assert!(matches!(
            r.next_delivery().unwrap().unwrap().what,
            Delivered::ChildStarted { .. }
        ));
    }
    assert!(r.unread_child_ends().is_empty(), "nothing awaited yet");
    r.issue(
        [
            Command::AwaitChild { child_id: child },
            Command::AwaitChild { child_id: recorded },
        ],
        t(5),
    )
    .unwrap();
    // The recorded end comes from the history; the other one is for the driver to read.
    assert_eq!(r.unread_child_ends(), [child]);
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildEnded {
            child_id: recorded,
            result: Ok(json!(2))
        }]
    );
    r.child_end_read(child, Ok(json!(1)));
    assert!(r.unread_child_ends().is_empty());
    assert!(r.deliver_child_end(t(6)));
    assert_eq!(
        r.take_writes().events[0].event,
        Event::ChildEnded {
            child_id: child,
            payload_id: 0,
            result: Ok(json!(1))
        }
    );
    assert_eq!(
        deliveries(&mut r),
        [Delivered::ChildEnded {
            child_id: child,
            result: Ok(json!(1))
        }]
    );
}
