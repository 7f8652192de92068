//! `docs/ARCHITECTURE.md` names only files and folders that exist.
//!
//! Every inline code span of the page (outside fenced code blocks) that looks like a path of
//! the repository is checked: a span made only of letters, digits, `_`, `-`, `.` and `/`
//! that ends with `.rs`, `.md`, `.toml` or `/`. Such a span resolves when it names an existing
//! file (a folder, for one ending with `/`) relative to
//!
//! - the repository's root (`docs/metrics.md`, `workflow-cli/`), or
//! - the `src/` folder of one of the repository's crates, that is of any `<dir>/src/` at the
//!   root (`runtime/worker.rs` is `workflow-core/src/runtime/worker.rs`, `web/guard.rs` is
//!   `workflow-cli/src/web/guard.rs`).
//!
//! The test fails naming every span that resolves nowhere.

use std::path::{Path, PathBuf};

/// The page checked, relative to the repository's root.
const ARCHITECTURE: &str = "docs/ARCHITECTURE.md";

/// The suffixes that make a code span a path to check.
const PATH_ENDINGS: [&str; 4] = [".rs", ".md", ".toml", "/"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workflow-core sits in the repository's root")
        .to_path_buf()
}

/// The inline code spans of `page` that look like paths, in order, outside fenced code
/// blocks. An odd number of backticks outside the fences is an error: the spans after it
/// could not be told from the text.
fn path_spans(page: &str) -> Result<Vec<String>, String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    if prose.matches('`').count() % 2 != 0 {
        return Err("an odd number of backticks outside code blocks".to_owned());
    }
    Ok(prose
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            !span.is_empty()
                && span
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
                && PATH_ENDINGS.iter().any(|end| span.ends_with(end))
        })
        .map(str::to_owned)
        .collect())
}

/// The folders a span may be relative to: the root, then each crate's `src/`.
fn bases(root: &Path) -> Vec<PathBuf> {
    let mut bases = vec![root.to_path_buf()];
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root)
        .expect("the repository's root is readable")
        .filter_map(|entry| Some(entry.ok()?.path().join("src")))
        .filter(|src| src.is_dir())
        .collect();
    crates.sort();
    bases.extend(crates);
    bases
}

fn resolves(span: &str, bases: &[PathBuf]) -> bool {
    bases.iter().any(|base| {
        let path = base.join(span);
        if span.ends_with('/') {
            path.is_dir()
        } else {
            path.is_file()
        }
    })
}

#[test]
fn every_path_the_architecture_page_names_exists() {
    let root = repo_root();
    let page = std::fs::read_to_string(root.join(ARCHITECTURE))
        .unwrap_or_else(|e| panic!("reading {ARCHITECTURE}: {e}"));
    let spans = path_spans(&page).unwrap_or_else(|e| panic!("{ARCHITECTURE}: {e}"));
    assert!(
        spans.iter().any(|s| s.ends_with(".rs")) && spans.iter().any(|s| s.ends_with('/')),
        "{ARCHITECTURE}: no file or folder found to check: {spans:?}"
    );
    let bases = bases(&root);
    let mut missing: Vec<&str> = spans
        .iter()
        .map(String::as_str)
        .filter(|span| !resolves(span, &bases))
        .collect();
    missing.sort_unstable();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "{ARCHITECTURE} names paths that exist neither from the repository's root nor from \
         a crate's src/: {missing:#?}"
    );
}

#[test]
fn the_spans_checked_are_the_path_like_ones_outside_code_blocks() {
    let page = "\
The `driver/` drives, `runtime/worker.rs` leases, `Cargo.toml` and `docs/x.md` too.
Not paths: `RunStore::append`, `rt.start(wf, args)`, `#[step]`, `a b.rs`, `queues.held`.

```rust
let x = `fenced/`;
```
";
    assert_eq!(
        path_spans(page).unwrap(),
        ["driver/", "runtime/worker.rs", "Cargo.toml", "docs/x.md"]
    );
    assert!(path_spans("one ` too many").is_err());

    let root = repo_root();
    let bases = bases(&root);
    for known in [
        "workflow-core/",
        "docs/ARCHITECTURE.md",
        "store/runs.rs",
        "web/",
    ] {
        assert!(resolves(known, &bases), "{known}");
    }
    // A file is not a folder, a folder not a file, and a path is not found by its name alone.
    for unknown in [
        "store/runs.rs/",
        "store.rs",
        "driver.rs",
        "runs.rs",
        "view.rs",
    ] {
        assert!(!resolves(unknown, &bases), "{unknown}");
    }
}
