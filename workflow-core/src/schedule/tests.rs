//! Nominal times: DST gaps and folds in two zones for daily and hourly expressions, seconds,
//! leap days, fixed periods, and refused expressions and zones.

use std::time::{Duration, SystemTime};

use super::timing::{zone, CronSpec, Timing};
use crate::error::ScheduleError;

/// An RFC 3339 instant.
fn at(s: &str) -> SystemTime {
    SystemTime::try_from(s.parse::<jiff::Timestamp>().unwrap()).unwrap()
}

fn cron(expr: &str, tz: &str) -> Timing {
    Timing::cron(CronSpec::parse(expr).unwrap(), zone(tz).unwrap())
}

fn upcoming(t: &Timing, from: &str, n: usize) -> Vec<SystemTime> {
    t.upcoming(at(from), n)
}

fn ats(v: &[&str]) -> Vec<SystemTime> {
    v.iter().map(|s| at(s)).collect()
}

#[test]
fn a_daily_time_in_the_spring_gap_fires_once_at_the_gap_s_end() {
    // Paris, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:00 does not exist.
    let t = cron("0 2 * * *", "Europe/Paris");
    assert_eq!(
        upcoming(&t, "2026-03-28T00:00:00Z", 3),
        ats(&[
            "2026-03-28T01:00:00Z", // 02:00 CET
            "2026-03-29T01:00:00Z", // the first instant after the gap (03:00 CEST)
            "2026-03-30T00:00:00Z", // 02:00 CEST
        ])
    );
    // New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
    let t = cron("30 2 * * *", "America/New_York");
    assert_eq!(
        upcoming(&t, "2026-03-07T00:00:00Z", 3),
        ats(&[
            "2026-03-07T07:30:00Z",
            "2026-03-08T07:00:00Z",
            "2026-03-09T06:30:00Z",
        ])
    );
}

#[test]
fn a_daily_time_in_the_autumn_fold_fires_once_at_its_first_occurrence() {
    // Paris, 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00 UTC); 02:30 occurs twice.
    let t = cron("30 2 * * *", "Europe/Paris");
    assert_eq!(
        upcoming(&t, "2026-10-24T12:00:00Z", 2),
        ats(&["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"])
    );
    // From inside the fold's second pass, the repeated 02:30 is not fired again.
    assert_eq!(
        upcoming(&t, "2026-10-25T01:10:00Z", 1),
        ats(&["2026-10-26T01:30:00Z"])
    );
    // New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST (06:00 UTC).
    let t = cron("30 1 * * *", "America/New_York");
    assert_eq!(
        upcoming(&t, "2026-10-31T12:00:00Z", 2),
        ats(&["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"])
    );
}

#[test]
fn an_hourly_expression_follows_the_zone_across_both_changes() {
    let t = cron("0 * * * *", "Europe/Paris");
    // Spring: 01:00 CET, then 02:00 (skipped) fires at 03:00 CEST, then 04:00 CEST.
    assert_eq!(
        upcoming(&t, "2026-03-28T23:30:00Z", 3),
        ats(&[
            "2026-03-29T00:00:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T02:00:00Z",
        ])
    );
    // Autumn: 02:00 CEST fires once; the repeated 02:00 (CET) does not; then 03:00 CET.
    assert_eq!(
        upcoming(&t, "2026-10-24T23:30:00Z", 2),
        ats(&["2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z"])
    );
    let t = cron("*/30 * * * *", "America/New_York");
    assert_eq!(
        upcoming(&t, "2026-03-08T06:40:00Z", 3),
        ats(&[
            // 01:30 EST, then 02:00 and 02:30 (skipped) both at 03:00 EDT, once.
            "2026-03-08T07:00:00Z",
            "2026-03-08T07:30:00Z",
            "2026-03-08T08:00:00Z",
        ])
    );
}

