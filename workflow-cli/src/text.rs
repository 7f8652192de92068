//! Text for people: times, durations, one-line JSON, aligned tables, and the escaping that
//! keeps what a store holds from steering the terminal it is printed on.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::SystemTime;

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

/// The zone times are shown in, set once by `--tz`; UTC until then.
static ZONE: OnceLock<TimeZone> = OnceLock::new();

/// A time zone named by a person: an IANA name (`Europe/Paris`), `UTC`, or `local` for this
/// machine's zone.
pub fn parse_zone(name: &str) -> Result<TimeZone, String> {
    let name = name.trim();
    let zone = if name.eq_ignore_ascii_case("utc") {
        // Needs no time zone database.
        Ok(TimeZone::UTC)
    } else if name.eq_ignore_ascii_case("local") {
        TimeZone::try_system().map_err(|e| format!("cannot read this machine's time zone: {e}"))
    } else {
        TimeZone::get(name).map_err(|e| format!("unknown time zone `{name}` ({e}); use an IANA name, e.g. Europe/Paris, UTC or local"))
    }?;
    Ok(zone)
}

/// Shows every time from now on in `zone` (the first call wins).
pub fn set_zone(zone: TimeZone) {
    let _ = ZONE.set(zone);
}

/// `2024-05-01T12:00:00.123Z`: RFC 3339 in UTC with milliseconds, whatever `--tz` says (the
/// JSON the commands and the dashboard's API print).
pub fn rfc3339(t: SystemTime) -> String {
    // A civil time, not a `Timestamp`: the stores' latest time (9999-12-31T23:59:59Z, "never")
    // lies past the last instant jiff can put in every zone.
    let ms = i64::try_from(workflow_core::store::to_millis(t)).unwrap_or(i64::MAX);
    DateTime::constant(1970, 1, 1, 0, 0, 0, 0)
        .checked_add(SignedDuration::from_millis(ms))
        .unwrap_or(DateTime::MAX)
        .strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// `t` for people: RFC 3339 with milliseconds in the zone `--tz` chose, `Z` for UTC
/// (`2024-05-01T12:00:00.123Z`), the offset otherwise (`2024-05-01T14:00:00.123+02:00`).
pub fn time(t: SystemTime) -> String {
    time_in(t, ZONE.get())
}

fn time_in(t: SystemTime, zone: Option<&TimeZone>) -> String {
    let zone = zone.filter(|z| z.iana_name() != Some("UTC"));
    let ms = i64::try_from(workflow_core::store::to_millis(t)).ok();
    match (zone, ms.and_then(|ms| Timestamp::from_millisecond(ms).ok())) {
        (Some(zone), Some(ts)) => ts
            .to_zoned_datetime(zone.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
            .to_string(),
        // UTC, or later than any zone can show (only "never" is): in UTC.
        _ => rfc3339(t),
    }
}

/// `850ms`, `2.35s`, `4m 12s`, `3h 05m`, `2d 04h`.
pub fn duration_ms(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => {
            let text = format!("{:.2}", ms as f64 / 1000.0);
            format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
        }
        60_000..3_600_000 => format!("{}m {:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `v` as compact JSON, cut to `max` characters with `…`.
pub fn json_line(v: &Value, max: usize) -> String {
    cut(&v.to_string(), max)
}

/// `s` cut to `max` characters with `…`.
pub fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// Whether printing `c` raw could move the cursor, recolour or retitle the terminal, or reorder
/// the text around it: C0 and C1 controls, DEL, and the bidirectional marks, embeddings,
/// overrides and isolates (a token shown `abc` that is really `cba` is a lie on screen).
fn unsafe_on_screen(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character a terminal would act on written as `\uXXXX` instead, line breaks
/// kept when `keep_newlines`. The escape is JSON's own, so JSON output stays valid and decodes to
/// the same value: raw such characters can only sit inside its strings (serde_json already
/// escapes C0 there; DEL, C1 and the bidi marks it leaves raw).
pub fn printable(s: &str, keep_newlines: bool) -> String {
    if !s.chars().any(unsafe_on_screen) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if unsafe_on_screen(c) && !(keep_newlines && c == '\n') {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// Columns aligned with spaces (comfy-table, without borders), two between columns; the last
/// column is never padded. Widths are display widths, so wide characters keep the columns
/// straight. Cells are made [`printable`] on one line, so a value cannot break a row or forge
/// one; rows are never wrapped to the terminal's width, so each stays one line for `grep`,
/// `cut` and copying ids.
pub struct Table {
    inner: comfy_table::Table,
}

impl Table {
    pub fn new<const N: usize>(header: [&str; N]) -> Self {
        let mut inner = comfy_table::Table::new();
        inner
            .load_preset(comfy_table::presets::NOTHING)
            .set_header(header);
        for (i, column) in inner.column_iter_mut().enumerate() {
            column.set_padding((0, if i + 1 == N { 0 } else { 2 }));
        }
        Table { inner }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.inner.add_row(
            cells
                .iter()
                .map(|c| printable(c, false))
                .collect::<Vec<_>>(),
        );
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for line in self.inner.lines() {
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn formats_times() {
        let t = |ms: u64| rfc3339(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(t(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(t(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(t(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(t(253_402_300_799_000), "9999-12-31T23:59:59.000Z");
        // Sub-millisecond parts are cut, not rounded.
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_999)),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(time(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn formats_times_in_a_zone_across_dst() {
        let paris = parse_zone("Europe/Paris").unwrap();
        let t = |ms: u64| time_in(UNIX_EPOCH + Duration::from_millis(ms), Some(&paris));
        // 2026-03-29 01:00 UTC: Paris moves from +01:00 to +02:00, 02:00-03:00 never happens.
        assert_eq!(t(1_774_745_999_999), "2026-03-29T01:59:59.999+01:00");
        assert_eq!(t(1_774_746_000_000), "2026-03-29T03:00:00.000+02:00");
        // 2026-10-25 01:00 UTC: back to +01:00, 02:00-03:00 happens twice.
        assert_eq!(t(1_792_889_999_000), "2026-10-25T02:59:59.000+02:00");
        assert_eq!(t(1_792_890_000_000), "2026-10-25T02:00:00.000+01:00");
        let utc = parse_zone("UTC").unwrap();
        assert_eq!(
            time_in(
                UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
                Some(&utc)
            ),
            "2023-11-14T22:13:20.123Z"
        );
        // The stores' "never" is shown in UTC, whatever the zone.
        assert_eq!(t(253_402_300_799_000), "9999-12-31T23:59:59.000Z");
        let e = parse_zone("Mars/Olympus").unwrap_err();
        assert!(e.contains("unknown time zone `Mars/Olympus`"), "{e}");
    }

    #[test]
    fn formats_durations() {
        assert_eq!(duration_ms(0), "0ms");
        assert_eq!(duration_ms(999), "999ms");
        assert_eq!(duration_ms(1_000), "1s");
        assert_eq!(duration_ms(2_350), "2.35s");
        assert_eq!(duration_ms(252_000), "4m 12s");
        assert_eq!(duration_ms(11_100_000), "3h 05m");
        assert_eq!(duration_ms(187_200_000), "2d 04h");
    }

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(["ID", "STATUS", "NOTE"]);
        t.row(vec!["1".into(), "completed".into(), "x".into()]);
        t.row(vec!["22".into(), "failed".into(), String::new()]);
        assert_eq!(
            t.to_string(),
            "ID  STATUS     NOTE\n1   completed  x\n22  failed\n"
        );
        assert_eq!(cut("abcdef", 4), "abc…");
    }

    #[test]
    fn wide_characters_keep_columns_straight() {
        // `確認` is two characters but four columns wide on a terminal.
        let mut t = Table::new(["TOKEN", "RUN"]);
        t.row(vec!["確認".into(), "1".into()]);
        t.row(vec!["abcd".into(), "2".into()]);
        t.row(vec!["ok ✓".into(), "3".into()]);
        assert_eq!(t.to_string(), "TOKEN  RUN\n確認   1\nabcd   2\nok ✓   3\n");
    }

    #[test]
    fn escapes_what_a_terminal_would_act_on() {
        assert_eq!(printable("plain, é, ✓", false), "plain, é, ✓");
        assert_eq!(
            printable("a\u{1b}[2Jb\u{7}c\rd\u{7f}e\u{9b}f", false),
            "a\\u001b[2Jb\\u0007c\\u000dd\\u007fe\\u009bf"
        );
        assert_eq!(
            printable("x\u{202e}y\u{2066}z\u{200f}", false),
            "x\\u202ey\\u2066z\\u200f"
        );
        assert_eq!(printable("one\ntwo\tx", true), "one\ntwo\\u0009x");
        assert_eq!(printable("one\ntwo", false), "one\\u000atwo");
        // Inside JSON the escape is JSON's own: the text still decodes to the same string.
        let raw = "tok\u{202e}en\u{85}";
        let json = printable(&serde_json::to_string(raw).unwrap(), true);
        assert!(json.is_ascii(), "{json}");
        assert_eq!(serde_json::from_str::<String>(&json).unwrap(), raw);
    }

    #[test]
    fn cells_cannot_forge_rows() {
        let mut t = Table::new(["A", "B"]);
        t.row(vec!["x\ny  fake".into(), "\u{1b}]0;title\u{7}".into()]);
        assert_eq!(t.to_string().lines().count(), 2, "{t}");
        assert!(!t.to_string().contains('\u{1b}'));
    }
}
