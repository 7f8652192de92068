//! Ends, eviction and resumption: what a run's end records, when a run is idle, and a run
//! picked up again from its history.

use super::*;

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
    let mut r: Replay<()> = Replay::new(records, measure());
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
