//! When a schedule ticks: the nominal times of a cron expression in a time zone, or of a fixed
//! period since the Unix epoch. A pure function of the spec and the zone, the same on every
//! worker and after every restart.
//!
//! Cron expressions are matched on the zone's civil (wall-clock) time by `croner`, on a
//! timeline without transitions, and each civil match is then placed on the real timeline by
//! `jiff`: a civil time that a DST gap skips fires once, at the first instant after the gap; a
//! civil time that a fold repeats fires once, at its first occurrence.

use std::fmt;
use std::time::{Duration, SystemTime};

use chrono::{Datelike as _, TimeZone as _, Timelike as _};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::civil;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::Timestamp;

use crate::error::ScheduleError;

/// The fields of a cron expression, in order, without and with seconds.
const FIVE: [&str; 5] = ["minute", "hour", "day of month", "month", "day of week"];
const SIX: [&str; 6] = [
    "second",
    "minute",
    "hour",
    "day of month",
    "month",
    "day of week",
];

/// A cron expression, parsed.
#[derive(Clone)]
pub(crate) struct CronSpec {
    pub(crate) expr: String,
    cron: Cron,
}

impl fmt::Debug for CronSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expr)
    }
}

impl CronSpec {
    /// Parses `expr`: 5 fields (minute, hour, day of month, month, day of week), or 6 with
    /// seconds first; names, ranges, steps and lists as in Vixie cron (a day of month and a
    /// day of week both restricted match either).
    pub(crate) fn parse(expr: &str) -> Result<Self, ScheduleError> {
        let fields: Vec<&str> = expr.split_whitespace().collect();
        let names: &[&'static str] = match fields.len() {
            5 => &FIVE,
            6 => &SIX,
            n => {
                return Err(ScheduleError::Cron {
                    expr: expr.to_owned(),
                    field: None,
                    reason: format!(
                        "it has {n} field(s); a cron expression has 5 (minute hour day-of-month \
                         month day-of-week) or 6 (with seconds first)"
                    ),
                })
            }
        };
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        match parser.parse(&fields.join(" ")) {
            Ok(cron) => Ok(CronSpec {
                expr: expr.to_owned(),
                cron,
            }),
            Err(e) => {
                // The field at fault: the one that is refused alone, the others left open.
                let field = (0..fields.len()).find_map(|i| {
                    let alone: Vec<&str> = (0..fields.len())
                        .map(|j| if i == j { fields[i] } else { "*" })
                        .collect();
                    parser.parse(&alone.join(" ")).is_err().then_some(names[i])
                });
                Err(ScheduleError::Cron {
                    expr: expr.to_owned(),
                    field,
                    reason: e.to_string(),
                })
            }
        }
    }
}

/// Parses `zone`, an IANA time zone name (`Europe/Paris`) or `UTC`.
pub(crate) fn zone(zone: &str) -> Result<TimeZone, ScheduleError> {
    TimeZone::get(zone).map_err(|e| ScheduleError::Zone {
        zone: zone.to_owned(),
        reason: e.to_string(),
    })
}

/// How a schedule ticks.
#[derive(Debug, Clone)]
pub(crate) enum Timing {
    /// At the civil times a cron expression matches, in a zone (boxed: a parsed expression
    /// is large beside a period).
    Cron(Box<CronSpec>, TimeZone),
    /// At the multiples of a period since the Unix epoch.
    Every(Duration),
}

impl Timing {
    /// At the civil times `spec` matches in `zone`.
    pub(crate) fn cron(spec: CronSpec, zone: TimeZone) -> Self {
        Timing::Cron(Box::new(spec), zone)
    }

    /// The first nominal time strictly after `from`, or `None` when there is none (a period
    /// of zero, a cron expression that matches no date before the year 5000).
    pub(crate) fn next_after(&self, from: SystemTime) -> Option<SystemTime> {
        match self {
            Timing::Every(period) => every_after(*period, from),
            Timing::Cron(spec, zone) => cron_after(spec, zone, from),
        }
    }

    /// The next `n` nominal times after `from`, in order.
    pub(crate) fn upcoming(&self, from: SystemTime, n: usize) -> Vec<SystemTime> {
        let mut times = Vec::with_capacity(n.min(1024));
        let mut at = from;
        while times.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    times.push(next);
                    at = next;
                }
                None => break,
            }
        }
        times
    }
}

/// The next multiple of `period` (in whole milliseconds) since the epoch after `from`.
fn every_after(period: Duration, from: SystemTime) -> Option<SystemTime> {
    let period = u64::try_from(period.as_millis()).ok().filter(|p| *p > 0)?;
    let since = from.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    let ms = u64::try_from(since.as_millis()).ok()?;
    let next = (ms / period).checked_add(1)?.checked_mul(period)?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(next))
}

/// Civil matches of the expression after `from`'s civil time in `zone`, each placed on the
/// timeline, until one lies after `from` (in a fold, the civil times of its second pass map to
/// instants of its first and are passed over).
fn cron_after(spec: &CronSpec, zone: &TimeZone, from: SystemTime) -> Option<SystemTime> {
    let from = Timestamp::try_from(from).ok()?;
    let mut civil = zone.to_datetime(from);
    // A fold repeats at most a few hours: bounded even for an every-second expression.
    for _ in 0..100_000 {
        let next = next_civil(&spec.cron, civil)?;
        let at = place(zone, next)?;
        if at > from {
            return SystemTime::try_from(at).ok();
        }
        civil = next;
    }
    None
}

/// The first civil time after `after` (whole seconds) that `cron` matches.
fn next_civil(cron: &Cron, after: civil::DateTime) -> Option<civil::DateTime> {
    let naive = chrono::NaiveDate::from_ymd_opt(
        i32::from(after.year()),
        u32::try_from(after.month()).ok()?,
        u32::try_from(after.day()).ok()?,
    )?
    .and_hms_opt(
        u32::try_from(after.hour()).ok()?,
        u32::try_from(after.minute()).ok()?,
        u32::try_from(after.second()).ok()?,
    )?;
    // UTC has no transitions: croner walks pure civil time.
    let next = cron
        .find_next_occurrence(&chrono::Utc.from_utc_datetime(&naive), false)
        .ok()?;
    civil::DateTime::new(
        i16::try_from(next.year()).ok()?,
        i8::try_from(next.month()).ok()?,
        i8::try_from(next.day()).ok()?,
        i8::try_from(next.hour()).ok()?,
        i8::try_from(next.minute()).ok()?,
        i8::try_from(next.second()).ok()?,
        0,
    )
    .ok()
}

/// The instant civil time `dt` names in `zone`: in a gap, the first instant after it; in a
/// fold, the first occurrence.
fn place(zone: &TimeZone, dt: civil::DateTime) -> Option<Timestamp> {
    match zone.to_ambiguous_timestamp(dt).offset() {
        AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(dt).ok(),
        AmbiguousOffset::Fold { before, .. } => before.to_timestamp(dt).ok(),
        AmbiguousOffset::Gap { after, .. } => {
            // Read with the offset after the gap, `dt` falls before the transition, within
            // the gap's length of it: the next transition is where the gap ends.
            let early = after.to_timestamp(dt).ok()?;
            zone.following(early).next().map(|t| t.timestamp())
        }
    }
}
