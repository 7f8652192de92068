//! Which of a schedule's due ticks start a run: a pure function of the schedule, its stored
//! state and the time, so it is unit-tested without a store or a clock. The overlap policy,
//! which depends on whether the previous run has ended, is applied when a tick fires.
//!
//! A tick is due once its nominal time plus the schedule's jitter has passed. A due tick is
//! missed (its time passed while no worker on the store was up) unless it fell due
//! while the worker looking at it was up (at or after the loop's `up_since`: such a tick is
//! late, not missed, and starts however late, within the catch-up window), or it is the latest
//! due tick and fell due within [`ON_TIME`] (a worker just up fires the tick of the moment).
//! Missed ticks follow the catch-up policy within the catch-up window.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use super::timing::Timing;
use crate::store::{tick_hash, CatchUp, ScheduleDef, ScheduleState, SkipReason, TICKS_KEPT};

/// How late a firing loop that just came up may look at the latest due tick and still count
/// it as on time.
pub(crate) const ON_TIME: Duration = Duration::from_secs(2);

/// A firing loop that wakes up more than this after it meant to was as good as down
/// meanwhile (its process or machine was suspended): the ticks of that span count as missed
/// and follow the catch-up policy, instead of all starting late.
pub(crate) const STALLED: Duration = Duration::from_secs(30);

/// The most nominal times one plan walks through: a cron expression ticking every second
/// and stopped for weeks is caught up over several passes.
const MAX_STEPS: usize = 200_000;

/// What to do with one due tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Start its run (subject to the overlap policy).
    Fire,
    /// Record it as skipped.
    Skip(SkipReason),
}

/// The due ticks of a schedule, oldest first, and its next nominal time after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) due: Vec<(SystemTime, Action)>,
    pub(crate) next: Option<SystemTime>,
}

/// The delay of the run of `def`'s tick at `nominal` after it: the same on every worker (a
/// hash of the name and the time), below the schedule's jitter.
pub(crate) fn jitter_of(def: &ScheduleDef, nominal: SystemTime) -> Duration {
    let jitter = u64::try_from(def.jitter.as_millis()).unwrap_or(u64::MAX);
    if jitter == 0 {
        return Duration::ZERO;
    }
    let h = tick_hash(&def.name, crate::history::to_millis(nominal));
    Duration::from_millis(h % jitter)
}

/// When `nominal`'s tick of `def` falls due.
pub(crate) fn due_at(def: &ScheduleDef, nominal: SystemTime) -> SystemTime {
    nominal + jitter_of(def, nominal)
}

/// The plan for `state` at `now`, by a firing loop up without a stall since `up_since` (see
/// the module docs). Only the latest [`TICKS_KEPT`] due ticks are in it: older ones would not
/// be kept anyway.
pub(crate) fn plan(
    timing: &Timing,
    state: &ScheduleState,
    now: SystemTime,
    up_since: Option<SystemTime>,
) -> Plan {
    let def = &state.def;
    let Some(stored) = state.next else {
        return Plan {
            due: Vec::new(),
            next: None,
        };
    };
    // The first nominal time at or after the stored one (under the current definition).
    let mut at = first_from(timing, stored);
    if let (Timing::Every(period), Some(t)) = (timing, at) {
        // A period jumps straight to the ticks that can be kept.
        let span = period.saturating_mul(u32::try_from(TICKS_KEPT + 1).unwrap_or(u32::MAX));
        if let Some(floor) = now.checked_sub(span).filter(|f| *f > t) {
            at = timing.next_after(floor);
        }
    }
    let mut due = VecDeque::new();
    for _ in 0..MAX_STEPS {
        let Some(t) = at else { break };
        if due_at(def, t) > now {
            break;
        }
        due.push_back(t);
        if due.len() > TICKS_KEPT {
            due.pop_front();
        }
        at = timing.next_after(t);
    }
    let due: Vec<SystemTime> = due.into();
    Plan {
        due: decide(state, &due, now, up_since),
        next: at,
    }
}

/// The first nominal time at or after `t`.
fn first_from(timing: &Timing, t: SystemTime) -> Option<SystemTime> {
    match t
        .checked_sub(Duration::from_millis(1))
        .filter(|b| *b >= SystemTime::UNIX_EPOCH)
    {
        Some(before) => timing.next_after(before),
        None => Some(t),
    }
}

