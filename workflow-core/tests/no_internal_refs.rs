//! The product speaks for itself: no file of the repository cites the documents, diaries or
//! trackers it was made with. A comment, a doc line, a CLI help text or a page of the guide
//! states the fact itself ("a step is retried up to `max_retries` times"), never where the
//! fact was decided (a contract's section number, a work session, a ticket).
//!
//! The test reads every file git tracks (or, without git, every file under the repository's
//! root but `target/` and `.git/`), skips the ones that are not UTF-8 text and this file
//! (which spells the patterns out), and fails naming `file:line` for each line that holds:
//!
//! - the word `SPEC` cited as a document: followed (after spaces or a `§`) by a digit or a
//!   lower-case word, or by `'s` or `.md`. An upper-case `SPEC` standing alone, such as the
//!   CLI's table header, is not a citation;
//! - `the seed` or `the seeds` as words, `seeds'`, or `seed system` (any case): the design notes'
//!   name for the system this one was modelled on. Seeding a random generator is not matched;
//! - a path into the internal notes' folder: `..` then `/shared`;
//! - `session` or `sessions` (any case) then a space or `-` and a digit: a development log;
//! - `issue` or `issues` (any case) then a space, an optional `#`, and a digit: a ticket.
//!   Links to other projects' trackers are written as URLs (`.../issues/3150`), which this
//!   does not match, and stay allowed.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root: the workspace holding this crate.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workflow-core lives in the workspace")
        .to_path_buf()
}

/// The files to read, relative to the root.
fn files(root: &Path) -> Vec<PathBuf> {
    let listed = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty());
    match listed {
        Some(out) => out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
            .collect(),
        None => {
            let mut found = Vec::new();
            walk(root, root, &mut found);
            found
        }
    }
}

fn walk(root: &Path, dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != ".git" {
                walk(root, &path, found);
            }
        } else if let Ok(rel) = path.strip_prefix(root) {
            found.push(rel.to_path_buf());
        }
    }
}

/// Whether `line` cites an internal document; the name of the pattern it matches.
fn citation(line: &str) -> Option<&'static str> {
    let lower = line.to_lowercase();
    if spec_citation(line) {
        return Some("a contract section (SPEC ...)");
    }
    if words(&lower, "the seed") || words(&lower, "the seeds") {
        return Some("\"the seeds\"");
    }
    if lower.contains("seeds'") || lower.contains("seed system") {
        return Some("\"the seeds\"");
    }
    if line.contains(concat!("..", "/shared")) {
        return Some("a path into the internal notes");
    }
    if numbered(&lower, "session") || numbered(&lower, "sessions") {
        return Some("a development session");
    }
    if ticket(&lower, "issue") || ticket(&lower, "issues") {
        return Some("an issue number");
    }
    None
}

/// `SPEC` as a word, followed by a section number, a lower-case word, `'s` or `.md`.
fn spec_citation(line: &str) -> bool {
    occurrences(line, "SPEC").any(|(before, after)| {
        if before.is_some_and(is_word) || after.chars().next().is_some_and(is_word) {
            return false; // part of a longer identifier: `SPECS`, `MY_SPEC`
        }
        if after.starts_with("'s") || after.starts_with(".md") {
            return true;
        }
        let rest = after.trim_start_matches([' ', '\u{a7}']);
        rest.len() < after.len()
            && rest
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit() || c.is_lowercase())
    })
}

/// `phrase` with a word boundary on both sides.
fn words(text: &str, phrase: &str) -> bool {
    occurrences(text, phrase).any(|(before, after)| {
        !before.is_some_and(is_word) && !after.chars().next().is_some_and(is_word)
    })
}

/// `word` as a word, then a space or `-`, then a digit.
fn numbered(text: &str, word: &str) -> bool {
    occurrences(text, word).any(|(before, after)| {
        let mut rest = after.chars();
        !before.is_some_and(is_word)
            && matches!(rest.next(), Some(' ' | '-'))
            && rest.next().is_some_and(|c| c.is_ascii_digit())
    })
}

