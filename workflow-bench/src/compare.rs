//! `--against <rev>`: the same scenarios measured by another revision's build and by this one,
//! alternately, in back-to-back pairs, printed side by side with the ratio of their medians.
//!
//! The other revision is built once from `git archive` into `target/bench-compare/<commit>/`
//! (its binary kept there; later comparisons against the same commit reuse it), with one
//! target directory shared by every revision built so, so only what changed is compiled again.
//! Each pair runs the two builds one after the other, the order alternating between pairs
//! (old, new; new, old; ..), so a drift of the machine's load weighs on both alike. Figures are
//! read from the table each build prints, which every revision of the harness prints the same
//! way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::BoxResult;

/// The arguments of one invocation of a build: everything the user gave except the
/// comparison's own options.
pub struct Comparison {
    pub against: String,
    pub pairs: u32,
    pub args: Vec<String>,
}

/// One figure of one invocation: its row's key, its median and its unit.
#[derive(Debug, Clone, PartialEq)]
struct Figure {
    value: f64,
    /// `µs` for every time, `/s`, or the printed unit.
    unit: String,
}

/// A row's key: scenario, store, figure.
type Key = (String, String, String);

pub fn compare(c: &Comparison) -> BoxResult<()> {
    let root = git(&["rev-parse", "--show-toplevel"], None)?;
    let root = PathBuf::from(root.trim());
    let commit = git(
        &[
            "rev-parse",
            "--verify",
            &format!("{}^{{commit}}", c.against),
        ],
        Some(&root),
    )
    .map_err(|e| format!("`{}` is not a revision of this repository: {e}", c.against))?;
    let commit = commit.trim().to_owned();
    let old = build(&root, &commit)?;
    let new = std::env::current_exe()?;
    let short = &commit[..commit.len().min(9)];

    let mut old_runs: Vec<BTreeMap<Key, Figure>> = Vec::new();
    let mut new_runs: Vec<BTreeMap<Key, Figure>> = Vec::new();
    let mut order: Vec<Key> = Vec::new();
    for pair in 0..c.pairs {
        let first_old = pair % 2 == 0;
        for is_old in [first_old, !first_old] {
            let (bin, name) = if is_old {
                (&old, short)
            } else {
                (&new, "this build")
            };
            eprintln!("pair {} of {}: {name}", pair + 1, c.pairs);
            let table = run(bin, &c.args)?;
            let figures = parse(&table);
            if figures.is_empty() {
                return Err(format!("{name} printed no figures:\n{table}").into());
            }
            for (key, _) in &figures {
                if !order.contains(key) {
                    order.push(key.clone());
                }
            }
            let figures: BTreeMap<Key, Figure> = figures.into_iter().collect();
            if is_old {
                old_runs.push(figures);
            } else {
                new_runs.push(figures);
            }
        }
    }
    print!("{}", render(short, &order, &old_runs, &new_runs));
    Ok(())
}

/// Runs `git args` (in `dir` when given); its standard output.
fn git(args: &[&str], dir: Option<&Path>) -> BoxResult<String> {
    let mut cmd = Command::new("git");
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let out = cmd.args(args).stderr(Stdio::piped()).output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr)
            .trim()
            .to_owned()
            .into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The release build of workflow-bench at `commit`, built unless kept from an earlier
/// comparison.
fn build(root: &Path, commit: &str) -> BoxResult<PathBuf> {
    let base = root.join("target").join("bench-compare");
    let dir = base.join(commit);
    let bin = dir.join("workflow-bench");
    if bin.exists() {
        eprintln!("using the build of {commit} kept in {}", dir.display());
        return Ok(bin);
    }
    let src = dir.join("src");
    if src.exists() {
        std::fs::remove_dir_all(&src)?;
    }
    std::fs::create_dir_all(&src)?;
    eprintln!("extracting {commit} into {}", src.display());
    let archive = Command::new("git")
        .current_dir(root)
        .args(["archive", "--format=tar", commit])
        .stdout(Stdio::piped())
        .spawn()?;
    let untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&src)
        .stdin(archive.stdout.ok_or("git archive gave no output")?)
        .status()?;
    if !untar.success() {
        return Err(format!("could not extract {commit}").into());
    }
    eprintln!("building workflow-bench at {commit} (release)");
    let built = Command::new(env_or("CARGO", "cargo"))
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", base.join("target"))
        .args([
            "build",
            "--release",
            "-p",
            "workflow-bench",
            "--all-features",
        ])
        .status()?;
    if !built.success() {
        return Err(format!("workflow-bench did not build at {commit}").into());
    }
    let exe = format!("workflow-bench{}", std::env::consts::EXE_SUFFIX);
    std::fs::copy(base.join("target").join("release").join(exe), &bin)?;
    Ok(bin)
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Runs `bin args`; its standard output (its progress goes to the terminal).
fn run(bin: &Path, args: &[String]) -> BoxResult<String> {
    let out = Command::new(bin)
        .args(args)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("{} {} failed", bin.display(), args.join(" ")).into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The figures of a printed table, in its order: the rows after the header's rule, whose
/// columns are separated by two spaces or more (scenario, store, figure, median (min .. max),
/// ..).
fn parse(table: &str) -> Vec<(Key, Figure)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in table.lines() {
        if line.starts_with("---") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        if line.trim().is_empty() {
            break;
        }
        let cells: Vec<&str> = line
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        if cells.len() < 4 {
            continue;
        }
        if let Some(figure) = median_of(cells[3]) {
            let key = (
                cells[0].to_owned(),
                cells[1].to_owned(),
                cells[2].to_owned(),
            );
            rows.push((key, figure));
        }
    }
    rows
}

