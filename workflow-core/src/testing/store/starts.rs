//! Delayed starts and run versions: a run admitted with its start ahead waits
//! for it whatever would wake it sooner, and a run keeps its start and the version of the
//! build that started it, which listings filter by.

use std::time::Duration;

use serde_json::json;

use super::support::{acquire, create, names, start_hook, t};
use crate::ids::RunId;
use crate::store::*;

/// A run of `hooked` admitted at `t(0)`, starting at `start_at`, started by build `version`.
fn run_at(
    start_at: Option<u64>,
    token: Option<&str>,
    version: Option<&str>,
    created: u64,
) -> NewRun {
    NewRun::new(RunId::new(), "hooked".to_owned(), json!([]), t(created))
        .start_at(start_at.map(t))
        .version(version.map(str::to_owned))
        .hook(token.and_then(|token| start_hook(token, None)))
}

/// A run whose start lies ahead is admitted now (its token claimed) and is `Pending` with
/// its start and version; it is not leased at admission, not handed out by `acquire` before
/// its start, and not made due earlier by a payload sent to its token. From its start on it
/// is handed out like any run, with its start and version. A start already passed at
/// admission delays nothing: such a run is leased at admission.
pub async fn a_delayed_run_waits_for_its_start<S: Store>(store: &S) {
    let plain = run_at(Some(1_000), None, Some("2.0.1"), 0);
    let hooked = run_at(Some(1_000), Some("later"), Some("2.0.1"), 0);
    let offered = run_at(Some(1_000), None, None, 0);
    let ids = [plain.id, hooked.id, offered.id];
    assert_eq!(store.create_run(plain).await.unwrap(), Admission::Admitted);
    assert_eq!(store.create_run(hooked).await.unwrap(), Admission::Admitted);
    let (admission, lease) = store
        .create_run_leased(offered, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(admission, Admission::Admitted);
    assert_eq!(lease, None, "a delayed run is not leased at admission");

    let record = store.get_run(&ids[0]).await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Pending);
    assert_eq!(record.start_at, Some(t(1_000)));
    assert_eq!(record.version.as_deref(), Some("2.0.1"));
    let offered = store.get_run(&ids[2]).await.unwrap().unwrap();
    assert_eq!(
        (offered.status, offered.version),
        (RunStatus::Pending, None)
    );

    // The token is the delayed run's from admission on, and a payload to it waits.
    let (owner, _) = store
        .resume_hook("later", json!("early"), t(10))
        .await
        .unwrap()
        .expect("the delayed run owns its token from admission on");
    assert_eq!(owner, ids[1]);

    let workflows = names(&["hooked"]);
    let lease = Duration::from_secs(60);
    let early = acquire(store, &workflows, t(999), lease, 10).await;
    assert!(
        early.is_empty(),
        "handed out before its start: {:?}",
        early.iter().map(|r| r.run.id).collect::<Vec<_>>()
    );

    let due = acquire(store, &workflows, t(1_000), lease, 10).await;
    let mut got: Vec<RunId> = due.iter().map(|r| r.run.id).collect();
    got.sort();
    let mut want = ids.to_vec();
    want.sort();
    assert_eq!(got, want, "every delayed run is due at its start");
    for r in &due {
        assert_eq!(r.run.start_at, Some(t(1_000)));
        assert_eq!(r.run.status, RunStatus::Running);
    }
    let hooked = due.iter().find(|r| r.run.id == ids[1]).unwrap();
    assert_eq!(hooked.run.version.as_deref(), Some("2.0.1"));

    // A start already passed at admission: leased at once, the start kept as given.
    let past = run_at(Some(0), None, Some("2.0.1"), 5);
    let past_id = past.id;
    let (_, lease) = store
        .create_run_leased(past, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(lease.is_some(), "a start in the past delays nothing");
    let record = store.get_run(&past_id).await.unwrap().unwrap();
    assert_eq!(record.start_at, Some(t(0)));

    // A run without a start or version has none.
    let plain = create(store, "hooked", t(0)).await;
    let record = store.get_run(&plain).await.unwrap().unwrap();
    assert_eq!((record.start_at, record.version), (None, None));
}

/// `RunFilter::version` lists only the runs started by that version, newest first, with the
/// other filters; runs without a version match no version.
pub async fn lists_runs_by_version<S: Store>(store: &S) {
    let mut admitted = Vec::new();
    for (i, version) in [Some("1.0"), None, Some("1.0"), Some("2.0")]
        .into_iter()
        .enumerate()
    {
        let run = run_at(None, None, version, i as u64);
        admitted.push(run.id);
        store.create_run(run).await.unwrap();
    }
    let listed = |f: RunFilter| async move {
        let runs = store.list_runs(&f).await.unwrap();
        runs.iter().map(|r| r.id).collect::<Vec<_>>()
    };
    assert_eq!(
        listed(RunFilter::new().version("1.0")).await,
        [admitted[2], admitted[0]]
    );
    assert_eq!(listed(RunFilter::new().version("2.0")).await, [admitted[3]]);
    assert_eq!(listed(RunFilter::new().version("3.0")).await, []);
    assert_eq!(
        listed(RunFilter::new().version("1.0").limit(1)).await,
        [admitted[2]]
    );
    assert_eq!(
        listed(RunFilter::new().version("1.0").status(RunStatus::Completed)).await,
        []
    );
    assert_eq!(listed(RunFilter::new()).await.len(), 4);
    let record = store.get_run(&admitted[3]).await.unwrap().unwrap();
    assert_eq!(record.version.as_deref(), Some("2.0"));
}
