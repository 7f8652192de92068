//! Figures, targets and the printed table.

use std::fmt::Write as _;

/// What a figure measures. Times are kept in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unit {
    /// A duration, in µs.
    Micros,
    /// Items per second.
    PerSec,
    /// Bytes.
    Bytes,
    /// A plain count.
    Count,
}

/// A figure's target, judged on the median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// At most this value (in the row's unit).
    AtMost(f64),
    /// At least this value.
    AtLeast(f64),
    /// Exactly this value.
    Exactly(f64),
    /// At most this multiple of the baseline commit (times only).
    AtMostCommits(f64),
    /// No slower than this reference median, within the given noise factor.
    NoSlowerThan(f64, f64),
}

/// One line of the table: one figure, one sample per trial.
#[derive(Debug, Clone)]
pub struct Row {
    pub scenario: String,
    pub store: String,
    pub metric: String,
    pub unit: Unit,
    pub samples: Vec<f64>,
    pub target: Option<Target>,
}

impl Row {
    pub fn new(scenario: &str, store: &str, metric: impl Into<String>, unit: Unit) -> Row {
        Row {
            scenario: scenario.to_owned(),
            store: store.to_owned(),
            metric: metric.into(),
            unit,
            samples: Vec::new(),
            target: None,
        }
    }

    pub fn target(mut self, t: Target) -> Row {
        self.target = Some(t);
        self
    }

    pub fn samples(mut self, s: Vec<f64>) -> Row {
        self.samples = s;
        self
    }

    pub fn median(&self) -> f64 {
        median(&self.samples)
    }

    fn verdict(&self, baseline_us: Option<f64>) -> (String, &'static str) {
        let Some(t) = self.target else {
            return (String::new(), "");
        };
        let m = self.median();
        let (text, ok) = match t {
            Target::AtMost(v) => (format!("≤ {}", self.fmt_one(v)), m <= v),
            Target::AtLeast(v) => (format!("≥ {}", self.fmt_one(v)), m >= v),
            Target::Exactly(v) => (format!("= {v:.0}"), m == v),
            Target::AtMostCommits(k) => match baseline_us {
                Some(b) => (format!("≤ {k}× commit"), m <= k * b),
                None => (format!("≤ {k}× commit"), false),
            },
            Target::NoSlowerThan(r, noise) => (format!("≤ first tenth × {noise}"), m <= r * noise),
        };
        (text, if ok { "met" } else { "MISSED" })
    }

    fn scale(&self) -> (f64, &'static str) {
        let m = self.median().abs();
        match self.unit {
            Unit::Micros if m >= 1e6 => (1e6, "s"),
            Unit::Micros if m >= 1e3 => (1e3, "ms"),
            Unit::Micros => (1.0, "µs"),
            Unit::PerSec => (1.0, "/s"),
            Unit::Bytes if m >= 1024.0 * 1024.0 => (1024.0 * 1024.0, "MiB"),
            Unit::Bytes if m >= 1024.0 => (1024.0, "KiB"),
            Unit::Bytes => (1.0, "B"),
            Unit::Count => (1.0, ""),
        }
    }

    fn fmt_one(&self, v: f64) -> String {
        let (div, unit) = match self.unit {
            Unit::Micros if v >= 1e6 => (1e6, "s"),
            Unit::Micros if v >= 1e3 => (1e3, "ms"),
            Unit::Micros => (1.0, "µs"),
            Unit::PerSec => (1.0, "/s"),
            Unit::Bytes if v >= 1024.0 => (1024.0, "KiB"),
            Unit::Bytes => (1.0, "B"),
            Unit::Count => (1.0, ""),
        };
        format!(
            "{}{}{unit}",
            num(v / div),
            if unit.is_empty() { "" } else { " " }
        )
    }

    fn figure(&self) -> String {
        if self.samples.is_empty() {
            return "-".to_owned();
        }
        let (div, unit) = self.scale();
        let lo = self.samples.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self
            .samples
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let m = self.median();
        let space = if unit.is_empty() { "" } else { " " };
        let num = |v: f64| {
            if self.unit == Unit::Count {
                format!("{v:.0}")
            } else {
                num(v)
            }
        };
        if self.samples.len() == 1 {
            format!("{}{space}{unit}", num(m / div))
        } else {
            format!(
                "{}{space}{unit} ({} .. {})",
                num(m / div),
                num(lo / div),
                num(hi / div)
            )
        }
    }

