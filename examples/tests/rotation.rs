//! The rotation example: a run sealed under one key stays readable through a rotation and a
//! rekey, after which the old key is not needed, and the secret is nowhere in the file.

#[allow(dead_code)]
#[path = "../rotation.rs"]
mod rotation;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stays_readable_through_rotation_and_rekey() {
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        rotation::demo(&dir.path().join("rotation.db")),
    )
    .await
    .expect("the demo finished in time")
    .unwrap();
    assert_eq!(out.outputs, vec!["card ending 4242"; 3]);
    assert!(out.rekeyed > 0, "{out:?}");
    assert!(!out.secret_in_file, "the secret was stored in the clear");
}