/// `word` as a word, then a space, an optional `#`, then a digit.
fn ticket(text: &str, word: &str) -> bool {
    occurrences(text, word).any(|(before, after)| {
        let Some(rest) = after.strip_prefix(' ') else {
            return false;
        };
        let rest = rest.strip_prefix('#').unwrap_or(rest);
        !before.is_some_and(is_word) && rest.chars().next().is_some_and(|c| c.is_ascii_digit())
    })
}

/// Each occurrence of `needle` in `text`: the character before it and the text after it.
fn occurrences<'a>(
    text: &'a str,
    needle: &'a str,
) -> impl Iterator<Item = (Option<char>, &'a str)> + 'a {
    text.match_indices(needle)
        .map(move |(at, _)| (text[..at].chars().next_back(), &text[at + needle.len()..]))
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

#[test]
fn no_file_cites_internal_documents() {
    let root = root();
    let this = Path::new(file!());
    let mut hits = Vec::new();
    let mut read = 0;
    for rel in files(&root) {
        if rel.ends_with(this) || this.ends_with(&rel) {
            continue;
        }
        let Ok(bytes) = std::fs::read(root.join(&rel)) else {
            continue; // listed by git but deleted in the working tree
        };
        let Ok(text) = String::from_utf8(bytes) else {
            continue; // not text (an image)
        };
        read += 1;
        for (n, line) in text.lines().enumerate() {
            if let Some(what) = citation(line) {
                hits.push(format!(
                    "{}:{}: {what}: {}",
                    rel.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        read > 100,
        "only {read} files were read under {}",
        root.display()
    );
    assert!(
        hits.is_empty(),
        "{} lines cite internal documents; state the fact itself instead:\n{}",
        hits.len(),
        hits.join("\n")
    );
}

/// The patterns catch what they are for and leave alone what merely looks alike.
#[test]
fn the_patterns_are_precise() {
    let cited = [
        "// Payload encryption (SPEC 18), all RustCrypto",
        "//! One clock on PostgreSQL (SPEC \u{a7}8): worker and client",
        "/// so at most four attempts (SPEC section 2).",
        "/// The error of `resume_hook` (SPEC name); the same type",
        "`reviews.next()` (SPEC 14's shape)",
        "The contract is [`../shared/SPEC.md`](../shared/SPEC.md).",
        "//! The order flow of the seeds: charge the card",
        "/// An error that is never retried (the seeds' `FatalError`).",
        "| vercel | seed system: 308 bodies |",
        "(BENCHMARKS.md, sessions 25 and 26)",
        "Figures: BENCHMARKS.md, session 21.",
        "The session-6 runtime changes",
        "//! Bounded histories (issue 30): how a run",
        "with the same figures without (Issue #29's overhead pair).",
    ];
    for line in cited {
        assert!(citation(line).is_some(), "not caught: {line}");
    }
    let fine = [
        r#"let mut t = Table::new(["SCHEDULE", "WORKFLOW", "SPEC", "STATE"]);"#,
        "SCHEDULE  WORKFLOW  SPEC        STATE",
        "const SPECS: usize = 3; let MY_SPEC = 1;",
        "/// The 64 low bits, used to seed the run's deterministic random numbers.",
        "//! The killer's choices come from a seed it prints; `WF_CHAOS_SEED=<seed>` replays them",
        "// general, https://github.com/launchbadge/sqlx/issues/3150.)",
        "/// Starts chromedriver and opens a headless Chromium session with a fresh profile.",
        "pub struct Session { token: String }",
        "let issue = issues[0]; // an issue of the tracker this example models",
        "// shared/state.rs keeps the shared state",
    ];
    for line in fine {
        assert_eq!(citation(line), None, "flagged: {line}");
    }
}
