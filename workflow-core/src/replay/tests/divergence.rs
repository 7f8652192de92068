//! Divergence: a replay that asks for other commands than the history holds, or returns
//! before its history is delivered.

use super::*;

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