#[test]
fn six_fields_put_seconds_first() {
    let t = cron("*/20 * * * * *", "UTC");
    assert_eq!(
        upcoming(&t, "2026-01-01T00:00:00Z", 3),
        ats(&[
            "2026-01-01T00:00:20Z",
            "2026-01-01T00:00:40Z",
            "2026-01-01T00:01:00Z",
        ])
    );
    // From within a second, the next match is the next whole one.
    assert_eq!(
        upcoming(&t, "2026-01-01T00:00:19.900Z", 1),
        ats(&["2026-01-01T00:00:20Z"])
    );
}

#[test]
fn a_leap_day_expression_waits_for_leap_years() {
    let t = cron("0 0 29 2 *", "UTC");
    assert_eq!(
        upcoming(&t, "2026-01-01T00:00:00Z", 2),
        ats(&["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"])
    );
}

#[test]
fn a_day_of_month_and_a_day_of_week_match_either() {
    // The 13th, or any Friday (Vixie cron): 2026-02-06 and -13 are Fridays; -13 once.
    let t = cron("0 0 13 * FRI", "UTC");
    assert_eq!(
        upcoming(&t, "2026-02-05T00:00:00Z", 3),
        ats(&[
            "2026-02-06T00:00:00Z",
            "2026-02-13T00:00:00Z",
            "2026-02-20T00:00:00Z",
        ])
    );
}

#[test]
fn a_period_ticks_at_its_multiples_since_the_epoch() {
    let t = Timing::Every(Duration::from_secs(60));
    assert_eq!(
        upcoming(&t, "2026-01-01T00:00:30Z", 2),
        ats(&["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"])
    );
    // Strictly after: a time on a tick gives the next one.
    assert_eq!(
        upcoming(&t, "2026-01-01T00:01:00Z", 1),
        ats(&["2026-01-01T00:02:00Z"])
    );
    let seven = Timing::Every(Duration::from_secs(7));
    let ticks = seven.upcoming(SystemTime::UNIX_EPOCH, 3);
    let secs: Vec<u64> = ticks
        .iter()
        .map(|t| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs())
        .collect();
    assert_eq!(secs, [7, 14, 21]);
    assert!(Timing::Every(Duration::ZERO)
        .upcoming(SystemTime::UNIX_EPOCH, 3)
        .is_empty());
}

/// The field a refused expression's error names.
fn refused_field(expr: &str) -> Option<&'static str> {
    match CronSpec::parse(expr) {
        Err(ScheduleError::Cron { field, .. }) => field,
        other => panic!("{expr:?} was not refused as a cron expression: {other:?}"),
    }
}

#[test]
fn a_refused_expression_names_its_field() {
    assert_eq!(refused_field("61 * * * *"), Some("minute"));
    assert_eq!(refused_field("* 25 * * *"), Some("hour"));
    assert_eq!(refused_field("* * 32 * *"), Some("day of month"));
    assert_eq!(refused_field("* * * 13 *"), Some("month"));
    assert_eq!(refused_field("* * * * MOO"), Some("day of week"));
    assert_eq!(refused_field("61 * * * * *"), Some("second"));
    assert_eq!(refused_field("* 61 * * * *"), Some("minute"));
    let shown = CronSpec::parse("* 25 * * *").unwrap_err().to_string();
    assert!(
        shown.contains("\"* 25 * * *\"") && shown.contains("hour"),
        "{shown}"
    );
}

#[test]
fn only_five_or_six_fields_are_accepted() {
    for expr in ["", "* * * *", "0 0 0 * * * 2030", "@daily"] {
        let err = CronSpec::parse(expr).unwrap_err();
        assert!(
            matches!(err, ScheduleError::Cron { field: None, .. }),
            "{expr:?}: {err:?}"
        );
        assert!(err.to_string().contains(&format!("{expr:?}")), "{err}");
    }
}

#[test]
fn an_unknown_zone_is_named_in_its_error() {
    let err = zone("Mars/Olympus_Mons").unwrap_err();
    assert!(matches!(err, ScheduleError::Zone { .. }));
    assert!(err.to_string().contains("Mars/Olympus_Mons"), "{err}");
    assert!(zone("UTC").is_ok());
}