/// The median of a printed figure such as `214 µs (197 .. 216)`, `5996 /s (..)` or `1.92 ms`,
/// times in µs.
fn median_of(cell: &str) -> Option<Figure> {
    let head = cell.split(" (").next()?.trim();
    let mut parts = head.splitn(2, ' ');
    let value: f64 = parts.next()?.parse().ok()?;
    let unit = parts.next().unwrap_or("").trim();
    let (value, unit) = match unit {
        "s" => (value * 1e6, "µs"),
        "ms" => (value * 1e3, "µs"),
        "µs" => (value, "µs"),
        "KiB" => (value * 1024.0, "B"),
        "MiB" => (value * 1024.0 * 1024.0, "B"),
        other => (value, other),
    };
    Some(Figure {
        value,
        unit: unit.to_owned(),
    })
}

/// The side-by-side table: per figure, the old build's medians, this build's, and the ratio of
/// their medians (this ÷ old), with which way is better.
fn render(
    old_name: &str,
    order: &[Key],
    old: &[BTreeMap<Key, Figure>],
    new: &[BTreeMap<Key, Figure>],
) -> String {
    let mut lines = vec![[
        "scenario".to_owned(),
        "store".to_owned(),
        "figure".to_owned(),
        format!("{old_name} (each pair)"),
        "this build (each pair)".to_owned(),
        "this ÷ old (medians)".to_owned(),
    ]];
    for key in order {
        let pick = |runs: &[BTreeMap<Key, Figure>]| -> Vec<Figure> {
            runs.iter().filter_map(|r| r.get(key).cloned()).collect()
        };
        let (a, b) = (pick(old), pick(new));
        let unit = a.first().or(b.first()).map(|f| f.unit.clone());
        let show = |v: &[Figure]| {
            if v.is_empty() {
                return "-".to_owned();
            }
            let unit = unit.as_deref().unwrap_or("");
            let shown: Vec<String> = v.iter().map(|f| crate::report::num(f.value)).collect();
            format!("{} {unit}", shown.join(" / "))
                .trim_end()
                .to_owned()
        };
        let values = |v: &[Figure]| v.iter().map(|f| f.value).collect::<Vec<_>>();
        let (ma, mb) = (
            crate::report::median(&values(&a)),
            crate::report::median(&values(&b)),
        );
        let ratio = if ma.is_finite() && mb.is_finite() && ma != 0.0 {
            let better = match unit.as_deref() {
                Some("/s") => "higher is better",
                Some("µs") | Some("B") => "lower is better",
                _ => "",
            };
            format!("{} {better}", crate::report::num(mb / ma))
                .trim_end()
                .to_owned()
        } else {
            "-".to_owned()
        };
        lines.push([
            key.0.clone(),
            key.1.clone(),
            key.2.clone(),
            show(&a),
            show(&b),
            ratio,
        ]);
    }
    let mut widths = [0usize; 6];
    for l in &lines {
        for (i, c) in l.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::from("\n");
    for (n, l) in lines.iter().enumerate() {
        let mut s = String::new();
        for (i, c) in l.iter().enumerate() {
            s.push_str(c);
            s.push_str(&" ".repeat(widths[i] - c.chars().count() + 2));
        }
        out.push_str(s.trim_end());
        out.push('\n');
        if n == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 10));
            out.push('\n');
        }
    }
    out.push_str("times in µs; µs and B: lower is better; /s: higher is better\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
workflow-bench common — 1 trial(s) per figure
scenario  store   figure                 median (min .. max)  × commit  target        
------------------------------------------------------------------------------------
baseline  sqlite  commit                 131 µs (128 .. 172)
W1        sqlite  per step               1.92 ms (1.80 .. 2.00)  14.7×  ≤ 250 µs  MISSED
W3        sqlite  workflows/s            5996 /s (5441 .. 6234)  0.167×  ≥ 5000 /s  met

W3 sqlite 5996 /s
";

    #[test]
    fn reads_each_row_s_median_in_one_unit() {
        let rows = parse(TABLE);
        let keys: Vec<&str> = rows.iter().map(|(k, _)| k.0.as_str()).collect();
        assert_eq!(keys, ["baseline", "W1", "W3"]);
        assert_eq!(
            rows[1].1,
            Figure {
                value: 1920.0,
                unit: "µs".into()
            }
        );
        assert_eq!(rows[2].0 .2, "workflows/s");
        assert_eq!(rows[2].1.value, 5996.0);
        assert_eq!(rows[2].1.unit, "/s");
    }

    #[test]
    fn the_ratio_is_of_the_medians_of_the_pairs() {
        let key: Key = ("W3".into(), "sqlite".into(), "workflows/s".into());
        let run = |v: f64| {
            BTreeMap::from([(
                key.clone(),
                Figure {
                    value: v,
                    unit: "/s".into(),
                },
            )])
        };
        let out = render(
            "abc",
            std::slice::from_ref(&key),
            &[run(100.0), run(120.0), run(110.0)],
            &[run(220.0), run(200.0), run(240.0)],
        );
        assert!(out.contains("100 / 120 / 110 /s"), "{out}");
        assert!(out.contains("2.00 higher is better"), "{out}");
    }
}
