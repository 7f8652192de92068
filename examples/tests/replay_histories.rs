//! A replay test, as the guide recommends (docs/guide/testing.md): every history in
//! `tests/histories/` (written by `workflow export <id>`, or by
//! `cargo run --example orders -- --export examples/tests/histories`) is replayed against the
//! `orders` workflow as this build has it. A change that would block the runs in flight fails
//! here, naming the file and the divergence, before it is deployed.

#[allow(dead_code)]
#[path = "../orders.rs"]
mod orders;

use std::path::{Path, PathBuf};

/// The histories in `dir` that do not fit this build: one `<file>: <divergence>` line each.
fn misfits(dir: &Path) -> (usize, Vec<String>) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let misfits = files
        .iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            let result = serde_json::from_str(&text)
                .map_err(|e| e.to_string())
                .and_then(|history| {
                    workflow_core::testing::replay(orders::process_order, &history)
                        .map_err(|e| e.to_string())
                });
            result.err().map(|e| format!("{}: {e}", path.display()))
        })
        .collect();
    (files.len(), misfits)
}

#[test]
fn this_build_replays_the_recorded_histories() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/histories");
    let (checked, misfits) = misfits(&dir);
    assert!(checked > 0, "no histories in {}", dir.display());
    assert!(
        misfits.is_empty(),
        "{} of {checked} histories do not fit this build; a deploy would block those runs:\n{}",
        misfits.len(),
        misfits.join("\n")
    );
}

/// The check has teeth: a history whose first step is not the one the code calls is reported
/// with its file name and the divergence.
#[test]
fn a_history_that_no_longer_fits_is_named() {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/histories");
    let first = std::fs::read_dir(&committed)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|ext| ext == "json"))
        .expect("a committed history");
    let mut history: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(first).unwrap()).unwrap();
    history["events"][0]["event"]["name"] = "orders.refund".into();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("changed.json"), history.to_string()).unwrap();
    let (checked, misfits) = misfits(dir.path());
    assert_eq!(checked, 1);
    assert_eq!(misfits.len(), 1);
    assert!(
        misfits[0].contains("changed.json")
            && misfits[0].contains("at event 1")
            && misfits[0].contains("orders.refund")
            && misfits[0].contains("orders.charge_card"),
        "{}",
        misfits[0]
    );
}
