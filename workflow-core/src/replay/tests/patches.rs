//! Patches and re-opened runs: patch markers recorded live and matched on replay, and a run
//! re-opened after its end.

use super::*;

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
