//! Timers: recorded and due, fired at their time, replayed with the recorded fire time.

use super::*;

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