    /// The median as a multiple of the baseline commit: times directly, rates as time per item.
    fn ratio(&self, baseline_us: Option<f64>) -> String {
        let (Some(b), false) = (baseline_us, self.samples.is_empty()) else {
            return String::new();
        };
        let m = self.median();
        match self.unit {
            Unit::Micros => format!("{}×", num(m / b)),
            Unit::PerSec if m > 0.0 => format!("{}×", num(1e6 / m / b)),
            _ => String::new(),
        }
    }
}

/// Three significant digits, without a float's noise.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".to_owned()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The `p`-th percentile (0..=100) by nearest rank.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// Everything one invocation measured.
#[derive(Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// `W<n> <store> <figure> <unit>` lines.
    pub wlines: Vec<String>,
    /// Things the reader must know (skipped stores, substitutions).
    pub notes: Vec<String>,
    /// The baseline SQLite commit, µs.
    pub baseline_us: Option<f64>,
}

impl Report {
    pub fn push(&mut self, row: Row) {
        self.rows.push(row);
    }

    pub fn note(&mut self, s: impl Into<String>) {
        let s = s.into();
        eprintln!("note: {s}");
        self.notes.push(s);
    }

    pub fn render(&self, title: &str) -> String {
        let header = [
            "scenario",
            "store",
            "figure",
            "median (min .. max)",
            "× commit",
            "target",
            "",
        ];
        let mut lines: Vec<[String; 7]> = Vec::new();
        for r in &self.rows {
            let (t, v) = r.verdict(self.baseline_us);
            lines.push([
                r.scenario.clone(),
                r.store.clone(),
                r.metric.clone(),
                r.figure(),
                r.ratio(self.baseline_us),
                t,
                v.to_owned(),
            ]);
        }
        let mut w = [0usize; 7];
        for (i, h) in header.iter().enumerate() {
            w[i] = h.chars().count();
        }
        for l in &lines {
            for (i, c) in l.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let pad = |s: &str, n: usize, right: bool| {
            let k = n.saturating_sub(s.chars().count());
            if right {
                format!("{}{s}", " ".repeat(k))
            } else {
                format!("{s}{}", " ".repeat(k))
            }
        };
        let mut out = String::new();
        let _ = writeln!(out, "{title}");
        let fmt_line = |cells: [&str; 7]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                let right = i == 3 || i == 4;
                s.push_str(&pad(c, w[i], right));
                s.push_str("  ");
            }
            s.trim_end().to_owned()
        };
        let _ = writeln!(out, "{}", fmt_line(header));
        let total: usize = w.iter().sum::<usize>() + 2 * 6;
        let _ = writeln!(out, "{}", "-".repeat(total));
        for l in &lines {
            let cells: [&str; 7] = std::array::from_fn(|i| l[i].as_str());
            let _ = writeln!(out, "{}", fmt_line(cells));
        }
        if !self.wlines.is_empty() {
            out.push('\n');
            for l in &self.wlines {
                let _ = writeln!(out, "{l}");
            }
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                let _ = writeln!(out, "note: {n}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn ratios_and_verdicts() {
        let r = Row::new("s", "sqlite", "per step", Unit::Micros)
            .samples(vec![200.0, 180.0, 220.0])
            .target(Target::AtMostCommits(1.5));
        assert_eq!(r.ratio(Some(100.0)), "2.00×");
        assert_eq!(r.verdict(Some(100.0)).1, "MISSED");
        assert_eq!(r.verdict(Some(150.0)).1, "met");
        assert_eq!(r.figure(), "200 µs (180 .. 220)");
        let t = Row::new("t", "sqlite", "steps/s", Unit::PerSec).samples(vec![10_000.0]);
        assert_eq!(t.ratio(Some(200.0)), "0.500×");
    }
}
