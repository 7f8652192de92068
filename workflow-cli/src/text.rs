//! Text for people: times, durations, one-line JSON, aligned tables, and the escaping that
//! keeps what a store holds from steering the terminal it is printed on.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// `2024-05-01T12:00:00.123Z`: UTC with milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let secs = (ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// The proleptic Gregorian date of day `z` after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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

/// Columns aligned with spaces; the last column is never padded. Cells are made
/// [`printable`] on one line, so a value cannot break a row or forge one.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<const N: usize>(header: [&str; N]) -> Self {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.iter().map(|c| printable(c, false)).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        let mut line = |cells: &[String]| -> std::fmt::Result {
            let mut out = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    out.push_str(cell);
                } else {
                    let pad = widths[i].saturating_sub(cell.chars().count());
                    let _ = write!(out, "{cell}{}  ", " ".repeat(pad));
                }
            }
            writeln!(f, "{}", out.trim_end())
        };
        line(&self.header)?;
        for row in &self.rows {
            line(row)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_times() {
        let t = |ms: u64| rfc3339(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(t(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(t(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(t(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(t(253_402_300_799_000), "9999-12-31T23:59:59.000Z");
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
