//! Where each delivery stands in the history (what `history_events` and `history_bytes` read):
//! the same when a run goes live as when its history is replayed, the events the store records
//! itself (a hook's claim, a transactional step's result) included.

use super::*;
use crate::history::HistorySize;

/// The places of the deliveries ready now, in order.
fn places(r: &mut Replay<()>) -> Vec<HistorySize> {
    std::iter::from_fn(|| r.next_delivery())
        .map(|d| d.expect("no divergence").history)
        .collect()
}

fn taken(r: &mut Replay<()>) -> Vec<Event> {
    r.take_writes()
        .events
        .into_iter()
        .map(|e| e.event)
        .collect()
}

#[test]
fn a_delivery_carries_its_place_in_the_history_live_and_on_replay() {
    let mut live = History::default().replay();
    let mut written: Vec<Event> = Vec::new();
    let mut seen = Vec::new();

    // A step that fails once, then succeeds; its result is delivered before it is written,
    // as the driver does.
    live.issue([step("s1", "charge")], t(0)).unwrap();
    written.extend(taken(&mut live));
    effects(&mut live);
    let boom = Err(Error::retryable("boom"));
    live.attempt_finished(&"s1".into(), 1, boom, t(1), backoff());
    written.extend(taken(&mut live));
    live.fire_due(t(1) + backoff());
    written.extend(taken(&mut live));
    effects(&mut live);
    live.attempt_finished(&"s1".into(), 2, Ok(json!("paid")), t(1002), backoff());
    seen.extend(places(&mut live));
    written.extend(taken(&mut live));

    // A hook whose claim the store records.
    live.issue([hook("hk_0", "tok")], t(1003)).unwrap();
    written.extend(taken(&mut live));
    effects(&mut live);
    live.claimed("hk_0".into(), "tok".into(), None, t(1003));
    written.push(Event::HookRegistered {
        hook_key: "hk_0".into(),
        token: "tok".into(),
        conflict: None,
    });
    seen.extend(places(&mut live));

    // A timer.
    live.issue([timer("tmr_0", 2000)], t(1004)).unwrap();
    written.extend(taken(&mut live));
    live.fire_due(t(2000));
    seen.extend(places(&mut live));
    written.extend(taken(&mut live));

    // A step whose result the store records itself (transactional) while another step's
    // scheduling waits to be written: the store's event comes first.
    live.issue([step("s2", "debit")], t(2001)).unwrap();
    written.extend(taken(&mut live));
    effects(&mut live);
    live.issue([step("s3", "ship")], t(2002)).unwrap();
    live.attempt_recorded(&"s2".into(), 1, json!(7), t(2003));
    written.push(Event::StepCompleted {
        step_id: "s2".into(),
        result: Ok(json!(7)),
    });
    seen.extend(places(&mut live));
    written.extend(taken(&mut live));

    // Each place is the prefix of the history up to the delivered event.
    let mut prefix = Vec::new();
    let mut size = HistorySize::default();
    for e in &written {
        size.add(measure()(&mut e.clone()));
        prefix.push(size);
    }
    let at = |events: usize| prefix[events - 1];
    assert_eq!(seen, [at(4), at(5), at(7), at(9)], "{written:#?}");
    assert_eq!(live.size(), size);
    assert!(seen.windows(2).all(|w| w[0].bytes < w[1].bytes));

    // Replayed, the same deliveries stand at the same places.
    let mut history = History::default();
    for (i, e) in written.into_iter().enumerate() {
        history = history.at(i as u64, e);
    }
    let mut replayed = history.replay();
    assert_eq!(replayed.size(), size, "read from the history");
    replayed
        .issue(
            [
                step("s1", "charge"),
                hook("hk_0", "tok"),
                timer("tmr_0", 2000),
                step("s2", "debit"),
                step("s3", "ship"),
            ],
            t(5000),
        )
        .unwrap();
    assert_eq!(places(&mut replayed), seen);
}

#[test]
fn a_divergence_keeps_nothing_of_its_poll_in_the_size() {
    let mut r = History::default()
        .scheduled(1, "s1", "charge")
        .completed(2, "s1", Ok(json!(1)))
        .replay();
    let before = r.size();
    assert_eq!(before.events, 2);
    let set = Command::SetEvent {
        set_id: SetId(0),
        key: "k".into(),
        value: json!("v"),
    };
    divergence(&mut r, vec![set, step("s9", "other")]);
    assert!(r.take_writes().is_empty());
    assert_eq!(r.size(), before);
}