/// The action for each of `due` (oldest first).
fn decide(
    state: &ScheduleState,
    due: &[SystemTime],
    now: SystemTime,
    up_since: Option<SystemTime>,
) -> Vec<(SystemTime, Action)> {
    let def = &state.def;
    if state.paused {
        return due
            .iter()
            .map(|t| (*t, Action::Skip(SkipReason::Paused)))
            .collect();
    }
    let on_time = due.last().is_some_and(|t| {
        now.checked_sub(ON_TIME)
            .is_none_or(|s| due_at(def, *t) >= s)
    });
    let last = due.len().saturating_sub(1);
    // Fell due while this worker was up: late, not missed.
    let live = |t: &SystemTime| up_since.is_some_and(|u| due_at(def, *t) >= u);
    let window_start = now.checked_sub(def.catch_up_window);
    let in_window = |t: &SystemTime| window_start.is_none_or(|s| *t >= s);
    let mut catch_up = match def.catch_up {
        CatchUp::None => 0,
        CatchUp::Latest => 1,
        CatchUp::All { max } => usize::try_from(max).unwrap_or(usize::MAX),
    };
    // From the latest back: the most recent missed ticks within the window, up to the
    // policy's count, start.
    let mut actions: Vec<(SystemTime, Action)> = due
        .iter()
        .enumerate()
        .rev()
        .map(|(i, t)| {
            let action = if i == last && on_time {
                Action::Fire
            } else if !in_window(t) {
                Action::Skip(SkipReason::Missed)
            } else if live(t) {
                Action::Fire
            } else if catch_up > 0 {
                catch_up -= 1;
                Action::Fire
            } else {
                Action::Skip(SkipReason::Missed)
            };
            (*t, action)
        })
        .collect();
    actions.reverse();
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Overlap, ScheduleSpec};

    fn s(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn state(next: u64, catch_up: CatchUp, window: u64, paused: bool) -> ScheduleState {
        ScheduleState {
            def: ScheduleDef {
                name: "s".into(),
                workflow: "wf".into(),
                queue: None,
                spec: ScheduleSpec::Every { period_ms: 10_000 },
                overlap: Overlap::Skip,
                catch_up,
                catch_up_window: Duration::from_secs(window),
                jitter: Duration::ZERO,
            },
            paused,
            next: Some(s(next)),
            last: None,
            last_started: None,
            buffered: None,
            last_started_live: false,
        }
    }

    const EVERY_10: Timing = Timing::Every(Duration::from_secs(10));

    fn actions(p: &Plan) -> Vec<(u64, Action)> {
        p.due
            .iter()
            .map(|(t, a)| {
                (
                    t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
                    *a,
                )
            })
            .collect()
    }

    const MISSED: Action = Action::Skip(SkipReason::Missed);

    #[test]
    fn an_on_time_tick_fires_and_nothing_else_is_due() {
        let p = plan(
            &EVERY_10,
            &state(100, CatchUp::None, 3600, false),
            s(101),
            None,
        );
        assert_eq!(actions(&p), [(100, Action::Fire)]);
        assert_eq!(p.next, Some(s(110)));
        let p = plan(
            &EVERY_10,
            &state(100, CatchUp::None, 3600, false),
            s(99),
            None,
        );
        assert_eq!((actions(&p), p.next), (vec![], Some(s(100))));
    }

    #[test]
    fn missed_ticks_follow_the_catch_up_policy() {
        // Stored next 100; back at 141: 100..130 missed, 140 on time.
        let now = s(141);
        let none = plan(
            &EVERY_10,
            &state(100, CatchUp::None, 3600, false),
            now,
            None,
        );
        assert_eq!(
            actions(&none),
            [
                (100, MISSED),
                (110, MISSED),
                (120, MISSED),
                (130, MISSED),
                (140, Action::Fire)
            ]
        );
        let latest = plan(
            &EVERY_10,
            &state(100, CatchUp::Latest, 3600, false),
            now,
            None,
        );
        assert_eq!(
            actions(&latest),
            [
                (100, MISSED),
                (110, MISSED),
                (120, MISSED),
                (130, Action::Fire),
                (140, Action::Fire)
            ]
        );
        let all = plan(
            &EVERY_10,
            &state(100, CatchUp::All { max: 2 }, 3600, false),
            now,
            None,
        );
        assert_eq!(
            actions(&all),
            [
                (100, MISSED),
                (110, MISSED),
                (120, Action::Fire),
                (130, Action::Fire),
                (140, Action::Fire)
            ]
        );
        assert_eq!(all.next, Some(s(150)));
    }

    #[test]
    fn the_window_bounds_the_catch_up_and_a_late_look_is_all_missed() {
        // Back at 145 (the tick of 140 is 5 s old: missed too), window 20 s: from 125 on.
        let now = s(145);
        let all = plan(
            &EVERY_10,
            &state(100, CatchUp::All { max: 10 }, 20, false),
            now,
            None,
        );
        assert_eq!(
            actions(&all),
            [
                (100, MISSED),
                (110, MISSED),
                (120, MISSED),
                (130, Action::Fire),
                (140, Action::Fire)
            ]
        );
        let latest = plan(&EVERY_10, &state(100, CatchUp::Latest, 3, false), now, None);
        assert!(actions(&latest).iter().all(|(_, a)| *a == MISSED));
    }

    #[test]
    fn a_paused_schedule_skips_every_due_tick() {
        let p = plan(
            &EVERY_10,
            &state(100, CatchUp::Latest, 3600, true),
            s(121),
            None,
        );
        let paused = Action::Skip(SkipReason::Paused);
        assert_eq!(actions(&p), [(100, paused), (110, paused), (120, paused)]);
        assert_eq!(p.next, Some(s(130)));
    }

    #[test]
    fn a_long_stop_keeps_only_the_ticks_that_are_kept() {
        let p = plan(
            &EVERY_10,
            &state(0, CatchUp::Latest, 60, false),
            s(1_000_000),
            None,
        );
        assert_eq!(p.due.len(), TICKS_KEPT);
        assert_eq!(p.due.last().unwrap(), &(s(1_000_000), Action::Fire));
        assert_eq!(p.next, Some(s(1_000_010)));
    }

    #[test]
    fn jitter_delays_a_tick_the_same_on_every_call_and_below_the_jitter() {
        let mut st = state(100, CatchUp::Latest, 3600, false);
        st.def.jitter = Duration::from_secs(5);
        let j = jitter_of(&st.def, s(100));
        assert!(j < Duration::from_secs(5));
        assert_eq!(j, jitter_of(&st.def, s(100)));
        let before = plan(&EVERY_10, &st, s(100) + j - Duration::from_millis(1), None);
        assert!(before.due.is_empty());
        let after = plan(&EVERY_10, &st, s(100) + j, None);
        assert_eq!(actions(&after), [(100, Action::Fire)]);
    }

    #[test]
    fn ticks_due_while_the_worker_was_up_start_late_whatever_the_policy() {
        // Up since 95, stalled from 101 to 135 (a loop that looked at 101 and again at 135,
        // not stalled in STALLED's sense): 100 to 130 fell due while it was up. With
        // `CatchUp::None` they start all the same: they were not missed.
        let p = plan(
            &EVERY_10,
            &state(100, CatchUp::None, 3600, false),
            s(135),
            Some(s(95)),
        );
        assert!(actions(&p).iter().all(|(_, a)| *a == Action::Fire), "{p:?}");
        // Up since 115 (just came up): 100 and 110 were missed and follow the policy.
        let p = plan(
            &EVERY_10,
            &state(100, CatchUp::Latest, 3600, false),
            s(135),
            Some(s(115)),
        );
        assert_eq!(
            actions(&p),
            [
                (100, MISSED),
                (110, Action::Fire),
                (120, Action::Fire),
                (130, Action::Fire)
            ]
        );
    }

    #[test]
    fn a_late_tick_beyond_the_catch_up_window_never_starts() {
        // Up since 95, looking at 145 with a window of 20 s: 100 to 120 are older than the
        // window; 130 and 140 start.
        let p = plan(
            &EVERY_10,
            &state(100, CatchUp::All { max: 10 }, 20, false),
            s(145),
            Some(s(95)),
        );
        assert_eq!(
            actions(&p),
            [
                (100, MISSED),
                (110, MISSED),
                (120, MISSED),
                (130, Action::Fire),
                (140, Action::Fire)
            ]
        );
    }
}
